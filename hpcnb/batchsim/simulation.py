"""Running a simulation and what comes out of it.

:func:`simulate` runs jobs on a platform under a scheduler and returns a
:class:`SimulationResult`: a job table, the allocated-node step function, metrics
(makespan, mean / median wait, turnaround, bounded slowdown with τ = 10 s,
utilisation), ElastiSim's ``job_statistics.csv`` and the invariant check that tests run
on every simulation (:func:`check_invariants`).

Example:
    EASY backfilling starts the short one-node job at once, in the gap strict FCFS keeps
    for the whole-machine job it cannot start yet:

    >>> from hpcnb.batchsim import FixedWork, Job, JobType, Platform, check_invariants, simulate
    >>> from hpcnb.batchsim.scheduler import FCFS, EasyBackfilling
    >>> jobs = [Job(i, t, JobType.RIGID, n, FixedWork(r))
    ...         for i, (t, n, r) in enumerate([(0, 2, 10), (0, 4, 5), (1, 1, 3)])]
    >>> for scheduler in (FCFS(), EasyBackfilling()):
    ...     result = simulate(jobs, Platform(4), scheduler)
    ...     check_invariants(result, jobs)
    ...     print(scheduler.name, result.jobs["start"].tolist(), result.metrics()["mean_wait"])
    fcfs [0.0, 10.0, 15.0] 8.0
    easy [0.0, 10.0, 1.0] 3.3333333333333335
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from hpcnb.batchsim.engine import JobStatus, SimulationTrace, Simulator
from hpcnb.batchsim.jobs import FixedWork, Job, JobType
from hpcnb.batchsim.nodes import NODE_UTILIZATION_COLUMNS
from hpcnb.batchsim.platform import Platform
from hpcnb.batchsim.scheduler import FCFS, EasyBackfilling, Scheduler
from hpcnb.errors import InvalidInputError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "JOB_STATISTICS_COLUMNS",
    "SimulationResult",
    "check_invariants",
    "simulate",
    "simulate_rigid",
]

JOB_STATISTICS_COLUMNS = (
    "ID",
    "Type",
    "Submit Time",
    "Start Time",
    "End Time",
    "Wait Time",
    "Makespan",
    "Turnaround Time",
    "Status",
)
#: The :attr:`SimulationResult.columns` that fill each of those columns.
_STATISTICS_SOURCES = (
    "id",
    "type",
    "submit",
    "start",
    "end",
    "wait",
    "runtime",
    "turnaround",
    "status",
)


@dataclass
class SimulationResult:
    """Outcome of one simulation.

    The job table is kept as columns (NumPy arrays) and turned into a pandas
    ``DataFrame`` only when :attr:`jobs` is read, so that the command line, which writes
    CSV files and metrics, never imports pandas.

    Attributes:
        columns: The job table by column, in submit order: ``id, type, user, submit,
            start, end, wait, runtime, turnaround, status, nodes`` (start size),
            ``min_nodes``, ``max_nodes`` (smallest / largest size held),
            ``requested_nodes``, ``resizes``.
        usage_times: Times at which the allocated node count changes.
        usage_nodes: Allocated nodes from each of those times on.
        num_nodes: Nodes of the machine.
        scheduler: Scheduler name.
        wall_seconds: Wall-clock time of the simulation (s).
        invocations: Scheduler invocations (0 on the compiled rigid path).
        compiled: Whether the compiled rigid kernel ran.
        extra: Other counters (``events`` of the general engine).
        resizes: One ``(id, time, old, new)`` per applied reconfiguration (sizes in nodes;
            the new size holds from ``time`` on, after the reconfiguration cost).
        node_log: With node identity, every change of a node's state: ``(time, node,
            state, running job, expected job)``, ElastiSim's ``node_utilization.csv`` rows.
    """

    columns: dict[str, np.ndarray]
    usage_times: np.ndarray
    usage_nodes: np.ndarray
    num_nodes: int
    scheduler: str
    wall_seconds: float = 0.0
    invocations: int = 0
    compiled: bool = False
    extra: dict[str, float] = field(default_factory=dict)
    resizes: list[tuple[int, float, int, int]] = field(default_factory=list)
    node_log: list[tuple[float, str, str, str, str]] | None = None

    @cached_property
    def jobs(self) -> pd.DataFrame:
        """The job table as a DataFrame (one row per job, the :attr:`columns`)."""
        import pandas as pd

        return pd.DataFrame(self.columns)

    @cached_property
    def resize_log(self) -> pd.DataFrame:
        """The reconfigurations as a DataFrame: ``id, time, old, new``."""
        import pandas as pd

        return pd.DataFrame(self.resizes, columns=["id", "time", "old", "new"])

    @property
    def jobs_per_second(self) -> float:
        """Simulated jobs per wall-clock second."""
        return len(self.columns["id"]) / max(self.wall_seconds, 1e-12)

    def metrics(self, tau: float = 10.0) -> dict[str, float]:
        """Return the headline metrics.

        Keys: ``jobs``, ``completed``, ``killed``, ``makespan`` (last end − first
        submit), ``mean_wait``, ``median_wait``, ``mean_turnaround``,
        ``mean_bounded_slowdown`` (``max(1, (wait + run) / max(run, tau))``),
        ``utilization`` (allocated node-seconds over ``nodes × makespan``).
        """
        c = self.columns
        n = len(c["id"])
        if n == 0:
            return {"jobs": 0.0}
        makespan = float(np.max(c["end"]) - np.min(c["submit"]))
        run, wait = c["runtime"], c["wait"]
        bsld = np.maximum(1.0, (wait + run) / np.maximum(run, tau))
        status = np.asarray(c["status"])
        return {
            "jobs": float(n),
            "completed": float(np.sum(status == JobStatus.COMPLETED.value)),
            "killed": float(np.sum(status == JobStatus.KILLED.value)),
            "makespan": makespan,
            "mean_wait": float(wait.mean()),
            "median_wait": float(np.median(wait)),
            "mean_turnaround": float(c["turnaround"].mean()),
            "mean_bounded_slowdown": float(bsld.mean()),
            "utilization": self.node_seconds() / (self.num_nodes * makespan) if makespan else 0.0,
        }

    def node_seconds(self) -> float:
        """Return the integral of allocated nodes over time."""
        t, n = self.usage_times, self.usage_nodes
        if len(t) < 2:
            return 0.0
        return float(np.sum(np.diff(t) * n[:-1]))

    def utilization_series(self) -> pd.DataFrame:
        """Return the node-utilisation step function (``time, allocated, utilization``)."""
        import pandas as pd

        return pd.DataFrame(self._utilization_columns())

    def _utilization_columns(self) -> dict[str, np.ndarray]:
        return {
            "time": self.usage_times,
            "allocated": self.usage_nodes,
            "utilization": self.usage_nodes / self.num_nodes,
        }

    def _statistics_columns(self) -> dict[str, np.ndarray]:
        pairs = zip(JOB_STATISTICS_COLUMNS, _STATISTICS_SOURCES, strict=True)
        return {name: self.columns[key] for name, key in pairs}

    def job_statistics(self) -> pd.DataFrame:
        """Return ElastiSim's ``job_statistics.csv`` table (Makespan = end − start)."""
        import pandas as pd

        return pd.DataFrame(self._statistics_columns())

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write ``job_statistics.csv``, ``node_utilization.csv`` and ``metrics.json``.

        ``node_utilization.csv`` has ElastiSim's per-node columns (``Time, Node, State,
        Running jobs, Expected jobs``) when nodes had identity, else the allocated-node
        step function (``time, allocated, utilization``).
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            "job_statistics": out / "job_statistics.csv",
            "node_utilization": out / "node_utilization.csv",
            "metrics": out / "metrics.json",
        }
        _write_csv(paths["job_statistics"], self._statistics_columns())
        if self.node_log is not None:  # ElastiSim's per-node shape
            with paths["node_utilization"].open("w", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle, lineterminator="\n")
                writer.writerow(NODE_UTILIZATION_COLUMNS)
                writer.writerows(self.node_log)
        else:
            _write_csv(paths["node_utilization"], self._utilization_columns())
        payload = {"scheduler": self.scheduler, "nodes": self.num_nodes, **self.metrics()}
        payload["wall_seconds"] = self.wall_seconds
        paths["metrics"].write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        return paths


