"""nn-Meter's recipe on this CPU: one forest per ATen kernel, a network as the sum of its kernels.

:class:`KernelModel` fits one :class:`~hpcnb.perfmodel.kernels.KernelPredictor` (a random
forest on log-features against log-seconds) per ATen operator from the timed samples of
:mod:`hpcnb.perfmodel.kernelset`, with FLOPs and bytes derived for convolutions and matrix
products as nn-Meter adds them. Where a kernel's operator was never sampled, or a
configuration lies outside the box its operator's samples span, the **fallback** prices it
instead: a non-negative line in FLOPs and bytes per predictor family (the FLOP/byte model of
:mod:`hpcnb.perfmodel.opmodel` at kernel granularity), fitted on all sampled kernels of the
family.

:func:`fit_kernel_model` samples, times and fits, then resamples around the primitives
whose kernels the forests get wrong by more than 10 % (out-of-bag) and fits again.
:class:`NetworkKernelPredictor` sums a network's kernels
(:func:`~hpcnb.perfmodel.aten.network_kernels`) and adds a per-call dispatch constant fitted
on measured networks (:func:`~hpcnb.perfmodel.kernels.fit_dispatch`).

Example:
    >>> import numpy as np
    >>> from hpcnb.perfmodel.kernelset import KernelProfile, KernelSample
    >>> rng = np.random.default_rng(0)
    >>> sizes = rng.integers(1_000, 100_000, 40).astype(float)
    >>> samples = [KernelSample("aten.relu.default", "generic", (n, n, 9.0, 1.0, 1.0),
    ...                         1e-9 * n, (), 0) for n in sizes]
    >>> model = KernelModel(trees=20).fit([KernelProfile("inference", samples, [], {})])
    >>> from hpcnb.perfmodel.aten import network_kernels
    >>> from torch import nn
    >>> calls = network_kernels(nn.ReLU(), (8, 32, 32), 4)
    >>> float(model.predict_calls(calls)[0]) > 0
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import nnls

from hpcnb.perfmodel.aten import KernelCall, kernel_features
from hpcnb.perfmodel.kernels import KernelPredictor, fit_dispatch
from hpcnb.perfmodel.kernelset import (
    KernelProfile,
    Primitive,
    SamplingRanges,
    neighbours,
    profile_kernels,
)
from hpcnb.perfmodel.protocol import PerfmodelError

__all__ = [
    "AdaptiveProfile",
    "KernelModel",
    "NetworkKernelPredictor",
    "DispatchFit",
    "derived_features",
    "dispatch_matrix",
    "fit_kernel_model",
    "held_out_dispatch",
]

_MIN_SAMPLES = 8
_SLACK = np.log(1.25)


def _conv_derived(x: np.ndarray) -> np.ndarray:
    n, c, h, w, k_out, kernel, stride, groups, outputs = x.T
    out = np.ceil(h / stride) * np.ceil(w / stride)
    flops = 2.0 * n * k_out * out * (c / groups) * kernel * outputs
    return np.column_stack([flops, n * c * h * w, n * k_out * out, k_out * c / groups * kernel])


def _gemm_derived(x: np.ndarray) -> np.ndarray:
    m, k, n = x.T
    return np.column_stack([2.0 * m * k * n, m * k + k * n + m * n])


def derived_features(family: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The derived columns of a predictor family (FLOPs and bytes), or ``None``.

    Args:
        family: ``"conv"``, ``"gemm"`` or ``"generic"``.
    """
    return {"conv": _conv_derived, "gemm": _gemm_derived}.get(family)


def _cost_columns(family: str, x: np.ndarray) -> np.ndarray:
    """Columns of the fallback line: 1, FLOPs, elements moved."""
    if family in ("conv", "gemm"):
        d = derived_features(family)(x)  # type: ignore[misc]
        return np.column_stack([np.ones(len(x)), d[:, 0], d[:, 1:].sum(axis=1)])
    return np.column_stack([np.ones(len(x)), x[:, 0] + x[:, 1]])


