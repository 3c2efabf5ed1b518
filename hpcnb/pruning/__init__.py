"""GNN-RL: topology-aware, FLOPs-constrained channel pruning (notebook 02).

Reconstruction of Yu, Mazaheri & Jannesari, "Topology-Aware Network Pruning using
Multi-stage Graph Embedding and Reinforcement Learning" (ICML 2022): a hierarchical graph
of the network (:mod:`~hpcnb.pruning.hiergraph`), a multi-stage GNN encoder in PyG
(:mod:`~hpcnb.pruning.encoder`), a gymnasium environment (:mod:`~hpcnb.pruning.env`),
the PPO agent and baselines (:mod:`~hpcnb.pruning.agents`,
:mod:`~hpcnb.pruning.peers`), real pruning through ``hpcnb.ir``
(:mod:`~hpcnb.pruning.task`) and training / latency helpers
(:mod:`~hpcnb.pruning.training`).

This face exports the core model only. The experiment driver of notebook 02 and its
tables live in :mod:`~hpcnb.pruning.compare`, the figures in :mod:`~hpcnb.pruning.plots`,
the Torch-Pruning peer in :mod:`~hpcnb.pruning.peers`; lower-level pieces (the GNN
layers, ``keep_counts``, ``measure_latency``, ...) are imported from their modules.
"""

from hpcnb.pruning.agents import (
    DDPGConfig,
    PolicySearchResult,
    PPOConfig,
    amc_ddpg_search,
    gnnrl_search,
    random_search,
    uniform_search,
)
from hpcnb.pruning.env import EnvConfig, LayerwiseEnv, PruningEnv
from hpcnb.pruning.hiergraph import HierarchicalGraph
from hpcnb.pruning.problem import FlopsModel, PruningProblem
from hpcnb.pruning.task import ModelPruningTask
from hpcnb.pruning.training import TrainConfig, fine_tune, recalibrate_batchnorm, train_classifier

__all__ = [
    # The problem: a network's channel groups, its FLOPs model, its graph
    "PruningProblem",
    "ModelPruningTask",
    "FlopsModel",
    "HierarchicalGraph",
    # The environments an agent prunes in (all groups at once / one group per step)
    "EnvConfig",
    "PruningEnv",
    "LayerwiseEnv",
    # Searches at a FLOPs budget: GNN-RL (PPO), AMC-style DDPG and the baselines
    "PPOConfig",
    "DDPGConfig",
    "PolicySearchResult",
    "gnnrl_search",
    "amc_ddpg_search",
    "random_search",
    "uniform_search",
    # The shared fine-tuning of every pruned network
    "TrainConfig",
    "train_classifier",
    "fine_tune",
    "recalibrate_batchnorm",
]
