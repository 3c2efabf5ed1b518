"""Policies using malleability or several resources (SRTF, DRF, malleable EASY); the registry.

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
* :class:`ElastiSimFCFS` (``elastisim-fcfs``) — ElastiSim's example policy: FCFS that
  molds waiting jobs to the free nodes, grows malleable jobs and grants evolving
  requests (the default for ElastiSim inputs).
* :class:`MalleableEasy` — EASY backfilling plus malleability: if the queue head does
  not fit, running resizable jobs are shrunk (largest headroom first, never below
  their minimum) to admit it; when nothing waits, idle nodes are shared among running
  resizable jobs, each only if the run time it saves exceeds twice the
  reconfiguration cost.

This module also holds the scheduler registry: :data:`SCHEDULERS` (a
:class:`~hpcnb.plugins.Registry` of :class:`Scheduler` subclasses by name),
:func:`make_scheduler` (the one lookup that the command line and the experiment drivers
use: a registered name, or ``"package.module:Class"`` for a scheduler of your own) and
:func:`register_scheduler`, which adds a user policy under a name.

Example:
    >>> from hpcnb.batchsim.scheduler import FCFS
    >>> class Patient(FCFS):
    ...     name = "patient"
    ...     def schedule(self, view, reasons):
    ...         if not view.running:
    ...             super().schedule(view, reasons)
    >>> register_scheduler("patient", Patient)
    >>> make_scheduler("patient")
    Patient()
    >>> unregister_scheduler("patient")
"""

from __future__ import annotations

import heapq
import re
from collections import defaultdict
from typing import Any

from hpcnb.batchsim.engine import InvocationReason, JobRecord, JobStatus, SchedulerView
from hpcnb.batchsim.jobs import JobType
from hpcnb.batchsim.scheduler import FCFS, SJF, ConservativeBackfilling, EasyBackfilling, Scheduler
from hpcnb.errors import InvalidInputError
from hpcnb.plugins import PluginError, Registry, is_reference

__all__ = [
    "DRF",
    "SCHEDULERS",
    "ElastiSimFCFS",
    "SRTF",
    "MalleableEasy",
    "expand_into_idle",
    "make_scheduler",
    "register_scheduler",
    "shrink_to_admit",
    "unregister_scheduler",
]


def _pending_release(view: SchedulerView) -> int:
    """Nodes of shrinks ordered but not yet in effect."""
    return sum(r.nodes - r.target for r in view.running)


def _headroom(recs: list[JobRecord]) -> int:
    """Nodes the jobs could give up by shrinking to their minimum sizes."""
    return sum(r.target - r.job.num_nodes_min for r in recs)


def _reclaimable(view: SchedulerView) -> int:
    """Nodes that shrinking the running resizable jobs could free, pending shrinks included."""
    return _pending_release(view) + _headroom([r for r in view.running if r.type.resizable])


def shrink_to_admit(view: SchedulerView, need: int, victims: list[JobRecord]) -> bool:
    """Shrink ``victims`` (in the given order) so that ``need`` nodes become free.

    Counts nodes already free and nodes of shrinks still pending. Shrinks nothing if
    the victims' headroom cannot cover the gap.

    Args:
        view: The scheduler's view, whose ``shrink`` action is used.
        need: Nodes that must be free.
        victims: Running resizable jobs that may be shrunk, first shrunk first.

    Returns:
        Whether enough nodes are (or will be, at the victims' next scheduling points)
        free.
    """
    gap = need - view.free_nodes - _pending_release(view)
    if gap <= 0:
        return True
    if _headroom(victims) < gap:
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

    Args:
        view: The scheduler's view, whose ``expand`` action is used.
        candidates: Running resizable jobs that may grow, first served first.
        gain: Least ratio of run time saved to reconfiguration cost for a growth.
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
    """Shortest remaining time first; shrinks longer resizable jobs to admit shorter ones."""

    name = "srtf"

    def act(self, view: SchedulerView) -> None:
        """Start by remaining time; shrink longer resizable jobs; expand when idle."""
        order = sorted((view.requested_time(r), i, r) for i, r in enumerate(view.queue))
        remaining = {r.id: view.remaining_time(r) for r in view.running if r.type.resizable}
        reclaim = _reclaimable(view)
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
                reclaim = _reclaimable(view)
        if not view.queue and view.free_nodes > 0:
            growable = [r for r in view.running if r.type.resizable]
            growable.sort(key=lambda r: (not r.at_point, view.remaining_time(r)))
            expand_into_idle(view, growable)


