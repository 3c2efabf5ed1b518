"""ElastiSim application models (``application_model.json``) and the work of one job.

An application model has optional ``on_init`` / ``on_reconfiguration`` /
``on_expansion`` task lists (the start-up and reconfiguration costs) and a list of
``phases``, each repeated ``iterations`` times, with ``tasks``. Every phase iteration is
one unit of work; the boundaries are scheduling points. Sizes of tasks are
expressions over the job's ``arguments`` and ``num_nodes``, ``num_gpus``,
``num_gpus_per_node`` and ``phase_iteration``, read with the safe evaluator of
:mod:`hpcnb.batchsim.expressions`.

Task timing (on ``n`` nodes, platform of :mod:`hpcnb.batchsim.platform`):

* ``cpu`` / ``gpu``: ``flops`` with ``computation_pattern`` ``uniform`` (each node does
  ``flops``), ``total`` / ``all_ranks`` (``flops / n`` each) or ``root_only``; divided by
  the node (or per-node GPU) speed. Communication ``bytes`` with
  ``communication_pattern`` as in :meth:`Platform.communication_time`. As in ElastiSim
  (SimGrid's parallel-task model ``ptask_L07``), compute and communication of a task
  progress together: a coupled task is one parallel task whose duration is set by its
  bottleneck (``max``); an uncoupled one runs both side by side (also ``max``). On a
  crossbar a job's node links are its own, so this is exact without sharing. On a
  platform with a fat-tree or dragonfly :class:`~hpcnb.batchsim.nodes.Topology` the task
  becomes a ``compute`` + ``comm_<pattern>`` pair that the engine runs as one flow over
  the group links its nodes use, shared with the other jobs (with node identity).
* ``pfs_read`` / ``pfs_write``: the PFS latency, then ``bytes`` in total (``all_ranks`` /
  ``total``: one flow per node), on the root (``root_only``: one flow) or ``bytes`` per
  node (``uniform``) through the node links and the PFS read or write link, shared
  max-min fairly with every other job's flows (:mod:`~hpcnb.batchsim.network`).
* ``idle`` / ``busy_wait``: ``delay`` seconds. ``sequence``: its ``tasks``, ``iterations``
  times.

* ``bb_read`` / ``bb_write``: burst buffers as in ElastiSim's platform files: each rank
  moves its share (``all_ranks`` / ``total``: ``bytes / n``; ``uniform``: ``bytes``;
  ``root_only``: rank 0) through its node-local buffer, or, with wide striping, through
  the buffers of all the job's nodes (:meth:`Platform.burst_buffer_time`). A platform
  without burst buffers makes them an error naming the task.

Explicit ``vector`` / ``matrix`` patterns are rejected with a
:class:`~hpcnb.batchsim.inputs.WorkloadError` naming the file and the JSON path of the
task (``application_model.json: phases[2].tasks[0].flops: ...``), as is every other
problem, within the :class:`~hpcnb.batchsim.inputs.ElastiSimLimits`.

**Iterations are modelled analytically.** A phase repeated ``N`` times is one *run* of
``N`` identical units, never ``N`` objects: unit ``u`` is found by bisection over the runs,
one iteration's segments are computed once (per size) and the time of the rest of a run
is ``count · unit time`` in closed form. A task or ``sequence`` repeated so often that its
segments would exceed ``max_segments`` becomes one block in closed form: its compute
time and PFS bytes times the count (exact when the PFS is not shared; with sharing the
block's transfers run back to back instead of interleaved with its compute).
Scheduling points: a resizable job (malleable, evolving, adaptive) has one after every
phase iteration, at most ``max_units`` of them. A rigid or moldable job has no observable
scheduling points, so when its phases have more than ``max_units`` iterations in all, each
phase that does not use ``phase_iteration`` runs as one block of all its iterations (same
closed form); a 10¹²-iteration phase then simulates in a few events. Below that, every
iteration is a unit as in ElastiSim.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcnb.batchsim.expressions import Expression, ExpressionError, parse_expression
from hpcnb.batchsim.inputs import (
    ElastiSimLimits,
    WorkloadError,
    boolean,
    child_path,
    describe,
    load_json,
)
from hpcnb.batchsim.jobs import RunContext, WorkModel
from hpcnb.batchsim.platform import (
    COMMUNICATION_PATTERNS,
    SEGMENT_KINDS,
    Platform,
    Segment,
    merge_segments,
    nominal_duration,
)
from hpcnb.errors import HpcnbError

__all__ = ["ApplicationModel", "ApplicationWork", "UnitIndexError", "read_application_model"]

_TASK_TYPES = (
    "cpu",
    "gpu",
    "pfs_read",
    "pfs_write",
    "bb_read",
    "bb_write",
    "idle",
    "busy_wait",
    "sequence",
)
_SPREAD = {"uniform": "uniform", "total": "total", "all_ranks": "total", "root_only": "root"}
_DEFAULT_LIMITS = ElastiSimLimits()


class UnitIndexError(HpcnbError, IndexError):
    """A unit number outside ``0..num_units - 1`` of the job's work."""


