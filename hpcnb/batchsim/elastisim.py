"""ElastiSim's input format: ``jobs.json``, ``application_model.json`` and the platform.

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
  ``communication_pattern`` as in :meth:`Platform.communication_time`. Coupled tasks
  compute then communicate (sum); uncoupled ones overlap (max).
* ``pfs_read`` / ``pfs_write``: the PFS latency, then ``bytes`` in total (``all_ranks`` /
  ``total``), on the root (``root_only``) or ``bytes`` per node (``uniform``) through the
  PFS read or write link, whose bandwidth the engine shares equally among the jobs
  transferring at the moment (:class:`~hpcnb.batchsim.platform.SharedLink`).
* ``idle`` / ``busy_wait``: ``delay`` seconds. ``sequence``: its ``tasks``, ``iterations``
  times.

Burst-buffer tasks and explicit ``vector`` / ``matrix`` patterns are rejected with an
error naming the file and task.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcnb.batchsim.expressions import ExpressionError, parse_expression
from hpcnb.batchsim.jobs import Job, JobType, RunContext, WorkModel
from hpcnb.batchsim.platform import (
    COMMUNICATION_PATTERNS,
    Platform,
    Segment,
    merge_segments,
    nominal_duration,
    read_platform_xml,
)

__all__ = ["ApplicationModel", "ElastiSimInput", "read_application_model", "read_elastisim"]

_TASK_TYPES = ("cpu", "gpu", "pfs_read", "pfs_write", "idle", "busy_wait", "sequence")
_SPREAD = {"uniform": "uniform", "total": "total", "all_ranks": "total", "root_only": "root"}


@dataclass(frozen=True)
class _Task:
    type: str
    where: str
    payload: Any = None  # expression of flops / bytes / delay
    spread: str = "uniform"
    comm_bytes: Any = None
    comm_pattern: str = ""
    coupled: bool = False
    iterations: Any = None
    children: tuple[_Task, ...] = ()


def _expr(value: Any, where: str) -> Any:
    if value is None:
        return None
    try:
        return parse_expression(value)
    except ExpressionError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _parse_task(raw: Mapping[str, Any], where: str) -> _Task:
    kind = raw.get("type")
    where = f"{where} ({raw.get('name', kind)!r})"
    if kind not in _TASK_TYPES:
        raise ValueError(f"{where}: task type {kind!r} is not supported; expected {_TASK_TYPES}")
    iterations = _expr(raw.get("iterations"), where)
    if kind == "sequence":
        kids = tuple(_parse_task(t, f"{where}.tasks[{i}]") for i, t in enumerate(raw["tasks"]))
        return _Task(kind, where, iterations=iterations, children=kids)
    if kind in ("idle", "busy_wait"):
        return _Task(kind, where, _expr(raw.get("delay", 0), where), iterations=iterations)
    pattern_key = "pattern" if kind.startswith("pfs") else "computation_pattern"
    spread_name = raw.get(pattern_key, "uniform" if kind in ("cpu", "gpu") else "total")
    if spread_name not in _SPREAD:
        raise ValueError(f"{where}: {pattern_key} {spread_name!r} is not supported; "
                         f"expected one of {sorted(_SPREAD)}")  # fmt: skip
    if kind.startswith("pfs"):
        if "bytes" not in raw:
            raise ValueError(f"{where}: an I/O task needs 'bytes'")
        return _Task(kind, where, _expr(raw["bytes"], where), _SPREAD[spread_name],
                     iterations=iterations)  # fmt: skip
    pattern = raw.get("communication_pattern", "none" if "bytes" not in raw else "")
    if pattern not in COMMUNICATION_PATTERNS or ("bytes" in raw and pattern in ("", "none")):
        raise ValueError(f"{where}: communication_pattern {pattern!r}: expected one of "
                         f"{COMMUNICATION_PATTERNS[:-2]}")  # fmt: skip
    if "flops" not in raw and "bytes" not in raw:
        raise ValueError(f"{where}: a compute task needs 'flops' or 'bytes'")
    return _Task(kind, where, _expr(raw.get("flops"), where), _SPREAD[spread_name],
                 _expr(raw.get("bytes"), where), pattern, bool(raw.get("coupled", False)),
                 iterations)  # fmt: skip


@dataclass(frozen=True)
class _Phase:
    iterations: Any
    tasks: tuple[_Task, ...]
    evolving_request: Any = None


@dataclass(frozen=True)
class ApplicationModel:
    """A parsed ``application_model.json`` (shared by the jobs that name it).

    Attributes:
        source: File it was read from.
        phases: The phases.
        on_init: Start-up tasks.
        on_reconfiguration: Tasks run after every resize.
        on_expansion: Tasks run after a growth (in addition), if given.
    """

    source: str
    phases: tuple[_Phase, ...]
    on_init: tuple[_Task, ...] = ()
    on_reconfiguration: tuple[_Task, ...] = ()
    on_expansion: tuple[_Task, ...] = ()

    def bind(self, arguments: Mapping[str, float], nodes: int) -> ApplicationWork:
        """Return the work of one job with its ``arguments`` (iterations fixed at ``nodes``)."""
        return ApplicationWork(self, dict(arguments), nodes)


def read_application_model(path: str | Path) -> ApplicationModel:
    """Read an ElastiSim ``application_model.json``.

    Raises:
        ValueError: Malformed JSON, unknown task types or patterns, or bad expressions;
            the message names the file and the task.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(raw.get("phases"), list) or not raw["phases"]:
        raise ValueError(f"{path}: expected a non-empty 'phases' list")

    def tasks(items: Any, where: str) -> tuple[_Task, ...]:
        return tuple(_parse_task(t, f"{where}[{i}]") for i, t in enumerate(items or []))

    phases = tuple(
        _Phase(
            _expr(ph.get("iterations", 1), f"{path}: phases[{k}].iterations"),
            tasks(ph.get("tasks"), f"{path}: phases[{k}].tasks"),
            _expr(ph.get("evolving_request"), f"{path}: phases[{k}].evolving_request"),
        )
        for k, ph in enumerate(raw["phases"])
    )
    return ApplicationModel(
        str(path),
        phases,
        tasks((raw.get("on_init") or {}).get("tasks"), f"{path}: on_init.tasks"),
        tasks((raw.get("on_reconfiguration") or {}).get("tasks"), f"{path}: on_reconfiguration"),
        tasks((raw.get("on_expansion") or {}).get("tasks"), f"{path}: on_expansion.tasks"),
    )


