"""ElastiSim's input format: ``jobs.json``, its application models and the platform.

:func:`read_elastisim` reads a ``jobs.json`` (``{"jobs": [...]}``: each job's ``type``,
``submit_time``, ``num_nodes`` or ``num_nodes_min`` / ``num_nodes_max``, optional
``walltime`` and ``num_gpus_per_node``, the ``application_model`` file and its numeric
``arguments``; one with a fraction is kept with six decimals, as ElastiSim substitutes
it, :func:`as_argument_text`), the application models it names
(:mod:`hpcnb.batchsim.application_model`) and the platform XML named by
``configuration.json`` beside it (:func:`~hpcnb.batchsim.platform.read_platform_xml`).

**Errors, limits and the machine.** Every problem raises
:class:`~hpcnb.batchsim.inputs.WorkloadError` with the file and the JSON path
(``jobs.json: jobs[3].arguments.alpha: expected a number, found "x"``); limits are the
:class:`~hpcnb.batchsim.inputs.ElastiSimLimits` (file bytes, JSON depth, iterations,
units, segments, platform bytes, expression length and nesting), passed as ``limits=``.
A machine of more than :data:`~hpcnb.batchsim.swf.MAX_NODES` nodes is refused, as by the
SWF reader. Jobs larger than the machine (``num_nodes_min``, or the rigid size, above its
nodes, or more GPUs per node than it has) follow the policy of the SWF path: they are
skipped and listed in :attr:`ElastiSimInput.skipped`, or raise with ``strict=True``. A
moldable or resizable job whose ``num_nodes`` / ``num_nodes_max`` exceed the machine is
capped at the machine size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcnb.batchsim.application_model import (
    ApplicationModel,
    ApplicationWork,
    read_application_model,
)
from hpcnb.batchsim.inputs import (
    ElastiSimLimits,
    WorkloadError,
    boolean,
    child_path,
    describe,
    integer,
    load_json,
    number,
)
from hpcnb.batchsim.jobs import Job, JobType
from hpcnb.batchsim.platform import Platform, read_platform_xml
from hpcnb.batchsim.swf import MAX_NODES

__all__ = [
    "ApplicationModel",
    "ApplicationWork",
    "ElastiSimInput",
    "ElastiSimLimits",
    "WorkloadError",
    "as_argument_text",
    "read_application_model",
    "read_elastisim",
]

_DEFAULT_LIMITS = ElastiSimLimits()


@dataclass
class ElastiSimInput:
    """A loaded ElastiSim project.

    Attributes:
        jobs: The jobs; a job's id is its index in ``jobs.json`` (skipped jobs leave gaps).
        platform: The machine from the platform XML (with ``num_nodes`` if given).
        configuration: ``configuration.json`` content (empty if absent).
        scheduling_interval: Periodic invocation interval from the configuration (s).
        on_scheduling_point: ``schedule_on_scheduling_point`` from the configuration.
        clip_evolving_requests: ``clip_evolving_requests`` from the configuration.
        skipped: ``"job <id>: reason"`` for each job larger than the machine, not simulated.
    """

    jobs: list[Job]
    platform: Platform
    configuration: dict[str, Any] = field(default_factory=dict)
    scheduling_interval: float = 0.0
    on_scheduling_point: bool = True
    clip_evolving_requests: bool = True
    skipped: list[str] = field(default_factory=list)

    def simulation_options(self) -> dict[str, float | bool | str]:
        """Return the configuration's options as keyword arguments of ``simulate``.

        ElastiSim runs SimGrid's parallel-task model ``ptask_L07``, whose default solver
        (``host/model ptask solver``: ``fairbottleneck``) gives every transfer crossing a
        saturated link an equal share of its bandwidth in bytes per second, up to the
        transfer's own bound: ``fairness="flow"``. (Equal *progress*, ``"ptask"``, is
        SimGrid's classic max-min solver, which ``ptask_L07`` does not use.)
        """
        return {
            "scheduling_interval": self.scheduling_interval,
            "on_scheduling_point": self.on_scheduling_point,
            "clip_evolving_requests": self.clip_evolving_requests,
            "fairness": "flow",
        }


def _resolve(base: Path, name: str) -> Path | None:
    """Return ``base / name``, else ``base / basename(name)``, if it is a file."""
    for candidate in (base / name, base / Path(name).name):
        try:
            if candidate.is_file():
                return candidate
        except (OSError, ValueError):  # a name too long, or with a NUL byte
            continue
    return None


def _read_platform(path: Path, limits: ElastiSimLimits) -> Platform:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise WorkloadError(path, "", f"cannot read the platform ({exc.strerror or exc})") from None
    if size > limits.max_platform_bytes:
        raise WorkloadError(
            path,
            "",
            f"{size:,} bytes; at most {limits.max_platform_bytes:,} "
            "are read (ElastiSimLimits.max_platform_bytes)",
        )
    try:
        platform = read_platform_xml(path)
    except (ValueError, OSError, ArithmeticError) as exc:
        reason = str(exc).removeprefix(f"{path}: ") or type(exc).__name__
        raise WorkloadError(path, "", reason.splitlines()[0]) from None
    if platform.num_nodes > MAX_NODES:
        raise WorkloadError(
            path,
            "",
            f"a machine of {platform.num_nodes:,} nodes; at most {MAX_NODES:,} are simulated",
        )
    return platform


def _configuration(base: Path, limits: ElastiSimLimits) -> tuple[Path, dict[str, Any]]:
    path = base / "configuration.json"
    if not path.exists():
        return path, {}
    config = load_json(path, limits)
    if not isinstance(config, dict):
        raise WorkloadError(path, "", f"expected a JSON object, found {describe(config)}")
    return path, config


def _sizes(item: Mapping[str, Any], file: Path, path: str) -> tuple[int, int, int]:
    """Return ``(num_nodes, num_nodes_min, num_nodes_max)`` as ElastiSim defines them."""
    given = {}
    for key in ("num_nodes", "num_nodes_min", "num_nodes_max"):
        if item.get(key) is not None:
            given[key] = integer(item[key], file, child_path(path, key), minimum=1)
    size = given.get("num_nodes", 0)
    lo = given.get("num_nodes_min", size)
    hi = given.get("num_nodes_max", size)
    size = size or hi
    if not size:
        raise WorkloadError(
            file, path, "no size: give num_nodes, or num_nodes_min and num_nodes_max"
        )
    return size, lo, hi


def as_argument_text(value: float) -> float:
    """Return a non-integer job argument as ElastiSim passes it: six decimals.

    ElastiSim keeps a job's arguments as text (``Utility::readStringMap``): a JSON number
    with a fraction is written with ``std::to_string`` (``printf("%f")``, six decimals,
    correctly rounded) and substituted into the model's expressions as that text; JSON
    integers are written in full.

    Args:
        value: The argument's value (a JSON number with a fraction).

    Example:
        >>> as_argument_text(0.7023175709607384), as_argument_text(1.25e-7)
        (0.702318, 0.0)
    """
    return float(f"{value:f}")


def _arguments(raw: Any, file: Path, path: str) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise WorkloadError(file, path, f"expected an object of numbers, found {describe(raw)}")
    out = {}
    for k, v in raw.items():
        value = number(v, file, child_path(path, str(k)))
        out[str(k)] = as_argument_text(value) if isinstance(v, float) else value
    return out


def read_elastisim(
    jobs_file: str | Path,
    platform: Platform | str | Path | None = None,
    *,
    num_nodes: int | None = None,
    strict: bool = False,
    limits: ElastiSimLimits | None = None,
) -> ElastiSimInput:
    """Read an ElastiSim ``jobs.json`` with its application models and platform.

    Application-model and platform paths in the files are resolved relative to the
    folder of ``jobs.json`` (by their full relative path, else by file name).

    Args:
        jobs_file: The ``jobs.json``.
        platform: A :class:`Platform`, a platform XML path, or ``None`` to use the
            ``platform_file`` of ``configuration.json`` beside ``jobs.json``.
        num_nodes: Machine size replacing the platform's (``--nodes``).
        strict: Raise on a job larger than the machine instead of skipping it and
            listing it in :attr:`ElastiSimInput.skipped` (the default, as for SWF traces).
        limits: Bounds on files, JSON, iterations and expressions (default
            :class:`ElastiSimLimits`).

    Raises:
        WorkloadError: Any problem with the inputs (a missing or unreadable file
            included); the message names the file and the JSON path.
    """
    limits = _DEFAULT_LIMITS if limits is None else limits
    jobs_file = Path(jobs_file)
    base = jobs_file.parent
    items = _job_items(jobs_file, limits)
    config_path, config = _configuration(base, limits)
    if not isinstance(platform, Platform):
        platform = _find_platform(platform, config, config_path, jobs_file, limits)
    platform = _machine(platform, num_nodes, jobs_file)
    reader = _JobReader(jobs_file, platform, limits, strict)
    jobs = [job for k, item in enumerate(items) if (job := reader.job(k, item)) is not None]
    interval, on_point, clip = _options(config, config_path)
    return ElastiSimInput(jobs, platform, config, interval, on_point, clip, reader.skipped)


def _job_items(jobs_file: Path, limits: ElastiSimLimits) -> list[Any]:
    """Read ``jobs.json`` and return its ``jobs`` list (unchecked items)."""
    raw = load_json(jobs_file, limits)
    if not isinstance(raw, dict) or not isinstance(raw.get("jobs"), list):
        found = describe(raw.get("jobs") if isinstance(raw, dict) else raw)
        raise WorkloadError(
            jobs_file,
            "jobs" if isinstance(raw, dict) else "",
            f"expected an object with a 'jobs' list, found {found}",
        )
    return raw["jobs"]


def _find_platform(
    given: str | Path | None,
    config: Mapping[str, Any],
    config_path: Path,
    jobs_file: Path,
    limits: ElastiSimLimits,
) -> Platform:
    """Read the platform XML given, else the ``platform_file`` of the configuration."""
    base = jobs_file.parent
    xml = given if given is not None else config.get("platform_file")
    if xml is None:
        raise WorkloadError(
            jobs_file,
            "",
            "no platform given and no configuration.json with a 'platform_file' beside it",
        )
    if not isinstance(xml, str | Path):
        raise WorkloadError(
            config_path, "platform_file", f"expected a file name, found {describe(xml)}"
        )
    found_xml = _resolve(base, str(xml))
    if found_xml is None:
        where = (config_path, "platform_file") if given is None else (jobs_file, "")
        raise WorkloadError(*where, f"platform file {str(xml)!r} not found (looked in {base})")
    return _read_platform(found_xml, limits)


def _machine(platform: Platform, num_nodes: int | None, jobs_file: Path) -> Platform:
    """Apply ``num_nodes`` to the platform; refuse a machine above :data:`MAX_NODES`."""
    if num_nodes is not None:
        if (
            isinstance(num_nodes, bool)
            or not isinstance(num_nodes, int)
            or not 1 <= num_nodes <= MAX_NODES
        ):
            raise WorkloadError(
                jobs_file,
                "",
                f"num_nodes={num_nodes!r}: expected the machine "
                f"size, an integer in [1, {MAX_NODES:,}]",
            )
        platform = dataclasses.replace(platform, num_nodes=num_nodes)
    if platform.num_nodes > MAX_NODES:
        raise WorkloadError(
            jobs_file,
            "",
            f"a machine of {platform.num_nodes:,} nodes; at most {MAX_NODES:,} are simulated",
        )
    return platform


@dataclass(frozen=True)
class _JobFields:
    """A job entry's checked fields, before its application model is bound."""

    kind: JobType
    submit: float
    size: int
    lo: int
    hi: int
    gpus: int
    walltime: float | None
    arguments: dict[str, float]


