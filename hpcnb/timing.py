"""The one timing layer of hpcnb: warm-up, interleaved repetitions, samples, pinned threads.

Timings on a shared 2-core machine are noisy, so every technique measures the same way:
untimed warm-up calls, then repetitions whose every duration is kept (:class:`Timing`), and
when two or more things are compared, *interleaved* rounds (one call of each per round) so
that a burst of load hits all of them alike. The per-round ratios
(:func:`ratios`) are what a notebook passes to :func:`hpcnb.records.record` as ``samples``,
so the record carries an interval (DESIGN.md, Performance).

Thread pools are pinned while timing (:func:`pinned_threads`): torch's intra-op pool,
numba's pool and the BLAS pools (through threadpoolctl), each restored afterwards; two pools
of two threads fighting over two cores make any timing meaningless.

Example:
    >>> from hpcnb.timing import interleaved, ratios
    >>> t = interleaved({"a": lambda: sum(range(100)), "b": lambda: sum(range(10))},
    ...                 repeats=3, warmup=1)
    >>> sorted(t), len(t["a"].samples), len(ratios(t["a"], t["b"]))
    (['a', 'b'], 3, 3)
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from hpcnb.errors import HpcnbError

__all__ = [
    "Clock",
    "Fresh",
    "Timing",
    "TimingError",
    "compare",
    "interleaved",
    "median_time",
    "pinned_threads",
    "ratios",
    "set_threads",
]

Clock = Literal["wall", "cpu", "thread"]
"""``"wall"``: :func:`time.perf_counter`; ``"cpu"``: :func:`time.process_time` (CPU seconds
of this process: on a shared machine it does not count the time spent waiting for a core,
which makes it repeatable for one-thread work; with several threads it sums them);
``"thread"``: :func:`time.thread_time` (CPU seconds of the calling thread only)."""


class Fresh(NamedTuple):
    """A timed call on inputs made just before it: ``run(make())``, only ``run`` timed.

    For kernels that change their inputs in place (each call must start from the same
    state) or whose input creation must stay out of the measurement.

    Attributes:
        make: Returns fresh inputs (untimed).
        run: Takes them; this call is timed.
    """

    make: Callable[[], Any]
    run: Callable[[Any], object]


class TimingError(HpcnbError, ValueError):
    """Bad timing arguments (repetitions, warm-up, thread counts, mismatched timings)."""


@dataclass(frozen=True)
class Timing:
    """Every duration of repeated calls of one callable.

    Attributes:
        median: Median seconds per call.
        minimum: Fastest call in seconds.
        samples: Every measured duration in seconds, in the order measured.
    """

    median: float
    minimum: float
    samples: tuple[float, ...]

    @property
    def maximum(self) -> float:
        """Slowest call in seconds."""
        return max(self.samples)

    @property
    def repeats(self) -> int:
        """Number of timed calls."""
        return len(self.samples)

    @classmethod
    def of(cls, samples: Sequence[float]) -> Timing:
        """Build a timing from measured durations.

        Raises:
            TimingError: No samples.
        """
        if not samples:
            raise TimingError("a timing needs at least one sample")
        values = tuple(float(s) for s in samples)
        return cls(statistics.median(values), min(values), values)


def _clock(clock: Clock) -> Callable[[], float]:
    if clock == "wall":
        return time.perf_counter
    if clock == "cpu":
        return time.process_time
    if clock == "thread":
        return time.thread_time
    raise TimingError(f"clock={clock!r}: expected 'wall', 'cpu' or 'thread'")


def _check(repeats: int, warmup: int) -> None:
    if repeats < 1 or warmup < 0:
        raise TimingError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")


def _check_threads(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TimingError(f"thread count must be an integer >= 1, got {n!r}")


_CONTROLLER: Any = None


def _blas_controller() -> Any:
    """The threadpoolctl controller, built once (inspecting loaded libraries is slow)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER


def set_threads(n: int) -> None:
    """Pin torch, numba and BLAS thread pools to ``n`` threads for the rest of the process.

    Prefer :func:`pinned_threads`, which restores the previous counts; this is for a
    notebook's set-up cell.

    Raises:
        TimingError: ``n`` is not a positive integer.
    """
    _check_threads(n)
    import numba
    import torch

    torch.set_num_threads(n)
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    from threadpoolctl import threadpool_limits

    threadpool_limits(n)


