"""Timing helpers: medians after warm-up, with thread pools pinned.

Timings on a shared 2-core machine are noisy; notebooks compare two things measured
interleaved in the same run and record the per-round ratios as samples
(``record(key, samples=ratios(base, cand))``), so the record carries an interval
(see DESIGN.md, Performance).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Timing", "compare", "median_time", "ratios", "set_threads"]


@dataclass(frozen=True)
class Timing:
    """Median and spread of repeated timings.

    Attributes:
        median: Median seconds per call.
        minimum: Fastest call in seconds.
        samples: Every measured duration in seconds.
    """

    median: float
    minimum: float
    samples: tuple[float, ...]


def set_threads(n: int) -> None:
    """Pin torch, numba and BLAS thread pools to ``n`` threads (those that are importable).

    Raises:
        ValueError: ``n`` is not positive.
    """
    if n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    try:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    except ImportError:  # pragma: no cover - numba is a dependency
        pass
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except ImportError:  # pragma: no cover - optional
        pass


def median_time(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> Timing:
    """Time ``fn()`` ``repeats`` times after ``warmup`` untimed calls.

    Raises:
        ValueError: ``repeats`` < 1 or ``warmup`` < 0.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Timing(statistics.median(samples), min(samples), tuple(samples))


def compare(
    baseline: Callable[[], object],
    candidate: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
) -> tuple[Timing, Timing, float]:
    """Time two callables interleaved and return both timings and the speedup.

    The calls alternate (baseline, candidate, baseline, ...) so that drifts in machine
    load affect both alike.

    Returns:
        ``(baseline timing, candidate timing, baseline median / candidate median)``.
    """
    for _ in range(warmup):
        baseline()
        candidate()
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeats):
        for fn, acc in ((baseline, a), (candidate, b)):
            start = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - start)
    ta = Timing(statistics.median(a), min(a), tuple(a))
    tb = Timing(statistics.median(b), min(b), tuple(b))
    return ta, tb, ta.median / tb.median


def ratios(baseline: Timing, candidate: Timing) -> tuple[float, ...]:
    """Per-round ratios ``baseline / candidate`` of two interleaved timings.

    Each round of :func:`compare` times both callables back to back, so the ratio of one
    round is robust to slow drifts of machine load; pass the ratios as ``samples`` to
    :func:`hpcnb.records.record` to get their median with an interval.

    Raises:
        ValueError: The timings have different numbers of samples, or a candidate sample
            is zero.
    """
    if len(baseline.samples) != len(candidate.samples):
        raise ValueError(
            f"timings differ in length ({len(baseline.samples)} vs {len(candidate.samples)}); "
            "ratios need the paired rounds of one compare()"
        )
    if any(c <= 0 for c in candidate.samples):
        raise ValueError("a candidate timing is zero; cannot form a ratio")
    return tuple(b / c for b, c in zip(baseline.samples, candidate.samples, strict=True))