class _JobReader:
    """Turns the items of ``jobs.json`` into jobs, one at a time.

    Application models are read once per file name and kept; jobs larger than the
    machine are listed in :attr:`skipped` (or raise, when ``strict``).
    """

    def __init__(
        self, jobs_file: Path, platform: Platform, limits: ElastiSimLimits, strict: bool
    ) -> None:
        self.jobs_file = jobs_file
        self.platform = platform
        self.limits = limits
        self.strict = strict
        self.models: dict[str, ApplicationModel] = {}
        self.skipped: list[str] = []

    def job(self, k: int, item: Any) -> Job | None:
        """Return job ``k`` of ``jobs.json``, or ``None`` if it is skipped."""
        path = f"jobs[{k}]"
        fields = self._fields(item, path)
        problem = self._oversized(fields)
        if problem:
            if self.strict:
                raise WorkloadError(
                    self.jobs_file,
                    path,
                    f"{problem} (strict: jobs larger than the machine are errors)",
                )
            self.skipped.append(f"job {k}: {problem}")
            return None
        size, hi = fields.size, fields.hi
        if fields.kind is not JobType.RIGID:  # a job never gets more than the machine
            machine = self.platform.num_nodes
            size, hi = min(size, machine), min(hi, machine)
        model = self._model(item["application_model"], path)
        try:
            work = model.bind(
                fields.arguments,
                size,
                platform=self.platform,
                scheduling_points=fields.kind.resizable,
            )
            return Job(
                k,
                fields.submit,
                fields.kind,
                size,
                work,
                fields.lo,
                hi,
                fields.walltime or None,
                fields.gpus,
            )
        except ValueError as exc:  # WorkloadError of the model, or Job's own checks
            raise WorkloadError(self.jobs_file, path, str(exc)) from None

    def _fields(self, item: Any, path: str) -> _JobFields:
        """Check a job entry's fields (all but the application model's contents)."""
        jobs_file = self.jobs_file
        if not isinstance(item, dict):
            raise WorkloadError(jobs_file, path, f"expected a job object, found {describe(item)}")
        for key in ("type", "submit_time", "application_model"):
            if key not in item:
                raise WorkloadError(jobs_file, path, f"missing field {key!r}")
        kind_raw = item["type"]
        if not isinstance(kind_raw, str) or kind_raw not in JobType.__members__.values():
            raise WorkloadError(
                jobs_file,
                f"{path}.type",
                f"{describe(kind_raw)}: expected one of {[t.value for t in JobType]}",
            )
        submit = number(item["submit_time"], jobs_file, f"{path}.submit_time", minimum=0)
        size, lo, hi = _sizes(item, jobs_file, path)
        gpn = item.get("num_gpus_per_node")
        gpn = 0 if gpn is None else integer(gpn, jobs_file, f"{path}.num_gpus_per_node")
        walltime = item.get("walltime")
        if walltime is not None and walltime != 0:
            walltime = number(walltime, jobs_file, f"{path}.walltime", minimum=0)
        arguments = _arguments(item.get("arguments"), jobs_file, f"{path}.arguments")
        return _JobFields(JobType(kind_raw), submit, size, lo, hi, gpn, walltime, arguments)

    def _oversized(self, fields: _JobFields) -> str:
        """Why the job does not fit the machine, or ``""``."""
        machine, gpus = self.platform.num_nodes, self.platform.gpus_per_node
        need = fields.size if fields.kind is JobType.RIGID else (fields.lo or fields.size)
        if need > machine:
            return f"{need} nodes > machine of {machine}"
        if fields.gpus > gpus:
            return f"{fields.gpus} GPUs per node > {gpus} per node of the machine"
        return ""

    def _model(self, name: Any, path: str) -> ApplicationModel:
        """The application model file ``name`` of job ``path``, read once per name."""
        jobs_file = self.jobs_file
        where = f"{path}.application_model"
        if not isinstance(name, str) or not name:
            raise WorkloadError(jobs_file, where, f"expected a file name, found {describe(name)}")
        try:
            if name not in self.models:
                model_path = _resolve(jobs_file.parent, name)
                if model_path is None:
                    raise WorkloadError(
                        jobs_file, where, f"file {name!r} not found (looked in {jobs_file.parent})"
                    )
                self.models[name] = read_application_model(model_path, limits=self.limits)
        except WorkloadError as exc:
            if exc.file == str(jobs_file):
                raise
            raise WorkloadError(jobs_file, where, str(exc)) from None
        return self.models[name]


def _options(config: Mapping[str, Any], config_path: Path) -> tuple[float, bool, bool]:
    """Return the configuration's scheduling options; refuse ``allow_oversubscription``.

    Returns:
        ``(scheduling_interval, schedule_on_scheduling_point, clip_evolving_requests)``.
    """
    interval = config.get("scheduling_interval")
    interval = (
        0.0 if not interval else number(interval, config_path, "scheduling_interval", minimum=0)
    )
    on_point = boolean(
        config.get("schedule_on_scheduling_point", True),
        config_path,
        "schedule_on_scheduling_point",
    )
    clip = boolean(
        config.get("clip_evolving_requests", True), config_path, "clip_evolving_requests"
    )
    if boolean(config.get("allow_oversubscription", False), config_path, "allow_oversubscription"):
        reason = "several jobs per node are not simulated (one job per node); set it to false"
        raise WorkloadError(config_path, "allow_oversubscription", reason)
    return interval, on_point, clip
