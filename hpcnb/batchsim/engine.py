"""The discrete-event core and the ElastiSim-like scheduler protocol.

Events live in a binary heap keyed ``(time, kind, sequence)``: the :class:`Event` kind
is an ordered rank, so at equal times unit ends (which free nodes) come before PFS
transfer completions, submissions and periodic ticks, and events of one kind keep the
order they were created in. Each event carries a typed payload (the job record, or the
link and its token) that the main loop matches on. All events of one time stamp are
handled, then the scheduler is invoked once with the set of reasons
(:class:`InvocationReason`) and a :class:`SchedulerView` on which it acts: ``start`` a
waiting job, ``resize`` (``expand`` / ``shrink``) a running malleable or evolving job,
``kill`` a job.

A running job works through its units; between two units it sits at a *scheduling
point*. Jobs that may change size (malleable, evolving, adaptive) pause there while
the scheduler runs, so a resize of such a job takes effect at once (nodes of a
shrink are free in the same invocation); a resize ordered for a job in the middle of
a unit takes effect at its next scheduling point (nodes of an expansion are
reserved at once, nodes of a shrink are freed then). Each resize pays the work
model's reconfiguration cost before the next unit.

A unit runs as a list of segments (:meth:`WorkModel.unit_segments`): timed segments are
single events; PFS transfers become flows of the engine's
:class:`~hpcnb.batchsim.network.FlowNetwork` (one per node of the job, or one for the
root), each through its node's link (a bound: on a crossbar the link is the node's own)
and the PFS read or write link, which the flows of all jobs share max-min fairly, so
their completion times move whenever another job starts or finishes a transfer. With
``network="isolated"`` each job sees the PFS alone (the contention-free model); with
``fairness="ptask"`` flows share by equal progress of their transfers, as SimGrid's
parallel-task model ``ptask_L07`` that ElastiSim uses, instead of equal bytes per second.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, ClassVar, Protocol, cast, overload

import numpy as np

from hpcnb.batchsim.jobs import FixedWork, Job, JobType, RunContext
from hpcnb.batchsim.network import FlowNetwork
from hpcnb.batchsim.nodes import ALLOCATION_POLICIES, NodePool, group_traffic
from hpcnb.batchsim.platform import (
    Platform,
    Segment,
    merge_segments,
    nominal_duration,
)
from hpcnb.errors import HpcnbError, InvalidInputError, InvalidStateError

if TYPE_CHECKING:  # the index needs Numba: imported where EASY first asks for it
    from hpcnb.batchsim.index import FitIndex

__all__ = [
    "Event",
    "InvocationReason",
    "JobRecord",
    "JobStatus",
    "SchedulerError",
    "SchedulerView",
    "SchedulingPolicy",
    "SimulationError",
    "Simulator",
    "QueueIndexError",
    "WaitingQueue",
    "shadow_time",
]


class Event(IntEnum):
    """Kinds of simulation events; at one time stamp they are handled in this order."""

    UNIT_END = 0  # a timed segment ends (it may end a unit and free nodes)
    LINK = 1  # a flow of the shared network may have completed
    SUBMIT = 2  # a job is submitted
    PERIODIC = 3  # the periodic scheduler tick


@dataclass(slots=True)
class _SegmentEnd:
    """A job's timed segment ends, unless the job ended meanwhile (epoch changed)."""

    kind: ClassVar[Event] = Event.UNIT_END
    rec: JobRecord
    epoch: int


@dataclass(slots=True)
class _LinkCompletion:
    """The next flow completes, unless the rates changed since (token changed)."""

    kind: ClassVar[Event] = Event.LINK
    token: int


@dataclass(slots=True)
class _Submission:
    """A job enters the queue."""

    kind: ClassVar[Event] = Event.SUBMIT
    rec: JobRecord


@dataclass(slots=True)
class _Tick:
    """The periodic scheduler invocation."""

    kind: ClassVar[Event] = Event.PERIODIC


_Payload = _SegmentEnd | _LinkCompletion | _Submission | _Tick


class InvocationReason(StrEnum):
    """Why the scheduler is invoked (ElastiSim's invocation types)."""

    JOB_SUBMIT = "job_submit"
    JOB_COMPLETED = "job_completed"
    SCHEDULING_POINT = "scheduling_point"
    EVOLVING_REQUEST = "evolving_request"
    PERIODIC = "periodic"


class JobStatus(StrEnum):
    """Life cycle of a job in a simulation."""

    PENDING = "pending"
    WAITING = "waiting"
    RUNNING = "running"
    COMPLETED = "completed"
    KILLED = "killed"


class SchedulerError(HpcnbError, RuntimeError):
    """The scheduler asked for something impossible (the message says what)."""


class SimulationError(HpcnbError, RuntimeError):
    """The simulation cannot finish (for instance jobs left waiting forever)."""