def _write_csv(path: Path, columns: dict[str, Any]) -> None:
    """Write columns as CSV (numbers as Python writes them, no index).

    The bytes are those of :class:`csv.writer` over the columns' Python values; when every
    column has a plain format (integers, floats, strings without characters CSV would
    quote) the rows are formatted by one ``%`` template per block of rows instead, which
    is several times faster for a table of millions of jobs.
    """
    values = [np.asarray(v) for v in columns.values()]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        plan = [_column_format(v) for v in values]
        if any(p is None for p in plan):
            writer.writerows(zip(*(v.tolist() for v in values), strict=True))
            return
        formats = [cast(tuple[str, Any], p) for p in plan]
        row = ",".join(f for f, _ in formats) + "\n"
        data = [v for _, v in formats if v is not None]
        n = len(values[0]) if values else 0
        step = 1 << 16
        for lo in range(0, n, step):
            m = min(n, lo + step) - lo
            if not data:
                handle.write(row * m)
                continue
            block = np.empty((m, len(data)), dtype=object)  # row-major: the template's order
            for k, d in enumerate(data):
                block[:, k] = d[lo : lo + m].tolist()
            handle.write((row * m) % tuple(block.ravel().tolist()))


_CSV_SPECIAL = (",", '"', "\n", "\r")


