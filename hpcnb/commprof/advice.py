"""Documented rules from locality symptoms to optimisation suggestions.

Regions with fewer than ``min_accesses`` accesses, or with less than ``min_share`` of the
kernel's accesses (not a hotspot: whatever its symptom, it cannot matter for the kernel's
time), are skipped, and every rule needs a
minimum of evidence (``min_events`` communication events, ``min_false_sharing``
false-sharing events), so a handful of events never fires one. Each rule looks at one
region's :class:`~hpcnb.commprof.locality.RegionLocality` and fires with the numbers that
triggered it (its evidence). Rules, in order:

* ``privatisation``: a few words (at most 2 per thread) are written many times
  (>= ``repeat`` writes per word) and are shared or falsely shared. Suggestion: keep a
  private accumulator per thread and combine once after the loop (reduction).
* ``padding``: false-sharing events between per-thread words (each written by one thread
  only: slots that padding can separate) are at least ``false_sharing`` of the accesses
  (and at least ``min_false_sharing``). Suggestion: pad per-thread data to cache-line
  boundaries. False sharing on words that several threads write in turn (a shared output
  array filled by a scatter) is not fixed by padding and does not count.
* ``schedule``: communication events per written word >= ``consumed``: most of what a
  thread writes is read by other threads. Suggestion: change the schedule or thread
  affinity so a thread owns the data it reads.
* ``tiling``: at least ``min_events`` events travel farther than the cache capacity and
  fewer than ``near`` of all events are within it. Suggestion: tile or fuse the loops so
  the consumer reads while the data is still cached.
* ``blocking``: the region is staggered (a wavefront: the threads' phase windows shift
  with the thread id) and its occupancy is below ``occupancy``: many (phase, thread) pairs
  idle while the wavefront fills and drains. Suggestion: cut each thread's work into more,
  smaller blocks so the wavefront fills sooner.
* ``layout``: the accesses use, on average, less than ``utilisation`` of the words of the
  lines they touch. Suggestion: change the data layout (AoS <-> SoA) so accesses fill
  whole lines.

**Running values at a fixed address.** When every thread that writes in a region writes
one word only, many times (``writer_words`` 1, ``write_repeat`` >= ``repeat``), the word is
a running value such as ``acc[tid] += x[i]``. An optimising compiler keeps it in a register
and only stores it, and the stores' line transfers are absorbed by the store buffer, so
neither ``privatisation`` nor ``padding`` fires on it: measured natively on 2 threads here,
privatising such a sum gains nothing (about 1.0x), while padding per-thread histograms,
whose bins are read and written in a data-dependent order, does.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcnb.commprof.instrument import Region
from hpcnb.commprof.locality import RegionLocality
from hpcnb.errors import InvalidInputError

__all__ = ["RULES", "Advice", "AdviceThresholds", "advise", "format_advice"]

RULES = ("privatisation", "padding", "schedule", "tiling", "blocking", "layout")


@dataclass(frozen=True)
class AdviceThresholds:
    """Thresholds of the rules (see module docstring).

    Attributes:
        repeat: ``privatisation``: writes per written word at or above which words count
            as written over and over.
        false_sharing: ``padding``: false-sharing events as a share of the accesses.
        consumed: ``schedule``: communication events per written word.
        near: ``tiling``: share of communication events within the cache capacity below
            which distances count as long.
        utilisation: ``layout``: share of the words of a touched line that are used.
        occupancy: ``blocking``: occupancy below which a staggered region fires.
        min_accesses: Regions with fewer accesses are skipped.
        min_share: Regions with a smaller share of all accesses are skipped.
        min_events: Communication events a region needs before ``schedule``, ``tiling`` or
            ``blocking`` fires (far events for ``tiling``).
        min_false_sharing: False-sharing events a region needs before ``padding`` or
            ``privatisation`` fires on false sharing.

    Raises:
        InvalidInputError: A share outside [0, 1], ``repeat`` not positive, or a negative
            ``consumed`` or minimum.
    """

    repeat: float = 8.0
    false_sharing: float = 0.05
    consumed: float = 1.0
    near: float = 0.5
    utilisation: float = 0.5
    occupancy: float = 0.75
    min_accesses: int = 64
    min_share: float = 0.05
    min_events: int = 16
    min_false_sharing: int = 32

    def __post_init__(self) -> None:
        shares = {
            "false_sharing": self.false_sharing,
            "near": self.near,
            "utilisation": self.utilisation,
            "occupancy": self.occupancy,
            "min_share": self.min_share,
        }
        for name, value in shares.items():
            if not 0.0 <= value <= 1.0:
                raise InvalidInputError(
                    f"AdviceThresholds.{name}={value}: expected a share in [0, 1]"
                )
        minima = (self.min_accesses, self.min_events, self.min_false_sharing)
        if self.repeat <= 0 or self.consumed < 0 or min(minima) < 0:
            raise InvalidInputError(
                f"AdviceThresholds(repeat={self.repeat}, consumed={self.consumed}, "
                f"min_accesses={self.min_accesses}, min_events={self.min_events}, "
                f"min_false_sharing={self.min_false_sharing}): need repeat > 0, the others >= 0"
            )


@dataclass(frozen=True)
class Advice:
    """One fired rule.

    Attributes:
        rid: Region id.
        line: Source line of the region.
        rule: Rule name (one of :data:`RULES`).
        evidence: The measured values that triggered it.
        suggestion: What to change.
    """

    rid: int
    line: int
    rule: str
    evidence: str
    suggestion: str


def advise(
    regions: list[Region],
    metrics: list[RegionLocality],
    nthreads: int,
    th: AdviceThresholds | None = None,
) -> list[Advice]:
    """Apply every rule to every region with accesses.

    Args:
        regions: The kernel's regions (for source lines).
        metrics: Per-region metrics from :func:`hpcnb.commprof.locality.analyse_locality`.
        nthreads: Thread count of the run.
        th: Rule thresholds.

    Returns:
        The fired rules in region order, rules in :data:`RULES` order within a region.
    """
    th = th or AdviceThresholds()
    out: list[Advice] = []
    total = sum(m.accesses for m in metrics)
    for m in metrics:
        if m.accesses >= max(th.min_accesses, th.min_share * total):
            out.extend(
                Advice(m.rid, regions[m.rid].line, rule, evidence, suggestion)
                for rule, evidence, suggestion in _fired(m, nthreads, th)
            )
    return out


def _running_value(m: RegionLocality, th: AdviceThresholds) -> bool:
    """Every writing thread rewrites one word: a compiler keeps it in a register."""
    return m.writer_words == 1 and m.write_repeat >= th.repeat


def _fired(m: RegionLocality, nthreads: int, th: AdviceThresholds) -> list[tuple[str, str, str]]:
    """The (rule, evidence, suggestion) triples that fire on one region, in RULES order."""
    fired: list[tuple[str, str, str]] = []
    running = _running_value(m, th)
    if (
        not running
        and m.write_repeat >= th.repeat
        and 0 < m.written_words <= 2 * nthreads
        and (m.false_sharing >= th.min_false_sharing or m.volume >= th.min_events)
    ):
        fired.append(
            (
                "privatisation",
                f"{m.written_words} words written {m.write_repeat:.0f}x each; "
                f"{m.false_sharing} false-sharing and {m.volume} communication events",
                "accumulate privately per thread, combine once (reduction)",
            )
        )
    if not running and m.private_false_sharing >= max(
        th.min_false_sharing, th.false_sharing * m.accesses
    ):
        fired.append(
            (
                "padding",
                f"{m.private_false_sharing} false-sharing events between per-thread words "
                f"({m.private_false_sharing / m.accesses:.1%} of accesses)",
                "pad per-thread data to cache-line boundaries",
            )
        )
    consumed = m.volume / m.written_words if m.written_words else 0.0
    if m.volume >= th.min_events and consumed >= th.consumed:
        fired.append(
            (
                "schedule",
                f"{m.volume} events for {m.written_words} written words ({consumed:.2f} per word)",
                "change the schedule or affinity so each thread owns what it reads",
            )
        )
    far = round((1.0 - m.near_fraction) * m.volume)
    if far >= th.min_events and m.near_fraction < th.near:
        fired.append(
            (
                "tiling",
                f"{far} of {m.volume} events ({1 - m.near_fraction:.0%}) farther than the capacity",
                "tile or fuse the loops so consumers read data while still cached",
            )
        )
    if m.staggered and m.occupancy < th.occupancy and m.volume >= th.min_events:
        fired.append(
            (
                "blocking",
                f"wavefront: {m.occupancy:.0%} of (phase, thread) pairs busy; {m.volume} events",
                "cut each thread's work into more, smaller blocks so the wavefront fills sooner",
            )
        )
    if m.line_utilisation < th.utilisation:
        fired.append(
            (
                "layout",
                f"threads use {m.line_utilisation:.0%} of each line they touch",
                "change the data layout (AoS <-> SoA) so accesses fill whole lines",
            )
        )
    return fired


def format_advice(advice: list[Advice]) -> str:
    """One line per fired rule: region line, rule, evidence and suggestion."""
    if not advice:
        return "no rule fired"
    return "\n".join(
        f"L{a.line:<4} {a.rule:<13} {a.suggestion}\n      evidence: {a.evidence}" for a in advice
    )