@dataclass(frozen=True)
class _Task:
    type: str
    path: str  # JSON path in the application model
    payload: Expression | None = None  # flops / bytes / delay
    spread: str = "uniform"
    comm_bytes: Expression | None = None
    comm_pattern: str = ""
    coupled: bool = False
    iterations: Expression | None = None
    children: tuple[_Task, ...] = ()


class _ModelReader:
    """Turns the JSON of one application model into tasks, with paths in every error."""

    def __init__(self, file: str, limits: ElastiSimLimits) -> None:
        self.file = file
        self.limits = limits

    def error(self, path: str, reason: str) -> WorkloadError:
        return WorkloadError(self.file, path, reason)

    def expr(self, value: Any, path: str) -> Expression | None:
        if value is None:
            return None
        try:
            return parse_expression(value, limits=self.limits.expression)
        except ExpressionError as exc:
            raise self.error(path, str(exc).splitlines()[0]) from None

    def required(self, value: Any, path: str) -> Expression:
        expr = self.expr(value, path)
        if expr is None:
            raise self.error(path, "expected an expression or a number, found null")
        return expr

    def task(self, raw: Any, path: str) -> _Task:
        if not isinstance(raw, dict):
            raise self.error(path, f"expected a task object, found {describe(raw)}")
        kind = raw.get("type")
        if not isinstance(kind, str) or kind not in _TASK_TYPES:
            raise self.error(
                child_path(path, "type"),
                f"task type {describe(kind)} is not supported; expected one of {_TASK_TYPES}",
            )
        iterations = self.expr(raw.get("iterations"), child_path(path, "iterations"))
        if kind == "sequence":
            if "tasks" not in raw:
                raise self.error(path, "a sequence needs 'tasks'")
            kids = self.tasks(raw["tasks"], child_path(path, "tasks"))
            return _Task(kind, path, iterations=iterations, children=kids)
        if kind in ("idle", "busy_wait"):
            delay = self.required(raw.get("delay", 0), child_path(path, "delay"))
            return _Task(kind, path, delay, iterations=iterations)
        io = kind.startswith(("pfs", "bb"))
        pattern_key = "pattern" if io else "computation_pattern"
        spread_name = raw.get(pattern_key, "uniform" if kind in ("cpu", "gpu") else "total")
        if not isinstance(spread_name, str) or spread_name not in _SPREAD:
            raise self.error(
                child_path(path, pattern_key),
                f"{describe(spread_name)} is not supported; expected one of {sorted(_SPREAD)}",
            )
        if io:
            if "bytes" not in raw:
                raise self.error(path, "an I/O task needs 'bytes'")
            size = self.required(raw["bytes"], child_path(path, "bytes"))
            return _Task(kind, path, size, _SPREAD[spread_name], iterations=iterations)
        has_bytes = raw.get("bytes") is not None
        pattern = raw.get("communication_pattern", "" if has_bytes else "none")
        if (
            not isinstance(pattern, str)
            or pattern not in COMMUNICATION_PATTERNS
            or (has_bytes and pattern in ("", "none"))
        ):
            raise self.error(
                child_path(path, "communication_pattern"),
                f"{describe(pattern)}: expected one of {COMMUNICATION_PATTERNS[:-2]}",
            )
        if raw.get("flops") is None and not has_bytes:
            raise self.error(path, "a compute task needs 'flops' or 'bytes'")
        coupled = boolean(raw.get("coupled", False), self.file, child_path(path, "coupled"))
        return _Task(
            kind,
            path,
            self.expr(raw.get("flops"), child_path(path, "flops")),
            _SPREAD[spread_name],
            self.expr(raw.get("bytes"), child_path(path, "bytes")),
            pattern,
            coupled,
            iterations,
        )

    def tasks(self, items: Any, path: str) -> tuple[_Task, ...]:
        if items is None:
            return ()
        if not isinstance(items, list):
            raise self.error(path, f"expected a list of tasks, found {describe(items)}")
        return tuple(self.task(t, child_path(path, i)) for i, t in enumerate(items))

    def hook(self, raw: Mapping[str, Any], name: str) -> tuple[_Task, ...]:
        block = raw.get(name)
        if block is None:
            return ()
        if not isinstance(block, dict):
            raise self.error(name, f"expected an object with 'tasks', found {describe(block)}")
        return self.tasks(block.get("tasks"), f"{name}.tasks")