@dataclass(eq=False)
class ApplicationWork(WorkModel):
    """One job's work under an :class:`ApplicationModel` (see the module docstring)."""

    model: ApplicationModel
    arguments: dict[str, float]
    nodes: int
    _units: list[tuple[int, int]] = field(default_factory=list, repr=False)
    _cache: dict[tuple[int, int, int, Platform], list[Segment]] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        env = {**self.arguments, "num_nodes": self.nodes}
        for k, phase in enumerate(self.model.phases):
            count = round(self._eval(phase.iterations, env, f"phases[{k}].iterations"))
            self._units.extend((k, i) for i in range(max(0, count)))
        if not self._units:
            raise ValueError(f"{self.model.source}: the phases have no iterations")
        self.num_units = len(self._units)
        self._by_iteration = [self._uses_iteration(ph.tasks) for ph in self.model.phases]
        self.uses_pfs = any(self._has_io(t) for ph in self.model.phases for t in ph.tasks)
        # dry run: every expression must evaluate with the job's arguments
        ctx = RunContext(Platform(max(1, self.nodes)))
        self.init_time(self.nodes, ctx)
        self.reconfiguration_time(self.nodes, self.nodes + 1, ctx)
        for phase in sorted({k for k, _ in self._units}):
            self._tasks_time(self.model.phases[phase].tasks, self.nodes, ctx, 0)
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

    def _eval(self, expr: Any, env: Mapping[str, float], what: str) -> float:
        try:
            return expr.evaluate(env)
        except ExpressionError as exc:
            where = what if what.startswith(self.model.source) else f"{self.model.source}: {what}"
            raise ValueError(f"{where}: {exc}") from None

    def _env(self, nodes: int, ctx: RunContext, iteration: int) -> dict[str, float]:
        gpn = ctx.platform.gpus_per_node
        return {**self.arguments, "num_nodes": nodes, "num_gpus": nodes * gpn,
                "num_gpus_per_node": gpn, "phase_iteration": iteration}  # fmt: skip

    def _task_segments(
        self, task: _Task, n: int, ctx: RunContext, env: dict[str, float]
    ) -> list[Segment]:
        reps = 1 if task.iterations is None else int(self._eval(task.iterations, env, task.where))
        if task.type == "sequence":
            one = [seg for c in task.children for seg in self._task_segments(c, n, ctx, env)]
        elif task.type in ("idle", "busy_wait"):
            one = [("time", self._eval(task.payload, env, task.where))]
        elif task.type.startswith("pfs"):
            size = self._eval(task.payload, env, task.where)
            if task.spread == "uniform":
                size *= n
            one = [("time", ctx.platform.pfs_latency), (task.type, size)]
        else:
            compute = 0.0
            if task.payload is not None:
                flops = self._eval(task.payload, env, task.where)
                per_node = flops / n if task.spread == "total" else flops
                if task.type == "gpu":
                    gpus = ctx.platform.gpus_per_node
                    if gpus == 0 or ctx.platform.gpu_flops <= 0:
                        raise ValueError(f"{task.where}: a gpu task on a platform without GPUs")
                    compute = per_node / (gpus * ctx.platform.gpu_flops)
                else:
                    compute = per_node / ctx.platform.node_flops
            comm = 0.0
            if task.comm_bytes is not None:
                size = self._eval(task.comm_bytes, env, task.where)
                comm = ctx.platform.communication_time(task.comm_pattern, size, n)
            one = [("time", compute + comm if task.coupled else max(compute, comm))]
        return one * max(0, reps)

    def _segments(
        self, tasks: tuple[_Task, ...], n: int, ctx: RunContext, it: int
    ) -> list[Segment]:
        env = self._env(n, ctx, it)
        out = [seg for t in tasks for seg in self._task_segments(t, n, ctx, env)]
        return merge_segments(out, self.model.source)

    def _nominal(self, segments: list[Segment], ctx: RunContext) -> float:
        p = ctx.platform
        return nominal_duration(segments, p.pfs_read_bandwidth, p.pfs_write_bandwidth,
                                ctx.pfs_sharers)  # fmt: skip

    def _tasks_time(self, tasks: tuple[_Task, ...], n: int, ctx: RunContext, it: int) -> float:
        return self._nominal(self._segments(tasks, n, ctx, it), ctx)

    def unit_segments(self, unit: int, nodes: int, ctx: RunContext) -> list[Segment]:
        """Return one phase iteration on ``nodes`` nodes as segments (memoised)."""
        phase, iteration = self._units[unit]
        key = (phase, iteration if self._by_iteration[phase] else -1, nodes, ctx.platform)
        value = self._cache.get(key)
        if value is None:
            value = self._segments(self.model.phases[phase].tasks, nodes, ctx, iteration)
            self._cache[key] = value
        return list(value)

    def unit_time(self, unit: int, nodes: int, ctx: RunContext) -> float:
        """Return the time of one phase iteration with the PFS shared by ``ctx.pfs_sharers``."""
        return self._nominal(self.unit_segments(unit, nodes, ctx), ctx)

    def init_segments(self, nodes: int, ctx: RunContext) -> list[Segment]:
        """Return the ``on_init`` tasks as segments."""
        return self._segments(self.model.on_init, nodes, ctx, 0)

    def reconfiguration_segments(self, old: int, new: int, ctx: RunContext) -> list[Segment]:
        """Return ``on_reconfiguration`` (+ ``on_expansion`` on growth) at ``new`` nodes."""
        segments = self._segments(self.model.on_reconfiguration, new, ctx, 0)
        if new > old:
            segments += self._segments(self.model.on_expansion, new, ctx, 0)
        return merge_segments(segments, self.model.source)

    def estimate(self, nodes: int, ctx: RunContext, from_unit: int = 0) -> float:
        """Return the time of units ``from_unit..``.

        Phases whose tasks do not use ``phase_iteration`` are summed in closed form.
        """
        total = self.init_time(nodes, ctx) if from_unit == 0 else 0.0
        unit = from_unit
        while unit < self.num_units:
            phase = self._units[unit][0]
            end = unit
            while end < self.num_units and self._units[end][0] == phase:
                end += 1
            if self._by_iteration[phase]:
                total += sum(self.unit_time(u, nodes, ctx) for u in range(unit, end))
            else:
                total += (end - unit) * self.unit_time(unit, nodes, ctx)
            unit = end
        return total

    def init_time(self, nodes: int, ctx: RunContext) -> float:
        """Return the ``on_init`` time."""
        return self._tasks_time(self.model.on_init, nodes, ctx, 0)

    def reconfiguration_time(self, old: int, new: int, ctx: RunContext) -> float:
        """Return the ``on_reconfiguration`` (+ ``on_expansion`` on growth) time at ``new``."""
        return self._nominal(self.reconfiguration_segments(old, new, ctx), ctx)

    def evolving_request(self, unit_done: int, nodes: int) -> int | None:
        """Evaluate the finished phase's ``evolving_request`` (``None`` if it has none)."""
        phase, iteration = self._units[unit_done - 1]
        expr = self.model.phases[phase].evolving_request
        if expr is None:
            return None
        env = {**self.arguments, "num_nodes": nodes, "phase_iteration": iteration}
        return round(self._eval(expr, env, f"phases[{phase}].evolving_request"))


