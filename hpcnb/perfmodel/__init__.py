"""ConvMeter-style runtime prediction: features, timing, estimators, multi-node scaling.

* :mod:`~hpcnb.perfmodel.features`: FLOPs, bytes, parameters and layer counts from the IR,
  training FLOPs measured with ``FlopCounterMode``.
* :mod:`~hpcnb.perfmodel.timing`: the timing harness and roofline micro-benchmarks.
* :mod:`~hpcnb.perfmodel.dataset`: zoo × widths × resolutions × batches, cached per machine.
* :mod:`~hpcnb.perfmodel.estimator`: :class:`ConvMeter`, the FLOPs-only and roofline
  baselines, leave-one-family-out evaluation, MAPE with a bootstrap interval.
* :mod:`~hpcnb.perfmodel.allreduce`, :mod:`~hpcnb.perfmodel.scaling`,
  :mod:`~hpcnb.perfmodel.distributed`, :mod:`~hpcnb.perfmodel.multinode`: α–β all-reduce,
  the multi-node step model validated on Pollux measurements, the gloo micro-benchmark
  and DDP check, and runtime vs nodes for the batch simulator.
"""

from hpcnb.perfmodel.allreduce import (
    ALGORITHMS,
    AlphaBeta,
    allreduce_time,
    fit_alpha_beta,
    message_terms,
    overlapped_step,
)
from hpcnb.perfmodel.dataset import (
    FAMILIES,
    GridConfig,
    build_network,
    cache_file,
    collect_dataset,
)
from hpcnb.perfmodel.distributed import (
    DistributedConfig,
    DistributedReport,
    run_distributed_benchmark,
    small_convnet,
)
from hpcnb.perfmodel.estimator import (
    MODES,
    ConvMeter,
    FamilyEvaluation,
    FlopsOnly,
    Measurement,
    Roofline,
    absolute_percentage_errors,
    bootstrap_rows,
    design_matrix,
    feature_names,
    leave_one_family_out,
    mape,
    mape_interval,
    measured_seconds,
    step_time_function,
)
from hpcnb.perfmodel.features import (
    NetworkFeatures,
    cache_bytes_per_core,
    network_features,
    training_flops,
)
from hpcnb.perfmodel.multinode import Cluster, TrainingCost, runtime_vs_nodes, training_cost
from hpcnb.perfmodel.scaling import (
    ScalingDataError,
    ScalingModel,
    ScalingParams,
    ScalingTable,
    ScalingValidation,
    read_placements,
    read_scalability,
    validate_scaling,
    write_synthetic_tables,
)
from hpcnb.perfmodel.timing import (
    TimingConfig,
    memory_bandwidth,
    peak_flops,
    time_inference,
    time_training,
)

__all__ = [
    "ALGORITHMS",
    "FAMILIES",
    "MODES",
    "AlphaBeta",
    "Cluster",
    "ConvMeter",
    "DistributedConfig",
    "DistributedReport",
    "FamilyEvaluation",
    "FlopsOnly",
    "GridConfig",
    "Measurement",
    "NetworkFeatures",
    "Roofline",
    "ScalingDataError",
    "ScalingModel",
    "ScalingParams",
    "ScalingTable",
    "ScalingValidation",
    "TimingConfig",
    "TrainingCost",
    "absolute_percentage_errors",
    "allreduce_time",
    "bootstrap_rows",
    "build_network",
    "cache_bytes_per_core",
    "cache_file",
    "collect_dataset",
    "design_matrix",
    "feature_names",
    "fit_alpha_beta",
    "leave_one_family_out",
    "mape",
    "mape_interval",
    "measured_seconds",
    "memory_bandwidth",
    "message_terms",
    "network_features",
    "overlapped_step",
    "peak_flops",
    "read_placements",
    "read_scalability",
    "run_distributed_benchmark",
    "runtime_vs_nodes",
    "small_convnet",
    "step_time_function",
    "time_inference",
    "time_training",
    "training_cost",
    "training_flops",
    "validate_scaling",
    "write_synthetic_tables",
]
