"""The parallel file system as shared links with processor-sharing bandwidth.

A job's unit of work is a list of *segments*: ``("time", seconds)`` for computation,
communication and latencies, and ``("pfs_read", bytes)`` / ``("pfs_write", bytes)`` for
transfers through the PFS. The PFS read and write links each split their bandwidth
equally among the jobs transferring on them at the moment (processor sharing, as a
fluid model of SimGrid's fair sharing of a bottleneck link): with ``k`` jobs active,
each progresses at ``bandwidth / k`` bytes/s, and the rate changes whenever a job
joins or leaves.

:class:`SharedLink` keeps this in *virtual bytes*: ``v`` is the number of bytes that
every continuously active job has received so far. A job joining at ``v0`` with ``b``
bytes finishes when ``v`` reaches ``v0 + b``; between events ``v`` grows at
``bandwidth / k``. Joins, leaves and completions cost ``O(k)``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

__all__ = ["SEGMENT_KINDS", "Segment", "SharedLink", "merge_segments", "nominal_duration"]

Segment = tuple[str, float]
SEGMENT_KINDS = ("time", "pfs_read", "pfs_write")


class SharedLink:
    """A link whose bandwidth is shared equally by the transfers active on it.

    Args:
        name: Name for messages (``"pfs_read"``).
        bandwidth: Bytes per second of the whole link.
    """

    def __init__(self, name: str, bandwidth: float) -> None:
        if not bandwidth > 0:
            raise ValueError(f"link {name}: bandwidth {bandwidth} must be > 0")
        self.name = name
        self.bandwidth = float(bandwidth)
        self.virtual = 0.0
        self.last = 0.0
        self.active: dict[Hashable, float] = {}
        self.token = 0

    def _advance(self, now: float) -> None:
        if self.active and now > self.last:
            self.virtual += (now - self.last) * self.bandwidth / len(self.active)
        self.last = max(self.last, now)

    def join(self, key: Hashable, nbytes: float, now: float) -> None:
        """Start a transfer of ``nbytes`` for ``key`` at time ``now``."""
        if key in self.active:
            raise ValueError(f"link {self.name}: {key!r} is already transferring")
        self._advance(now)
        self.active[key] = self.virtual + float(nbytes)

    def leave(self, key: Hashable, now: float) -> None:
        """Abort the transfer of ``key`` (a killed job)."""
        self._advance(now)
        self.active.pop(key, None)

    def pop_finished(self, now: float) -> list[Hashable]:
        """Return (and remove) the transfers complete at ``now``, in joining order."""
        self._advance(now)
        tol = 1e-9 * max(1.0, abs(self.virtual))
        done = [k for k, finish in self.active.items() if finish <= self.virtual + tol]
        for key in done:
            del self.active[key]
        return done

    def next_completion(self, now: float) -> float | None:
        """Return when the next transfer completes at the current sharing, or ``None``."""
        if not self.active:
            return None
        self._advance(now)
        remaining = min(self.active.values()) - self.virtual
        return now + max(0.0, remaining) * len(self.active) / self.bandwidth

    def remaining(self, key: Hashable) -> float:
        """Return the bytes ``key`` still has to transfer (as of the last update)."""
        return max(0.0, self.active[key] - self.virtual)


def merge_segments(segments: list[Segment], where: str = "") -> list[Segment]:
    """Validate segments, drop empty ones and merge consecutive ``time`` segments.

    Raises:
        ValueError: Unknown kind or an amount that is negative or not finite.
    """
    out: list[Segment] = []
    for kind, amount in segments:
        if kind not in SEGMENT_KINDS:
            raise ValueError(f"{where}: segment kind {kind!r}, expected one of {SEGMENT_KINDS}")
        if not (amount >= 0 and math.isfinite(amount)):
            raise ValueError(f"{where}: {kind} segment of {amount} (expected finite >= 0)")
        if amount == 0:
            continue
        if out and kind == "time" and out[-1][0] == "time":
            out[-1] = ("time", out[-1][1] + amount)
        else:
            out.append((kind, float(amount)))
    return out


def nominal_duration(
    segments: list[Segment], read_bandwidth: float, write_bandwidth: float, sharers: int = 1
) -> float:
    """Return the duration of segments if each PFS link were shared by ``sharers`` jobs."""
    total = 0.0
    for kind, amount in segments:
        if kind == "time":
            total += amount
        else:
            bandwidth = read_bandwidth if kind == "pfs_read" else write_bandwidth
            total += amount * max(1, sharers) / bandwidth
    return total