@dataclass
class ElastiSimInput:
    """A loaded ElastiSim project.

    Attributes:
        jobs: Jobs with ids 0, 1, ... in file order.
        platform: The machine from the platform XML.
        configuration: ``configuration.json`` content (empty if absent).
        scheduling_interval: Periodic invocation interval from the configuration (s).
        on_scheduling_point: ``schedule_on_scheduling_point`` from the configuration.
        clip_evolving_requests: ``clip_evolving_requests`` from the configuration.
    """

    jobs: list[Job]
    platform: Platform
    configuration: dict[str, Any] = field(default_factory=dict)
    scheduling_interval: float = 0.0
    on_scheduling_point: bool = True
    clip_evolving_requests: bool = True

    def simulation_options(self) -> dict[str, float | bool]:
        """Return the configuration's options as keyword arguments of ``simulate``."""
        return {
            "scheduling_interval": self.scheduling_interval,
            "on_scheduling_point": self.on_scheduling_point,
            "clip_evolving_requests": self.clip_evolving_requests,
        }


def _resolve(base: Path, name: str, what: str) -> Path:
    for candidate in (base / name, base / Path(name).name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{base}: {what} {name!r} not found (looked in {base})")


def read_elastisim(
    jobs_file: str | Path, platform: Platform | str | Path | None = None
) -> ElastiSimInput:
    """Read an ElastiSim ``jobs.json`` with its application models and platform.

    Application-model and platform paths in the files are resolved relative to the
    folder of ``jobs.json`` (by their full relative path, else by file name).

    Args:
        jobs_file: The ``jobs.json``.
        platform: A :class:`Platform`, a platform XML path, or ``None`` to use the
            ``platform_file`` of ``configuration.json`` beside ``jobs.json``.

    Raises:
        ValueError: Malformed jobs (the message names the file and job index).
        FileNotFoundError: A referenced file is missing.
    """
    jobs_file = Path(jobs_file)
    base = jobs_file.parent
    try:
        raw = json.loads(jobs_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{jobs_file}: invalid JSON ({exc})") from exc
    config: dict[str, Any] = {}
    if (base / "configuration.json").exists():
        config = json.loads((base / "configuration.json").read_text(encoding="utf-8"))
    if not isinstance(platform, Platform):
        xml = platform or config.get("platform_file")
        if xml is None:
            raise ValueError(f"{jobs_file}: no platform given and no configuration.json")
        platform = read_platform_xml(_resolve(base, str(xml), "platform file"))
    models: dict[str, ApplicationModel] = {}
    jobs: list[Job] = []
    for k, item in enumerate(raw.get("jobs", [])):
        where = f"{jobs_file}: jobs[{k}]"
        try:
            kind = JobType(item["type"])
            name = item["application_model"]
            if name not in models:
                models[name] = read_application_model(_resolve(base, name, "application model"))
            lo = int(item.get("num_nodes_min", item.get("num_nodes", 0)))
            hi = int(item.get("num_nodes_max", item.get("num_nodes", 0)))
            size = int(item.get("num_nodes", hi))
            work = models[name].bind(item.get("arguments", {}), size)
            walltime = item.get("walltime")
            jobs.append(Job(k, float(item["submit_time"]), kind, size, work, lo, hi,
                            float(walltime) if walltime else None,
                            int(item.get("num_gpus_per_node", 0))))  # fmt: skip
        except KeyError as exc:
            raise ValueError(f"{where}: missing field {exc}") from None
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    interval = float(config.get("scheduling_interval", 0) or 0)
    return ElastiSimInput(
        jobs,
        platform,
        config,
        interval,
        bool(config.get("schedule_on_scheduling_point", True)),
        bool(config.get("clip_evolving_requests", True)),
    )
