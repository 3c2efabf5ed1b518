"""Round-robin timing for a shared machine: interleaved rounds checked by a reference kernel.

A kernel timed in one burst on a shared VM measures the machine as much as the kernel: a
neighbour's job, a frequency change or a descheduled thread inflates every sample of the
burst alike, so its spread looks small and its median is wrong. :func:`measure_round_robin`
spreads each kernel's samples over several *rounds* instead:

1. **Repeat counts**: each kernel (and the reference) gets the smallest power-of-two count
   of back-to-back calls that lasts at least :attr:`RoundRobinPolicy.min_sample_seconds`, so
   the clock's resolution and the per-call overhead of timing do not dominate short kernels.
2. **Rounds**: every round times the reference kernel, then every kernel
   (:attr:`RoundRobinPolicy.samples` samples each, the order rotated from round to round so
   that no kernel always runs first or last), then the reference again; a pause between
   rounds spreads them in time. A round's value for a kernel is the median of its samples.
3. **Slow rounds**: a round whose reference time (the larger of its two) exceeds the fastest
   reference seen by more than :attr:`RoundRobinPolicy.reference_slack` was disturbed and is
   timed again, at most :attr:`RoundRobinPolicy.max_reruns` times over the whole run; the slow
   round stays in the log, not in the result.
4. **Result**: per kernel, the minimum over the kept rounds of its round medians (other work
   only ever adds time, so the fastest undisturbed round is the best estimate), with the
   load average before every round.

The clock, the load reader and the pause are arguments, so the protocol can be tested on a
simulated machine.

Example:
    A simulated machine where a kernel costs 2 ms and everything runs twice as slow during
    the second round: that round is timed again and the result stays 2 ms.

    >>> now, factor = [0.0], [1.0]
    >>> def kernel(cost):
    ...     def run():
    ...         now[0] += cost * factor[0]
    ...     return run
    >>> slowdowns = iter([2.0, 1.0, 1.0])  # the machine's slowdown from the second round on
    >>> result = measure_round_robin(
    ...     {"conv": kernel(0.002)}, kernel(0.001), RoundRobinPolicy(rounds=3),
    ...     clock=lambda: now[0], load=lambda: (0.0, 0.0, 0.0),
    ...     pause=lambda seconds: factor.__setitem__(0, next(slowdowns)),
    ... )
    >>> round(result.seconds["conv"], 6), result.reruns, [r.slow for r in result.rounds]
    (0.002, 1, [False, True, False, False])
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hpcnb.perfmodel.protocol import PerfmodelError, load_average

__all__ = [
    "RoundRecord",
    "RoundRobinPolicy",
    "RoundRobinResult",
    "measure_round_robin",
    "reference_kernel",
]

REFERENCE = "conv 3x3 (16 -> 16 channels, 8 x 16 x 16) + batch norm + ReLU, and a 128^2 matmul"


@dataclass(frozen=True)
class RoundRobinPolicy:
    """How :func:`measure_round_robin` times a set of kernels.

    Attributes:
        rounds: Kept rounds (at least 3: a minimum over fewer rounds is one burst).
        samples: Timed samples per kernel per round (the round's value is their median).
        min_sample_seconds: Shortest duration of one sample; the repeat count doubles until
            a sample lasts this long.
        max_repeats: Largest repeat count (a kernel slower than the sample length runs once).
        reference_slack: A round is slow when its reference time exceeds the fastest
            reference seen by more than this factor.
        max_reruns: Slow rounds timed again over the whole run, at most.
        pause_seconds: Pause between rounds (spreads the rounds in time).
    """

    rounds: int = 3
    samples: int = 3
    min_sample_seconds: float = 0.05
    max_repeats: int = 1 << 16
    reference_slack: float = 1.25
    max_reruns: int = 3
    pause_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.rounds < 3 or self.samples < 1 or self.max_repeats < 1 or self.max_reruns < 0:
            raise PerfmodelError(
                f"RoundRobinPolicy: rounds={self.rounds} (>= 3), samples={self.samples} (>= 1), "
                f"max_repeats={self.max_repeats} (>= 1), max_reruns={self.max_reruns} (>= 0)"
            )
        if not self.min_sample_seconds > 0 or not self.reference_slack >= 1:
            raise PerfmodelError(
                f"RoundRobinPolicy: min_sample_seconds={self.min_sample_seconds} (> 0), "
                f"reference_slack={self.reference_slack} (>= 1)"
            )
        if not self.pause_seconds >= 0:
            raise PerfmodelError(f"RoundRobinPolicy: pause_seconds={self.pause_seconds} (>= 0)")


@dataclass(frozen=True)
class RoundRecord:
    """One timed round.

    Attributes:
        medians: Per kernel, the median seconds per call over the round's samples.
        reference: The round's reference seconds per call (the larger of its two timings).
        load: The 1-, 5- and 15-minute load average before the round.
        slow: The round was judged disturbed and timed again.
    """

    medians: dict[str, float]
    reference: float
    load: tuple[float, float, float]
    slow: bool = False


@dataclass(frozen=True)
class RoundRobinResult:
    """What :func:`measure_round_robin` measured.

    Attributes:
        seconds: Per kernel, the minimum over the kept rounds of its round medians
            (seconds per call).
        repeats: Per kernel (and ``"reference"``), the calls per sample.
        rounds: Every round in the order timed, slow ones included.
        reruns: Rounds timed again because they were slow.
        policy: The settings.
    """

    seconds: dict[str, float]
    repeats: dict[str, int]
    rounds: tuple[RoundRecord, ...]
    reruns: int
    policy: RoundRobinPolicy = field(repr=False)

    @property
    def kept(self) -> tuple[RoundRecord, ...]:
        """The rounds behind :attr:`seconds` (those not judged slow)."""
        return tuple(r for r in self.rounds if not r.slow)

    def round_medians(self, name: str) -> list[float]:
        """A kernel's median per kept round (the samples of a record's interval).

        Args:
            name: A kernel's name.

        Raises:
            PerfmodelError: An unknown kernel.
        """
        if name not in self.seconds:
            raise PerfmodelError(f"round_medians: no kernel {name!r} (have {sorted(self.seconds)})")
        return [r.medians[name] for r in self.kept]


def _sample(fn: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    """Seconds per call of ``repeats`` back-to-back calls."""
    t0 = clock()
    for _ in range(repeats):
        fn()
    return (clock() - t0) / repeats


def _repeats(fn: Callable[[], object], policy: RoundRobinPolicy, clock: Callable[[], float]) -> int:
    """The smallest power-of-two repeat count whose sample lasts ``min_sample_seconds``."""
    n = 1
    while n < policy.max_repeats and _sample(fn, n, clock) * n < policy.min_sample_seconds:
        n *= 2
    return min(n, policy.max_repeats)


def _round(
    kernels: Mapping[str, Callable[[], object]],
    reference: Callable[[], object],
    repeats: Mapping[str, int],
    index: int,
    policy: RoundRobinPolicy,
    clock: Callable[[], float],
) -> tuple[dict[str, float], float]:
    """Time one round: reference, every kernel in rotated order, reference again."""
    names = list(kernels)
    shift = index % len(names)
    first = _sample(reference, repeats["reference"], clock)
    medians = {}
    for name in names[shift:] + names[:shift]:
        samples = [_sample(kernels[name], repeats[name], clock) for _ in range(policy.samples)]
        medians[name] = statistics.median(samples)
    last = _sample(reference, repeats["reference"], clock)
    return {n: medians[n] for n in names}, max(first, last)


def measure_round_robin(
    kernels: Mapping[str, Callable[[], object]],
    reference: Callable[[], object],
    policy: RoundRobinPolicy | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    load: Callable[[], tuple[float, float, float]] = load_average,
    pause: Callable[[float], object] = time.sleep,
) -> RoundRobinResult:
    """Time ``kernels`` in interleaved rounds, re-timing rounds the reference calls slow.

    Args:
        kernels: Name -> a callable running the kernel once (its result is discarded).
        reference: A fixed kernel timed at the start and end of every round.
        policy: The protocol's settings (default :class:`RoundRobinPolicy`).
        clock: Seconds, monotonic.
        load: The 1-, 5- and 15-minute load average.
        pause: Sleeps between rounds (called with ``policy.pause_seconds``).

    Returns:
        The per-kernel minimum of round medians, the repeat counts and every round.

    Raises:
        PerfmodelError: No kernels, or a kernel named ``"reference"``.
    """
    policy = policy or RoundRobinPolicy()
    if not kernels or "reference" in kernels:
        raise PerfmodelError(
            f"measure_round_robin: kernels {sorted(kernels)}: give at least one, none named "
            "'reference'"
        )
    repeats = {name: _repeats(fn, policy, clock) for name, fn in kernels.items()}
    repeats["reference"] = _repeats(reference, policy, clock)
    rounds: list[RoundRecord] = []
    reruns = 0
    while sum(not r.slow for r in rounds) < policy.rounds:
        if rounds:
            pause(policy.pause_seconds)
        before = tuple(float(v) for v in load())
        medians, ref = _round(kernels, reference, repeats, len(rounds), policy, clock)
        rounds.append(RoundRecord(medians, ref, (before[0], before[1], before[2])))
        bound = policy.reference_slack * min(r.reference for r in rounds)
        for i, r in enumerate(rounds):  # a faster round can show an earlier one was slow
            if not r.slow and r.reference > bound and reruns < policy.max_reruns:
                rounds[i] = dataclasses.replace(r, slow=True)
                reruns += 1
    kept = [r for r in rounds if not r.slow]
    seconds = {name: min(r.medians[name] for r in kept) for name in kernels}
    return RoundRobinResult(seconds, repeats, tuple(rounds), reruns, policy)


def reference_kernel(seed: int = 0) -> Callable[[], object]:
    """The fixed reference of every round: a small convolution block and a matrix product.

    A matrix product alone is compute-bound and barely notices a neighbour that contends
    for the caches and memory; a small convolution block with its batch norm and
    activation feels that contention as networks do. :data:`REFERENCE` describes it.

    Args:
        seed: Seed of its weights and inputs.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 16, 16, 16, generator=gen)
    w = torch.randn(16, 16, 3, 3, generator=gen)
    a, b = torch.randn(128, 128, generator=gen), torch.randn(128, 128, generator=gen)
    mean, var = torch.zeros(16), torch.ones(16)

    def run() -> object:
        with torch.no_grad():
            y = torch.nn.functional.conv2d(x, w, padding=1)
            y = torch.relu(torch.nn.functional.batch_norm(y, mean, var))
            return y, a @ b

    return run