def _column_format(values: np.ndarray) -> tuple[str, np.ndarray | None] | None:
    """Return a ``%`` format of one CSV column and the values it formats, or ``None``.

    ``None``: no plain format (the caller falls back to :class:`csv.writer`). A constant
    string column is written into the format itself (values ``None``).
    """
    kind = values.dtype.kind
    if kind in "iu":
        return "%d", values
    if kind == "f":
        whole = np.isfinite(values) & (values == np.trunc(values)) & (np.abs(values) < 2**53)
        if np.all(whole) and not np.any((values == 0) & np.signbit(values)):  # no -0.0
            return "%d.0", values.astype(np.int64)  # repr of a whole float: digits + ".0"
        return "%r", values.astype(np.float64)
    if kind in "UO" and values.size:
        first = values[0]
        if not all(isinstance(v, str) for v in values.tolist()):
            return None
        strings = values.astype(str)
        if any(np.any(np.char.find(strings, c) >= 0) for c in _CSV_SPECIAL):
            return None
        if np.all(strings == first):
            return str(first).replace("%", "%%"), None
        return "%s", strings
    return None


def _table(rows: dict[str, Any]) -> dict[str, np.ndarray]:
    n = len(rows["id"])
    table = {k: (np.asarray(v) if not np.isscalar(v) else np.full(n, v)) for k, v in rows.items()}
    table["wait"] = table["start"] - table["submit"]
    table["runtime"] = table["end"] - table["start"]
    table["turnaround"] = table["end"] - table["submit"]
    return table


def _usage(starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, ...]:
    times = np.concatenate([[0.0], starts, ends])
    delta = np.concatenate([[0], sizes, -sizes])
    order = np.argsort(times, kind="stable")
    times, delta = times[order], delta[order]
    uniq, idx = np.unique(times, return_index=True)
    sums = np.add.reduceat(delta, idx)
    return uniq, np.cumsum(sums)


#: Compiled rigid-job kernels (:func:`simulate_rigid_arrays` policies) by the EXACT scheduler
#: type they reproduce: a subclass may change ``act()`` or ``schedule()``, so it always runs
#: its own.
_RIGID_KERNELS: dict[type[Scheduler], str] = {FCFS: "fcfs", EasyBackfilling: "easy"}


def _rigid_kernel(jobs: Sequence[Job], scheduler: Scheduler, interval: float) -> str | None:
    """Return the compiled kernel that reproduces this run exactly, or ``None``."""
    kernel = _RIGID_KERNELS.get(type(scheduler))
    if kernel is None or interval > 0:
        return None
    rigid = all(j.type is JobType.RIGID and type(j.work) is FixedWork for j in jobs)
    return kernel if rigid else None