@dataclass(frozen=True)
class _Phase:
    iterations: Expression
    tasks: tuple[_Task, ...]
    evolving_request: Expression | None = None


@dataclass(frozen=True)
class ApplicationModel:
    """A parsed ``application_model.json`` (shared by the jobs that name it).

    Attributes:
        source: File it was read from.
        phases: The phases.
        on_init: Start-up tasks.
        on_reconfiguration: Tasks run after every resize.
        on_expansion: Tasks run after a growth (in addition), if given.
        limits: The limits it was read with (they also bound the bound work).
    """

    source: str
    phases: tuple[_Phase, ...]
    on_init: tuple[_Task, ...] = ()
    on_reconfiguration: tuple[_Task, ...] = ()
    on_expansion: tuple[_Task, ...] = ()
    limits: ElastiSimLimits = _DEFAULT_LIMITS

    def bind(
        self,
        arguments: Mapping[str, float],
        nodes: int,
        *,
        platform: Platform | None = None,
        scheduling_points: bool = True,
    ) -> ApplicationWork:
        """Return the work of one job with its ``arguments`` (iterations fixed at ``nodes``).

        Args:
            arguments: The job's arguments (numbers).
            nodes: The job's size; phase iteration counts are evaluated with it.
            platform: The machine, for the validating dry run (default: ``nodes`` CPU nodes).
            scheduling_points: Whether the job's scheduling points are observable (resizable
                jobs); if not, huge phases may run as blocks (see the module docstring).

        Raises:
            WorkloadError: An expression fails with these arguments, or a limit is exceeded.
        """
        return ApplicationWork(self, dict(arguments), nodes, platform, scheduling_points)


def read_application_model(
    path: str | Path, *, limits: ElastiSimLimits | None = None
) -> ApplicationModel:
    """Read an ElastiSim ``application_model.json``.

    Args:
        path: The file.
        limits: Bounds on the file and its expressions (default :class:`ElastiSimLimits`).

    Raises:
        WorkloadError: Unreadable or malformed JSON, unknown task types or patterns, bad
            expressions; the message names the file and the JSON path.
    """
    limits = _DEFAULT_LIMITS if limits is None else limits
    raw = load_json(path, limits)
    reader = _ModelReader(str(path), limits)
    if not isinstance(raw, dict):
        raise reader.error("", f"expected an object with 'phases', found {describe(raw)}")
    phases_raw = raw.get("phases")
    if not isinstance(phases_raw, list) or not phases_raw:
        raise reader.error("phases", f"expected a non-empty list, found {describe(phases_raw)}")
    phases = []
    for k, ph in enumerate(phases_raw):
        where = f"phases[{k}]"
        if not isinstance(ph, dict):
            raise reader.error(where, f"expected a phase object, found {describe(ph)}")
        iterations = reader.required(ph.get("iterations", 1), f"{where}.iterations")
        phases.append(
            _Phase(
                iterations,
                reader.tasks(ph.get("tasks"), f"{where}.tasks"),
                reader.expr(ph.get("evolving_request"), f"{where}.evolving_request"),
            )
        )
    return ApplicationModel(
        str(path),
        tuple(phases),
        reader.hook(raw, "on_init"),
        reader.hook(raw, "on_reconfiguration"),
        reader.hook(raw, "on_expansion"),
        limits,
    )