class JobRecord:
    """A job's state during a simulation, as the scheduler sees it.

    Attributes:
        job: The submitted :class:`Job`.
        status: Current :class:`JobStatus`.
        nodes: Nodes allocated now (an expansion reserves them at once).
        target: Size after the next reconfiguration.
        active: Size the current unit runs with.
        unit: Index of the unit being run (number of units completed).
        start_time: Start time (``nan`` before the start).
        end_time: End time (``nan`` before the end).
        at_point: Whether the job sits at a scheduling point now.
        evolving_request: Size an evolving job asked for at its last point, or ``None``.
        resizes: ``(time, old, new)`` for each applied reconfiguration.
        seq: Position in submission order (submit time, then input order).
        hosts: Ids of the nodes held, in the order taken (with node identity; else empty).
    """

    __slots__ = (
        "active",
        "at_point",
        "end_time",
        "epoch",
        "evolving_request",
        "hosts",
        "job",
        "link",
        "nodes",
        "resizes",
        "segments",
        "seq",
        "start_time",
        "status",
        "target",
        "unit",
        "unit_end",
    )

    def __init__(self, job: Job) -> None:
        self.job = job
        self.seq = 0  # position in submission order
        self.hosts: list[int] = []  # node ids held (with node identity)
        self.status = JobStatus.PENDING
        self.nodes = 0
        self.target = 0
        self.active = 0
        self.unit = 0
        self.start_time = math.nan
        self.end_time = math.nan
        self.unit_end = math.nan
        self.at_point = False
        self.evolving_request: int | None = None
        self.resizes: list[tuple[float, int, int]] = []
        self.epoch = 0
        self.segments: deque[Segment] = deque()
        self.link = False  # whether a flow of the job is active

    @property
    def id(self) -> int:
        """The job id."""
        return self.job.id

    @property
    def type(self) -> JobType:
        """The job type."""
        return self.job.type

    def __repr__(self) -> str:
        return f"JobRecord(id={self.id}, {self.type}, {self.status}, nodes={self.nodes})"


class QueueIndexError(HpcnbError, IndexError):
    """A position outside the waiting queue."""


class WaitingQueue(Sequence[JobRecord]):
    """The waiting jobs in submit order: a read-only sequence for schedulers.

    ``len``, truth, ``queue[0]`` and membership cost O(1), iteration O(1) per item (it is
    lazy: a scheduler that stops at the first job that cannot start pays for the jobs it
    looked at, not for the queue), and
    the engine adds and removes jobs in amortised O(1): jobs sit in a list in submission
    order with removed ones skipped (the list is compacted when they outnumber the
    waiting ones), so a scheduler that looks only at the head pays nothing for a long
    queue. ``queue[k]`` for ``k > 0`` walks ``k`` items; slices copy, as ``list(queue)``.
    """

    __slots__ = ("_dead", "_head", "_index", "_jobs", "_order")

    def __init__(self) -> None:
        self._jobs: dict[int, JobRecord] = {}  # waiting jobs by submission position
        self._order: list[JobRecord] = []  # waiting and removed jobs, by position
        self._head = 0  # removed jobs before it are skipped for good
        self._dead = 0  # removed jobs still in _order[_head:]
        self._index: FitIndex | None = None

    def __len__(self) -> int:
        return len(self._jobs)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __iter__(self) -> Iterator[JobRecord]:
        """Yield the jobs waiting when they are reached (lazily, in submit order).

        A job that leaves the queue while the iteration runs (started or killed by the
        scheduler) is not yielded after it left, so ``for rec in view.queue:
        view.start(rec)`` visits every job once; ``list(view.queue)`` takes a snapshot.
        """
        order, jobs = self._order, self._jobs
        head = self._head
        while head < len(order) and jobs.get(order[head].seq) is not order[head]:
            head += 1  # removed jobs at the front are skipped for good
        self._dead -= head - self._head
        self._head = head
        for i in range(head, len(order)):
            rec = order[i]
            if jobs.get(rec.seq) is rec:
                yield rec

    def __contains__(self, rec: object) -> bool:
        return isinstance(rec, JobRecord) and self._jobs.get(rec.seq) is rec

    @overload
    def __getitem__(self, k: int) -> JobRecord: ...

    @overload
    def __getitem__(self, k: slice) -> list[JobRecord]: ...

    def __getitem__(self, k: int | slice) -> JobRecord | list[JobRecord]:
        if isinstance(k, slice):
            return list(self)[k]
        n = len(self._jobs)
        if not -n <= k < n:
            raise QueueIndexError(f"queue index {k} out of range (length {n})")
        if k < 0:
            k += n
        if k == 0:
            order, jobs = self._order, self._jobs
            while jobs.get(order[self._head].seq) is not order[self._head]:
                self._head += 1
                self._dead -= 1
            return order[self._head]
        return next(itertools.islice(iter(self), k, None))

    def __repr__(self) -> str:
        return f"WaitingQueue({list(self)!r})"

    def _add(self, rec: JobRecord, requested: float | None) -> None:
        self._jobs[rec.seq] = rec
        self._order.append(rec)
        if self._index is not None and requested is not None:
            self._index.add(rec.seq, rec.job.num_nodes_min, rec.job.num_nodes, requested)

    def _remove(self, rec: JobRecord) -> None:
        del self._jobs[rec.seq]
        self._dead += 1
        if self._dead > 32 and self._dead > len(self._jobs):
            jobs = self._jobs
            self._order = [r for r in self._order[self._head :] if jobs.get(r.seq) is r]
            self._head = self._dead = 0
        if self._index is not None:
            self._index.remove(rec.seq)