def simulate(
    jobs: Sequence[Job],
    platform: Platform,
    scheduler: Scheduler,
    *,
    scheduling_interval: float = 0.0,
    on_scheduling_point: bool = True,
    clip_evolving_requests: bool = True,
    compiled: bool = True,
    network: str = "shared",
    fairness: str = "flow",
    node_links: bool = True,
    allocation: str | None = None,
) -> SimulationResult:
    """Simulate ``jobs`` on ``platform`` under ``scheduler``.

    Args:
        jobs: The workload (any order; submit order is used, ties by position).
        platform: The machine.
        scheduler: The policy.
        scheduling_interval: Periodic invocations every so many seconds (0: none).
        on_scheduling_point: Invoke the scheduler when a resizable job reaches a
            scheduling point (ElastiSim's ``schedule_on_scheduling_point``).
        clip_evolving_requests: Clip evolving requests to the job's size range.
        network: ``"shared"`` or ``"isolated"`` (see :class:`~hpcnb.batchsim.engine.Simulator`).
        fairness: ``"flow"`` or ``"ptask"`` (idem).
        node_links: Bound each PFS flow by its node's link (idem).
        allocation: ``None`` (nodes counted) or an allocation policy giving nodes identity
            (``first-fit``, ``contiguous``, ``topology``; idem).
        compiled: Use the compiled rigid kernel when the workload and the scheduler
            allow it (same schedule as the general engine, much faster): every job rigid
            with a fixed run time, no periodic invocations, and the scheduler exactly
            :class:`~hpcnb.batchsim.scheduler.FCFS` or
            :class:`~hpcnb.batchsim.scheduler.EasyBackfilling` (not a subclass).

    Raises:
        InvalidInputError: A job does not fit the machine, ids repeat, or an option is
            unknown.
        SchedulerError: The scheduler ordered something impossible.
        SimulationError: Jobs are left waiting with nothing more to happen.
    """
    t0 = time.perf_counter()
    use_kernel = compiled and allocation is None
    kernel = _rigid_kernel(jobs, scheduler, scheduling_interval) if use_kernel else None
    if kernel is not None:
        return _simulate_compiled(jobs, platform, scheduler, kernel, t0)
    sim = Simulator(
        platform,
        scheduler,
        scheduling_interval,
        on_scheduling_point,
        clip_evolving_requests,
        network,
        fairness,
        node_links,
        allocation,
    )
    trace = sim.run(jobs)
    return _engine_result(trace, platform, scheduler, time.perf_counter() - t0)


def _simulate_compiled(
    jobs: Sequence[Job], platform: Platform, scheduler: Scheduler, kernel: str, t0: float
) -> SimulationResult:
    """Run rigid fixed-time ``jobs`` on the compiled ``kernel``; ``t0`` is the start clock."""
    for job in jobs:
        if job.gpus_per_node > platform.gpus_per_node:
            raise InvalidInputError(
                f"job {job.id}: needs {job.gpus_per_node} GPUs per node, "
                f"the nodes have {platform.gpus_per_node}"
            )
    runtimes = [cast(FixedWork, j.work).runtime for j in jobs]
    return _compiled_result(
        np.array([j.id for j in jobs], dtype=np.int64),
        np.array([j.submit_time for j in jobs], dtype=np.float64),
        np.array([j.num_nodes for j in jobs], dtype=np.int64),
        np.array(runtimes, dtype=np.float64),
        np.array([0.0 if j.walltime is None else j.walltime for j in jobs], dtype=np.float64),
        np.array([j.user for j in jobs], dtype=np.int64),
        platform,
        scheduler,
        kernel,
        t0,
    )


