"""Documented rules from locality symptoms to optimisation suggestions.

Regions with fewer than ``min_accesses`` accesses are skipped. Each rule looks at one
region's :class:`~hpcnb.commprof.locality.RegionLocality` and fires
with the numbers that triggered it (its evidence). Rules, in order:

* ``privatisation``: a few words (at most 2 per thread) are written many times
  (>= ``repeat`` writes per word) and are shared or falsely shared. Suggestion: keep a
  private accumulator per thread and combine once after the loop (reduction).
* ``padding``: false-sharing events are at least ``false_sharing`` of the accesses (and
  at least 8). Suggestion: pad per-thread data to cache-line boundaries.
* ``schedule``: communication events per written word >= ``consumed``: most of what a
  thread writes is read by other threads. Suggestion: change the schedule or thread
  affinity so a thread owns the data it reads.
* ``tiling``: communication exists but fewer than ``near`` of its events are within the
  cache capacity (long distances). Suggestion: tile or fuse the loops so the consumer reads
  while the data is still cached.
* ``layout``: the accesses use, on average, less than ``utilisation`` of the words of the
  lines they touch. Suggestion: change the data layout (AoS <-> SoA) so accesses fill
  whole lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcnb.commprof.instrument import Region
from hpcnb.commprof.locality import RegionLocality
from hpcnb.errors import InvalidInputError

__all__ = ["RULES", "Advice", "AdviceThresholds", "advise", "format_advice"]

RULES = ("privatisation", "padding", "schedule", "tiling", "layout")


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
        min_accesses: Regions with fewer accesses are skipped.

    Raises:
        InvalidInputError: A share outside [0, 1], ``repeat`` not positive, or a negative
            ``consumed`` or ``min_accesses``.
    """

    repeat: float = 8.0
    false_sharing: float = 0.05
    consumed: float = 1.0
    near: float = 0.5
    utilisation: float = 0.5
    min_accesses: int = 64

    def __post_init__(self) -> None:
        shares = {
            "false_sharing": self.false_sharing,
            "near": self.near,
            "utilisation": self.utilisation,
        }
        for name, value in shares.items():
            if not 0.0 <= value <= 1.0:
                raise InvalidInputError(
                    f"AdviceThresholds.{name}={value}: expected a share in [0, 1]"
                )
        if self.repeat <= 0 or self.consumed < 0 or self.min_accesses < 0:
            raise InvalidInputError(
                f"AdviceThresholds(repeat={self.repeat}, consumed={self.consumed}, "
                f"min_accesses={self.min_accesses}): need repeat > 0, the others >= 0"
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
    for m in metrics:
        if m.accesses < th.min_accesses:
            continue
        fs_rate = m.false_sharing / m.accesses

        def fire(rule: str, evidence: str, suggestion: str, m: RegionLocality = m) -> None:
            out.append(Advice(m.rid, regions[m.rid].line, rule, evidence, suggestion))

        if (
            m.write_repeat >= th.repeat
            and 0 < m.written_words <= 2 * nthreads
            and (m.false_sharing > 0 or m.volume > 0)
        ):
            fire(
                "privatisation",
                f"{m.written_words} words written {m.write_repeat:.0f}x each; "
                f"{m.false_sharing} false-sharing and {m.volume} communication events",
                "accumulate privately per thread, combine once (reduction)",
            )
        if m.false_sharing >= max(8, th.false_sharing * m.accesses):
            fire(
                "padding",
                f"{m.false_sharing} false-sharing events ({fs_rate:.1%} of accesses)",
                "pad per-thread data to cache-line boundaries",
            )
        consumed = m.volume / m.written_words if m.written_words else 0.0
        if consumed >= th.consumed:
            fire(
                "schedule",
                f"{m.volume} events for {m.written_words} written words ({consumed:.2f} per word)",
                "change the schedule or affinity so each thread owns what it reads",
            )
        if m.volume > 0 and m.near_fraction < th.near:
            fire(
                "tiling",
                f"only {m.near_fraction:.0%} of {m.volume} events within capacity",
                "tile or fuse the loops so consumers read data while still cached",
            )
        if m.line_utilisation < th.utilisation:
            fire(
                "layout",
                f"threads use {m.line_utilisation:.0%} of each line they touch",
                "change the data layout (AoS <-> SoA) so accesses fill whole lines",
            )
    return out


def format_advice(advice: list[Advice]) -> str:
    """One line per fired rule: region line, rule, evidence and suggestion."""
    if not advice:
        return "no rule fired"
    return "\n".join(
        f"L{a.line:<4} {a.rule:<13} {a.suggestion}\n      evidence: {a.evidence}" for a in advice
    )
