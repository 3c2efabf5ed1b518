"""A measurement protocol that knows its noise: samples, dispersion, load, bounded re-measures.

A timing on a shared machine is only as good as the conditions it was taken under. Every
timing of the perfmodel data set therefore keeps, besides its median:

* every timed sample (not only the median);
* its **dispersion**, the inter-quartile range divided by the median (IQR ÷ median, a
  robust relative spread: one stray sample does not move it, a burst of several does);
* the 1-, 5- and 15-minute **load average** and the machine's core count at the time;
* the **thread settings** (torch's intra- and inter-op pools, the clock, ``OMP_NUM_THREADS``).

:func:`measure_until_quiet` applies the protocol: a timing whose dispersion is above
:attr:`NoisePolicy.max_dispersion` (default 0.10: the middle half of the samples spans more
than 10 % of the median), or that was taken while the 1-minute load average exceeded the
core count, is measured again, at most :attr:`NoisePolicy.retries` more times. The kept
attempt is the best by, in order: taken under acceptable load, dispersion under the
threshold, the *lowest median* (other work on the machine only ever adds time — cache and
memory contention inflate even the CPU clock — so the fastest clean attempt is the best
estimate of the undisturbed time, and over runs a re-measured data set converges instead of
drifting); all attempts stay in the record. A timing that is still noisy after the
retries is *flagged* (:attr:`ProtocolTiming.flags`: ``"dispersion"`` and/or ``"load"``) so
that a reader, or a later run with ``remeasure="noisy"``, can tell it apart.

The **noise floor** of a data set is the median dispersion of its timings
(:func:`noise_floor`): no model can be judged on errors below it.

Example:
    A timing function that is disturbed on its first call is re-measured once:

    >>> calls = []
    >>> def timer():
    ...     calls.append(1)
    ...     return [1.0, 1.0, 1.0, 1.0, 1.0] if len(calls) > 1 else [1.0, 2.0, 1.0, 3.0, 1.0]
    >>> t = measure_until_quiet(timer, NoisePolicy(), load=lambda: (0.0, 0.0, 0.0), cores=2)
    >>> t.attempts, t.dispersion, t.noisy
    (2, 0.0, False)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcnb.errors import HpcnbError

__all__ = [
    "NoisePolicy",
    "PerfmodelError",
    "ProtocolTiming",
    "dispersion",
    "load_average",
    "measure_until_quiet",
    "noise_floor",
    "preference",
    "steady_allocator",
    "thread_settings",
]


class PerfmodelError(HpcnbError, ValueError):
    """Bad input to a perfmodel model, measurement or predictor; names what and where."""


def dispersion(samples: Sequence[float]) -> float:
    """Inter-quartile range divided by the median (linear interpolation of quartiles).

    Args:
        samples: At least one positive duration.

    Raises:
        PerfmodelError: No samples, or a non-finite or non-positive median.

    Example:
        >>> dispersion([1.0, 1.0, 1.0, 1.0])
        0.0
        >>> round(dispersion([1.0, 2.0, 3.0, 4.0, 5.0]), 6)  # IQR 2, median 3
        0.666667
    """
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        raise PerfmodelError("dispersion: need at least one sample")
    median = float(np.median(values))
    if not np.isfinite(median) or median <= 0:
        raise PerfmodelError(f"dispersion: median {median} of the samples is not positive")
    q1, q3 = np.percentile(values, [25, 75])
    return float((q3 - q1) / median)


_ALLOCATOR: dict[str, Any] = {}


def steady_allocator(threshold_bytes: int = 1 << 30) -> dict[str, Any]:
    """Keep freed memory in the process heap (glibc), so timings do not measure page faults.

    glibc's ``malloc`` serves large blocks by ``mmap`` and returns freed memory at the top
    of the heap to the system; a network that frees and allocates activations of several
    megabytes at every layer then pays a page fault per 4 KiB page, every pass, which a
    kernel timed alone (reusing one block) never sees. Raising ``M_MMAP_THRESHOLD`` and
    ``M_TRIM_THRESHOLD`` (``mallopt``) keeps the blocks in the heap, as the jemalloc or
    TCMalloc that PyTorch's CPU tuning guide recommends do. The setting is process-wide and
    stays (glibc has no way to read it back); calling again changes nothing.

    Args:
        threshold_bytes: The two thresholds.

    Returns:
        ``{"allocator": "glibc", "mmap_threshold": ..., "trim_threshold": ...}`` when
        applied, ``{"allocator": "default"}`` where glibc's ``mallopt`` is not available.
    """
    if _ALLOCATOR:
        return dict(_ALLOCATOR)
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        _ALLOCATOR["allocator"] = "default"
        return dict(_ALLOCATOR)
    m_trim_threshold, m_mmap_threshold = -1, -3
    if mallopt(m_trim_threshold, threshold_bytes) and mallopt(m_mmap_threshold, threshold_bytes):
        _ALLOCATOR.update(
            allocator="glibc", mmap_threshold=threshold_bytes, trim_threshold=threshold_bytes
        )
    else:
        _ALLOCATOR["allocator"] = "default"
    return dict(_ALLOCATOR)


def load_average() -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages (``nan`` where the OS does not report them)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux/macOS
        return (float("nan"),) * 3
    return float(one), float(five), float(fifteen)


def thread_settings(threads: int, clock: str) -> dict[str, Any]:
    """The thread settings in force now, with the requested ones (stored beside a timing).

    Args:
        threads: Threads requested for timing.
        clock: The clock used.
    """
    import torch

    return {
        "requested": int(threads),
        "torch_intra_op": int(torch.get_num_threads()),
        "torch_inter_op": int(torch.get_num_interop_threads()),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "clock": str(clock),
    }


@dataclass(frozen=True)
class NoisePolicy:
    """When a timing counts as noisy and how often it is measured again.

    Attributes:
        max_dispersion: Largest acceptable IQR ÷ median of a timing's samples (0.10: the
            middle half of the samples spans at most 10 % of the median).
        max_load_per_core: Largest acceptable 1-minute load average per core (1.0: load
            above the core count means other work competed for the cores).
        retries: Extra measurements of a noisy timing (bounded; 0 = measure once).
    """

    max_dispersion: float = 0.10
    max_load_per_core: float = 1.0
    retries: int = 2

    def __post_init__(self) -> None:
        if not self.max_dispersion > 0 or not self.max_load_per_core > 0:
            raise PerfmodelError(
                f"NoisePolicy(max_dispersion={self.max_dispersion}, max_load_per_core="
                f"{self.max_load_per_core}): both must be positive"
            )
        if isinstance(self.retries, bool) or not 0 <= self.retries <= 10:
            raise PerfmodelError(f"NoisePolicy.retries={self.retries}: expected 0..10")

    def flags(self, disp: float, load: float, cores: int) -> tuple[str, ...]:
        """Reasons a timing with this dispersion and 1-minute load counts as noisy.

        Args:
            disp: The timing's IQR ÷ median.
            load: The 1-minute load average when it was taken (``nan``: unknown).
            cores: Logical cores of the machine.

        Returns:
            ``"dispersion"`` and/or ``"load"``; empty when the timing is quiet.
        """
        out = []
        if disp > self.max_dispersion:
            out.append("dispersion")
        if np.isfinite(load) and load > self.max_load_per_core * cores:
            out.append("load")
        return tuple(out)


@dataclass(frozen=True)
class ProtocolTiming:
    """One timing kept by the protocol, with its conditions and every attempt.

    Attributes:
        samples: The kept attempt's timed durations in seconds.
        dispersion: Their IQR ÷ median.
        load: Load averages (1, 5, 15 minutes) when the kept attempt started.
        cores: Logical cores of the machine.
        threads: Thread settings during the kept attempt (:func:`thread_settings`).
        attempts: Measurements taken (1 + re-measures).
        flags: Why the kept attempt is still noisy (empty when it is not).
        history: ``(dispersion, 1-minute load, median seconds)`` of every attempt, in
            order (also attempts of earlier runs merged by a re-measure; the median is
            ``nan`` for entries written before it was kept).
    """

    samples: tuple[float, ...]
    dispersion: float
    load: tuple[float, float, float]
    cores: int
    threads: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1
    flags: tuple[str, ...] = ()
    history: tuple[tuple[float, float, float], ...] = ()

    @property
    def median(self) -> float:
        """Median seconds of the kept samples."""
        return float(np.median(self.samples))

    @property
    def between_attempts(self) -> float:
        """Spread of the attempts' medians, ``(max - min) / median`` of them (``nan`` if < 2).

        Within one attempt the samples follow each other within milliseconds; between
        attempts (and between runs) the machine's load and cache contention change. On a
        busy machine this spread can be far larger than :attr:`dispersion`.
        """
        medians = [h[2] for h in self.history if np.isfinite(h[2])]
        if len(medians) < 2:
            return float("nan")
        return float((max(medians) - min(medians)) / np.median(medians))

    @property
    def noisy(self) -> bool:
        """True when the kept attempt is still above the dispersion or load threshold."""
        return bool(self.flags)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able data (inverse of :meth:`from_json`)."""
        return {
            "samples": list(self.samples),
            "median": self.median,
            "dispersion": self.dispersion,
            "load": list(self.load),
            "cores": self.cores,
            "threads": dict(self.threads),
            "attempts": self.attempts,
            "flags": list(self.flags),
            "history": [list(h) for h in self.history],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProtocolTiming:
        """Rebuild a timing from :meth:`to_json` output.

        Raises:
            PerfmodelError: A required field is missing or malformed (no samples, not three
                load averages).
        """
        try:
            samples = tuple(float(s) for s in data["samples"])
            if not samples:
                raise PerfmodelError("timing entry has no samples")
            one, five, fifteen = (float(v) for v in data["load"])
            return cls(
                samples=samples,
                dispersion=float(data["dispersion"]),
                load=(one, five, fifteen),
                cores=int(data["cores"]),
                threads=dict(data.get("threads", {})),
                attempts=int(data.get("attempts", 1)),
                flags=tuple(str(f) for f in data.get("flags", ())),
                history=tuple(
                    (float(h[0]), float(h[1]), float(h[2]) if len(h) > 2 else float("nan"))
                    for h in data.get("history", ())
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PerfmodelError(f"timing entry {str(data)[:80]}...: {exc}") from exc


def preference(flags: Sequence[str], median: float) -> tuple[bool, bool, float]:
    """Sort key of attempts (smaller is better): under load, too dispersed, median seconds.

    Args:
        flags: The attempt's flags (:meth:`NoisePolicy.flags`).
        median: The attempt's median seconds.

    Example:
        >>> preference(("load",), 1.0) > preference(("dispersion",), 2.0) > preference((), 3.0)
        True
    """
    return ("load" in flags, "dispersion" in flags, float(median))


def measure_until_quiet(
    measure: Callable[[], Sequence[float]],
    policy: NoisePolicy,
    *,
    load: Callable[[], tuple[float, float, float]] = load_average,
    cores: int | None = None,
    threads: Callable[[], dict[str, Any]] | None = None,
) -> ProtocolTiming:
    """Measure, and re-measure while noisy (at most ``policy.retries`` times).

    Args:
        measure: Takes one measurement and returns its timed samples (seconds).
        policy: Thresholds and retry bound.
        load: Returns the load averages (injectable for tests).
        cores: Core count (default :func:`os.cpu_count`).
        threads: Returns the thread settings to store (default: none stored).

    Returns:
        The kept attempt (the smallest :func:`preference`; see the module docstring) with
        every attempt's dispersion, load and median in ``history``.

    Raises:
        PerfmodelError: ``measure`` returned no samples or a non-positive median.
    """
    n_cores = int(cores or os.cpu_count() or 1)
    attempts: list[tuple[tuple[float, ...], float, tuple[float, float, float], dict, tuple]] = []
    for _ in range(policy.retries + 1):
        before = load()
        samples = tuple(float(s) for s in measure())
        disp = dispersion(samples)
        settings = threads() if threads else {}
        flags = policy.flags(disp, before[0], n_cores)
        attempts.append((samples, disp, before, settings, flags))
        if not flags:
            break
    samples, disp, before, settings, flags = min(
        attempts, key=lambda a: preference(a[4], float(np.median(a[0])))
    )
    return ProtocolTiming(
        samples=samples,
        dispersion=disp,
        load=before,
        cores=n_cores,
        threads=settings,
        attempts=len(attempts),
        flags=flags,
        history=tuple((a[1], a[2][0], float(np.median(a[0]))) for a in attempts),
    )


def between_attempt_spread(timings: Sequence[ProtocolTiming]) -> float:
    """Median :attr:`ProtocolTiming.between_attempts` over timings measured more than once.

    Returns ``nan`` when no timing has two attempts with a known median.
    """
    values = [t.between_attempts for t in timings]
    values = [v for v in values if np.isfinite(v)]
    return float(np.median(values)) if values else float("nan")


def noise_floor(timings: Sequence[ProtocolTiming]) -> float:
    """Median dispersion (IQR ÷ median) of a data set's timings.

    Raises:
        PerfmodelError: No timings.
    """
    if not timings:
        raise PerfmodelError("noise_floor: no timings")
    return float(np.median([t.dispersion for t in timings]))
