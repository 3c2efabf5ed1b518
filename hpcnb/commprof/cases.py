"""Case-study kernels for the locality advice: a symptom and its fix, plus a clean kernel.

Each :class:`CaseStudy` pairs a *before* and an *after* configuration of a kernel (same
results) that differ only in what the advice suggests: padding, privatisation + reduction,
a schedule change, tiling, or a data-layout change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

import hpcnb.commprof.kernels as K
from hpcnb.commprof.instrument import Kernel, kernel, prange
from hpcnb.commprof.runtime import KernelArg, Schedule, ScheduledKernel
from hpcnb.stats import median_interval
from hpcnb.timing import Fresh, Timing, interleaved

__all__ = [
    "CASE_STUDIES",
    "CaseStudy",
    "Variant",
    "aos_update",
    "clean_inputs",
    "clean_scale",
    "count_improved",
    "measure_case",
    "soa_update",
    "sum_private",
    "sum_shared",
    "thread_histogram",
]


@kernel
def thread_histogram(tid, nthreads, phase, x, hist):
    """Per-thread histograms of ``x % 4`` (rows adjacent: false sharing).

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        x: Non-negative integers; ``x % 4`` picks the bin of each.
        hist: ``[nthreads, row length]`` counts, one row per thread with its 4 bins first; the
            row length sets how far apart threads write.
    """
    nb = 4
    for i in prange(x.shape[0]):
        hist[tid, x[i] % nb] += 1


@kernel
def sum_shared(tid, nthreads, phase, x, acc):
    """Sums of squares accumulated straight into a shared per-thread slot.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        x: Values whose squares are added to ``acc[tid]`` one at a time.
        acc: One running sum per thread, adjacent in memory and written at every element.
    """
    for i in prange(x.shape[0]):
        acc[tid] += x[i] * x[i]


@kernel
def sum_private(tid, nthreads, phase, x, acc):
    """Sums of squares accumulated in a private scalar, written once.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        x: Values whose squares are summed.
        acc: One sum per thread, written once after its block.
    """
    s = 0.0
    for i in prange(x.shape[0]):
        s += x[i] * x[i]
    acc[tid] = s


@kernel
def aos_update(tid, nthreads, phase, p):
    """Position update on an array of structures (position, velocity).

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        p: One row per particle: position, velocity and further fields (the row length sets
            how much of each cache line is unused).
    """
    for i in prange(p.shape[0]):
        p[i, 0] = p[i, 0] + 0.5 * p[i, 1]


@kernel
def soa_update(tid, nthreads, phase, pos, vel):
    """Position update on a structure of arrays.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        pos: Positions, advanced in place by half a velocity step.
        vel: Velocities (read only).
    """
    for i in prange(pos.shape[0]):
        pos[i] = pos[i] + 0.5 * vel[i]


@kernel
def clean_scale(tid, nthreads, phase, x, y):
    """``y = 2 x`` on disjoint blocks: no communication, nothing to advise.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        x: Input; each thread reads only its own block.
        y: Output ``2 x``; each thread writes only its own block.
    """
    for i in prange(x.shape[0]):
        y[i] = 2.0 * x[i]


Args = list[KernelArg]


@dataclass(frozen=True)
class Variant(ScheduledKernel):
    """One configuration: kernel, inputs, phases and schedule.

    Attributes:
        kernel: The kernel.
        make: ``make(size, nthreads, seed) -> (args, nphases)``.
        schedule: Schedule of its ``prange`` loops.
    """

    kernel: Kernel
    make: Callable[[int, int, int], tuple[Args, int]]
    schedule: Schedule = field(default_factory=Schedule)


@dataclass(frozen=True)
class CaseStudy:
    """A symptom (``before``), the advice rule expected to fire, and the fix (``after``).

    Attributes:
        name: Short name.
        rule: Advice rule expected on ``before`` (see :mod:`hpcnb.commprof.advice`).
        before: The configuration with the symptom.
        after: The configuration with the suggested fix applied.
        description: One line on the fix.
    """

    name: str
    rule: str
    before: Variant
    after: Variant
    description: str


def _hist(pad: int) -> Callable[[int, int, int], tuple[Args, int]]:
    def make(n: int, T: int, seed: int) -> tuple[Args, int]:
        x = np.random.default_rng(seed).integers(0, 1 << 20, n * 512).astype(np.int64)
        return [x, np.zeros((T, pad), np.int64)], 1

    return make


def _sum(n: int, T: int, seed: int) -> tuple[Args, int]:
    return [np.random.default_rng(seed).random(n * 512), np.zeros(T)], 1


def clean_inputs(n: int, T: int, seed: int) -> tuple[Args, int]:
    """Inputs of :func:`clean_scale`: ``n * 512`` values and the output array, one phase.

    Args:
        n: Size unit.
        T: Threads (unused: the blocks follow from the schedule).
        seed: Input seed.
    """
    return [np.random.default_rng(seed).random(n * 512), np.zeros(n * 512)], 1


def _jacobi(n: int, T: int, seed: int) -> tuple[Args, int]:
    a = np.random.default_rng(seed).random((n, n))
    return [a, a.copy()], 4


def _nw(blocks_per_thread: int) -> Callable[[int, int, int], tuple[Args, int]]:
    def make(n: int, T: int, seed: int) -> tuple[Args, int]:
        rng = np.random.default_rng(seed)
        m = n
        score = np.zeros((m + 1, m + 1), np.int64)
        score[0, :] = -np.arange(m + 1)
        score[:, 0] = -np.arange(m + 1)
        ncb = blocks_per_thread * T
        return [score, rng.integers(0, 4, m), rng.integers(0, 4, m), 1, ncb], T + ncb - 1

    return make


def _aos(n: int, T: int, seed: int) -> tuple[Args, int]:
    return [np.random.default_rng(seed).random((n * 256, 8))], 1


def _soa(n: int, T: int, seed: int) -> tuple[Args, int]:
    p = np.random.default_rng(seed).random((n * 256, 8))
    return [np.ascontiguousarray(p[:, 0]), np.ascontiguousarray(p[:, 1])], 1


CASE_STUDIES: dict[str, CaseStudy] = {
    c.name: c
    for c in (
        CaseStudy(
            "histogram",
            "padding",
            Variant(thread_histogram, _hist(4)),
            Variant(thread_histogram, _hist(16)),
            "pad each thread's histogram row to two cache lines",
        ),
        CaseStudy(
            "sum",
            "privatisation",
            Variant(sum_shared, _sum),
            Variant(sum_private, _sum),
            "accumulate in a private scalar, write the partial sum once",
        ),
        CaseStudy(
            "jacobi",
            "schedule",
            Variant(K.jacobi, _jacobi, Schedule("cyclic", 1)),
            Variant(K.jacobi, _jacobi, Schedule("static")),
            "static row blocks instead of cyclic rows",
        ),
        CaseStudy(
            "wavefront",
            "blocking",
            Variant(K.needleman_wunsch, _nw(1)),
            Variant(K.needleman_wunsch, _nw(3)),
            "3 column tiles per thread instead of 1",
        ),
        CaseStudy(
            "particles",
            "layout",
            Variant(aos_update, _aos),
            Variant(soa_update, _soa),
            "structure of arrays instead of array of structures",
        ),
    )
}


def measure_case(
    cs: CaseStudy, size: int, nthreads: int = 2, repeats: int = 5, seed: int = 0, warmup: int = 1
) -> tuple[Timing, Timing, float]:
    """Wall times of the native parallel (``prange``) kernel before and after the fix.

    The variants alternate (before, after, before, ...) on fresh inputs after ``warmup``
    untimed rounds (:class:`hpcnb.timing.Fresh`), as
    :func:`hpcnb.timing.compare` does; input creation is not timed.
    ``hpcnb.timing.ratios(before, after)`` gives the per-round speedups.

    Args:
        cs: The case study.
        size: Problem-size unit of its inputs.
        nthreads: Threads of the ``prange`` loops.
        repeats: Timed rounds.
        seed: Input seed.
        warmup: Untimed rounds first (compilation, caches).

    Returns:
        ``(before timing, after timing, before median / after median)``.

    Raises:
        TimingError: ``repeats`` < 1 or ``warmup`` < 0.
    """

    def timed(v: Variant) -> Fresh:
        def run(inputs: tuple[Args, int]) -> None:
            args, nphases = inputs
            v.run_native(args, nthreads=nthreads, nphases=nphases, parallel=True)

        return Fresh(lambda: v.make(size, nthreads, seed), run)

    t = interleaved(
        {"before": timed(cs.before), "after": timed(cs.after)}, repeats=repeats, warmup=warmup
    )
    return t["before"], t["after"], t["before"].median / t["after"].median


def count_improved(speedups: Mapping[str, Sequence[float]], threshold: float = 1.1) -> int:
    """Cases whose speedup is above ``threshold`` beyond doubt: the median interval's low end.

    The interval is the order-statistic one of :func:`hpcnb.stats.median_interval`.

    Args:
        speedups: Case name -> per-round speedups (``hpcnb.timing.ratios``).
        threshold: Speedup a fix must exceed to count as an improvement.

    Returns:
        The number of cases whose interval of the median speedup lies at or above
        ``threshold`` (a case with one sample counts when that sample does).
    """
    count = 0
    for samples in speedups.values():
        if len(samples) == 0:
            continue
        estimate = median_interval(samples)
        low = estimate.value if estimate.low is None else estimate.low
        count += int(low >= threshold)
    return count
