"""Sampling mode of the Numba profiler: scaled matrices, their error bound, and a sweep over k.

``MemoryConfig(sample_every=k)`` profiles a sample (:mod:`hpcnb.commprof.hooks`): by
default (``sample_mode="words"``) the words whose Fibonacci hash of the element index
falls below ``2**32 / k``, with every access to them, so the events on the sampled words
are exact and :func:`scaled` (k times the sampled matrix) estimates the full matrix
without bias; every other access costs one multiply and compare in the hook.

Error bound (:func:`error_bound`; a model, checked by :func:`sweep`'s coverage): if word
``w`` carries ``c_w`` events of a cell and is sampled with probability ``p = 1/k``
independently, the estimate ``k * sum(sampled c_w)`` has variance ``(k - 1) * sum(c_w^2)``,
estimated from the sample by ``k (k - 1) * sum(sampled c_w^2)``. The sampled run does not
keep per-word counts, so the bound assumes ``c_w <= c_max`` (default 1, one event per word
and cell): the half-width of a 95 % interval is ``1.96 * sqrt(k (k - 1) * c_max * X)`` for a
sampled count ``X``. The hash is deterministic, so "independently" is an assumption about
how the hash spreads the kernels' index patterns.

Example:
    >>> import numpy as np
    >>> scaled(np.array([[0, 2], [1, 0]]), 4).tolist()
    [[0, 8], [4, 0]]
    >>> float(error_bound(np.array([4]), 4)[0]) == 1.96 * (4 * 3 * 4) ** 0.5
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hpcnb.commprof.analysis import classify_pattern, inclusive
from hpcnb.commprof.runtime import MemoryConfig
from hpcnb.commprof.suite import Args, SuiteCase, suite_case
from hpcnb.timing import ratios

__all__ = ["SampledRow", "correlation", "error_bound", "scaled", "sweep"]


def scaled(sampled: np.ndarray, k: int) -> np.ndarray:
    """The estimate of the full matrix: ``k`` times the sampled counts.

    Args:
        sampled: Event counts of the sampled profile.
        k: Sampling period (1/k of the words sampled).
    """
    return np.asarray(sampled, dtype=np.int64) * int(k)


def error_bound(sampled: np.ndarray, k: int, z: float = 1.96, c_max: float = 1.0) -> np.ndarray:
    """Half-width of the ``z`` interval of :func:`scaled` per cell (module docstring).

    Args:
        sampled: Event counts of the sampled profile.
        k: Sampling period.
        z: Normal quantile of the interval (1.96: 95 %).
        c_max: Most events one word carries per cell.
    """
    x = np.asarray(sampled, dtype=float)
    return z * np.sqrt(k * (k - 1) * c_max * x)


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two matrices' cells (1 when both are constant and equal).

    Args:
        a: First matrix.
        b: Second matrix, of the same size.
    """
    x, y = np.asarray(a, float).ravel(), np.asarray(b, float).ravel()
    if x.std() == 0 or y.std() == 0:
        return 1.0 if np.array_equal(x, y) else 0.0
    return float(np.corrcoef(x, y)[0, 1])


@dataclass(frozen=True)
class SampledRow:
    """One kernel at one sampling period.

    Attributes:
        kernel: Suite kernel.
        k: Sampling period.
        correlation: Of the scaled and the full whole-kernel matrix.
        total_error: ``|scaled total - full total| / full total``.
        coverage: Share of non-empty full cells inside the scaled cell's bound.
        same_pattern: The scaled matrix's pattern equals the full one's.
        overhead: Per-round instrumented/native CPU-time ratios (empty when not timed).
    """

    kernel: str
    k: int
    correlation: float
    total_error: float
    coverage: float
    same_pattern: bool
    overhead: tuple[float, ...]


def sweep(
    kernels: Sequence[str],
    ks: Sequence[int],
    *,
    size: int,
    nthreads: int,
    seed: int = 0,
    repeats: int = 0,
) -> list[SampledRow]:
    """Profile each kernel fully and sampled at every ``k``; optionally time them.

    Args:
        kernels: Suite kernel names.
        ks: Sampling periods (1 = the full profile, timed like the others).
        size: Problem-size unit.
        nthreads: Virtual threads.
        seed: Input seed.
        repeats: Interleaved timed rounds against native (0: no timing).
    """
    out = []
    for name in kernels:
        c = suite_case(name)
        args, nph = c.make(size, nthreads, seed)
        p = c.profile(args, nthreads=nthreads, nphases=nph)
        full = inclusive(p.regions, p.exact)[0]
        for k in ks:
            mem = MemoryConfig(sample_every=int(k))
            args, _ = c.make(size, nthreads, seed)
            ps = c.profile(args, nthreads=nthreads, nphases=nph, memory=mem)
            raw = inclusive(ps.regions, ps.exact)[0]
            est = scaled(raw, k)
            bound = error_bound(raw, k)
            cells = full > 0
            cover = float((np.abs(est - full) <= bound)[cells].mean()) if cells.any() else 1.0
            tot = int(full.sum())
            err = abs(int(est.sum()) - tot) / tot if tot else float(est.sum() > 0)
            over: tuple[float, ...] = ()
            if repeats:

                def fresh_args(case: SuiteCase = c) -> Args:
                    return case.make(size, nthreads, seed)[0]

                t = c.time_samples(
                    fresh_args,
                    nthreads=nthreads,
                    nphases=nph,
                    memory=mem,
                    repeats=repeats,
                    variants=("native", "instrumented"),
                    clock="cpu",
                )
                over = tuple(ratios(t["instrumented"], t["native"]))
            out.append(
                SampledRow(
                    name,
                    int(k),
                    correlation(est, full),
                    err,
                    cover,
                    classify_pattern(est) == classify_pattern(full),
                    over,
                )
            )
    return out