@dataclass
class KernelModel:
    """Per-operator forests with a FLOP/byte fallback.

    Attributes:
        trees: Trees per forest.
        seed: Seed of the forests.
        predictors: Operator -> fitted forest (operators with enough samples).
        boxes: Operator -> ``(low, high)`` log-feature bounds of its samples.
        fallback: Family -> coefficients of its fallback line.
        samples: Operator -> number of samples.
    """

    trees: int = 100
    seed: int = 0
    predictors: dict[str, KernelPredictor] = field(default_factory=dict)
    boxes: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    fallback: dict[str, np.ndarray] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    rows: dict[str, list[tuple[float, ...]]] = field(default_factory=dict, repr=False)

    def fit(self, profiles: Sequence[KernelProfile]) -> KernelModel:
        """Fit on the samples of ``profiles`` (duplicates of one kernel count once).

        Args:
            profiles: Timed kernel samples (inference and training may be combined).

        Raises:
            PerfmodelError: No samples at all.
        """
        grouped: dict[str, dict[tuple[float, ...], float]] = {}
        family_of: dict[str, str] = {}
        for prof in profiles:
            for s in prof.samples:
                grouped.setdefault(s.op, {})[s.features] = s.seconds
                family_of[s.op] = s.family
        if not grouped:
            raise PerfmodelError("KernelModel.fit: no kernel samples")
        by_family: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for op, rows in grouped.items():
            x = np.array(list(rows), dtype=np.float64)
            t = np.array(list(rows.values()), dtype=np.float64)
            family = family_of[op]
            by_family.setdefault(family, []).append((x, t))
            self.samples[op] = len(t)
            self.rows[op] = list(rows)
            if len(t) < _MIN_SAMPLES:
                continue
            names = tuple(f"f{i}" for i in range(x.shape[1]))
            self.predictors[op] = KernelPredictor(
                names, trees=self.trees, seed=self.seed, derived=derived_features(family)
            ).fit(x, t)
            self.boxes[op] = (np.log(x).min(axis=0) - _SLACK, np.log(x).max(axis=0) + _SLACK)
        for family, parts in by_family.items():
            x = np.concatenate([p[0] for p in parts])
            t = np.concatenate([p[1] for p in parts])
            a = _cost_columns(family, x) / t[:, None]
            self.fallback[family] = nnls(a, np.ones(len(t)))[0]
        return self

    def _fallback(self, family: str, x: np.ndarray) -> np.ndarray:
        coef = self.fallback.get(family, self.fallback.get("generic"))
        if coef is None:
            raise PerfmodelError(f"KernelModel: no fallback for kernel family {family!r}")
        if family not in self.fallback:
            family, x = "generic", np.ones((len(x), 5))
        return np.maximum(_cost_columns(family, x) @ coef, 1e-9)

    def predict_calls(self, calls: Sequence[KernelCall]) -> np.ndarray:
        """Predicted seconds of each call.

        Args:
            calls: Captured calls (:func:`~hpcnb.perfmodel.aten.network_kernels`).
        """
        described = [(c.op, *kernel_features(c)) for c in calls]
        out = np.empty(len(calls))
        groups: dict[tuple[str, str], list[int]] = {}
        for i, (op, family, _) in enumerate(described):
            groups.setdefault((op, family), []).append(i)
        for (op, family), idx in groups.items():
            x = np.array([described[i][2] for i in idx], dtype=np.float64)
            pred = self._fallback(family, x)
            if op in self.predictors:
                inside = self._inside(op, x)
                if inside.any():
                    pred[inside] = self.predictors[op].predict(x[inside])
            out[idx] = pred
        return out

    def coverage(self, calls: Sequence[KernelCall]) -> float:
        """Share of the calls priced by a forest (the rest by the fallback).

        Args:
            calls: Captured calls.
        """
        if not calls:
            return float("nan")
        hits = 0
        for c in calls:
            _, x = kernel_features(c)
            hits += c.op in self.predictors and bool(self._inside(c.op, np.array([x]))[0])
        return hits / len(calls)

    def _inside(self, op: str, x: np.ndarray) -> np.ndarray:
        """Per row of ``x``, whether it lies in the box ``op``'s samples span."""
        low, high = self.boxes[op]
        return ((np.log(x) >= low) & (np.log(x) <= high)).all(axis=1)

    def leave_out_errors(self) -> dict[str, np.ndarray]:
        """Operator -> out-of-bag relative error of each of its samples."""
        return {op: p.leave_out_errors() for op, p in self.predictors.items()}

    def sample_errors(self) -> dict[tuple[str, tuple[float, ...]], float]:
        """``(operator, features)`` -> out-of-bag relative error, for every fitted sample."""
        out: dict[tuple[str, tuple[float, ...]], float] = {}
        for op, errs in self.leave_out_errors().items():
            out.update({(op, f): float(e) for f, e in zip(self.rows[op], errs, strict=True)})
        return out