def shadow_time(
    now: float, free: int, need: int, releases: Iterable[tuple[float, int]]
) -> tuple[float, int]:
    """Return EASY's shadow time and extra nodes.

    Args:
        now: Current time.
        free: Nodes free now.
        need: Nodes the queue head needs.
        releases: ``(expected end, nodes)`` of running jobs.

    Returns:
        ``(shadow, extra)``: the earliest time at which ``need`` nodes are free (all jobs
        ending at that time counted) and the nodes left over then; ``(inf, 0)`` if never.
    """
    if free >= need:
        return now, free - need
    ordered = sorted(releases)
    i = 0
    while i < len(ordered):
        end = ordered[i][0]
        while i < len(ordered) and ordered[i][0] == end:
            free += ordered[i][1]
            i += 1
        if free >= need:
            return end, free - need
    return math.inf, 0


class SchedulerView:
    """The scheduler's window on the system and its means to act.

    Attributes:
        time: Current simulated time (s).
        platform: The machine.
        queue: Waiting jobs in submit order (do not modify; use the actions).
        running: Running jobs in start order.
        free_nodes: Nodes neither allocated nor reserved.
        ctx: Context for timing work models.
        allocations: Counts the changes of allocated nodes (a start, an end, a resize): a
            scheduler may keep what it derived from :attr:`running` while it is unchanged.
    """

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim
        self.time = 0.0
        self.platform = sim.platform
        self.queue = WaitingQueue()
        self.running: list[JobRecord] = []
        self.free_nodes = sim.platform.num_nodes
        self.allocations = 0
        self._moving_ends = 0  # running jobs whose expected end moves with the clock
        # the availability profile of the running jobs of fixed end, as arrays for
        # profile_shadow: job seq -> (base, length) with end = base + length, its nodes
        n = len(sim.records)
        self._fix_base = np.zeros(n)
        self._fix_length = np.zeros(n)
        self._fix_nodes = np.zeros(n, dtype=np.int64)
        self._fix_seqs = np.zeros(n, dtype=np.int64)  # running seqs, [:_fix_len]
        self._fix_pos: dict[int, int] = {}
        self._fix_len = 0
        self._fix_scratch = (np.empty(n), np.empty(n, dtype=np.int64))
        self._kept_reservation: tuple[tuple[int, int], float, int] | None = None
        self.ctx = RunContext(sim.platform)
        self._requested: dict[int, float] = {}

    @property
    def total_nodes(self) -> int:
        """Nodes of the machine."""
        return self.platform.num_nodes

    def start(self, rec: JobRecord, nodes: int | None = None) -> None:
        """Start a waiting job on ``nodes`` nodes (default: its ``num_nodes``).

        Args:
            rec: A job of :attr:`queue`.
            nodes: Nodes to start it on (default: its ``num_nodes``).

        Raises:
            SchedulerError: The job is not waiting, the size is outside the job's range
                (rigid jobs only take their own size) or not enough nodes are free.
        """
        n = rec.job.num_nodes if nodes is None else int(nodes)
        if rec.status is not JobStatus.WAITING:
            raise SchedulerError(f"start(job {rec.id}): job is {rec.status}, not waiting")
        if not rec.job.num_nodes_min <= n <= rec.job.num_nodes_max:
            raise SchedulerError(
                f"start(job {rec.id}, {n}): size outside [{rec.job.num_nodes_min}, "
                f"{rec.job.num_nodes_max}] of this {rec.type} job"
            )
        if n > self.free_nodes:
            raise SchedulerError(f"start(job {rec.id}, {n}): only {self.free_nodes} nodes free")
        self._sim._start(rec, n)

    def resize(self, rec: JobRecord, nodes: int) -> None:
        """Set the size of a running malleable / evolving / adaptive job.

        Growth reserves nodes now; the new size takes effect at the job's scheduling
        point (now, if it sits at one).

        Args:
            rec: A running resizable job.
            nodes: Its new size, within its ``[num_nodes_min, num_nodes_max]``.

        Raises:
            SchedulerError: Not running, not resizable, size out of range, or not
                enough free nodes.
        """
        n = int(nodes)
        if rec.status is not JobStatus.RUNNING or not rec.type.resizable:
            raise SchedulerError(f"resize(job {rec.id}): {rec.status} {rec.type} job")
        if not rec.job.num_nodes_min <= n <= rec.job.num_nodes_max:
            raise SchedulerError(
                f"resize(job {rec.id}, {n}): outside [{rec.job.num_nodes_min}, "
                f"{rec.job.num_nodes_max}]"
            )
        if n - rec.nodes > self.free_nodes:
            raise SchedulerError(
                f"resize(job {rec.id}, {n}): needs {n - rec.nodes}, {self.free_nodes} free"
            )
        self._sim._resize(rec, n)

    def expand(self, rec: JobRecord, nodes: int) -> None:
        """Grow a running job to ``nodes`` nodes (see :meth:`resize`).

        The extra nodes are reserved at once.

        Args:
            rec: A running resizable job.
            nodes: Its new size, above its current target.

        Raises:
            SchedulerError: ``nodes`` is not above the target, or :meth:`resize` refuses it
                (above the job's maximum, or more nodes than are free).
        """
        if nodes <= rec.target:
            raise SchedulerError(f"expand(job {rec.id}, {nodes}): not above {rec.target}")
        self.resize(rec, nodes)

    def shrink(self, rec: JobRecord, nodes: int) -> None:
        """Shrink a running job to ``nodes`` nodes (see :meth:`resize`).

        The freed nodes return to the pool at the job's next scheduling point (at once if it
        sits at one).

        Args:
            rec: A running resizable job.
            nodes: Its new size, below its current target.

        Raises:
            SchedulerError: ``nodes`` is not below the target, or :meth:`resize` refuses it.
        """
        if nodes >= rec.target:
            raise SchedulerError(f"shrink(job {rec.id}, {nodes}): not below {rec.target}")
        self.resize(rec, nodes)

    def kill(self, rec: JobRecord) -> None:
        """Kill a waiting or running job; its nodes are freed at once."""
        if rec.status not in (JobStatus.WAITING, JobStatus.RUNNING):
            raise SchedulerError(f"kill(job {rec.id}): job is {rec.status}")
        self._sim._finish(rec, JobStatus.KILLED)

    def requested_time(self, rec: JobRecord) -> float:
        """Return the time a job reserves: its walltime, else its model estimate.

        The estimate is the uncontended one (PFS not shared), computed once per job.
        """
        value = self._requested.get(rec.job.id)
        if value is None:
            value = self._requested[rec.job.id] = rec.job.requested_time(self.ctx)
        return value

    def fit_index(self) -> FitIndex:
        """Return the tree of minima over the waiting jobs (see :mod:`~hpcnb.batchsim.index`).

        Built on the first call from the queue as it stands; from then on the engine keeps
        it up to date as jobs arrive and leave. Its positions are the jobs' ``seq``; each
        leaf holds a job's ``num_nodes_min``, ``num_nodes`` and :meth:`requested_time`.
        """
        from hpcnb.batchsim.index import FitIndex

        queue = self.queue
        if queue._index is None:
            queue._index = FitIndex(len(self._sim.records))
            for rec in queue:
                queue._index.add(
                    rec.seq, rec.job.num_nodes_min, rec.job.num_nodes, self.requested_time(rec)
                )
        return queue._index

    def record(self, seq: int) -> JobRecord:
        """Return the job record at submission position ``seq`` (:attr:`JobRecord.seq`)."""
        return self._sim.records[seq]

    @staticmethod
    def fixed_end(rec: JobRecord) -> bool:
        """Whether a job's :meth:`expected_end` is a fixed time clipped to now once it runs.

        True for rigid jobs with a walltime or a single unit: their expected end moves only
        when the clock passes it, so a reservation computed from them stays valid while
        :attr:`allocations` is unchanged.
        """
        job = rec.job
        return job.type is JobType.RIGID and (job.walltime is not None or job.work.num_units == 1)

    def reservation(self, need: int) -> tuple[float, int]:
        """Return EASY's shadow time and extra nodes for a job that needs ``need`` nodes.

        The earliest time at which ``need`` nodes are free by the running jobs'
        :meth:`expected_end` (all jobs ending at one time counted together), and the nodes
        left over then; ``(now, free - need)`` if they are free now, ``(inf, 0)`` if never.
        When every running job has a fixed end (:meth:`fixed_end`) the profile is scanned
        by the compiled :func:`~hpcnb.batchsim.index.profile_shadow` and the answer is kept:
        while no node is allocated or freed (:attr:`allocations` unchanged) it stays valid
        until the clock passes it (ends already passed count as now, before it either way).
        Otherwise it is computed in Python from :meth:`expected_end`.

        Args:
            need: Nodes the job needs.
        """
        from hpcnb.batchsim.index import profile_shadow

        if self.free_nodes >= need:
            return self.time, self.free_nodes - need
        if self._moving_ends:
            releases = [(self.expected_end(r), r.nodes) for r in self.running]
            return shadow_time(self.time, self.free_nodes, need, releases)
        key = (self.allocations, need)
        kept = self._kept_reservation
        if kept is not None and kept[0] == key and kept[1] >= self.time:
            return kept[1], kept[2]
        shadow, extra = profile_shadow(
            self.time,
            self.free_nodes,
            need,
            self._fix_base,
            self._fix_length,
            self._fix_nodes,
            self._fix_seqs,
            self._fix_len,
            *self._fix_scratch,
        )
        self._kept_reservation = (key, float(shadow), int(extra))
        return float(shadow), int(extra)

    def _add_fixed(self, rec: JobRecord) -> None:
        """Enter a started job of fixed end into the profile."""
        seq, job = rec.seq, rec.job
        if job.walltime is not None:
            self._fix_base[seq], self._fix_length[seq] = rec.start_time, job.walltime
        else:  # one unit: it ends at unit_end (+ 0.0 keeps the value bit for bit)
            self._fix_base[seq], self._fix_length[seq] = rec.unit_end, 0.0
        self._fix_nodes[seq] = rec.nodes
        self._fix_pos[seq] = self._fix_len
        self._fix_seqs[self._fix_len] = seq
        self._fix_len += 1

    def _drop_fixed(self, rec: JobRecord) -> None:
        """Take an ended job out of the profile (the last entry fills its place)."""
        pos = self._fix_pos.pop(rec.seq)
        self._fix_len -= 1
        last = int(self._fix_seqs[self._fix_len])
        if last != rec.seq:
            self._fix_seqs[pos] = last
            self._fix_pos[last] = pos

    def remaining_time(self, rec: JobRecord) -> float:
        """Return the estimated remaining run time of a job at its current (target) size.

        For waiting jobs: the requested time; for running ones: the current unit's end
        plus the model's estimate of the units after it.
        """
        if rec.status is JobStatus.WAITING:
            return self.requested_time(rec)
        rest = rec.job.work.estimate(max(rec.target, 1), self.ctx, rec.unit + 1)
        current = 0.0 if rec.at_point else max(0.0, rec.unit_end - self.time)
        if rec.at_point:
            rest = rec.job.work.estimate(max(rec.target, 1), self.ctx, rec.unit)
        return current + rest

    def expected_end(self, rec: JobRecord) -> float:
        """Return when a running job is expected to end for reservations.

        Rigid jobs: start + requested time (or now, if already over it).
        """
        job = rec.job
        if job.type is JobType.RIGID:
            if job.walltime is not None:
                return max(self.time, rec.start_time + job.walltime)
            if job.work.num_units == 1:  # its one unit ends at unit_end
                return max(self.time, rec.unit_end)
        return self.time + self.remaining_time(rec)