def simulate_rigid(
    ids: np.ndarray,
    submit: np.ndarray,
    size: np.ndarray,
    runtime: np.ndarray,
    walltime: np.ndarray,
    user: np.ndarray,
    platform: Platform,
    scheduler: Scheduler,
) -> SimulationResult:
    """Simulate rigid jobs given as columns on the compiled kernel (no :class:`Job` objects).

    The same schedule and result as :func:`simulate` on the equivalent rigid jobs
    (``Job(ids[i], submit[i], RIGID, size[i], FixedWork(runtime[i]), walltime=...,
    user=user[i])``) under exactly :class:`~hpcnb.batchsim.scheduler.FCFS` or
    :class:`~hpcnb.batchsim.scheduler.EasyBackfilling`; for traces of millions of jobs,
    where building the objects would cost more than the simulation
    (:func:`~hpcnb.batchsim.workloads.rigid_arrays_from_swf` gives the columns of a trace).

    Args:
        ids: Unique job ids.
        submit: Submit times (s, >= 0); any order (ties keep array order).
        size: Nodes of each job, in ``[1, platform.num_nodes]``.
        runtime: Run times (s).
        walltime: Requested times (s) reserved by backfilling; ``<= 0`` for unknown (the
            run time is reserved then).
        user: User ids.
        platform: The machine.
        scheduler: Exactly ``FCFS()`` or ``EasyBackfilling()``.

    Raises:
        InvalidInputError: Another scheduler, columns of different lengths, repeated ids,
            a negative or non-finite submit time, or the kernel's own checks.
    """
    t0 = time.perf_counter()
    kernel = _RIGID_KERNELS.get(type(scheduler))
    if kernel is None:
        raise InvalidInputError(
            f"simulate_rigid: scheduler {scheduler!r} has no compiled kernel; expected exactly "
            "FCFS() or EasyBackfilling() (use simulate() for the others)"
        )
    columns = [np.asarray(c) for c in (ids, submit, size, runtime, walltime, user)]
    if len({c.shape for c in columns}) != 1 or columns[0].ndim != 1:
        raise InvalidInputError("simulate_rigid: the six columns must be 1-D and of one length")
    walltime = np.asarray(walltime, dtype=np.float64)
    return _compiled_result(
        np.asarray(ids, dtype=np.int64),
        np.asarray(submit, dtype=np.float64),
        np.asarray(size, dtype=np.int64),
        np.asarray(runtime, dtype=np.float64),
        np.where(walltime > 0, walltime, 0.0),
        np.asarray(user, dtype=np.int64),
        platform,
        scheduler,
        kernel,
        t0,
    )


def _compiled_result(
    ids: np.ndarray,
    submit: np.ndarray,
    size: np.ndarray,
    runtime: np.ndarray,
    walltime: np.ndarray,
    user: np.ndarray,
    platform: Platform,
    scheduler: Scheduler,
    kernel: str,
    t0: float,
) -> SimulationResult:
    """Check the columns, run the kernel in submit order and build the result."""
    over = np.flatnonzero(size > platform.num_nodes)
    if over.size:
        i = int(over[0])
        raise InvalidInputError(
            f"job {int(ids[i])}: needs {int(size[i])} nodes, the machine has {platform.num_nodes}"
        )
    bad = np.flatnonzero(~(np.isfinite(submit) & (submit >= 0)))
    if bad.size:
        i = int(bad[0])
        raise InvalidInputError(f"job {int(ids[i])}: submit_time={submit[i]}, expected >= 0")
    ordered_ids = np.sort(ids)
    if np.any(ordered_ids[1:] == ordered_ids[:-1]):
        raise InvalidInputError("job ids are not unique")
    order = np.argsort(submit, kind="stable")
    ids, submit, size, runtime = ids[order], submit[order], size[order], runtime[order]
    walltime, user = walltime[order], user[order]
    estimate = np.where(walltime > 0, walltime, runtime)
    from hpcnb.batchsim.rigid import simulate_rigid_arrays  # Numba: only when used

    start = simulate_rigid_arrays(submit, runtime, estimate, size, platform.num_nodes, kernel)
    end = start + runtime
    wall = time.perf_counter() - t0
    columns = {
        "id": ids,
        "type": "rigid",
        "user": user,
        "submit": submit,
        "start": start,
        "end": end,
        "status": "completed",
        "nodes": size,
        "min_nodes": size,
        "max_nodes": size,
        "requested_nodes": size,
        "resizes": 0,
    }
    times, used = _usage(start, end, size)
    return SimulationResult(
        _table(columns), times, used, platform.num_nodes, scheduler.name, wall, 0, True
    )


