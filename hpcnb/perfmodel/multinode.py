"""Runtime vs nodes of a data-parallel (malleable) training job, for what-if studies.

A job trains a network with a fixed *global* batch ``B``; on ``p`` nodes each node holds
``⌈B / p⌉`` samples (strong scaling, as when a malleable job is resized). One iteration::

    T(p) = T_compute(⌈B/p⌉) + T_allreduce(p, gradient bytes) − ω · min(…)

with ``T_compute(b) = overhead + b · training FLOPs per sample / node FLOP/s`` unless the
caller supplies a measured compute model (e.g. a fitted ConvMeter on this machine), and the
ring (or tree) α–β all-reduce of :mod:`hpcnb.perfmodel.allreduce` over the cluster's links.
This is the function the batch-system simulator (notebook 05) calls to get the scaling
curve of a deep-learning job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch import nn

from hpcnb.perfmodel.allreduce import allreduce_time, overlapped_step
from hpcnb.perfmodel.features import NetworkFeatures, network_features
from hpcnb.perfmodel.protocol import PerfmodelError

__all__ = ["Cluster", "TrainingCost", "runtime_vs_nodes", "training_cost"]


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster of nodes joined by links.

    Attributes:
        name: Label for plots.
        node_flops: Sustained training FLOP/s of one node.
        step_overhead_s: Fixed seconds per iteration on a node (framework, launches).
        link_gbps: Link bandwidth per node in Gbit/s.
        latency_s: Latency per message step in seconds (``α``).
        overlap: Overlap factor ``ω`` of compute and all-reduce in [0, 1].
        algorithm: ``"ring"`` or ``"tree"``.

    Raises:
        PerfmodelError: A rate that is not positive, a negative overhead or latency, or an
            overlap outside [0, 1].
    """

    name: str = "cluster"
    node_flops: float = 1e12
    step_overhead_s: float = 1e-3
    link_gbps: float = 100.0
    latency_s: float = 5e-6
    overlap: float = 0.0
    algorithm: str = "ring"

    def __post_init__(self) -> None:
        if self.node_flops <= 0 or self.link_gbps <= 0:
            raise PerfmodelError(
                f"Cluster {self.name!r}: node_flops={self.node_flops} and "
                f"link_gbps={self.link_gbps} must be positive"
            )
        if self.step_overhead_s < 0 or self.latency_s < 0:
            raise PerfmodelError(f"Cluster {self.name!r}: overhead and latency must be >= 0")
        if not 0.0 <= self.overlap <= 1.0:
            raise PerfmodelError(f"Cluster {self.name!r}: overlap={self.overlap} not in [0, 1]")

    @property
    def beta(self) -> float:
        """Seconds per byte of one link."""
        return 8.0 / (self.link_gbps * 1e9)


@dataclass(frozen=True)
class TrainingCost:
    """What one training sample and one gradient exchange cost.

    Attributes:
        train_flops_per_sample: Forward + backward FLOPs per sample.
        gradient_bytes: Bytes all-reduced per iteration (float32 gradients).
    """

    train_flops_per_sample: float
    gradient_bytes: float


def training_cost(
    model: nn.Module | NetworkFeatures | TrainingCost,
    input_shape: tuple[int, ...] = (3, 32, 32),
) -> TrainingCost:
    """Return the per-sample training FLOPs and gradient bytes of a model.

    Args:
        model: A network (its features are computed), its features, or a cost directly.
        input_shape: One sample's shape when ``model`` is a network.
    """
    if isinstance(model, TrainingCost):
        return model
    if isinstance(model, nn.Module):
        grad_bytes = 4.0 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        feats = network_features(model, input_shape)
        return TrainingCost(feats.train_flops, grad_bytes)
    return TrainingCost(model.train_flops, 4.0 * model.params)


def runtime_vs_nodes(
    model: nn.Module | NetworkFeatures | TrainingCost,
    batch: int,
    cluster: Cluster,
    nodes: Iterable[int] = range(1, 65),
    *,
    input_shape: tuple[int, ...] = (3, 32, 32),
    compute_time: Callable[[int], float] | None = None,
) -> dict[int, float]:
    """Seconds per training iteration of a global batch on each node count.

    Args:
        model: Network, its features, or a :class:`TrainingCost`.
        batch: Global batch size (split evenly; each node gets ``⌈batch / p⌉``).
        cluster: Nodes and links.
        nodes: Node counts to evaluate.
        input_shape: One sample's shape when ``model`` is a network.
        compute_time: Measured compute model ``local_batch -> seconds`` replacing the
            FLOP-rate estimate (e.g. a fitted ConvMeter's prediction).

    Returns:
        ``{p: seconds per iteration}``.

    Raises:
        PerfmodelError: ``batch`` below 1 or a node count below 1 or above ``batch``.
    """
    if batch < 1:
        raise PerfmodelError(f"batch={batch}: expected >= 1")
    cost = training_cost(model, input_shape)
    out: dict[int, float] = {}
    for p in nodes:
        if p < 1 or p > batch:
            raise PerfmodelError(f"nodes: {p} is outside 1..batch={batch}")
        local = math.ceil(batch / p)
        if compute_time is not None:
            compute = float(compute_time(local))
        else:
            compute = cluster.step_overhead_s + local * cost.train_flops_per_sample / (
                cluster.node_flops
            )
        comm = float(
            allreduce_time(
                p, cost.gradient_bytes, cluster.latency_s, cluster.beta, cluster.algorithm
            )
        )
        out[int(p)] = float(overlapped_step(compute, comm, cluster.overlap))
    return out