def _aggregate(segments: list[Segment], count: int | float) -> list[Segment]:
    """Return ``count`` repetitions of ``segments`` in closed form: total time, read, write."""
    totals = dict.fromkeys(SEGMENT_KINDS, 0.0)
    for kind, amount in merge_segments(segments):
        totals[kind] += amount
    return [(kind, amount * count) for kind, amount in totals.items() if amount]


@dataclass(eq=False)
class ApplicationWork(WorkModel):
    """One job's work under an :class:`ApplicationModel` (see the module docstring).

    Attributes:
        model: The application model.
        arguments: The job's arguments.
        nodes: The size the phase iteration counts were evaluated at.
        platform: The machine of the validating dry run, if known.
        scheduling_points: Whether every phase iteration is a unit (resizable jobs).
        iterations: Iterations of each phase.
    """

    model: ApplicationModel
    arguments: dict[str, float]
    nodes: int
    platform: Platform | None = None
    scheduling_points: bool = True
    iterations: tuple[int, ...] = field(init=False, default=())
    # runs: (phase, first unit, units, iterations per unit); per unit > 1 is a block
    _runs: list[tuple[int, int, int, int]] = field(init=False, default_factory=list, repr=False)
    _starts: list[int] = field(init=False, default_factory=list, repr=False)
    _cache: dict[tuple[int, int, int, Platform], list[Segment]] = field(
        init=False, default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        limits, source = self.model.limits, self.model.source
        env = {**self.arguments, "num_nodes": self.nodes}
        counts = tuple(
            self._count(phase.iterations, env, f"phases[{k}].iterations", round)
            for k, phase in enumerate(self.model.phases)
        )
        total = sum(counts)
        if total == 0:
            raise WorkloadError(source, "phases", "the phases have no iterations")
        if total > limits.max_iterations:
            most = f"{limits.max_iterations:,} (ElastiSimLimits.max_iterations)"
            raise WorkloadError(source, "phases", f"{total:,} iterations in all; at most {most}")
        self.iterations = counts
        self._by_iteration = [self._uses_iteration(ph.tasks) for ph in self.model.phases]
        one_by_one = self.scheduling_points or total <= limits.max_units
        unit = 0
        for k, count in enumerate(counts):
            if count == 0:
                continue
            self._starts.append(unit)
            if one_by_one or self._by_iteration[k]:
                self._runs.append((k, unit, count, 1))
                unit += count
            else:
                self._runs.append((k, unit, 1, count))
                unit += 1
        if unit > limits.max_units:
            k = max((r for r in self._runs if r[3] == 1), key=lambda r: r[2])[0]
            why = (
                "a resizable job has a scheduling point after every iteration"
                if self.scheduling_points
                else "the phase uses phase_iteration"
            )
            raise WorkloadError(
                source,
                f"phases[{k}].iterations",
                f"{counts[k]:,} iterations: "
                f"{why}, and at most {limits.max_units:,} iterations are "
                "simulated one by one (ElastiSimLimits.max_units)",
            )
        self.num_units = unit
        self.uses_pfs = any(self._has_io(t) for ph in self.model.phases for t in ph.tasks)
        # dry run: every expression must evaluate with the job's arguments
        ctx = RunContext(self.platform or Platform(max(1, self.nodes)))
        self.init_time(self.nodes, ctx)
        self.reconfiguration_time(self.nodes, self.nodes + 1, ctx)
        for start in self._starts:
            self.unit_segments(start, self.nodes, ctx)
        self._cache.clear()

    def _uses_iteration(self, tasks: tuple[_Task, ...]) -> bool:
        for task in tasks:
            for expr in (task.payload, task.comm_bytes, task.iterations):
                if expr is not None and "phase_iteration" in expr.names:
                    return True
            if self._uses_iteration(task.children):
                return True
        return False

    def _has_io(self, task: _Task) -> bool:
        return task.type.startswith("pfs") or any(self._has_io(c) for c in task.children)

    def _eval(self, expr: Expression, env: Mapping[str, float], path: str) -> float:
        try:
            return expr.evaluate(env)
        except ExpressionError as exc:
            raise WorkloadError(self.model.source, path, str(exc).splitlines()[0]) from None

    def _count(
        self,
        expr: Expression,
        env: Mapping[str, float],
        path: str,
        to_int: Callable[[float], int] = math.trunc,
    ) -> int:
        """Evaluate an iteration count: finite, at most ``max_iterations``; < 0 means 0."""
        value = self._eval(expr, env, path)
        limit = self.model.limits.max_iterations
        if not math.isfinite(value) or value > limit:
            raise WorkloadError(
                self.model.source,
                path,
                f"{value:g} iterations; at most {limit:,} (ElastiSimLimits.max_iterations)",
            )
        return max(0, to_int(value))

    def _merge(self, segments: list[Segment], path: str) -> list[Segment]:
        try:
            return merge_segments(segments)
        except ValueError as exc:
            raise WorkloadError(self.model.source, path, str(exc).removeprefix(": ")) from None

    def _concat(self, parts: Iterable[list[Segment]], path: str) -> list[Segment]:
        """Concatenate segment lists, aggregating whenever ``max_segments`` is exceeded."""
        out: list[Segment] = []
        limit = self.model.limits.max_segments
        for part in parts:
            out.extend(part)
            if len(out) > limit:
                out = _aggregate(self._merge(out, path), 1)
        return out

    def _repeat(self, one: list[Segment], reps: int, path: str) -> list[Segment]:
        if reps <= 0 or not one:
            return []
        if reps == 1:
            return one
        if reps * len(one) <= self.model.limits.max_segments:
            return one * reps
        return _aggregate(self._merge(one, path), reps)

    def _env(self, nodes: int, ctx: RunContext, iteration: int) -> dict[str, float]:
        gpn = ctx.platform.gpus_per_node
        return {
            **self.arguments,
            "num_nodes": nodes,
            "num_gpus": nodes * gpn,
            "num_gpus_per_node": gpn,
            "phase_iteration": iteration,
        }

    def _task_segments(
        self, task: _Task, n: int, ctx: RunContext, env: dict[str, float]
    ) -> list[Segment]:
        path, p = task.path, ctx.platform
        reps = 1
        if task.iterations is not None:
            reps = self._count(task.iterations, env, f"{path}.iterations")
        if task.type == "sequence":
            parts = (self._task_segments(c, n, ctx, env) for c in task.children)
            one = self._concat(parts, path)
        elif task.type in ("idle", "busy_wait"):
            assert task.payload is not None
            one = [("time", self._eval(task.payload, env, f"{path}.delay"))]
        elif task.type.startswith("bb"):
            assert task.payload is not None
            size = self._eval(task.payload, env, f"{path}.bytes")
            per_rank = size / n if task.spread == "total" else size
            try:
                one = [("time", p.burst_buffer_time(per_rank, task.type == "bb_write", n))]
            except ValueError as exc:
                raise WorkloadError(self.model.source, path, str(exc)) from None
        elif task.type.startswith("pfs"):
            assert task.payload is not None
            size = self._eval(task.payload, env, f"{path}.bytes")
            if task.spread == "uniform":
                size *= n
            kind = f"{task.type}_root" if task.spread == "root" else task.type
            # ptask_L07: the route's latency first; a transfer of nothing costs nothing
            one = [("time", p.pfs_route_latency), (kind, size)] if size > 0 else []
        else:
            compute = 0.0
            if task.payload is not None:
                flops = self._eval(task.payload, env, f"{path}.flops")
                per_node = flops / n if task.spread == "total" else flops
                if task.type == "gpu":
                    if p.gpus_per_node == 0 or p.gpu_flops <= 0:
                        raise WorkloadError(
                            self.model.source, path, "a gpu task on a platform without GPUs"
                        )
                    compute = per_node / (p.gpus_per_node * p.gpu_flops)
                else:
                    compute = per_node / p.node_flops
            comm = 0.0
            size = 0.0
            if task.comm_bytes is not None:
                size = self._eval(task.comm_bytes, env, f"{path}.bytes")
                comm = p.communication_time(task.comm_pattern, size, n)
            topology = p.topology
            if (
                comm > 0
                and topology is not None
                and topology.kind != "crossbar"
                and task.comm_pattern not in ("", "none")
            ):
                # the engine runs both as one flow over the job's links
                one = [("compute", compute), (f"comm_{task.comm_pattern}", size)]
            elif task.coupled and comm > 0:
                # one parallel task (ptask_L07): the route latency, then compute and
                # communication progress together, the slower one setting the time
                one = [("time", max(compute + p.node_route_latency, comm))]
            else:
                # the node computes while rank 0's communication task runs beside it
                one = [("time", max(compute, comm))]
        return self._repeat(one, reps, path)

    def _segments(
        self, tasks: tuple[_Task, ...], n: int, ctx: RunContext, it: int, path: str
    ) -> list[Segment]:
        env = self._env(n, ctx, it)
        parts = (self._task_segments(t, n, ctx, env) for t in tasks)
        return self._merge(self._concat(parts, path), path)

    def _nominal(self, segments: list[Segment], ctx: RunContext) -> float:
        p = ctx.platform
        return nominal_duration(
            segments, p.pfs_read_bandwidth, p.pfs_write_bandwidth, ctx.pfs_sharers
        )

    def _run(self, unit: int) -> tuple[int, int, int, int]:
        if not 0 <= unit < self.num_units:
            raise UnitIndexError(f"unit {unit} of a job with {self.num_units} units")
        return self._runs[bisect.bisect_right(self._starts, unit) - 1]

    def _context(self, ctx: RunContext | None) -> RunContext:
        """Return ``ctx``, or for ``None`` (callers that know no machine) the bound platform."""
        if ctx is not None:
            return ctx
        return RunContext(self.platform or Platform(max(1, self.nodes)))

    def unit_segments(self, unit: int, nodes: int, ctx: RunContext | None) -> list[Segment]:
        """Return one phase iteration (or block of iterations) as segments (memoised).

        Args:
            unit: The unit, ``0 <= unit < num_units``.
            nodes: Nodes the job runs on.
            ctx: The machine and its PFS sharers; ``None``: the platform the work was bound with.

        Raises:
            UnitIndexError: ``unit`` is not a unit of the job.
            WorkloadError: A task's expression fails or a limit is exceeded.
        """
        ctx = self._context(ctx)
        phase, first, _, per_unit = self._run(unit)
        iteration = unit - first
        by_iteration = self._by_iteration[phase] and per_unit == 1
        key = (phase, iteration if by_iteration else -1 - (per_unit > 1), nodes, ctx.platform)
        value = self._cache.get(key)
        if value is None:
            path = f"phases[{phase}].tasks"
            value = self._segments(self.model.phases[phase].tasks, nodes, ctx, iteration, path)
            if per_unit > 1:
                value = self._merge(_aggregate(value, per_unit), path)
            self._cache[key] = value
        return list(value)

    def unit_time(self, unit: int, nodes: int, ctx: RunContext | None) -> float:
        """Return the time of one unit with the PFS shared by ``ctx.pfs_sharers``.

        Args:
            unit: The unit, ``0 <= unit < num_units``.
            nodes: Nodes the job runs on.
            ctx: The machine and its PFS sharers; ``None``: the platform the work was bound with.
        """
        ctx = self._context(ctx)
        return self._nominal(self.unit_segments(unit, nodes, ctx), ctx)

    def init_segments(self, nodes: int, ctx: RunContext | None) -> list[Segment]:
        """Return the ``on_init`` tasks as segments.

        Args:
            nodes: Nodes the job starts on.
            ctx: The machine and its PFS sharers; ``None``: the platform the work was bound with.
        """
        ctx = self._context(ctx)
        return self._segments(self.model.on_init, nodes, ctx, 0, "on_init.tasks")

    def reconfiguration_segments(self, old: int, new: int, ctx: RunContext | None) -> list[Segment]:
        """Return ``on_reconfiguration`` (+ ``on_expansion`` on growth) at ``new`` nodes.

        Args:
            old: Nodes before the resize.
            new: Nodes after it (the tasks run at this size).
            ctx: The machine and its PFS sharers; ``None``: the platform the work was bound with.
        """
        ctx = self._context(ctx)
        tasks = self.model.on_reconfiguration
        segments = self._segments(tasks, new, ctx, 0, "on_reconfiguration.tasks")
        if new > old:
            segments += self._segments(self.model.on_expansion, new, ctx, 0, "on_expansion.tasks")
        return self._merge(segments, "on_reconfiguration.tasks")

    def estimate(self, nodes: int, ctx: RunContext | None, from_unit: int = 0) -> float:
        """Return the time of units ``from_unit..``.

        Runs of phases whose tasks do not use ``phase_iteration`` are summed in closed form.

        Args:
            nodes: Nodes the job runs on.
            ctx: The machine and its PFS sharers; ``None``: the platform the work was bound with.
            from_unit: First unit still to run (``0`` adds the ``on_init`` time).
        """
        ctx = self._context(ctx)
        total = self.init_time(nodes, ctx) if from_unit == 0 else 0.0
        if from_unit >= self.num_units:
            return total
        r = bisect.bisect_right(self._starts, max(0, from_unit)) - 1
        unit = max(0, from_unit)
        for phase, first, count, per_unit in self._runs[r:]:
            end = first + count
            if per_unit == 1 and self._by_iteration[phase]:
                total += sum(self.unit_time(u, nodes, ctx) for u in range(unit, end))
            else:
                total += (end - unit) * self.unit_time(unit, nodes, ctx)
            unit = end
        return total

    def init_time(self, nodes: int, ctx: RunContext | None) -> float:
        """Return the ``on_init`` time.

        Args:
            nodes: Nodes the job starts on.
            ctx: The machine and its PFS sharers; ``None``: the platform the work was bound with.
        """
        ctx = self._context(ctx)
        return self._nominal(self.init_segments(nodes, ctx), ctx)

    def reconfiguration_time(self, old: int, new: int, ctx: RunContext | None) -> float:
        """Return the ``on_reconfiguration`` (+ ``on_expansion`` on growth) time at ``new``.

        Args:
            old: Nodes before the resize.
            new: Nodes after it.
            ctx: The machine and its PFS sharers; ``None``: the platform the work was bound with.
        """
        ctx = self._context(ctx)
        return self._nominal(self.reconfiguration_segments(old, new, ctx), ctx)

    def evolving_request(self, unit_done: int, nodes: int) -> int | None:
        """Evaluate the ``evolving_request`` of the phase about to run (``None``: none).

        As ElastiSim's ``Application``: before every phase iteration but the job's first,
        the request of that iteration's phase is evaluated with ``phase_iteration`` the
        iteration's index in its phase and ``num_nodes`` the current size, and cut to an
        integer (toward zero).

        Args:
            unit_done: Units finished so far (the next unit's phase and index are used).
            nodes: Nodes the job runs on.

        Raises:
            WorkloadError: The expression fails or asks for a size that is not finite.
        """
        if unit_done <= 0 or unit_done >= self.num_units:
            return None
        phase, first, _, per_unit = self._run(unit_done)
        expr = self.model.phases[phase].evolving_request
        if expr is None:
            return None
        iteration = unit_done - first if per_unit == 1 else 0
        env = {**self.arguments, "num_nodes": nodes, "phase_iteration": iteration}
        path = f"phases[{phase}].evolving_request"
        value = self._eval(expr, env, path)
        if not math.isfinite(value) or abs(value) > 2**62:
            raise WorkloadError(self.model.source, path, f"{value:g} nodes requested")
        return math.trunc(value)