class DRF(Scheduler):
    """Dominant resource fairness over nodes and GPUs: the least-served user goes first."""

    name = "drf"

    def act(self, view: SchedulerView) -> None:
        """Serve the user with the smallest dominant share, repeatedly."""
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
    """EASY backfilling that shrinks resizable jobs for the queue head and grows them when idle.

    Args:
        gain: A job grows into idle nodes only if the run time saved exceeds ``gain``
            times the reconfiguration cost.
    """

    name = "malleable"

    def __init__(self, gain: float = 2.0) -> None:
        self.gain = gain

    def act(self, view: SchedulerView) -> None:
        """EASY pass; shrink to admit the head; expand into idle nodes when nothing waits."""
        super().act(view)
        if view.queue:
            head = view.queue[0]
            victims = [r for r in view.running if r.type.resizable]
            victims.sort(key=lambda r: (-(r.target - r.job.num_nodes_min), r.id))
            if shrink_to_admit(view, self.reserve_size(head), victims):
                super().act(view)
        if not view.queue and view.free_nodes > 0:
            growable = [r for r in view.running if r.type.resizable]
            growable.sort(key=lambda r: (not r.at_point, r.id))
            expand_into_idle(view, growable, self.gain)


class ElastiSimFCFS(Scheduler):
    """ElastiSim's example policy: FCFS that molds, expands malleable jobs, grants evolving.

    Our reading of the scheduling algorithm of ElastiSim's example project (written here,
    not ported). The default, ``expand="invocation"``, acts per invocation type as that
    algorithm does:

    * a job at a **scheduling point** (malleable, or adaptive without an evolving
      request) grows by ``min(free, maximum - current)`` nodes;
    * an **evolving request** is granted when it shrinks, or when enough nodes are free
      to grow; only that job is touched (nodes a shrink frees wait for the next walk);
    * a **submission**, **completion** or periodic tick walks the waiting jobs in
      submission order: a rigid job starts when its node count is free, any other job
      gets ``min(free, maximum)`` nodes if that reaches its minimum; the first job that
      cannot start ends the walk. Running jobs are not visited there.

    Two looser readings merge every invocation into one pass that grants evolving
    requests and then walks waiting and running malleable jobs together in submission
    order, growing a running malleable job with no resize pending by ``min(free, maximum
    - current)``: at any invocation (``expand="any"``; the nodes are reserved at once and
    the job takes them at its next scheduling point) or only while it sits at a
    scheduling point (``expand="point"``).

    Args:
        expand: ``"invocation"``, ``"any"`` or ``"point"`` (see above).
    """

    name = "elastisim-fcfs"

    def __init__(self, expand: str = "invocation") -> None:
        if expand not in ("point", "any", "invocation"):
            raise InvalidInputError(
                f"ElastiSimFCFS(expand={expand!r}): expected 'point', 'any' or 'invocation'"
            )
        self.expand = expand

    def schedule(self, view: SchedulerView, reasons: frozenset[InvocationReason]) -> None:
        """Act per invocation as the example algorithm does (``expand="invocation"``).

        ElastiSim invokes the algorithm once per message: a job at a scheduling point
        (malleable, or adaptive without an evolving request) grows by
        ``min(free, maximum - current)``; a job's evolving request is granted when it
        shrinks or when enough nodes are free; a submission or completion walks the
        waiting jobs. Only that invocation's job is touched, so nodes freed by a shrink
        wait for the next submission or completion. Other modes: the base behaviour.

        Args:
            view: The system as the scheduler sees it, with the actions it may take.
            reasons: Why the scheduler is invoked at this time stamp.
        """
        if self.expand != "invocation":
            super().schedule(view, reasons)
            return
        at_point = sorted((r for r in view.running if r.at_point), key=lambda r: r.seq)
        for rec in at_point:
            want = rec.evolving_request
            if want is not None:
                if want < rec.target or want - rec.nodes <= view.free_nodes:
                    view.resize(rec, want)
                continue
            if rec.type is JobType.ADAPTIVE and _has_evolving_model(rec):
                continue  # its request equals its size: ElastiSim sends nothing
            if rec.type in (JobType.MALLEABLE, JobType.ADAPTIVE):
                grow = min(view.free_nodes, rec.job.num_nodes_max - rec.target)
                if grow > 0:
                    view.expand(rec, rec.target + grow)
        walk = {InvocationReason.JOB_SUBMIT, InvocationReason.JOB_COMPLETED}
        walk.add(InvocationReason.PERIODIC)
        if reasons & walk:
            self._walk_queue(view)

    @staticmethod
    def _walk_queue(view: SchedulerView) -> None:
        for rec in view.queue:  # lazily: the walk ends at the first job that cannot start
            size = ElastiSimFCFS._walk_size(view, rec)
            if size is None:
                return
            view.start(rec, size)

    @staticmethod
    def _walk_size(view: SchedulerView, rec: JobRecord) -> int | None:
        """The size the walk starts a waiting job with, or ``None`` (the walk stops)."""
        job = rec.job
        if job.type is JobType.RIGID:
            return job.num_nodes if job.num_nodes <= view.free_nodes else None
        size = min(view.free_nodes, job.num_nodes_max)
        return size if size >= job.num_nodes_min else None

    def act(self, view: SchedulerView) -> None:
        """Grant evolving requests, then walk the jobs in submission order."""
        if view.free_nodes <= 0:  # nothing can start or grow
            return
        growable = [
            r
            for r in view.running
            if r.type is JobType.MALLEABLE
            and r.target == r.nodes
            and (r.at_point or self.expand == "any")
        ]
        growable.sort(key=lambda r: r.seq)
        # lazily: the walk stops at the first job that cannot start
        for rec in heapq.merge(growable, view.queue, key=lambda r: r.seq):
            if view.free_nodes <= 0:
                return
            job = rec.job
            if rec.status is JobStatus.RUNNING:
                grow = min(view.free_nodes, job.num_nodes_max - rec.target)
                if grow > 0:
                    view.expand(rec, rec.target + grow)
                continue
            size = self._walk_size(view, rec)
            if size is None:
                return
            view.start(rec, size)


