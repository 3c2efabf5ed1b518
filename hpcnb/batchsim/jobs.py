"""Jobs and the work they carry.

A :class:`Job` is what a user submits: a type (rigid, moldable, malleable, evolving,
adaptive), a size or a size range, a submit time, an optional requested wall time and
a :class:`WorkModel` that says how long its work takes on a given number of nodes.

Work is a sequence of *units* (ElastiSim's phase iterations). The boundary between
two units is a *scheduling point*: the only moments at which a malleable job can be
resized, paying the model's reconfiguration cost. Rigid trace jobs carry one unit
(:class:`FixedWork`); jobs turned malleable carry several (:class:`ScaledWork`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from hpcnb.batchsim.platform import Platform, Segment
from hpcnb.errors import InvalidInputError

__all__ = ["FixedWork", "Job", "JobType", "RunContext", "ScaledWork", "WorkModel"]


class JobType(StrEnum):
    """ElastiSim's job types.

    RIGID: fixed size. MOLDABLE: the scheduler picks the size at start, then fixed.
    MALLEABLE: the scheduler may resize it at scheduling points. EVOLVING: the job
    asks for resizes itself (evolving requests) that the scheduler may grant.
    ADAPTIVE: both malleable and evolving.
    """

    RIGID = "rigid"
    MOLDABLE = "moldable"
    MALLEABLE = "malleable"
    EVOLVING = "evolving"
    ADAPTIVE = "adaptive"

    @property
    def resizable(self) -> bool:
        """Whether a running job of this type may change size."""
        return self in _RESIZABLE


_RESIZABLE = frozenset((JobType.MALLEABLE, JobType.EVOLVING, JobType.ADAPTIVE))


@dataclass(frozen=True)
class RunContext:
    """What a work model may look at when timing a unit.

    Attributes:
        platform: The machine.
        pfs_sharers: Number of running jobs that do PFS I/O. Used for *estimates*
            (:meth:`WorkModel.unit_time`, backfilling, remaining times); the engine itself
            shares the PFS links dynamically (:class:`~hpcnb.batchsim.network.FlowNetwork`).
    """

    platform: Platform
    pfs_sharers: int = 1


class WorkModel:
    """How long a job's work takes; subclass and override the methods.

    Attributes:
        num_units: Number of units (phase iterations); scheduling points lie between.
        uses_pfs: Whether the work does PFS I/O (counts as a PFS sharer).
    """

    num_units: int = 1
    uses_pfs: bool = False

    def unit_time(self, unit: int, nodes: int, ctx: RunContext) -> float:
        """Return the duration (s) of unit ``unit`` (0-based) on ``nodes`` nodes.

        Args:
            unit: The unit (0-based).
            nodes: Nodes the job runs on.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        raise NotImplementedError

    def init_time(self, nodes: int, ctx: RunContext) -> float:
        """Return the start-up cost (s) paid before the first unit.

        Args:
            nodes: Nodes the job starts on.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        return 0.0

    def reconfiguration_time(self, old: int, new: int, ctx: RunContext) -> float:
        """Return the cost (s) of resizing from ``old`` to ``new`` nodes.

        Args:
            old: Nodes before the resize.
            new: Nodes after it.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        return 0.0

    def evolving_request(self, unit_done: int, nodes: int) -> int | None:
        """Return the size an evolving job asks for before unit ``unit_done``, or ``None``.

        Called at every scheduling point, after ``unit_done`` units and before the next
        one (ElastiSim evaluates the request of the phase about to run).

        Args:
            unit_done: Units finished so far (the index of the unit about to run).
            nodes: Nodes the job runs on.
        """
        return None

    def unit_segments(self, unit: int, nodes: int, ctx: RunContext) -> list[Segment]:
        """Return unit ``unit`` as segments: ``("time", s)``, ``("pfs_read" | "pfs_write", B)``.

        The engine runs ``time`` segments as they are and PFS segments on the shared PFS
        links (see :class:`~hpcnb.batchsim.network.FlowNetwork`). Default: one ``time``
        segment of :meth:`unit_time`.

        Args:
            unit: The unit (0-based).
            nodes: Nodes the job runs on.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        return [("time", self.unit_time(unit, nodes, ctx))]

    def init_segments(self, nodes: int, ctx: RunContext) -> list[Segment]:
        """Return the start-up cost as segments (default: :meth:`init_time`).

        Args:
            nodes: Nodes the job starts on.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        return [("time", self.init_time(nodes, ctx))]

    def reconfiguration_segments(self, old: int, new: int, ctx: RunContext) -> list[Segment]:
        """Return the resize cost as segments (default: :meth:`reconfiguration_time`).

        Args:
            old: Nodes before the resize.
            new: Nodes after it.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        return [("time", self.reconfiguration_time(old, new, ctx))]

    def estimate(self, nodes: int, ctx: RunContext, from_unit: int = 0) -> float:
        """Return the time (s) to run units ``from_unit..`` on ``nodes`` nodes.

        Args:
            nodes: Nodes the job runs on.
            ctx: The machine and the number of jobs sharing the PFS.
            from_unit: First unit still to run (``0`` includes the start-up cost).
        """
        total = self.init_time(nodes, ctx) if from_unit == 0 else 0.0
        return total + sum(self.unit_time(u, nodes, ctx) for u in range(from_unit, self.num_units))


@dataclass(frozen=True)
class FixedWork(WorkModel):
    """One unit of a fixed duration regardless of size (a rigid trace job).

    Attributes:
        runtime: Duration (s).
    """

    runtime: float

    def __post_init__(self) -> None:
        if not (self.runtime >= 0 and math.isfinite(self.runtime)):
            raise InvalidInputError(
                f"FixedWork.runtime={self.runtime}: expected a finite value >= 0"
            )

    def unit_time(self, unit: int, nodes: int, ctx: RunContext) -> float:
        """Return the fixed run time.

        Args:
            unit: The unit (there is one).
            nodes: Nodes the job runs on (the time does not depend on it).
            ctx: The machine and the number of jobs sharing the PFS.
        """
        return self.runtime

    def estimate(self, nodes: int, ctx: RunContext, from_unit: int = 0) -> float:
        """Return the fixed run time (0 once done).

        Args:
            nodes: Nodes the job runs on (the time does not depend on it).
            ctx: The machine and the number of jobs sharing the PFS.
            from_unit: ``0`` before the job ran, ``1`` once done.
        """
        return self.runtime if from_unit == 0 else 0.0


@dataclass(frozen=True)
class ScaledWork(WorkModel):
    """Work measured at one size and scaled to others by Amdahl's law.

    The run time on ``n`` nodes is ``runtime · (s + (1 - s) · base_nodes / n)``, split
    into ``units`` equal iterations. Each resize costs ``reconfiguration_cost`` seconds
    plus ``data_bytes`` redistributed over the PFS (read at the new size).

    Attributes:
        runtime: Measured run time (s) on ``base_nodes`` nodes.
        base_nodes: Size of the measurement.
        serial_fraction: Amdahl serial fraction ``s`` in [0, 1].
        units: Number of iterations (scheduling points = ``units - 1``).
        reconfiguration_cost: Fixed cost of a resize (s).
        data_bytes: State re-read from the PFS on a resize (bytes).
    """

    runtime: float
    base_nodes: int
    serial_fraction: float = 0.05
    units: int = 10
    reconfiguration_cost: float = 10.0
    data_bytes: float = 0.0
    num_units: int = field(init=False)
    uses_pfs: bool = field(init=False)

    def __post_init__(self) -> None:
        if self.runtime < 0 or self.base_nodes < 1 or self.units < 1:
            raise InvalidInputError(
                f"ScaledWork(runtime={self.runtime}, base_nodes={self.base_nodes}, "
                f"units={self.units}): expected runtime >= 0, base_nodes >= 1, units >= 1"
            )
        if not 0.0 <= self.serial_fraction <= 1.0:
            raise InvalidInputError(
                f"ScaledWork.serial_fraction={self.serial_fraction}: not in [0, 1]"
            )
        object.__setattr__(self, "num_units", self.units)
        object.__setattr__(self, "uses_pfs", self.data_bytes > 0)

    def scale(self, nodes: int) -> float:
        """Return run time on ``nodes`` nodes divided by run time on ``base_nodes``."""
        s = self.serial_fraction
        return s + (1.0 - s) * self.base_nodes / nodes

    def unit_time(self, unit: int, nodes: int, ctx: RunContext) -> float:
        """Return ``runtime / units`` scaled to ``nodes`` nodes.

        Args:
            unit: The unit (all take the same time).
            nodes: Nodes the job runs on.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        return self.runtime / self.units * self.scale(nodes)

    def reconfiguration_time(self, old: int, new: int, ctx: RunContext) -> float:
        """Return the fixed cost plus the state re-read from the PFS.

        Args:
            old: Nodes before the resize.
            new: Nodes after it.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        io = (
            ctx.platform.pfs_time(self.data_bytes, False, ctx.pfs_sharers) if self.data_bytes else 0
        )
        return self.reconfiguration_cost + io

    def reconfiguration_segments(self, old: int, new: int, ctx: RunContext) -> list[Segment]:
        """Return the fixed cost, the PFS latency and the state read as segments.

        Args:
            old: Nodes before the resize.
            new: Nodes after it.
            ctx: The machine and the number of jobs sharing the PFS.
        """
        if not self.data_bytes:
            return [("time", self.reconfiguration_cost)]
        fixed = self.reconfiguration_cost + ctx.platform.pfs_latency
        return [("time", fixed), ("pfs_read", self.data_bytes)]

    def estimate(self, nodes: int, ctx: RunContext, from_unit: int = 0) -> float:
        """Return the remaining time in closed form.

        Args:
            nodes: Nodes the job runs on.
            ctx: The machine and the number of jobs sharing the PFS.
            from_unit: First unit still to run (``0`` includes the start-up cost).
        """
        return max(0, self.units - from_unit) * self.runtime / self.units * self.scale(nodes)


@dataclass(frozen=True)
class Job:
    """A submitted job.

    Attributes:
        id: Unique job id.
        submit_time: Submit time (s).
        type: The :class:`JobType`.
        num_nodes: Size of a rigid job; the preferred start size of others.
        work: How long the work takes.
        num_nodes_min: Smallest allowed size (equal to ``num_nodes`` for rigid jobs).
        num_nodes_max: Largest allowed size.
        walltime: Requested time (s) used by backfilling, ``None`` for unknown.
        gpus_per_node: GPUs the job uses on each of its nodes.
        user: User id (DRF shares resources among users).
    """

    id: int
    submit_time: float
    type: JobType
    num_nodes: int
    work: WorkModel
    num_nodes_min: int = 0
    num_nodes_max: int = 0
    walltime: float | None = None
    gpus_per_node: int = 0
    user: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", JobType(self.type))
        if self.type == JobType.RIGID or self.num_nodes_min <= 0:
            object.__setattr__(self, "num_nodes_min", self.num_nodes)
        if self.type == JobType.RIGID or self.num_nodes_max <= 0:
            object.__setattr__(self, "num_nodes_max", self.num_nodes)
        if not 1 <= self.num_nodes_min <= self.num_nodes <= self.num_nodes_max:
            raise InvalidInputError(
                f"job {self.id}: sizes min={self.num_nodes_min} <= num_nodes={self.num_nodes}"
                f" <= max={self.num_nodes_max} must hold with min >= 1"
            )
        if not (math.isfinite(self.submit_time) and self.submit_time >= 0):
            raise InvalidInputError(f"job {self.id}: submit_time={self.submit_time}, expected >= 0")
        if self.walltime is not None and not self.walltime > 0:
            raise InvalidInputError(
                f"job {self.id}: walltime={self.walltime}, expected > 0 or None"
            )

    def requested_time(self, ctx: RunContext) -> float:
        """Return the time backfilling reserves: the walltime, else the model estimate."""
        if self.walltime is not None:
            return self.walltime
        return self.work.estimate(self.num_nodes, ctx)
