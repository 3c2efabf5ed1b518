"""Latency of a network predicted with an interval: for other notebooks.

:class:`KernelLatencyPredictor` (the default) sums the network's ATen kernels priced by the
per-operator forests of :mod:`hpcnb.perfmodel.kernelmodel`, plus a dispatch cost per call;
its interval comes from networks of families the dispatch constant was fitted without.
:class:`LatencyPredictor` wraps a fitted :class:`~hpcnb.perfmodel.opmodel.OpCostModel` with
a *prediction interval* taken from held-out errors: the model is fitted once per held-out
family on the others (:func:`~hpcnb.perfmodel.estimator.leave_one_family_out`), and the
empirical quantiles of ``measured / predicted`` over those held-out rows scale a prediction
into ``[low, high]`` (a 90 % interval by default). The interval therefore says how far off
the model was on *families it had not seen*, which is the situation of a pruned network.

:func:`predict_latency` is the one call other notebooks use (the pruning notebook's
latency-aware reward)::

    estimate = predict_latency(net, (3, 32, 32), batch=8, threads=1)
    estimate.seconds, estimate.low, estimate.high

Without an explicit ``predictor`` it fits the kernel-level one on this machine's cached
kernel samples and network timings for that thread count (:func:`default_predictor`;
measured by notebook 03 or, the first time, here — minutes), once per process.

Example:
    >>> from hpcnb.perfmodel.estimator import Measurement
    >>> from hpcnb.perfmodel.features import network_features
    >>> from torch import nn
    >>> def net(width):
    ...     return nn.Sequential(nn.Conv2d(3, width, 3), nn.ReLU(), nn.Flatten(),
    ...                          nn.Linear(width * 36, 10))
    >>> rows = []
    >>> for family, widths in (("a", (4, 8, 16)), ("b", (6, 12, 24))):
    ...     for w in widths:
    ...         f = network_features(net(w), (3, 8, 8), name=f"{family}{w}", family=family,
    ...                              training=False)
    ...         for batch in (2, 8):
    ...             t = 1e-4 + 1e-9 * batch * f.forward_flops
    ...             rows.append(Measurement(f, batch, t, t))
    >>> p = LatencyPredictor.fit(rows, threads=1, cache_bytes=1 << 20)
    >>> e = p.predict(net(10), (3, 8, 8), batch=4)
    >>> e.low <= e.seconds <= e.high
    True
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from torch import nn

from hpcnb.perfmodel.aten import network_kernels
from hpcnb.perfmodel.dataset import GridConfig
from hpcnb.perfmodel.estimator import Measurement, leave_one_family_out, measured_seconds
from hpcnb.perfmodel.features import NetworkFeatures, cache_bytes_per_core, network_features
from hpcnb.perfmodel.kernelmodel import (
    KernelModel,
    NetworkKernelPredictor,
    fit_kernel_model,
    held_out_dispatch,
)
from hpcnb.perfmodel.kernelset import SamplingRanges, sample_primitives
from hpcnb.perfmodel.netset import NetworkSet, collect_networks
from hpcnb.perfmodel.opmodel import OpCostModel, op_design_matrix
from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.perfmodel.timing import TimingConfig

__all__ = [
    "KernelLatencyPredictor",
    "LatencyEstimate",
    "LatencyPredictor",
    "default_predictor",
    "predict_latency",
]


class LatencyEstimate(NamedTuple):
    """A predicted latency with its interval.

    Attributes:
        seconds: Predicted seconds per call (one forward pass, or one training step).
        low: Lower end of the interval.
        high: Upper end of the interval.
        confidence: Nominal coverage of ``[low, high]`` on held-out families.
    """

    seconds: float
    low: float
    high: float
    confidence: float


@dataclass(frozen=True)
class LatencyPredictor:
    """A fitted per-op-kind model and its held-out error quantiles.

    Attributes:
        model: The :class:`OpCostModel`, fitted on every row.
        mode: ``"inference"`` or ``"training"``.
        threads: Thread count the timings were measured with.
        cache_bytes: Cache size used by the features.
        ratio_low: Lower quantile of held-out ``measured / predicted``.
        ratio_high: Upper quantile of held-out ``measured / predicted``.
        confidence: Coverage between the two quantiles.
        rows: Rows the model was fitted on.
    """

    model: OpCostModel
    mode: str
    threads: int
    cache_bytes: float
    ratio_low: float
    ratio_high: float
    confidence: float
    rows: int

    @classmethod
    def fit(
        cls,
        rows: Sequence[Measurement],
        *,
        threads: int,
        mode: str = "inference",
        confidence: float = 0.9,
        cache_bytes: float | None = None,
        peak_flops: float | None = None,
    ) -> LatencyPredictor:
        """Fit on ``rows`` and take the interval from leave-one-family-out errors.

        Args:
            rows: Timed configurations of at least two families.
            threads: Thread count they were timed with (checked at prediction).
            mode: ``"inference"`` or ``"training"``.
            confidence: Coverage of the interval, in (0, 1).
            cache_bytes: Cache size for the features (default: this machine's L2).
            peak_flops: Measured FLOP/s, the floor of the dense-FLOP cost
                (:class:`~hpcnb.perfmodel.opmodel.OpCostModel`); ``None``: no floor.

        Raises:
            PerfmodelError: Fewer than two families, or a bad confidence.
        """
        if not 0 < confidence < 1:
            raise PerfmodelError(f"LatencyPredictor.fit: confidence={confidence} not in (0, 1)")
        cache = float(cache_bytes if cache_bytes is not None else cache_bytes_per_core())
        X = op_design_matrix(rows, mode, cache)
        y = measured_seconds(rows, mode)
        families = [r.family for r in rows]
        if len(set(families)) < 2:
            raise PerfmodelError(f"LatencyPredictor.fit: need two families, got {set(families)}")
        held = leave_one_family_out(lambda: OpCostModel(mode, peak_flops), X, y, families)
        ratio = y / np.maximum(held.predicted, 1e-12)
        alpha = (1 - confidence) / 2
        low, high = np.quantile(ratio, [alpha, 1 - alpha])
        return cls(
            model=OpCostModel(mode, peak_flops).fit(X, y),
            mode=mode,
            threads=int(threads),
            cache_bytes=cache,
            ratio_low=float(min(low, 1.0)),
            ratio_high=float(max(high, 1.0)),
            confidence=float(confidence),
            rows=len(rows),
        )

    def predict_features(self, features: NetworkFeatures, batch: int) -> LatencyEstimate:
        """Predicted latency of a network given its features, at ``batch``.

        Args:
            features: The network's features (:func:`~hpcnb.perfmodel.features.network_features`).
            batch: Batch size (a positive integer).

        Raises:
            PerfmodelError: A batch below 1.
        """
        if isinstance(batch, bool) or int(batch) != batch or batch < 1:
            raise PerfmodelError(f"batch={batch!r}: expected a positive integer")
        row = Measurement(features, int(batch), float("nan"), float("nan"))
        seconds = float(self.model.predict(op_design_matrix([row], self.mode, self.cache_bytes))[0])
        seconds = max(seconds, 1e-9)
        return LatencyEstimate(
            seconds, seconds * self.ratio_low, seconds * self.ratio_high, self.confidence
        )

    def predict(self, model: nn.Module, input_shape: Sequence[int], batch: int) -> LatencyEstimate:
        """Predicted latency of ``model`` on samples of ``input_shape`` at ``batch``.

        Args:
            model: The network (any module the IR can trace).
            input_shape: One sample's shape, e.g. ``(3, 32, 32)``.
            batch: Batch size (a positive integer).

        Raises:
            PerfmodelError: A batch below 1.
        """
        features = network_features(
            model, tuple(int(s) for s in input_shape), training=self.mode == "training"
        )
        return self.predict_features(features, batch)


@dataclass
class KernelLatencyPredictor:
    """The kernel-level model (:mod:`hpcnb.perfmodel.kernelmodel`) with a held-out interval.

    A network is captured into its ATen calls, each call priced by its operator's forest
    (or the FLOP/byte fallback), and the sum plus a dispatch cost per call is the estimate.
    The interval is the empirical ``measured / predicted`` quantiles over networks whose
    family the dispatch constant was fitted without.

    Attributes:
        network: The kernel model and its dispatch constant (fitted on every network).
        mode: ``"inference"`` or ``"training"``.
        threads: Thread count of the timings.
        ratio_low: Lower quantile of held-out ``measured / predicted``.
        ratio_high: Upper quantile.
        confidence: Coverage between the two quantiles.
        rows: Networks the dispatch constant was fitted on.
    """

    network: NetworkKernelPredictor
    mode: str
    threads: int
    ratio_low: float
    ratio_high: float
    confidence: float
    rows: int

    @classmethod
    def fit(
        cls,
        model: KernelModel,
        networks: NetworkSet,
        *,
        mode: str = "inference",
        threads: int = 1,
        confidence: float = 0.9,
    ) -> KernelLatencyPredictor:
        """Fit the dispatch constant on ``networks`` and the interval on held-out families.

        Args:
            model: A fitted kernel model.
            networks: Timed networks (:func:`~hpcnb.perfmodel.netset.collect_networks`).
            mode: ``"inference"`` or ``"training"``.
            threads: Thread count of the timings.
            confidence: Coverage of the interval, in (0, 1).

        Raises:
            PerfmodelError: A bad confidence, or fewer than two families.
        """
        if not 0 < confidence < 1:
            raise PerfmodelError(f"KernelLatencyPredictor.fit: confidence={confidence}")
        calls = [networks.calls(i, mode) for i in range(len(networks.rows))]
        y = measured_seconds(networks.rows, mode)
        families = [r.family for r in networks.rows]
        net = NetworkKernelPredictor(model)
        held = held_out_dispatch(net, calls, y, families)
        alpha = (1 - confidence) / 2
        low, high = np.quantile(y / np.maximum(held, 1e-12), [alpha, 1 - alpha])
        net.fit_dispatch(calls, y)
        return cls(
            net,
            mode,
            int(threads),
            float(min(low, 1.0)),
            float(max(high, 1.0)),
            float(confidence),
            len(y),
        )

    def predict(self, model: nn.Module, input_shape: Sequence[int], batch: int) -> LatencyEstimate:
        """Predicted latency of ``model`` on samples of ``input_shape`` at ``batch``.

        The network is captured on a copy (a training step changes weights), so ``model``
        keeps its weights and mode.

        Args:
            model: The network.
            input_shape: One sample's shape, e.g. ``(3, 32, 32)``.
            batch: Batch size (a positive integer).

        Raises:
            PerfmodelError: A batch below 1.
        """
        if isinstance(batch, bool) or int(batch) != batch or batch < 1:
            raise PerfmodelError(f"batch={batch!r}: expected a positive integer")
        calls = network_kernels(
            copy.deepcopy(model), tuple(int(s) for s in input_shape), int(batch), self.mode
        )
        seconds = max(self.network.seconds(calls), 1e-9)
        return LatencyEstimate(
            seconds, seconds * self.ratio_low, seconds * self.ratio_high, self.confidence
        )


_DEFAULTS: dict[tuple[int, str, GridConfig, int], KernelLatencyPredictor] = {}


def default_predictor(
    threads: int = 1,
    mode: str = "inference",
    grid: GridConfig | None = None,
    primitives: int = 400,
) -> KernelLatencyPredictor:
    """The kernel-level predictor of this machine for ``threads`` (memoised).

    Kernel samples (``primitives`` sampled configurations,
    :func:`~hpcnb.perfmodel.kernelmodel.fit_kernel_model`) and the network timings of
    ``grid`` (notebook 03's default grid, :func:`~hpcnb.perfmodel.netset.collect_networks`)
    come from this machine's cache; what is missing is measured now (several minutes the
    first time). A caller with a tight budget passes a smaller grid and fewer primitives.

    Args:
        threads: Thread count of the timings.
        mode: ``"inference"`` or ``"training"``.
        grid: The networks the dispatch constant is fitted on (default: notebook 03's).
        primitives: Sampled kernel configurations.

    Raises:
        PerfmodelError: ``grid.timing.threads`` differs from ``threads``.
    """
    if grid is None:
        timing = TimingConfig(threads=int(threads), clock="cpu" if threads == 1 else "wall")
        grid = GridConfig(timing=timing)
    if grid.timing.threads != threads:
        raise PerfmodelError(
            f"default_predictor: threads={threads} but grid.timing.threads={grid.timing.threads}"
        )
    key = (int(threads), mode, grid, int(primitives))
    if key not in _DEFAULTS:
        nets = collect_networks(grid)
        prims = sample_primitives(np.random.default_rng(grid.seed), primitives, SamplingRanges())
        fit = fit_kernel_model(prims, (mode,), threads=int(threads), seed=grid.seed)
        _DEFAULTS[key] = KernelLatencyPredictor.fit(fit.model, nets, mode=mode, threads=threads)
    return _DEFAULTS[key]


def predict_latency(
    model: nn.Module,
    input_shape: Sequence[int],
    batch: int,
    threads: int,
    *,
    mode: str = "inference",
    predictor: LatencyPredictor | KernelLatencyPredictor | None = None,
) -> LatencyEstimate:
    """Predicted seconds of one forward pass (or training step) of ``model``, with interval.

    Args:
        model: The network (any module the IR can trace, e.g. a pruned ``GraphModule``).
        input_shape: One sample's shape, e.g. ``(3, 32, 32)``.
        batch: Batch size.
        threads: Threads the latency is wanted for (must match the predictor's timings).
        mode: ``"inference"`` or ``"training"`` (used when no predictor is given).
        predictor: A fitted :class:`KernelLatencyPredictor` or :class:`LatencyPredictor`
            (default: :func:`default_predictor`, the kernel-level model).

    Returns:
        :class:`LatencyEstimate` ``(seconds, low, high, confidence)``.

    Raises:
        PerfmodelError: ``threads`` differs from the predictor's, or a bad batch.
    """
    if isinstance(threads, bool) or int(threads) != threads or threads < 1:
        raise PerfmodelError(f"threads={threads!r}: expected a positive integer")
    predictor = predictor or default_predictor(int(threads), mode)
    if predictor.threads != threads:
        raise PerfmodelError(
            f"predict_latency: threads={threads}, but the predictor was fitted on timings "
            f"with {predictor.threads} thread(s)"
        )
    return predictor.predict(model, input_shape, batch)
