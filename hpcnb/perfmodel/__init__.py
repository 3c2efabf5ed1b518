"""ConvMeter-style runtime prediction of ConvNets, on one machine and across nodes.

The core model is importable from here; the pieces behind it from their modules:

* :mod:`~hpcnb.perfmodel.features`: FLOPs, bytes, parameters and layer counts from the IR,
  training FLOPs measured with ``FlopCounterMode``.
* :mod:`~hpcnb.perfmodel.timing`: what is timed (inference pass, training step) and the
  roofline micro-benchmarks, through :mod:`hpcnb.timing`.
* :mod:`~hpcnb.perfmodel.protocol`: the measurement protocol that knows its noise (samples,
  IQR ÷ median, load average, threads; bounded re-measures; flags; the noise floor).
* :mod:`~hpcnb.perfmodel.dataset`: zoo × widths × resolutions × batches, cached per machine.
* :mod:`~hpcnb.perfmodel.estimator`: :class:`ConvMeter`, the FLOPs-only and roofline
  baselines, leave-one-family-out evaluation and MAPE (its bootstrap interval:
  :func:`hpcnb.stats.mape_interval`).
* :mod:`~hpcnb.perfmodel.opmodel`: :class:`OpCostModel`, per-op-kind terms on IR features,
  and the gradient-boosted reference.
* :mod:`~hpcnb.perfmodel.aten`, :mod:`~hpcnb.perfmodel.kernelset`,
  :mod:`~hpcnb.perfmodel.kernelmodel`: nn-Meter's recipe on this CPU: the ATen kernels a
  network runs, kernel configurations sampled from ranges of their own and timed
  round-robin (:mod:`~hpcnb.perfmodel.roundrobin`), one forest per operator
  (:mod:`~hpcnb.perfmodel.kernels`), a network as the sum of its kernels.
* :mod:`~hpcnb.perfmodel.netset`: the zoo timed round-robin, and the noise ceiling.
* :mod:`~hpcnb.perfmodel.evaluation`: share within ±10 % / ±20 %, random split, per family.
* :mod:`~hpcnb.perfmodel.predict`: :func:`predict_latency` with an interval, for other
  notebooks (the kernel-level model by default).
* :mod:`~hpcnb.perfmodel.allreduce`, :mod:`~hpcnb.perfmodel.scaling`,
  :mod:`~hpcnb.perfmodel.distributed`, :mod:`~hpcnb.perfmodel.multinode`: α–β all-reduce,
  the multi-node step model validated on Pollux measurements, the gloo micro-benchmark
  and DDP check, and runtime vs nodes for the batch simulator.
* :mod:`~hpcnb.perfmodel.cli`: ``hpcnb perfmodel validate-scaling``.

Example:
    >>> from hpcnb.perfmodel import Cluster, runtime_vs_nodes
    >>> from hpcnb.perfmodel.multinode import TrainingCost
    >>> cost = TrainingCost(train_flops_per_sample=1e9, gradient_bytes=1e8)
    >>> steps = runtime_vs_nodes(cost, 64, Cluster(link_gbps=100.0), nodes=[1, 2, 4])
    >>> steps[1] > steps[2] > steps[4]
    True
"""

from hpcnb.perfmodel.allreduce import allreduce_time
from hpcnb.perfmodel.dataset import GridConfig, collect_dataset
from hpcnb.perfmodel.estimator import ConvMeter, Measurement, leave_one_family_out, mape
from hpcnb.perfmodel.evaluation import within_share
from hpcnb.perfmodel.features import NetworkFeatures, network_features
from hpcnb.perfmodel.multinode import Cluster, runtime_vs_nodes
from hpcnb.perfmodel.opmodel import OpCostModel
from hpcnb.perfmodel.predict import KernelLatencyPredictor, LatencyPredictor, predict_latency
from hpcnb.perfmodel.protocol import NoisePolicy
from hpcnb.perfmodel.scaling import ScalingModel
from hpcnb.perfmodel.timing import TimingConfig

__all__ = [
    # What a network costs per sample, read from the IR
    "NetworkFeatures",
    "network_features",
    # Measuring step times under a noise-aware protocol, and the cached data set
    "TimingConfig",
    "NoisePolicy",
    "GridConfig",
    "Measurement",
    "collect_dataset",
    # Runtime estimators (scikit-learn style) and their evaluation
    "ConvMeter",
    "OpCostModel",
    "leave_one_family_out",
    "mape",
    "within_share",
    # Latency with an interval, for other notebooks
    "KernelLatencyPredictor",
    "LatencyPredictor",
    "predict_latency",
    # Communication and scaling beyond one machine
    "allreduce_time",
    "ScalingModel",
    "Cluster",
    "runtime_vs_nodes",
]