class SchedulingPolicy(Protocol):
    """What the simulator needs of a scheduler: a name and :meth:`schedule`.

    Subclass :class:`~hpcnb.batchsim.scheduler.Scheduler`, which satisfies this and adds
    helpers (start sizes, reservations, evolving requests).

    Attributes:
        name: Short name used in messages, results and plots.
    """

    name: str

    def schedule(self, view: SchedulerView, reasons: frozenset[InvocationReason]) -> None:
        """Act on the system; called once per time stamp at which something happened.

        Args:
            view: The system as the scheduler sees it, with the actions it may take.
            reasons: Why the scheduler is invoked at this time stamp.
        """
        ...


@dataclass(frozen=True)
class SimulationTrace:
    """Raw output of :meth:`Simulator.run` (and :meth:`Simulator.trace`).

    Attributes:
        records: Every job's final :class:`JobRecord`, in submit order.
        usage_times: Times at which the allocated node count changed.
        usage_nodes: Allocated nodes from each of those times on.
        invocations: Number of scheduler invocations.
        events: Number of events handled.
        node_log: Per-node state changes ``(time, node, state, running, expected)`` (with
            node identity; else ``None``).
    """

    records: Sequence[JobRecord]
    usage_times: np.ndarray
    usage_nodes: np.ndarray
    invocations: int
    events: int
    node_log: list[tuple[float, str, str, str, str]] | None = None