def _has_evolving_model(rec: JobRecord) -> bool:
    """Whether the phase a job at a point is about to run has an evolving request."""
    request = getattr(rec.job.work, "evolving_request", None)
    return request is not None and request(rec.unit, rec.active) is not None


def _check_scheduler(obj: Any) -> str | None:
    """The registry's check: an error text unless ``obj`` is a :class:`Scheduler` subclass."""
    if isinstance(obj, type) and issubclass(obj, Scheduler):
        return None
    if isinstance(obj, Scheduler):
        return f"{obj!r} is an instance; register its class, a subclass of Scheduler"
    if isinstance(obj, type):
        shown = obj.__name__
    elif hasattr(obj, "__name__"):  # a function or a module
        shown = f"{obj.__name__} (a {type(obj).__name__})"
    else:
        shown = repr(obj) if len(repr(obj)) <= 60 else repr(obj)[:60] + "..."
    return f"{shown} is not a subclass of hpcnb.batchsim.scheduler.Scheduler"


_NAME = re.compile(r"[a-z0-9][a-z0-9_.+-]*")

#: The registered schedulers by name: a :class:`~hpcnb.plugins.Registry` of
#: :class:`Scheduler` subclasses (add with :func:`register_scheduler`).
SCHEDULERS: Registry[type[Scheduler]] = Registry("scheduler", check=_check_scheduler)


def register_scheduler(name: str, cls: type[Scheduler], *, replace: bool = False) -> None:
    """Make a scheduler available by name to :func:`make_scheduler`, the CLI and experiments.

    Args:
        name: Lower-case name (letters, digits, ``_ . + -``), as given to
            ``hpcnb batchsim simulate --scheduler``.
        cls: A :class:`Scheduler` subclass; :func:`make_scheduler` calls it with the
            keyword arguments it is given.
        replace: Replace a scheduler already registered under ``name`` (else an error).

    Raises:
        PluginError: The name is malformed or taken, or ``cls`` is not a
            :class:`Scheduler` subclass.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PluginError(
            f"register_scheduler({name!r}): a name is lower-case letters, digits and _ . + - "
            "(starting with a letter or digit)"
        )
    SCHEDULERS.register(name, cls, replace=replace)


def unregister_scheduler(name: str) -> None:
    """Remove a registered scheduler.

    Args:
        name: The registered name.

    Raises:
        PluginError: No scheduler has that name.
    """
    if name not in SCHEDULERS:
        raise PluginError(f"unregister_scheduler({name!r}): no such scheduler")
    SCHEDULERS.unregister(name)


def make_scheduler(name: str, **kwargs: Any) -> Scheduler:
    """Return a new scheduler by its registered name, or import it by reference.

    Built-in names (case-insensitive): ``fcfs``, ``sjf``, ``srtf``, ``drf``, ``easy``,
    ``conservative``, ``malleable``, ``elastisim-fcfs``; others are added with
    :func:`register_scheduler`. ``"package.module:Class"`` imports ``package.module``
    and uses its :class:`Scheduler` subclass ``Class`` (``"package.module:"`` imports a
    module that registers one scheduler).

    Args:
        name: A registered name or a ``"package.module:Class"`` reference.
        **kwargs: Keyword arguments of the scheduler's class (``gain=0.5`` for
            ``malleable``).

    Raises:
        PluginError: Unknown name (the message lists the registered ones), or a reference
            that does not import or does not name a :class:`Scheduler` subclass.

    Example:
        >>> make_scheduler("malleable", gain=0.5).gain
        0.5
        >>> make_scheduler("hpcnb.batchsim.scheduler:EasyBackfilling")
        EasyBackfilling()
    """
    key = name if is_reference(name) else name.lower()
    return SCHEDULERS.get(key)(**kwargs)


# The built-in policies. A new policy of this package is written above and added here.
for _builtin in (
    FCFS,
    SJF,
    SRTF,
    DRF,
    EasyBackfilling,
    ConservativeBackfilling,
    MalleableEasy,
    ElastiSimFCFS,
):
    register_scheduler(_builtin.name, _builtin)
del _builtin
