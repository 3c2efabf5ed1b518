"""Kernel-level runtime prediction: a fusion test, per-kernel forests, adaptive sampling.

The recipe follows nn-Meter's (Zhang et al., MobiSys 2021), reconstructed here for a CPU:

* **Fusion test** (:func:`fusion_rule`, :func:`time_fusion`): two operators that run back to
  back are one *kernel* when running them together saves more than half the cheaper one's
  time, ``T1 + T2 - T12 > 0.5 * min(T1, T2)``; otherwise they are two kernels whose times
  add. Eager PyTorch fuses little, so most pairs come out unfused.
* **Per-kernel predictors** (:class:`KernelPredictor`): one random forest per kernel type,
  fitted on kernel configurations sampled from ranges no network family defines (input
  size, channels, kernel, stride, groups, batch, threads), on log-features against log-time,
  so relative errors count alike for small and large kernels.
* **Adaptive sampling** (:func:`adaptive_fit`): after an initial sample, configurations
  around the points whose leave-out error exceeds a threshold (10 % by default) are
  sampled and measured again, where the forest is least sure.
* **A network's time** (:func:`network_seconds`) is the plain sum of its kernels'
  predictions plus a fitted per-kernel dispatch constant.

Everything that measures takes the timing function as an argument, so the fitting and the
rules are tested on synthetic cost functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike
from sklearn.ensemble import RandomForestRegressor

from hpcnb.perfmodel.protocol import PerfmodelError

__all__ = [
    "AdaptiveFit",
    "FusionTest",
    "KernelPredictor",
    "adaptive_fit",
    "fit_dispatch",
    "fusion_rule",
    "network_seconds",
    "time_fusion",
]


def fusion_rule(t_first: float, t_second: float, t_pair: float, threshold: float = 0.5) -> bool:
    """nn-Meter's fusion rule: the pair is one kernel when running it together saves enough.

    Args:
        t_first: Seconds of the first operator alone.
        t_second: Seconds of the second operator alone (on the first one's output).
        t_pair: Seconds of the two run back to back as one call.
        threshold: Share of the cheaper operator's time the pair must save.

    Raises:
        PerfmodelError: A time that is not positive, or a threshold outside (0, 1].

    Example:
        >>> fusion_rule(1.0, 0.4, 1.05), fusion_rule(1.0, 0.4, 1.38)
        (True, False)
    """
    if min(t_first, t_second, t_pair) <= 0 or not 0 < threshold <= 1:
        raise PerfmodelError(
            f"fusion_rule: times {t_first}, {t_second}, {t_pair} must be > 0 and threshold "
            f"{threshold} in (0, 1]"
        )
    return t_first + t_second - t_pair > threshold * min(t_first, t_second)


@dataclass(frozen=True)
class FusionTest:
    """One operator pair's fusion test.

    Attributes:
        first: Name of the first operator.
        second: Name of the second operator.
        t_first: Seconds of the first alone.
        t_second: Seconds of the second alone.
        t_pair: Seconds of the pair as one call.
        fused: :func:`fusion_rule` holds.
    """

    first: str
    second: str
    t_first: float
    t_second: float
    t_pair: float
    fused: bool

    @property
    def saving(self) -> float:
        """``(T1 + T2 - T12) / min(T1, T2)``: the share of the cheaper operator saved."""
        return (self.t_first + self.t_second - self.t_pair) / min(self.t_first, self.t_second)


def time_fusion(
    first: tuple[str, Callable[[], object]],
    second: tuple[str, Callable[[], object]],
    pair: Callable[[], object],
    timer: Callable[[Mapping[str, Callable[[], object]]], Mapping[str, float]],
    threshold: float = 0.5,
) -> FusionTest:
    """Time two operators alone and together in one interleaved run, and apply the rule.

    Args:
        first: ``(name, callable)`` of the first operator.
        second: ``(name, callable)`` of the second, run on the first one's output.
        pair: Runs both back to back.
        timer: Times named callables together and returns seconds per call by name, e.g.
            ``lambda k: measure_round_robin(k, reference).seconds``.
        threshold: The rule's share (:func:`fusion_rule`).
    """
    seconds = timer({"first": first[1], "second": second[1], "pair": pair})
    t1, t2, t12 = (float(seconds[k]) for k in ("first", "second", "pair"))
    return FusionTest(first[0], second[0], t1, t2, t12, fusion_rule(t1, t2, t12, threshold))


@dataclass
class KernelPredictor:
    """A random forest of one kernel type: log-features -> log seconds.

    Attributes:
        features: Names of the configuration's features, in column order.
        trees: Trees of the forest.
        seed: Seed of the forest.
        derived: Extra positive columns computed from a configuration matrix (as nn-Meter
            adds FLOPs and parameter counts to a convolution's shape), appended before the
            logarithm; ``None`` for none.
        forest: The fitted forest (``None`` before :meth:`fit`).
    """

    features: tuple[str, ...]
    trees: int = 200
    seed: int = 0
    derived: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)
    forest: RandomForestRegressor | None = field(default=None, repr=False)
    _log_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def _matrix(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.features) or (x <= 0).any():
            raise PerfmodelError(
                f"KernelPredictor: configurations of shape {x.shape}, expected (n, "
                f"{len(self.features)}) positive values for {self.features}"
            )
        if self.derived is not None:
            extra = np.asarray(self.derived(x), dtype=np.float64).reshape(len(x), -1)
            if (extra <= 0).any():
                raise PerfmodelError("KernelPredictor: derived features must be positive")
            x = np.column_stack([x, extra])
        return np.log(x)

    def fit(self, x: np.ndarray, seconds: np.ndarray) -> KernelPredictor:
        """Fit on configurations ``x`` (one row each) and their measured seconds.

        Args:
            x: ``(n, len(features))`` positive configuration values.
            seconds: ``(n,)`` positive seconds.

        Raises:
            PerfmodelError: Bad shapes, or values that are not positive.
        """
        t = np.asarray(seconds, dtype=np.float64)
        m = self._matrix(x)
        if t.shape != (m.shape[0],) or (t <= 0).any() or m.shape[0] < 2:
            raise PerfmodelError(
                f"KernelPredictor.fit: {t.shape} seconds for {m.shape[0]} configurations; "
                "need one positive time per row and at least 2 rows"
            )
        self.forest = RandomForestRegressor(
            n_estimators=self.trees, oob_score=True, random_state=self.seed, n_jobs=1
        ).fit(m, np.log(t))
        self._log_seconds = np.log(t)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted seconds of configurations ``x``.

        Args:
            x: ``(n, len(features))`` positive configuration values.

        Raises:
            PerfmodelError: Not fitted, or bad configurations.
        """
        if self.forest is None:
            raise PerfmodelError("KernelPredictor.predict: fit it first")
        return np.exp(self.forest.predict(self._matrix(x)))

    def leave_out_errors(self) -> np.ndarray:
        """Per training row, the relative error of the trees that did not see it.

        The forest's out-of-bag prediction of each row (the trees whose bootstrap sample
        left the row out), against its measured time: ``|predicted / measured - 1|``.

        Raises:
            PerfmodelError: Not fitted.
        """
        if self.forest is None:
            raise PerfmodelError("KernelPredictor.leave_out_errors: fit it first")
        oob = np.asarray(self.forest.oob_prediction_, dtype=np.float64)
        return np.abs(np.exp(oob - self._log_seconds) - 1.0)


@dataclass(frozen=True)
class AdaptiveFit:
    """What :func:`adaptive_fit` sampled and fitted.

    Attributes:
        predictor: The forest fitted on every sampled configuration.
        x: The sampled configurations, in the order sampled.
        seconds: Their measured seconds.
        errors: Per round (the initial fit first), the mean leave-out relative error.
    """

    predictor: KernelPredictor
    x: np.ndarray
    seconds: np.ndarray
    errors: tuple[float, ...]


def adaptive_fit(
    predictor: KernelPredictor,
    sample: Callable[[np.random.Generator, int], np.ndarray],
    near: Callable[[np.random.Generator, np.ndarray, int], np.ndarray],
    measure: Callable[[np.ndarray], np.ndarray],
    *,
    initial: int = 500,
    rounds: int = 3,
    per_point: int = 2,
    threshold: float = 0.1,
    seed: int = 0,
) -> AdaptiveFit:
    """Sample configurations, fit, and resample around the points the forest gets wrong.

    Args:
        predictor: The (unfitted) forest of one kernel type.
        sample: ``(rng, n)`` -> ``n`` configurations from the sampling ranges.
        near: ``(rng, row, n)`` -> ``n`` configurations close to ``row``.
        measure: Configurations -> their measured seconds.
        initial: Configurations of the first sample.
        rounds: Resampling rounds after the first fit.
        per_point: New configurations around each point above ``threshold``.
        threshold: Leave-out relative error that triggers resampling.
        seed: Seed of the sampling.

    Raises:
        PerfmodelError: ``initial`` < 2, ``rounds`` < 0 or ``per_point`` < 1.
    """
    if initial < 2 or rounds < 0 or per_point < 1:
        raise PerfmodelError(
            f"adaptive_fit: initial={initial} (>= 2), rounds={rounds} (>= 0), "
            f"per_point={per_point} (>= 1)"
        )
    rng = np.random.default_rng(seed)
    x = np.asarray(sample(rng, initial), dtype=np.float64)
    t = np.asarray(measure(x), dtype=np.float64)
    predictor.fit(x, t)
    errors = [float(np.nanmean(predictor.leave_out_errors()))]
    for _ in range(rounds):
        bad = np.flatnonzero(predictor.leave_out_errors() > threshold)
        if bad.size == 0:
            break
        extra = np.concatenate([np.asarray(near(rng, x[i], per_point)) for i in bad])
        x = np.concatenate([x, extra])
        t = np.concatenate([t, np.asarray(measure(extra), dtype=np.float64)])
        predictor.fit(x, t)
        errors.append(float(np.nanmean(predictor.leave_out_errors())))
    return AdaptiveFit(predictor, x, t, tuple(errors))


def network_seconds(kernel_seconds: Sequence[float], dispatch: float = 0.0) -> float:
    """A network's time: the sum of its kernels' seconds plus a dispatch cost per kernel.

    Args:
        kernel_seconds: Predicted (or measured) seconds of each kernel of the network.
        dispatch: Seconds of fixed cost per kernel call (:func:`fit_dispatch`).

    Raises:
        PerfmodelError: No kernels, or a negative dispatch cost.
    """
    if len(kernel_seconds) == 0 or dispatch < 0:
        raise PerfmodelError(
            f"network_seconds: {len(kernel_seconds)} kernels, dispatch {dispatch}: need at "
            "least one kernel and dispatch >= 0"
        )
    return float(np.sum(kernel_seconds)) + dispatch * len(kernel_seconds)


def fit_dispatch(kernel_sums: ArrayLike, kernel_counts: ArrayLike, measured: ArrayLike) -> float:
    """The per-kernel dispatch constant that best closes the gap to measured network times.

    Minimises the squared *relative* error of ``sum + c * count`` against the measured
    times over ``c >= 0``.

    Args:
        kernel_sums: Per network, the sum of its kernels' predicted seconds.
        kernel_counts: Per network, its number of kernels.
        measured: Per network, its measured seconds.

    Raises:
        PerfmodelError: Lengths differ, no network, or a time that is not positive.
    """
    s, c, m = (np.asarray(v, dtype=np.float64) for v in (kernel_sums, kernel_counts, measured))
    if not s.size or s.shape != c.shape or s.shape != m.shape or (m <= 0).any():
        raise PerfmodelError(
            f"fit_dispatch: {s.size}, {c.size}, {m.size} values; need equal, >= 1, positive times"
        )
    a, b = c / m, 1.0 - s / m  # relative residual: a * dispatch - b
    return max(0.0, float(a @ b / (a @ a))) if a @ a > 0 else 0.0
