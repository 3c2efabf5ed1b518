"""GNN-RL: topology-aware, FLOPs-constrained channel pruning (notebook 02).

Reconstruction of Yu, Mazaheri & Jannesari, "Topology-Aware Network Pruning using
Multi-stage Graph Embedding and Reinforcement Learning" (ICML 2022): a hierarchical graph
of the network (:mod:`~hpcnb.pruning.hiergraph`), a multi-stage GNN encoder in PyG
(:mod:`~hpcnb.pruning.encoder`), a gymnasium environment (:mod:`~hpcnb.pruning.env`),
the PPO agent and baselines (:mod:`~hpcnb.pruning.agents`,
:mod:`~hpcnb.pruning.peers`), real pruning through ``hpcnb.ir``
(:mod:`~hpcnb.pruning.task`) and training / latency helpers
(:mod:`~hpcnb.pruning.training`).
"""

from hpcnb.pruning.agents import (
    DDPGConfig,
    PolicySearchResult,
    PPOConfig,
    amc_ddpg_search,
    gnnrl_search,
    learning_curve,
    random_search,
    uniform_search,
)
from hpcnb.pruning.compare import (
    METHODS,
    MethodOutcome,
    accuracy_gap,
    bar_table,
    compare_methods,
    count_passing,
    outcomes_table,
    score_pruned,
)
from hpcnb.pruning.encoder import (
    EdgeConditionedConv,
    GNNFeaturesExtractor,
    MultiStageGNN,
    WeightedGCNConv,
)
from hpcnb.pruning.env import EnvConfig, EpisodeRecord, LayerwiseEnv, PruningEnv
from hpcnb.pruning.hiergraph import KIND_VOCAB, LEVEL1_FEATURES, HierarchicalGraph
from hpcnb.pruning.peers import PeerResult, torch_pruning_at_budget
from hpcnb.pruning.plots import plot_hierarchical_graph, plot_keep_ratios, plot_learning_curves
from hpcnb.pruning.problem import (
    FlopsModel,
    PruningProblem,
    keep_counts,
    project_to_budget,
    uniform_ratios,
)
from hpcnb.pruning.task import ModelPruningTask
from hpcnb.pruning.training import (
    LatencyResult,
    TrainConfig,
    count_params,
    fine_tune,
    measure_latency,
    recalibrate_batchnorm,
    train_classifier,
    training_batches,
)

__all__ = [
    "KIND_VOCAB",
    "LEVEL1_FEATURES",
    "METHODS",
    "DDPGConfig",
    "EdgeConditionedConv",
    "EnvConfig",
    "EpisodeRecord",
    "FlopsModel",
    "GNNFeaturesExtractor",
    "HierarchicalGraph",
    "LatencyResult",
    "LayerwiseEnv",
    "MethodOutcome",
    "ModelPruningTask",
    "MultiStageGNN",
    "PPOConfig",
    "PeerResult",
    "PruningEnv",
    "PruningProblem",
    "PolicySearchResult",
    "TrainConfig",
    "WeightedGCNConv",
    "accuracy_gap",
    "amc_ddpg_search",
    "bar_table",
    "compare_methods",
    "count_params",
    "count_passing",
    "fine_tune",
    "gnnrl_search",
    "keep_counts",
    "learning_curve",
    "measure_latency",
    "outcomes_table",
    "plot_hierarchical_graph",
    "plot_keep_ratios",
    "plot_learning_curves",
    "project_to_budget",
    "random_search",
    "recalibrate_batchnorm",
    "score_pruned",
    "torch_pruning_at_budget",
    "train_classifier",
    "training_batches",
    "uniform_ratios",
    "uniform_search",
]
