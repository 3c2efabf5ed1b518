"""The scheduler base class and the classic queue policies.

A scheduler subclasses :class:`Scheduler` and implements ``act(view)``: it looks at
``view.queue`` (waiting jobs in submit order), ``view.running`` and ``view.free_nodes``
and acts with ``view.start``, ``view.resize`` / ``expand`` / ``shrink`` and
``view.kill``. The simulator calls ``schedule(view, reasons)``, which grants the
evolving requests first when one is among the reasons and then runs ``act``; a policy
that handles the reasons itself overrides ``schedule`` instead.

Policies here: strict :class:`FCFS`, :class:`SJF`, :class:`EasyBackfilling` and
:class:`ConservativeBackfilling`. Rigid jobs start at their size; other jobs start
at their preferred size when it fits, else at the largest size >= their minimum
that fits (:meth:`Scheduler.start_size`).

A scheduler is known by name (``hpcnb batchsim simulate --scheduler NAME``, the
experiment drivers) once registered with
:func:`~hpcnb.batchsim.policies.register_scheduler` (the built-in ones are registered
at the end of :mod:`~hpcnb.batchsim.policies`), or by reference without registering:
``--scheduler package.module:Class`` imports the module and runs its subclass.
"""

from __future__ import annotations

import math

from hpcnb.batchsim.engine import InvocationReason, JobRecord, SchedulerView, shadow_time
from hpcnb.batchsim.jobs import JobType
from hpcnb.errors import InvalidStateError

__all__ = [
    "FCFS",
    "SJF",
    "ConservativeBackfilling",
    "EasyBackfilling",
    "Scheduler",
    "shadow_time",
]


class Scheduler:
    """Base class: override :meth:`act` (or :meth:`schedule`).

    A subclass always runs its own :meth:`schedule` and :meth:`act`: the simulator's
    compiled rigid-job kernels stand in only for exactly :class:`FCFS` and
    :class:`EasyBackfilling`, never for their subclasses.

    Attributes:
        name: Short name used on the command line and in plots.
    """

    name = "base"

    def schedule(self, view: SchedulerView, reasons: frozenset[InvocationReason]) -> None:
        """Act on the system; called once per time stamp at which something happened.

        Grants the evolving requests (:meth:`grant_evolving_requests`) when one is among
        the ``reasons``, then runs the policy's :meth:`act`. Override this instead of
        :meth:`act` for a policy that handles the reasons itself.

        Args:
            view: The system as the scheduler sees it, with the actions it may take.
            reasons: Why the scheduler is invoked at this time stamp.
        """
        if InvocationReason.EVOLVING_REQUEST in reasons:
            self.grant_evolving_requests(view)
        self.act(view)

    def act(self, view: SchedulerView) -> None:
        """Start, resize or kill jobs: the policy itself, run by :meth:`schedule`.

        Args:
            view: The system as the scheduler sees it, with the actions it may take.
        """
        raise NotImplementedError

    @staticmethod
    def start_size(view: SchedulerView, rec: JobRecord, free: int | None = None) -> int | None:
        """Return the size to start ``rec`` with on ``free`` nodes, or ``None`` if none fits.

        Args:
            view: The scheduler's view (its free nodes are the default ``free``).
            rec: The waiting job.
            free: Nodes to fit the job into (default: the nodes free now).
        """
        free = view.free_nodes if free is None else free
        job = rec.job
        if job.num_nodes <= free:
            return job.num_nodes
        if job.type is not JobType.RIGID and job.num_nodes_min <= free:
            return free
        return None

    @staticmethod
    def grant_evolving_requests(view: SchedulerView) -> None:
        """Grant the evolving requests of jobs at scheduling points where nodes allow.

        Shrinks are always granted; growths when enough nodes are free (else the
        request lapses, as in ElastiSim when the scheduler does not answer it).
        """
        for rec in list(view.running):
            want = rec.evolving_request
            if want is None or want == rec.target:
                continue
            if want < rec.target or want - rec.nodes <= view.free_nodes:
                view.resize(rec, want)

    @staticmethod
    def reserve_size(rec: JobRecord) -> int:
        """Return the size a reservation holds for a waiting job (its smallest start)."""
        job = rec.job
        return job.num_nodes if job.type is JobType.RIGID else job.num_nodes_min

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FCFS(Scheduler):
    """Strict first-come first-served: no job starts before an earlier-submitted one."""

    name = "fcfs"

    def act(self, view: SchedulerView) -> None:
        """Start jobs in submit order until the first that does not fit."""
        queue = view.queue
        while queue:  # only the head is looked at: O(started) per pass
            rec = queue[0]
            size = self.start_size(view, rec)
            if size is None:
                return
            view.start(rec, size)


