"""OSF: weight-sharing supernets from pretrained models, samplers, fork-join training, search.

Reproduces "OSF: Optimized Supernet Formation" (Sixing Yu et al.): a model is converted
into a supernet through the IR's channel groups and residual blocks
(:meth:`Supernet.from_model`), subnets are real smaller modules extracted by graph
traversal, training uses the sandwich rule with in-place distillation and uniform,
sandwich or prioritised samplers, several subnets train concurrently on shared weights
with a fork-join step whose join is a coverage-count average (MPI ``Allreduce``), and
evolutionary or exhaustive search returns Pareto fronts.
"""

from hpcnb.progress import show_progress
from hpcnb.supernet.benchmark import ModelComparison, ModelMeasurement, compare_models
from hpcnb.supernet.forkjoin import (
    PHASES,
    LocalResult,
    StepPhases,
    assign_subnets,
    coverage_average,
    distill_loss,
    fork_join_step,
    join_order_demo,
    last_writer_step,
    local_gradients,
)
from hpcnb.supernet.mpi import (
    ForkJoinBenchmark,
    ForkJoinJob,
    benchmark_fork_join,
    run_benchmark_job,
    run_forkjoin_mpi,
    run_job,
    run_local,
    variant_name,
    write_job,
)
from hpcnb.supernet.pareto import crowding_distance, pareto_ranks
from hpcnb.supernet.samplers import PrioritizedSampler, Sampler, SandwichSampler, UniformSampler
from hpcnb.supernet.search import (
    Candidate,
    SubnetSearchResult,
    evolutionary_search,
    exhaustive_search,
    pareto_front,
    search_supernet,
)
from hpcnb.supernet.sharing import FlatParameters, SubnetBinding, bind_subnet
from hpcnb.supernet.space import Dimension, SearchSpace, SubnetConfig, width_choices
from hpcnb.supernet.supernet import Supernet
from hpcnb.supernet.training import (
    SupernetTrainConfig,
    TrainLog,
    batches,
    finetune_subnet,
    make_optimizer,
    recalibrate_norm,
    selective_recall,
    subnet_accuracy,
    train_model,
    train_supernet,
)

__all__ = [
    "PHASES",
    "Candidate",
    "Dimension",
    "FlatParameters",
    "ForkJoinBenchmark",
    "ForkJoinJob",
    "LocalResult",
    "ModelComparison",
    "ModelMeasurement",
    "PrioritizedSampler",
    "Sampler",
    "SandwichSampler",
    "SubnetSearchResult",
    "SearchSpace",
    "StepPhases",
    "SubnetBinding",
    "SubnetConfig",
    "Supernet",
    "SupernetTrainConfig",
    "TrainLog",
    "UniformSampler",
    "assign_subnets",
    "batches",
    "benchmark_fork_join",
    "bind_subnet",
    "compare_models",
    "coverage_average",
    "crowding_distance",
    "distill_loss",
    "evolutionary_search",
    "exhaustive_search",
    "finetune_subnet",
    "fork_join_step",
    "join_order_demo",
    "last_writer_step",
    "local_gradients",
    "make_optimizer",
    "pareto_front",
    "pareto_ranks",
    "recalibrate_norm",
    "run_benchmark_job",
    "run_job",
    "run_local",
    "run_forkjoin_mpi",
    "search_supernet",
    "selective_recall",
    "show_progress",
    "subnet_accuracy",
    "train_model",
    "train_supernet",
    "variant_name",
    "width_choices",
    "write_job",
]
