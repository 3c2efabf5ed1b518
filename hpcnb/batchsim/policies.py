"""Policies that use malleability or multiple resources: SRTF, DRF and malleable EASY.

* :class:`SRTF` — shortest remaining time first. Waiting jobs are ordered by their
  requested time; a running resizable job's remaining time comes from its progress
  (units done) under its work model. When a waiting job does not fit, resizable
  running jobs with a longer remaining time are shrunk (towards their minimum) to
  admit it; idle nodes go to the running resizable jobs with the shortest remaining
  time when nothing waits.
* :class:`DRF` — dominant resource fairness over nodes and GPUs (Ghodsi et al., NSDI
  2011). A job's usage share of a resource is its amount over the machine's; a user's
  dominant share is the largest of its running jobs' summed shares. The waiting job of
  the user with the smallest dominant share is served first (ties: the job's own
  dominant demand, then submit order); jobs that do not fit are passed over.
* :class:`MalleableEasy` — EASY backfilling plus malleability: if the queue head does
  not fit, running resizable jobs are shrunk (largest headroom first, never below
  their minimum) to admit it; when nothing waits, idle nodes are shared among running
  resizable jobs, each only if the run time it saves exceeds twice the
  reconfiguration cost.
"""

from __future__ import annotations

from collections import defaultdict

from hpcnb.batchsim.engine import InvocationReason, JobRecord, SchedulerView
from hpcnb.batchsim.scheduler import FCFS, SJF, ConservativeBackfilling, EasyBackfilling, Scheduler

__all__ = [
    "DRF",
    "SCHEDULERS",
    "SRTF",
    "MalleableEasy",
    "expand_into_idle",
    "make_scheduler",
    "shrink_to_admit",
]


def _pending_release(view: SchedulerView) -> int:
    return sum(r.nodes - r.target for r in view.running)


def shrink_to_admit(view: SchedulerView, need: int, victims: list[JobRecord]) -> bool:
    """Shrink ``victims`` (in the given order) so that ``need`` nodes become free.

    Counts nodes already free and nodes of shrinks still pending. Shrinks nothing if
    the victims' headroom cannot cover the gap.

    Returns:
        Whether enough nodes are (or will be, at the victims' next scheduling points)
        free.
    """
    gap = need - view.free_nodes - _pending_release(view)
    if gap <= 0:
        return True
    headroom = sum(r.target - r.job.num_nodes_min for r in victims)
    if headroom < gap:
        return False
    for rec in victims:
        take = min(gap, rec.target - rec.job.num_nodes_min)
        if take > 0:
            view.shrink(rec, rec.target - take)
            gap -= take
        if gap <= 0:
            break
    return True