def _engine_result(
    trace: SimulationTrace, platform: Platform, scheduler: Scheduler, wall: float
) -> SimulationResult:
    """The result of a run of the general engine, from its trace."""
    recs = trace.records
    starts_size = [r.resizes[0][1] if r.resizes else r.active for r in recs]
    sizes_seen = [
        [s, *(new for _, _, new in r.resizes)] for r, s in zip(recs, starts_size, strict=True)
    ]
    columns = {
        "id": [r.id for r in recs],
        "type": [r.type.value for r in recs],
        "user": [r.job.user for r in recs],
        "submit": [r.job.submit_time for r in recs],
        "start": [r.start_time for r in recs],
        "end": [r.end_time for r in recs],
        "status": [r.status.value for r in recs],
        "nodes": starts_size,
        "min_nodes": [min(s) for s in sizes_seen],
        "max_nodes": [max(s) for s in sizes_seen],
        "requested_nodes": [r.job.num_nodes for r in recs],
        "resizes": [len(r.resizes) for r in recs],
    }
    return SimulationResult(
        _table(columns),
        trace.usage_times,
        trace.usage_nodes,
        platform.num_nodes,
        scheduler.name,
        wall,
        trace.invocations,
        False,
        {"events": float(trace.events)},
        [(r.id, t, old, new) for r in recs for t, old, new in r.resizes],
        trace.node_log,
    )


def check_invariants(result: SimulationResult, jobs: Sequence[Job] | None = None) -> None:
    """Check what every simulation must satisfy; raise ``AssertionError`` otherwise.

    Never more nodes allocated than exist (and never negative); every job ends
    exactly once (one row per job, completed or killed, finite end >= start);
    start >= submit; rigid jobs keep their size; sizes stay in the job's range (jobs
    killed while waiting hold no nodes).

    Args:
        result: The simulation's result.
        jobs: The jobs simulated, to check sizes against their ranges (optional).
    """
    df = result.jobs
    if result.usage_nodes.size:
        assert result.usage_nodes.max() <= result.num_nodes, "more nodes allocated than exist"
        assert result.usage_nodes.min() >= 0, "negative allocation"
    assert df["id"].is_unique, "a job appears twice"
    assert df["status"].isin(["completed", "killed"]).all(), "a job did not end"
    assert np.isfinite(df["end"]).all() and np.isfinite(df["start"]).all(), "missing times"
    assert (df["start"] >= df["submit"]).all(), "a job started before its submission"
    assert (df["end"] >= df["start"]).all(), "a job ended before it started"
    rigid = df["type"] == "rigid"
    assert (df.loc[rigid, "min_nodes"] == df.loc[rigid, "max_nodes"]).all(), "rigid resized"
    assert (df.loc[rigid, "resizes"] == 0).all(), "rigid job reconfigured"
    if jobs is not None:
        assert len(jobs) == len(df), f"{len(jobs)} jobs submitted, {len(df)} in the result"
        by_id = {j.id: j for j in jobs}
        for row in df.itertuples(index=False):
            job = by_id[row.id]
            if row.nodes == 0:  # killed while waiting: never held nodes
                assert row.status == "killed", f"job {row.id} ran on no nodes"
                continue
            assert job.num_nodes_min <= row.min_nodes, f"job {row.id} below its minimum"
            assert row.max_nodes <= job.num_nodes_max, f"job {row.id} above its maximum"
            if job.type is JobType.RIGID:
                assert row.nodes == job.num_nodes, f"rigid job {row.id} changed size"
    busy = result.node_seconds()
    span = (df["end"].max() - 0.0) * result.num_nodes if len(df) else 0.0
    assert busy <= span * (1 + 1e-9) + 1e-6 or math.isclose(busy, span), "usage exceeds capacity"
