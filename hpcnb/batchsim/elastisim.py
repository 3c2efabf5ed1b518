"""ElastiSim's input format: ``jobs.json``, its application models and the platform.

:func:`read_elastisim` reads a ``jobs.json`` (``{"jobs": [...]}``: each job's ``type``,
``submit_time``, ``num_nodes`` or ``num_nodes_min`` / ``num_nodes_max``, optional
``walltime`` and ``num_gpus_per_node``, the ``application_model`` file and its numeric
``arguments``), the application models it names (:mod:`hpcnb.batchsim.application_model`)
and the platform XML named by ``configuration.json`` beside it
(:func:`~hpcnb.batchsim.platform.read_platform_xml`).

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

        ElastiSim runs SimGrid's parallel-task model ``ptask_L07``, so transfers share the
        PFS by equal progress (``fairness="ptask"``).
        """
        return {
            "scheduling_interval": self.scheduling_interval,
            "on_scheduling_point": self.on_scheduling_point,
            "clip_evolving_requests": self.clip_evolving_requests,
            "fairness": "ptask",
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
        raise WorkloadError(path, "", f"{size:,} bytes; at most {limits.max_platform_bytes:,} "
                            "are read (ElastiSimLimits.max_platform_bytes)")  # fmt: skip
    try:
        platform = read_platform_xml(path)
    except (ValueError, OSError, ArithmeticError) as exc:
        reason = str(exc).removeprefix(f"{path}: ") or type(exc).__name__
        raise WorkloadError(path, "", reason.splitlines()[0]) from None
    if platform.num_nodes > MAX_NODES:
        raise WorkloadError(path, "", f"a machine of {platform.num_nodes:,} nodes; at most "
                            f"{MAX_NODES:,} are simulated")  # fmt: skip
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
        raise WorkloadError(file, path, "no size: give num_nodes, or num_nodes_min and "
                            "num_nodes_max")  # fmt: skip
    return size, lo, hi


def _arguments(raw: Any, file: Path, path: str) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise WorkloadError(file, path, f"expected an object of numbers, found {describe(raw)}")
    return {str(k): number(v, file, child_path(path, str(k))) for k, v in raw.items()}


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
    raw = load_json(jobs_file, limits)
    if not isinstance(raw, dict) or not isinstance(raw.get("jobs"), list):
        found = describe(raw.get("jobs") if isinstance(raw, dict) else raw)
        raise WorkloadError(jobs_file, "jobs" if isinstance(raw, dict) else "",
                            f"expected an object with a 'jobs' list, found {found}")  # fmt: skip
    config_path, config = _configuration(base, limits)
    if not isinstance(platform, Platform):
        xml = platform if platform is not None else config.get("platform_file")
        if xml is None:
            raise WorkloadError(jobs_file, "", "no platform given and no configuration.json "
                                "with a 'platform_file' beside it")  # fmt: skip
        if not isinstance(xml, str | Path):
            raise WorkloadError(config_path, "platform_file", f"expected a file name, found "
                                f"{describe(xml)}")  # fmt: skip
        found_xml = _resolve(base, str(xml))
        if found_xml is None:
            where = (config_path, "platform_file") if platform is None else (jobs_file, "")
            raise WorkloadError(*where, f"platform file {str(xml)!r} not found (looked in {base})")
        platform = _read_platform(found_xml, limits)
    if num_nodes is not None:
        if (isinstance(num_nodes, bool) or not isinstance(num_nodes, int)
                or not 1 <= num_nodes <= MAX_NODES):  # fmt: skip
            raise WorkloadError(jobs_file, "", f"num_nodes={num_nodes!r}: expected the machine "
                                f"size, an integer in [1, {MAX_NODES:,}]")  # fmt: skip
        platform = dataclasses.replace(platform, num_nodes=num_nodes)
    if platform.num_nodes > MAX_NODES:
        raise WorkloadError(jobs_file, "", f"a machine of {platform.num_nodes:,} nodes; at most "
                            f"{MAX_NODES:,} are simulated")  # fmt: skip
    machine, gpus = platform.num_nodes, platform.gpus_per_node
    models: dict[str, ApplicationModel] = {}
    jobs: list[Job] = []
    skipped: list[str] = []
    for k, item in enumerate(raw["jobs"]):
        path = f"jobs[{k}]"
        if not isinstance(item, dict):
            raise WorkloadError(jobs_file, path, f"expected a job object, found {describe(item)}")
        for key in ("type", "submit_time", "application_model"):
            if key not in item:
                raise WorkloadError(jobs_file, path, f"missing field {key!r}")
        kind_raw = item["type"]
        if not isinstance(kind_raw, str) or kind_raw not in JobType.__members__.values():
            raise WorkloadError(jobs_file, f"{path}.type", f"{describe(kind_raw)}: expected one "
                                f"of {[t.value for t in JobType]}")  # fmt: skip
        kind = JobType(kind_raw)
        submit = number(item["submit_time"], jobs_file, f"{path}.submit_time", minimum=0)
        size, lo, hi = _sizes(item, jobs_file, path)
        gpn = item.get("num_gpus_per_node")
        gpn = 0 if gpn is None else integer(gpn, jobs_file, f"{path}.num_gpus_per_node")
        walltime = item.get("walltime")
        if walltime is not None and walltime != 0:
            walltime = number(walltime, jobs_file, f"{path}.walltime", minimum=0)
        arguments = _arguments(item.get("arguments"), jobs_file, f"{path}.arguments")
        need = size if kind is JobType.RIGID else (lo or size)
        problem = ""
        if need > machine:
            problem = f"{need} nodes > machine of {machine}"
        elif gpn > gpus:
            problem = f"{gpn} GPUs per node > {gpus} per node of the machine"
        if problem:
            if strict:
                raise WorkloadError(jobs_file, path, f"{problem} (strict: jobs larger than the "
                                    "machine are errors)")  # fmt: skip
            skipped.append(f"job {k}: {problem}")
            continue
        if kind is not JobType.RIGID:  # a job never gets more than the machine
            size, hi = min(size, machine), min(hi, machine)
        name = item["application_model"]
        if not isinstance(name, str) or not name:
            raise WorkloadError(jobs_file, f"{path}.application_model",
                                f"expected a file name, found {describe(name)}")  # fmt: skip
        try:
            if name not in models:
                model_path = _resolve(base, name)
                if model_path is None:
                    raise WorkloadError(jobs_file, f"{path}.application_model",
                                        f"file {name!r} not found (looked in {base})")  # fmt: skip
                models[name] = read_application_model(model_path, limits=limits)
        except WorkloadError as exc:
            if exc.file == str(jobs_file):
                raise
            raise WorkloadError(jobs_file, f"{path}.application_model", str(exc)) from None
        try:
            work = models[name].bind(arguments, size, platform=platform,
                                     scheduling_points=kind.resizable)  # fmt: skip
            jobs.append(Job(k, submit, kind, size, work, lo, hi, walltime or None, gpn))
        except ValueError as exc:  # WorkloadError of the model, or Job's own checks
            raise WorkloadError(jobs_file, path, str(exc)) from None
    interval = config.get("scheduling_interval")
    interval = 0.0 if not interval else number(interval, config_path, "scheduling_interval",
                                                minimum=0)  # fmt: skip
    options = {}
    for key in ("schedule_on_scheduling_point", "clip_evolving_requests"):
        options[key] = boolean(config.get(key, True), config_path, key)
    if boolean(config.get("allow_oversubscription", False), config_path,
               "allow_oversubscription"):  # fmt: skip
        reason = "several jobs per node are not simulated (one job per node); set it to false"
        raise WorkloadError(config_path, "allow_oversubscription", reason)
    return ElastiSimInput(jobs, platform, config, interval,
                          options["schedule_on_scheduling_point"],
                          options["clip_evolving_requests"], skipped)  # fmt: skip