@dataclass(frozen=True)
class AdaptiveProfile:
    """What :func:`fit_kernel_model` sampled, timed and fitted.

    Attributes:
        model: The kernel model fitted on everything.
        profiles: The timed profiles (first the initial sample, then each resampling).
        errors: Mean out-of-bag relative error over the convolution samples, after each fit.
    """

    model: KernelModel
    profiles: tuple[KernelProfile, ...]
    errors: tuple[float, ...]

    @property
    def seconds_spent(self) -> float:
        """Seconds of timing in this process."""
        return float(sum(p.seconds_spent for p in self.profiles))


def _conv_error(model: KernelModel) -> float:
    errs = [e for op, e in model.leave_out_errors().items() if "convolution" in op]
    return float(np.mean(np.concatenate(errs))) if errs else float("nan")


def fit_kernel_model(
    primitives: Sequence[Primitive],
    modes: Sequence[str] = ("inference", "training"),
    *,
    ranges: SamplingRanges | None = None,
    rounds: int = 1,
    per_point: int = 1,
    max_new: int = 200,
    threshold: float = 0.1,
    trees: int = 100,
    seed: int = 0,
    **profile_kw: Any,
) -> AdaptiveProfile:
    """Time the primitives' kernels, fit, and resample where the forests miss.

    After each fit, the primitives behind samples whose out-of-bag error exceeds
    ``threshold`` get ``per_point`` neighbours each (:func:`~hpcnb.perfmodel.kernelset.neighbours`,
    at most ``max_new`` per round), which are timed and added before the next fit.

    Args:
        primitives: The initial sample.
        modes: Modes whose kernels are timed.
        ranges: Size limits for the neighbours (default :class:`SamplingRanges`).
        rounds: Resampling rounds.
        per_point: Neighbours per badly predicted primitive.
        max_new: Most new primitives per round.
        threshold: Out-of-bag relative error that triggers resampling.
        trees: Trees per forest.
        seed: Seed of sampling and forests.
        **profile_kw: Passed to :func:`~hpcnb.perfmodel.kernelset.profile_kernels`.

    Raises:
        PerfmodelError: ``rounds`` < 0 or ``per_point`` < 1.
    """
    if rounds < 0 or per_point < 1:
        raise PerfmodelError(
            f"fit_kernel_model: rounds={rounds} (>= 0), per_point={per_point} (>= 1)"
        )
    ranges = ranges or SamplingRanges()
    rng = np.random.default_rng(seed + 1)
    profiles = [profile_kernels(primitives, m, seed=seed, **profile_kw) for m in modes]
    model = KernelModel(trees=trees, seed=seed).fit(profiles)
    errors = [_conv_error(model)]
    for r in range(rounds):
        errs = model.sample_errors()
        bad = {
            (p_index, s.primitive)
            for p_index, prof in enumerate(profiles)
            for s in prof.samples
            if errs.get((s.op, s.features), 0.0) > threshold
        }
        if not bad:
            break
        chosen = sorted(bad)[:max_new]
        new_prims = [
            q
            for pi, i in chosen
            for q in neighbours(rng, profiles[pi].primitives[i], per_point, ranges)
        ]
        if not new_prims:
            break
        for m in modes:
            profiles.append(profile_kernels(new_prims, m, seed=seed + 1000 * (r + 1), **profile_kw))
        model = KernelModel(trees=trees, seed=seed).fit(profiles)
        errors.append(_conv_error(model))
    return AdaptiveProfile(model, tuple(profiles), tuple(errors))