def expand_into_idle(view: SchedulerView, candidates: list[JobRecord], gain: float = 2.0) -> None:
    """Share the free nodes among ``candidates`` (in order) where it pays.

    A job grows only if the run time saved exceeds ``gain`` times the reconfiguration
    cost of the growth.
    """
    ctx = view.ctx
    for i, rec in enumerate(candidates):
        if view.free_nodes <= 0:
            return
        share = max(1, view.free_nodes // (len(candidates) - i))
        new = min(rec.job.num_nodes_max, rec.target + share)
        if new <= rec.target or new - rec.nodes > view.free_nodes:
            continue
        work = rec.job.work
        start_unit = rec.unit if rec.at_point else rec.unit + 1
        saved = work.estimate(rec.target, ctx, start_unit) - work.estimate(new, ctx, start_unit)
        if saved > gain * work.reconfiguration_time(rec.target, new, ctx):
            view.expand(rec, new)


class SRTF(Scheduler):
    """Shortest remaining time first, shrinking longer malleable jobs (module docstring)."""

    name = "srtf"

    def schedule(self, view: SchedulerView, reasons: frozenset[InvocationReason]) -> None:
        """Start by remaining time; shrink longer resizable jobs; expand when idle."""
        if InvocationReason.EVOLVING_REQUEST in reasons:
            self.grant_evolving_requests(view)
        order = sorted((view.requested_time(r), i, r) for i, r in enumerate(view.queue))
        remaining = {r.id: view.remaining_time(r) for r in view.running if r.type.resizable}
        reclaim = _pending_release(view) + sum(
            r.target - r.job.num_nodes_min for r in view.running if r.type.resizable
        )
        for mine, _, rec in order:
            size = self.start_size(view, rec)
            if size is None:
                if self.reserve_size(rec) > view.free_nodes + reclaim:
                    continue
                victims = [r for r in view.running if remaining.get(r.id, 0.0) > mine]
                victims.sort(key=lambda r: (-remaining[r.id], r.id))
                if shrink_to_admit(view, self.reserve_size(rec), victims):
                    for r in victims:
                        remaining[r.id] = view.remaining_time(r)
                    size = self.start_size(view, rec)
            if size is not None:
                view.start(rec, size)
                if rec.type.resizable:
                    remaining[rec.id] = view.remaining_time(rec)
                reclaim = _pending_release(view) + sum(
                    r.target - r.job.num_nodes_min for r in view.running if r.type.resizable
                )
        if not view.queue and view.free_nodes > 0:
            growable = [r for r in view.running if r.type.resizable]
            growable.sort(key=lambda r: (not r.at_point, view.remaining_time(r)))
            expand_into_idle(view, growable)


class DRF(Scheduler):
    """Dominant resource fairness over nodes and GPUs (see the module docstring)."""

    name = "drf"

    def schedule(self, view: SchedulerView, reasons: frozenset[InvocationReason]) -> None:
        """Serve the user with the smallest dominant share, repeatedly."""
        if InvocationReason.EVOLVING_REQUEST in reasons:
            self.grant_evolving_requests(view)
        total_nodes = view.total_nodes
        total_gpus = max(1, view.platform.num_gpus)
        usage: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for r in view.running:
            usage[r.job.user][0] += r.nodes / total_nodes
            usage[r.job.user][1] += r.nodes * r.job.gpus_per_node / total_gpus
        waiting = list(enumerate(view.queue))
        while waiting and view.free_nodes > 0:
            best = None
            for pos, (idx, rec) in enumerate(waiting):
                size = self.start_size(view, rec)
                if size is None:
                    continue
                share = max(usage[rec.job.user])
                demand = max(size / total_nodes, size * rec.job.gpus_per_node / total_gpus)
                key = (share, demand, idx)
                if best is None or key < best[0]:
                    best = (key, pos, size)
            if best is None:
                return
            _, pos, size = best
            rec = waiting.pop(pos)[1]
            view.start(rec, size)
            usage[rec.job.user][0] += size / total_nodes
            usage[rec.job.user][1] += size * rec.job.gpus_per_node / total_gpus


class MalleableEasy(EasyBackfilling):
    """EASY backfilling that shrinks and expands resizable jobs (module docstring)."""

    name = "malleable"
    rigid_kernel = None

    def __init__(self, gain: float = 2.0) -> None:
        self.gain = gain

    def schedule(self, view: SchedulerView, reasons: frozenset[InvocationReason]) -> None:
        """EASY pass; shrink to admit the head; expand into idle nodes when nothing waits."""
        super().schedule(view, reasons)
        if view.queue:
            head = view.queue[0]
            victims = [r for r in view.running if r.type.resizable]
            victims.sort(key=lambda r: (-(r.target - r.job.num_nodes_min), r.id))
            if shrink_to_admit(view, self.reserve_size(head), victims):
                super().schedule(view, frozenset())
        if not view.queue and view.free_nodes > 0:
            growable = [r for r in view.running if r.type.resizable]
            growable.sort(key=lambda r: (not r.at_point, r.id))
            expand_into_idle(view, growable, self.gain)


SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (
        FCFS,
        SJF,
        SRTF,
        DRF,
        EasyBackfilling,
        ConservativeBackfilling,
        MalleableEasy,
    )
}


def make_scheduler(name: str) -> Scheduler:
    """Return a new scheduler by name.

    Names: ``fcfs``, ``sjf``, ``srtf``, ``drf``, ``easy``, ``conservative``, ``malleable``.

    Raises:
        ValueError: Unknown name (the message lists the known ones).
    """
    try:
        return SCHEDULERS[name.lower()]()
    except KeyError:
        known = sorted(SCHEDULERS)
        raise ValueError(f"unknown scheduler {name!r}; expected one of {known}") from None