class Simulator:
    """Run a set of jobs on a platform under a scheduler.

    As in SimPy, :meth:`run` loops over :meth:`step`, which handles one event;
    :meth:`reset` sets up a run (``run(jobs)`` calls it), :meth:`peek` tells when the next
    event happens and ``run(until=t)`` stops after the events at ``t``, so a run can be
    advanced piece by piece and inspected between the pieces (:meth:`trace`).

    Args:
        platform: The machine.
        scheduler: Decides what runs (a :class:`SchedulingPolicy`, usually a subclass of
            :class:`~hpcnb.batchsim.scheduler.Scheduler`).
        scheduling_interval: Periodic invocation interval (s); 0 for none.
        on_scheduling_point: Invoke the scheduler when a resizable job reaches a point.
        clip_evolving_requests: Clip evolving requests to the job's size range.
        network: ``"shared"`` (flows of all jobs share the PFS links max-min fairly) or
            ``"isolated"`` (each job alone on the network: the contention-free model).
        fairness: ``"flow"`` (equal bytes per second per flow, SimGrid's flow model) or
            ``"ptask"`` (equal progress per transfer, SimGrid's ``ptask_L07``).
        node_links: Bound each PFS flow by its node's link and the TCP window over its
            route (``Platform.pfs_flow_bandwidth``).
        allocation: ``None`` (nodes are counted, not identified) or an allocation policy
            of :data:`~hpcnb.batchsim.nodes.ALLOCATION_POLICIES`: nodes get ids, the
            per-node state is logged (:attr:`SimulationTrace.node_log`) and, on a platform
            with a topology, collectives run as flows over its links.

    Raises:
        InvalidInputError: An unknown ``allocation``, ``network`` or ``fairness``.

    Attributes:
        records: The jobs' records of the current run, in submit order.
        invocations: Scheduler invocations so far in the current run.
        events: Events handled so far in the current run.

    Example:
        >>> from hpcnb.batchsim.jobs import FixedWork
        >>> from hpcnb.batchsim.scheduler import FCFS
        >>> sim = Simulator(Platform(2), FCFS())
        >>> sim.reset([Job(1, 0.0, JobType.RIGID, 2, FixedWork(5.0)),
        ...            Job(2, 1.0, JobType.RIGID, 1, FixedWork(1.0))])
        >>> _ = sim.run(until=1.0)
        >>> sim.now, [r.status.value for r in sim.records], sim.peek()
        (1.0, ['running', 'waiting'], 5.0)
        >>> [r.end_time for r in sim.run().records]
        [5.0, 6.0]
    """

    def __init__(
        self,
        platform: Platform,
        scheduler: SchedulingPolicy,
        scheduling_interval: float = 0.0,
        on_scheduling_point: bool = True,
        clip_evolving_requests: bool = True,
        network: str = "shared",
        fairness: str = "flow",
        node_links: bool = True,
        allocation: str | None = None,
    ) -> None:
        if allocation is not None and allocation not in ALLOCATION_POLICIES:
            raise InvalidInputError(
                f"allocation={allocation!r}: expected None or one of {ALLOCATION_POLICIES}"
            )
        self.allocation = allocation
        if network not in ("shared", "isolated"):
            raise InvalidInputError(f"network={network!r}: expected 'shared' or 'isolated'")
        if fairness not in ("flow", "ptask"):
            raise InvalidInputError(f"fairness={fairness!r}: expected 'flow' or 'ptask'")
        self.network = network
        self.fairness = fairness
        self.node_links = node_links
        self.platform = platform
        self.scheduler = scheduler
        self.interval = float(scheduling_interval)
        self.on_point = on_scheduling_point
        self.clip = clip_evolving_requests
        self.reset()

    # -- internal actions -------------------------------------------------------------
    def _push(self, time: float, payload: _Payload) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, payload.kind, self._seq, payload))

    def _alloc(self, delta: int) -> None:
        view = self._view
        view.free_nodes -= delta
        view.allocations += 1
        if self._usage_t and self._usage_t[-1] == view.time:
            self._usage_n[-1] = self.platform.num_nodes - view.free_nodes
        else:
            self._usage_t.append(view.time)
            self._usage_n.append(self.platform.num_nodes - view.free_nodes)

    def _ctx(self) -> RunContext:
        sharers = max(1, self._pfs_users)
        ctx = self._contexts.get(sharers)
        if ctx is None:
            ctx = self._contexts[sharers] = RunContext(self.platform, sharers)
        return ctx

    def _start(self, rec: JobRecord, n: int) -> None:
        view = self._view
        view.queue._remove(rec)
        view.running.append(rec)
        fixed = view.fixed_end(rec)
        view._moving_ends += not fixed
        rec.status = JobStatus.RUNNING
        rec.start_time = view.time
        rec.target = rec.active = n
        self._set_size(rec, n)
        work = rec.job.work
        if type(work) is FixedWork and self._pool is None:
            # fast path: one timed unit, no PFS (the segments would merge to this one)
            rec.at_point = False
            rec.unit_end = view.time + work.runtime
            self._push(rec.unit_end, _SegmentEnd(rec, rec.epoch))
            if fixed:
                view._add_fixed(rec)
            return
        self._pfs_users += work.uses_pfs
        ctx = self._ctx()
        self._schedule_unit(rec, rec.job.work.init_segments(n, ctx), ctx)
        if fixed:
            view._add_fixed(rec)

    def _schedule_unit(self, rec: JobRecord, extra: list[Segment], ctx: RunContext) -> None:
        rec.at_point = False
        where = f"job {rec.id}: unit {rec.unit} on {rec.active} nodes"
        try:
            segments = merge_segments(
                [*extra, *rec.job.work.unit_segments(rec.unit, rec.active, ctx)], where
            )
        except ValueError as exc:
            raise SimulationError(f"{exc} (check the work model)") from None
        p = self.platform
        nominal = nominal_duration(
            segments, p.pfs_read_bandwidth, p.pfs_write_bandwidth, ctx.pfs_sharers
        )
        rec.unit_end = self._view.time + nominal
        rec.segments = deque(segments)
        if not segments:  # an empty unit still ends through an event, never inside a call
            self._push(self._view.time, _SegmentEnd(rec, rec.epoch))
        else:
            self._next_segment(rec)

    def _next_segment(self, rec: JobRecord) -> None:
        """Start the job's next segment, or end its unit when none is left."""
        now = self._view.time
        if not rec.segments:
            self._unit_done(rec)
            return
        kind, amount = rec.segments.popleft()
        if kind == "time":
            self._push(now + amount, _SegmentEnd(rec, rec.epoch))
            return
        if kind == "compute" or kind.startswith("comm_"):
            compute, pattern, nbytes = 0.0, kind[5:], amount
            if kind == "compute":
                compute, pattern, nbytes = amount, "", 0.0
                if rec.segments and rec.segments[0][0].startswith("comm_"):
                    comm_kind, nbytes = rec.segments.popleft()
                    pattern = comm_kind[5:]
            self._start_collective(rec, compute, pattern, nbytes)
            return
        root = kind.endswith("_root")
        base = kind.removesuffix("_root")
        count = 1 if root else max(1, rec.active)
        per_flow = amount / count
        # the node's own link and the TCP window over its route to the PFS (ptask_L07)
        cap = self.platform.pfs_flow_bandwidth if self.node_links else math.inf
        resource = base if self.network == "shared" else (base, rec.id)
        if resource not in self._net.capacity:
            self._net.add_resource(resource, self._net.capacity[base])
        if self.fairness == "ptask":
            self._net.add(rec, 1.0, {resource: per_flow}, now, bound=cap / per_flow, count=count)
        else:
            self._net.add(rec, per_flow, {resource: 1.0}, now, bound=cap, count=count)
        rec.link = True
        self._reschedule_flows()

    def _start_collective(
        self, rec: JobRecord, compute: float, pattern: str, nbytes: float
    ) -> None:
        """Run compute and a collective together: one flow over the job's group links.

        The job's own node links bound it (the crossbar time of the collective, as
        :meth:`Platform.communication_time`); traffic between groups loads the groups'
        up and down links, shared with every other job's flows. Without node identity,
        or inside one group, it is a timed segment.
        """
        now = self._view.time
        n = rec.active
        private = self.platform.communication_time(pattern, nbytes, n) if pattern else 0.0
        duration = max(compute, private)
        topology = self.platform.topology
        usage: dict[Hashable, float] = {}
        if self._pool is not None and topology is not None and n > 1 and duration > 0:
            groups = [topology.group(h) for h in rec.hosts[:n]]
            out, inn = group_traffic(pattern, nbytes, groups)
            for direction, traffic in (("up", out), ("down", inn)):
                for g, amount in traffic.items():
                    resource = (
                        (direction, g) if self.network == "shared" else (direction, g, rec.id)
                    )
                    self._net.add_resource(resource, topology.uplink_bandwidth)
                    usage[resource] = amount
        if not usage:
            self._push(now + duration, _SegmentEnd(rec, rec.epoch))
            return
        self._net.add(rec, 1.0, usage, now, bound=1.0 / duration)
        rec.link = True
        self._reschedule_flows()

    def _reschedule_flows(self) -> None:
        when = self._net.next_completion(self._view.time)
        if when is not None:
            self._push(when, _LinkCompletion(self._net.token))

    def _unit_done(self, rec: JobRecord) -> None:
        rec.unit += 1
        if rec.unit >= rec.job.work.num_units:
            self._finish(rec, JobStatus.COMPLETED)
            self._reasons.add(InvocationReason.JOB_COMPLETED)
            return
        rec.at_point = True
        self._paused.append(rec)
        if rec.nodes > rec.target:  # a shrink ordered earlier takes effect now
            self._set_size(rec, rec.target)
        if rec.type.resizable and self.on_point:
            self._reasons.add(InvocationReason.SCHEDULING_POINT)
        if rec.type in (JobType.EVOLVING, JobType.ADAPTIVE):
            want = rec.job.work.evolving_request(rec.unit, rec.active)
            if want is not None and self.clip:
                want = min(max(want, rec.job.num_nodes_min), rec.job.num_nodes_max)
            if want is not None and want != rec.active:
                rec.evolving_request = want
                self._reasons.add(InvocationReason.EVOLVING_REQUEST)

    def _set_size(self, rec: JobRecord, n: int) -> None:
        """Allocate or free nodes so that the job holds ``n`` (ids too, with identity)."""
        delta = n - rec.nodes
        self._alloc(delta)
        pool = self._pool
        if pool is not None and delta:
            now = self._view.time
            if delta > 0:  # growth of a job between points: reserved until its next point
                reserved = rec.nodes > 0 and not rec.at_point
                rec.hosts += pool.take(delta, rec.id, now, reserved)
            else:
                pool.release(rec.hosts[n:], now)
                del rec.hosts[n:]
        rec.nodes = n

    def _resize(self, rec: JobRecord, n: int) -> None:
        if n > rec.nodes:
            self._set_size(rec, n)
        rec.target = n
        if rec.at_point and rec.nodes > n:
            self._set_size(rec, n)

    def _finish(self, rec: JobRecord, status: JobStatus) -> None:
        view = self._view
        if rec.status is JobStatus.WAITING:
            view.queue._remove(rec)
            rec.start_time = view.time
        else:
            view.running.remove(rec)
            if view.fixed_end(rec):
                view._drop_fixed(rec)
            else:
                view._moving_ends -= 1
            self._set_size(rec, 0)
            self._pfs_users -= rec.job.work.uses_pfs
        if rec.link:
            self._net.remove(rec, view.time)
            self._reschedule_flows()
        rec.link = False
        rec.status = status
        rec.end_time = view.time
        rec.epoch += 1
        rec.at_point = False
        self._open -= 1

    def _resume(self, rec: JobRecord) -> None:
        if rec.status is not JobStatus.RUNNING or not rec.at_point:
            return
        ctx = self._ctx()
        extra: list[Segment] = []
        if rec.nodes > rec.target:
            self._set_size(rec, rec.target)
        if rec.target != rec.active:
            if self._pool is not None:
                self._pool.activate(rec.hosts[rec.active :], self._view.time)
            extra = rec.job.work.reconfiguration_segments(rec.active, rec.target, ctx)
            rec.resizes.append((self._view.time, rec.active, rec.target))
            rec.active = rec.target
        self._schedule_unit(rec, extra, ctx)

    # -- the run: state, one event, the loop -------------------------------------------
    def _records(self, jobs: Sequence[Job]) -> list[JobRecord]:
        """Check that ``jobs`` fit the machine and have distinct ids; their records by seq."""
        n_nodes = self.platform.num_nodes
        ids = set()
        for job in jobs:
            if job.num_nodes_min > n_nodes:
                raise InvalidInputError(
                    f"job {job.id}: needs {job.num_nodes_min} nodes, the machine has {n_nodes}"
                )
            if job.gpus_per_node > self.platform.gpus_per_node:
                raise InvalidInputError(
                    f"job {job.id}: needs {job.gpus_per_node} GPUs per node, "
                    f"the nodes have {self.platform.gpus_per_node}"
                )
            if job.id in ids:
                raise InvalidInputError(f"job id {job.id} appears twice")
            ids.add(job.id)
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit_time, i))
        records = [JobRecord(jobs[i]) for i in order]
        for k, rec in enumerate(records):
            rec.seq = k
        return records

    def reset(self, jobs: Sequence[Job] = ()) -> None:
        """Set up a new run of ``jobs``: every job pending, the clock at their first event.

        All state of a run lives in the attributes set here; :meth:`step` and :meth:`run`
        advance it.

        Args:
            jobs: The workload (any order; submit order is used, ties by position).

        Raises:
            InvalidInputError: A job does not fit the machine or ids repeat.
        """
        records = self._records(jobs)
        platform = self.platform
        self.records = records
        self._heap: list[tuple[float, Event, int, _Payload]] = []
        self._seq = 0
        self._view = SchedulerView(self)
        self._usage_t: list[float] = [0.0]
        self._usage_n: list[int] = [0]
        self._open = len(records)  # jobs not yet ended
        self._net = FlowNetwork(
            {"pfs_read": platform.pfs_read_bandwidth, "pfs_write": platform.pfs_write_bandwidth}
        )
        self._reasons: set[InvocationReason] = set()  # of the time stamp being handled
        self._paused: list[JobRecord] = []  # jobs that reached a point at that time stamp
        self._in_time_stamp = False  # whether events of the current time stamp remain
        self._pfs_users = 0  # running jobs whose work does PFS I/O (for estimates)
        self._pool: NodePool | None = None
        if self.allocation is not None:
            self._pool = NodePool(
                platform.num_nodes, platform.topology, self.allocation, platform.hosts
            )
        self._contexts: dict[int, RunContext] = {}
        self.invocations = 0
        self.events = 0
        for rec in records:
            self._push(rec.job.submit_time, _Submission(rec))
        if self.interval > 0 and records:
            self._push(records[0].job.submit_time, _Tick())

    @property
    def now(self) -> float:
        """The simulated time of the last event handled (s)."""
        return self._view.time

    def peek(self) -> float:
        """Return the time of the next event, or ``inf`` when none is left."""
        return self._heap[0][0] if self._heap else math.inf

    def step(self) -> None:
        """Handle the next event.

        After the last event of a time stamp, the scheduler is invoked (once, with the
        reasons gathered at that time stamp) and the jobs paused at scheduling points
        resume.

        Raises:
            InvalidStateError: No event is left (:meth:`peek` is ``inf``).
            SchedulerError: The scheduler ordered something impossible.
            SimulationError: Jobs are left waiting with nothing more to happen.
        """
        heap = self._heap
        if not heap:
            raise InvalidStateError("step(): no event left; the simulation has ended")
        now = heap[0][0]
        if not self._in_time_stamp:
            self._view.time = now
            self._reasons = set()
            self._paused = []
            self._in_time_stamp = True
        payload = heapq.heappop(heap)[3]
        self.events += 1
        self._handle(payload, now)
        if not heap or heap[0][0] != now:
            self._in_time_stamp = False
            self._invoke(now)

    def _handle(self, payload: _Payload, now: float) -> None:
        """Apply one event at time ``now``."""
        match payload:
            case _Submission(rec):
                rec.status = JobStatus.WAITING
                view = self._view
                index = view.queue._index
                view.queue._add(rec, None if index is None else view.requested_time(rec))
                self._reasons.add(InvocationReason.JOB_SUBMIT)
            case _SegmentEnd(rec, epoch):
                if epoch == rec.epoch:
                    self._next_segment(rec)
            case _LinkCompletion(token):
                if token != self._net.token:
                    return
                done = cast("list[JobRecord]", self._net.pop_finished(now))
                self._reschedule_flows()
                for rec in done:
                    rec.link = False
                    self._next_segment(rec)
            case _Tick():
                self._reasons.add(InvocationReason.PERIODIC)
                if self._open > 0:
                    self._push(now + self.interval, _Tick())

    def _invoke(self, now: float) -> None:
        """End the time stamp ``now``: invoke the scheduler, resume paused jobs, check."""
        view, reasons, paused = self._view, self._reasons, self._paused
        if reasons and (view.queue or paused or view.running):
            self.invocations += 1
            self.scheduler.schedule(view, frozenset(reasons))
        for rec in paused:
            rec.evolving_request = None
            self._resume(rec)
        if view.queue and not view.running and all(e[1] is Event.PERIODIC for e in self._heap):
            raise SimulationError(
                f"{len(view.queue)} job(s) still waiting (first: job {view.queue[0].id}) "
                f"at t={now} with nothing left to happen; scheduler {self.scheduler.name!r} "
                "never started them"
            )

    def run(self, jobs: Sequence[Job] | None = None, until: float | None = None) -> SimulationTrace:
        """Simulate ``jobs`` to the end (or the run set up last, up to ``until``).

        Args:
            jobs: The workload; it starts a new run (:meth:`reset`). ``None`` continues
                the current run.
            until: Handle only the events at times up to and including this one; ``None``
                runs until no event is left.

        Returns:
            The trace of the run so far (complete when no event is left).

        Raises:
            InvalidInputError: A job does not fit the machine or ids repeat.
            SchedulerError: The scheduler ordered something impossible.
            SimulationError: Jobs are left waiting with nothing more to happen.
        """
        # The run allocates a few objects per event and frees none until it ends, so the
        # cyclic garbage collector's passes would rescan every record again and again
        # (cost growing with the number of jobs); it is paused for the run.
        collecting = gc.isenabled()
        gc.disable()
        try:
            if jobs is not None:
                self.reset(jobs)
            heap = self._heap
            if until is None:
                while heap:
                    self.step()
            else:
                while heap and heap[0][0] <= until:
                    self.step()
        finally:
            if collecting:
                gc.enable()
        return self.trace()

    def trace(self) -> SimulationTrace:
        """Return the records and counters of the current run."""
        return SimulationTrace(
            self.records,
            np.asarray(self._usage_t, dtype=np.float64),
            np.asarray(self._usage_n, dtype=np.int64),
            self.invocations,
            self.events,
            None if self._pool is None else self._pool.log_rows,
        )