@dataclass
class NetworkKernelPredictor:
    """A network's seconds: the sum of its kernels' predictions plus a dispatch cost per call.

    Attributes:
        model: The fitted :class:`KernelModel`.
        dispatch: Seconds per call of fixed cost (framework overhead outside the kernels).
    """

    model: KernelModel
    dispatch: float = 0.0

    def kernel_sum(self, calls: Sequence[KernelCall]) -> float:
        """Sum of the calls' predicted seconds (no dispatch cost).

        Args:
            calls: A network's captured calls.

        Raises:
            PerfmodelError: No calls.
        """
        if not calls:
            raise PerfmodelError("NetworkKernelPredictor: a network with no kernels")
        return float(self.model.predict_calls(calls).sum())

    def seconds(self, calls: Sequence[KernelCall]) -> float:
        """Predicted seconds of the network whose calls these are.

        Args:
            calls: A network's captured calls.
        """
        return self.kernel_sum(calls) + self.dispatch * len(calls)

    def fit_dispatch(
        self, networks: Sequence[Sequence[KernelCall]], measured: ArrayLike
    ) -> NetworkKernelPredictor:
        """Fit the dispatch constant on measured networks (relative least squares, >= 0).

        Args:
            networks: Each network's calls.
            measured: Each network's measured seconds.
        """
        sums = [self.kernel_sum(c) for c in networks]
        self.dispatch = fit_dispatch(sums, [len(c) for c in networks], measured)
        return self


class DispatchFit:
    """The one constant fitted on networks, as an estimator: ``X = [[kernel_sum, calls]]``.

    ``fit`` finds the dispatch cost per call (:func:`~hpcnb.perfmodel.kernels.fit_dispatch`),
    ``predict`` returns ``kernel_sum + dispatch * calls``, so the kernel-level model goes
    through the same held-out-family and random-split evaluations as the other estimators.

    Attributes:
        dispatch: The fitted seconds per call.
    """

    def __init__(self) -> None:
        self.dispatch = 0.0

    def fit(self, X: np.ndarray, y: np.ndarray) -> DispatchFit:
        """Fit the dispatch constant.

        Args:
            X: ``(n, 2)``: each network's kernel sum and call count.
            y: ``(n,)`` measured seconds.
        """
        X = np.asarray(X, dtype=np.float64)
        self.dispatch = fit_dispatch(X[:, 0], X[:, 1], y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``kernel_sum + dispatch * calls`` per row.

        Args:
            X: ``(n, 2)`` as for :meth:`fit`.
        """
        X = np.asarray(X, dtype=np.float64)
        return X[:, 0] + self.dispatch * X[:, 1]


def dispatch_matrix(
    predictor: NetworkKernelPredictor, networks: Sequence[Sequence[KernelCall]]
) -> np.ndarray:
    """``(n, 2)``: each network's predicted kernel sum and its number of calls.

    Args:
        predictor: Holds the fitted kernel model.
        networks: Each network's calls.
    """
    return np.array([[predictor.kernel_sum(c), len(c)] for c in networks], dtype=np.float64)


def held_out_dispatch(
    predictor: NetworkKernelPredictor,
    networks: Sequence[Sequence[KernelCall]],
    measured: ArrayLike,
    families: Sequence[str],
) -> np.ndarray:
    """Each network's prediction with the dispatch constant fitted without its family.

    The kernel forests never see a network; the one constant fitted on networks is the
    dispatch cost, so it is the only thing held out.

    Args:
        predictor: Holds the fitted kernel model (its ``dispatch`` is left unchanged).
        networks: Each network's calls.
        measured: Each network's measured seconds.
        families: Each network's family.

    Raises:
        PerfmodelError: Lengths differ, or fewer than two families.
    """
    from hpcnb.perfmodel.estimator import leave_one_family_out

    y = np.asarray(measured, dtype=np.float64)
    if not len(networks) == len(y) == len(families):
        raise PerfmodelError(
            f"held_out_dispatch: {len(networks)} networks, {len(y)} times, {len(families)} families"
        )
    X = dispatch_matrix(predictor, networks)
    return leave_one_family_out(DispatchFit, X, y, families).predicted