@contextlib.contextmanager
def pinned_threads(
    n: int, *, torch: bool = True, numba: bool = True, blas: bool = True
) -> Iterator[None]:
    """Pin thread pools to ``n`` threads inside the block, restoring them afterwards.

    Args:
        n: Threads per pool (numba's is capped at ``NUMBA_NUM_THREADS``).
        torch: Pin torch's intra-op pool.
        numba: Pin numba's parallel pool.
        blas: Pin the BLAS / OpenMP pools that threadpoolctl finds.

    Raises:
        TimingError: ``n`` is not a positive integer.
    """
    _check_threads(n)
    with contextlib.ExitStack() as stack:
        if torch:
            import torch as _torch

            old_torch = _torch.get_num_threads()
            _torch.set_num_threads(n)
            stack.callback(_torch.set_num_threads, old_torch)
        if numba:
            import numba as _numba

            old_numba = _numba.get_num_threads()
            _numba.set_num_threads(min(n, _numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
            stack.callback(_numba.set_num_threads, old_numba)
        if blas:
            stack.enter_context(_blas_controller().limit(limits=n, user_api="blas"))
        yield


def median_time(
    fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1, clock: Clock = "wall"
) -> Timing:
    """Time ``fn()`` ``repeats`` times after ``warmup`` untimed calls.

    Args:
        fn: The operation.
        repeats: Timed calls (each kept as a sample).
        warmup: Untimed calls first (compilation, caches, allocator).
        clock: ``"wall"`` or ``"cpu"`` (see :data:`Clock`).

    Raises:
        TimingError: ``repeats`` < 1, ``warmup`` < 0 or an unknown clock.
    """
    return interleaved([fn], repeats=repeats, warmup=warmup, clock=clock)[0]


Timed = Callable[[], object] | Fresh


def interleaved(
    fns: Mapping[Any, Timed] | Sequence[Timed],
    *,
    repeats: int = 5,
    warmup: int = 1,
    clock: Clock = "wall",
    calls: int = 1,
    lead: int = 0,
) -> Any:
    """Time several callables in interleaved rounds: one sample of each per round, in order.

    ``warmup`` untimed rounds come first. Round ``i`` of one callable and round ``i`` of
    another ran back to back, so their ratio (:func:`ratios`) is a sample robust to slow
    drifts of machine load. A sample is the mean of ``calls`` back-to-back calls, after
    ``lead`` untimed calls of the same callable: a short call that follows another
    library's parallel work would otherwise pay for that library's threads still spinning
    on the cores (OpenMP and OpenBLAS workers busy-wait for a while after their work),
    which is the previous callable's cost, not its own.

    Args:
        fns: Callables, as a mapping (name -> callable) or a sequence; an entry may be a
            :class:`Fresh` pair, whose ``make()`` runs untimed before each timed ``run``.
        repeats: Timed rounds.
        warmup: Untimed rounds first.
        clock: ``"wall"`` or ``"cpu"``.
        calls: Timed calls per sample (the sample is their mean), at least 1.
        lead: Untimed calls before each sample, at least 0.

    Returns:
        A dict name -> :class:`Timing` for a mapping, a list of :class:`Timing` in order for
        a sequence.

    Raises:
        TimingError: No callables, ``repeats`` < 1, ``warmup`` < 0, ``calls`` < 1,
            ``lead`` < 0 or an unknown clock.
    """
    _check(repeats, warmup)
    if calls < 1 or lead < 0:
        raise TimingError(f"interleaved() needs calls >= 1 and lead >= 0, got {calls}, {lead}")
    now = _clock(clock)
    items = list(fns.items()) if isinstance(fns, Mapping) else list(enumerate(fns))
    if not items:
        raise TimingError("interleaved() needs at least one callable")
    for _ in range(warmup):
        for _, fn in items:
            if isinstance(fn, Fresh):
                fn.run(fn.make())
            else:
                fn()
    samples: list[list[float]] = [[] for _ in items]
    for _ in range(repeats):
        for acc, (_, fn) in zip(samples, items, strict=True):
            acc.append(_sample(fn, now, calls, lead))
    timings = [Timing.of(s) for s in samples]
    if isinstance(fns, Mapping):
        return {key: t for (key, _), t in zip(items, timings, strict=True)}
    return timings


def _sample(fn: Any, now: Callable[[], float], calls: int, lead: int) -> float:
    """Mean seconds of ``calls`` calls of ``fn`` after ``lead`` untimed ones."""
    total = 0.0
    for i in range(lead + calls):
        if isinstance(fn, Fresh):
            inputs = fn.make()
            start = now()
            fn.run(inputs)
        else:
            start = now()
            fn()
        if i >= lead:
            total += now() - start
    return total / calls


def compare(
    baseline: Callable[[], object],
    candidate: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    clock: Clock = "wall",
) -> tuple[Timing, Timing, float]:
    """Time two callables interleaved and return both timings and the speed-up.

    Args:
        baseline: The reference callable (no arguments).
        candidate: The callable compared with it.
        repeats: Timed rounds of each, interleaved.
        warmup: Untimed calls of each before the rounds.
        clock: Which clock times the rounds (see :data:`Clock`).

    Returns:
        ``(baseline timing, candidate timing, baseline median / candidate median)``.

    Raises:
        TimingError: Bad arguments (see :func:`interleaved`).
    """
    base, cand = interleaved([baseline, candidate], repeats=repeats, warmup=warmup, clock=clock)
    return base, cand, base.median / cand.median


def ratios(baseline: Timing, candidate: Timing) -> tuple[float, ...]:
    """Per-round ratios ``baseline / candidate`` of two interleaved timings.

    Pass them as ``samples`` to :func:`hpcnb.records.record` to get their median with an
    interval.

    Args:
        baseline: Timing of the reference.
        candidate: Timing of the candidate, from the same interleaved rounds.

    Raises:
        TimingError: The timings have different numbers of samples, or a candidate sample
            is zero.
    """
    if len(baseline.samples) != len(candidate.samples):
        raise TimingError(
            f"timings differ in length ({len(baseline.samples)} vs {len(candidate.samples)}); "
            "ratios need the paired rounds of one interleaved()"
        )
    if any(c <= 0 for c in candidate.samples):
        raise TimingError("a candidate timing is zero; cannot form a ratio")
    return tuple(b / c for b, c in zip(baseline.samples, candidate.samples, strict=True))