class SJF(Scheduler):
    """Shortest job first by requested time; jobs that do not fit are passed over."""

    name = "sjf"

    def act(self, view: SchedulerView) -> None:
        """Start waiting jobs by increasing requested time (ties: submit order)."""
        order = sorted(enumerate(view.queue), key=lambda p: (view.requested_time(p[1]), p[0]))
        for _, rec in order:
            size = self.start_size(view, rec)
            if size is not None:
                view.start(rec, size)
            if view.free_nodes == 0:
                return


class EasyBackfilling(Scheduler):
    """EASY backfilling (Lifka 1995; Mu'alem and Feitelson 2001).

    Jobs start in submit order while they fit. The first that does not fit gets a
    reservation at the *shadow time* (when enough running jobs are expected to have
    ended, by their requested times). A later job may start now if it fits and either
    ends by the shadow time or uses only the *extra* nodes left over at the shadow time.
    """

    name = "easy"

    def act(self, view: SchedulerView) -> None:
        """Start in order, reserve for the head, backfill the rest.

        The backfill candidates come from the view's tree of minima
        (:meth:`~hpcnb.batchsim.engine.SchedulerView.fit_index`) in submit order, so a
        pass costs O(log n) per job it examines rather than a scan of the queue; the test
        each candidate passes is the rule above.
        """
        queue = view.queue
        while queue:
            size = self.start_size(view, queue[0])
            if size is None:
                break
            view.start(queue[0], size)
        if len(queue) < 2 or view.free_nodes == 0:
            return
        # only jobs whose smallest size fits now can be backfilled (free only shrinks below)
        head = queue[0]
        index = view.fit_index()
        now = view.time
        if index.first(head.seq + 1, view.free_nodes, view.free_nodes, now, math.inf) < 0:
            return
        shadow, extra = view.reservation(self.reserve_size(head))
        lo = head.seq + 1
        while view.free_nodes > 0:
            seq = index.first(lo, view.free_nodes, extra, now, shadow)
            if seq < 0:
                return
            rec = view.record(seq)
            lo = seq + 1
            size = self.start_size(view, rec)
            if size is None:
                continue
            if now + view.requested_time(rec) <= shadow:
                view.start(rec, size)
            elif size <= extra:
                view.start(rec, size)
                extra -= size


class ConservativeBackfilling(Scheduler):
    """Conservative backfilling: every waiting job holds a reservation.

    At each invocation the reservations are rebuilt in submit order on the profile of
    free nodes (running jobs released at their expected ends): each job takes the
    earliest slot of its requested time that fits without moving an earlier job's
    reservation. Jobs whose slot begins now start. Rebuilding at every invocation is
    conservative backfilling with schedule compression.
    """

    name = "conservative"

    def act(self, view: SchedulerView) -> None:
        """Rebuild the reservation profile and start the jobs whose slot is now."""
        now = view.time
        # profile: sorted breakpoint times and free nodes from each breakpoint on
        times = [now]
        free = [view.free_nodes]
        for end, nodes in sorted((view.expected_end(r), r.nodes) for r in view.running):
            if end <= times[-1]:
                free[-1] += nodes
            else:
                times.append(end)
                free.append(free[-1] + nodes)
        for rec in list(view.queue):
            need = self.reserve_size(rec)
            start_now = self.start_size(view, rec)
            length = view.requested_time(rec)
            slot = self._earliest(times, free, need, length)
            if slot == 0 and start_now is not None:
                view.start(rec, start_now)
                need = start_now
            self._reserve(times, free, slot, need, times[slot] + length)

    @staticmethod
    def _earliest(times: list[float], free: list[int], need: int, length: float) -> int:
        for k in range(len(times)):
            if free[k] < need:
                continue
            end = times[k] + length
            j = k + 1
            while j < len(times) and times[j] < end and free[j] >= need:
                j += 1
            if j >= len(times) or times[j] >= end:
                return k
        raise InvalidStateError("profile ends with all nodes free; a slot always exists")

    @staticmethod
    def _reserve(times: list[float], free: list[int], k: int, need: int, end: float) -> None:
        j = k
        while j < len(times) and times[j] < end:
            j += 1
        if (j < len(times) and times[j] == end) or math.isinf(end):
            pass
        else:
            times.insert(j, end)
            free.insert(j, free[j - 1])
        for m in range(k, j):
            free[m] -= need
