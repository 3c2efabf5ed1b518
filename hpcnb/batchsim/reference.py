"""ElastiSim itself as the reference: build it, run a project, compare its jobs with ours.

ElastiSim (the SimGrid-based C++ simulator) and its Python scheduling interface are
not part of this package; this module drives them from local source folders, never
downloading anything:

* :func:`build_elastisim` configures and compiles the simulator with CMake against the
  installed SimGrid and ZeroMQ (Debian: ``libsimgrid-dev``, ``libzmq3-dev``,
  ``cppzmq-dev``, ``cmake``, ``g++``). The sources are copied into the build folder
  first, so that the two compatibility edits older SimGrid releases need (a header
  include, and ``Link::get_load`` named ``get_usage`` before SimGrid 3.33) touch only the
  copy.
* :func:`run_elastisim` stages a project (``configuration.json``, the jobs file, the
  application models, the platform) into an output folder with every path made
  absolute and a private ZeroMQ socket, starts the simulator and the project's Python
  scheduling algorithm (``algorithm.py`` with ``schedule(jobs, nodes, system)``, run with
  the ``elastisim_python`` interface) as two processes with a time limit, and returns
  where ElastiSim wrote ``job_statistics.csv`` and its other outputs.
* :func:`compare_jobs` compares our job table with ElastiSim's ``job_statistics.csv``:
  per job the start and makespan differences, the share of jobs of each type whose
  makespan is within a tolerance, and the first job whose start time differs.
* :func:`self_agreement` compares our simulation of a project with itself on a platform
  changed by one part in 10¹²: how far two faithful simulators that round differently
  can agree on that workload (the ceiling of :func:`compare_jobs`).

Command line (``python -m hpcnb.batchsim.reference``)::

    build SRC BUILD                      compile ElastiSim, print the binary's path
    run PROJECT OUT --binary B --interface PY [--algorithm A]
    compare PROJECT JOB_STATISTICS_CSV   simulate PROJECT here, print the comparison
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcnb.errors import HpcnbError, InvalidInputError

if TYPE_CHECKING:
    import pandas as pd

    from hpcnb.batchsim.simulation import SimulationResult

__all__ = [
    "JobComparison",
    "ElastiSimRunError",
    "ReferenceRun",
    "build_elastisim",
    "compare_jobs",
    "run_elastisim",
    "self_agreement",
]

#: Keys of ElastiSim's configuration that name output files.
OUTPUT_KEYS = (
    "job_statistics",
    "cpu_utilization",
    "node_utilization",
    "network_activity",
    "pfs_utilization",
    "gpu_utilization",
    "task_times",
)
_INCLUDE_DIRS = ("/usr/include", "/usr/local/include")


class ElastiSimRunError(HpcnbError):
    """ElastiSim could not be built or run (the message says which step and why)."""


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run_step(cmd: Sequence[str], cwd: Path, timeout: float, what: str) -> str:
    """Run one command; return its output, or raise naming the step with the log's tail."""
    try:
        done = subprocess.run(
            list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise ElastiSimRunError(f"{what}: {cmd[0]!r} is not installed") from None
    except subprocess.TimeoutExpired:
        command = " ".join(cmd)
        raise ElastiSimRunError(f"{what}: no result within {timeout:g} s ({command})") from None
    log = done.stdout + done.stderr
    (cwd / f"{what.replace(' ', '_')}.log").write_text(log, encoding="utf-8")
    if done.returncode != 0:
        raise ElastiSimRunError(f"{what} failed (exit {done.returncode}) in {cwd}:\n{_tail(log)}")
    return log


def simgrid_version(include_dirs: Sequence[str | Path] = _INCLUDE_DIRS) -> tuple[int, int] | None:
    """Return ``(major, minor)`` of the installed SimGrid headers, or ``None`` if absent.

    Args:
        include_dirs: Folders searched for ``simgrid/version.h``.
    """
    for folder in include_dirs:
        header = Path(folder) / "simgrid" / "version.h"
        if header.is_file():
            text = header.read_text(encoding="utf-8", errors="replace")
            found = {
                key: int(m.group(1))
                for key in ("MAJOR", "MINOR")
                if (m := re.search(rf"#define SIMGRID_VERSION_{key}\s+(\d+)", text))
            }
            if len(found) == 2:
                return found["MAJOR"], found["MINOR"]
    return None


def _stage_sources(src_dir: Path, dest: Path, version: tuple[int, int]) -> list[str]:
    """Copy the sources to ``dest``; apply the edits the installed SimGrid needs."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src_dir, dest, ignore=shutil.ignore_patterns(".git", "build", "cmake-build*"))
    edits = []
    if version < (3, 33):  # s4u::Link::get_load() was called get_usage() before 3.33
        for path in sorted((dest / "src").rglob("*.cpp")):
            text = path.read_text(encoding="utf-8")
            new = text.replace("link->get_load()", "link->get_usage()")
            if new != text:
                path.write_text(new, encoding="utf-8")
                edits.append(f"{path.relative_to(dest)}: Link::get_load -> get_usage")
    return edits


def build_elastisim(
    src_dir: str | Path,
    build_dir: str | Path,
    *,
    jobs: int = 2,
    timeout: float = 1800.0,
) -> Path:
    """Compile ElastiSim from a local source folder and return the simulator binary.

    Args:
        src_dir: The ElastiSim sources (with ``CMakeLists.txt`` and ``src/``).
        build_dir: Folder for the staged sources and the build (created).
        jobs: Parallel compile jobs (``make -j``).
        timeout: Limit for configure and for compile, each (s).

    Raises:
        ElastiSimRunError: Missing sources, SimGrid headers or tools, or a failed step.
    """
    src, build = Path(src_dir).resolve(), Path(build_dir).resolve()
    if not (src / "CMakeLists.txt").is_file() or not (src / "src").is_dir():
        raise ElastiSimRunError(f"{src}: not ElastiSim's sources (no CMakeLists.txt and src/)")
    version = simgrid_version()
    if version is None:
        raise ElastiSimRunError(
            "SimGrid headers not found (simgrid/version.h in /usr/include or /usr/local/include);"
            " install libsimgrid-dev"
        )
    for tool in ("cmake", "make", "c++"):
        if shutil.which(tool) is None:
            raise ElastiSimRunError(f"{tool!r} is not installed (needed to build ElastiSim)")
    build.mkdir(parents=True, exist_ok=True)
    staged = build / "source"
    _stage_sources(src, staged, version)
    out = build / "cmake"
    out.mkdir(exist_ok=True)
    flags = "-include unordered_set"  # PlatformManager.h relies on a transitive include
    configure = [
        "cmake",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CXX_FLAGS={flags}",
        str(staged),
    ]
    _run_step(configure, out, timeout, "configure")
    _run_step(["make", f"-j{max(1, int(jobs))}"], out, timeout, "compile")
    binary = out / "elastisim"
    if not binary.is_file():
        raise ElastiSimRunError(f"compile finished but {binary} is missing")
    return binary


def _find(base: Path, name: str, what: str) -> Path:
    """Resolve a path of the project: as given from ``base``, else its file name there."""
    for candidate in (base / name, base / Path(name).name):
        if candidate.is_file():
            return candidate.resolve()
    raise ElastiSimRunError(f"{base}: {what} {name!r} not found (as given, or by its file name)")


def _stage_project(project: Path, work: Path, url: str) -> Path:
    """Write the project into ``work/input`` with absolute paths; return the configuration."""
    config_path = project / "configuration.json"
    if not config_path.is_file():
        raise ElastiSimRunError(f"{project}: no configuration.json")
    config: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8"))
    inputs, outputs = work / "input", work / "output"
    inputs.mkdir(parents=True, exist_ok=True)
    outputs.mkdir(parents=True, exist_ok=True)
    jobs_src = _find(project, str(config.get("jobs_file", "jobs.json")), "jobs_file")
    jobs = json.loads(jobs_src.read_text(encoding="utf-8"))
    models: dict[str, Path] = {}
    for job in jobs.get("jobs", []):
        name = job.get("application_model")
        if isinstance(name, str):
            if name not in models:
                models[name] = _find(project, name, "application model")
            job["application_model"] = str(models[name])
    (inputs / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    platform = _find(project, str(config.get("platform_file", "")), "platform_file")
    config["jobs_file"] = str(inputs / "jobs.json")
    config["platform_file"] = str(platform)
    config["zmq_url"] = url
    for key in OUTPUT_KEYS:
        if key in config:
            config[key] = str(outputs / Path(str(config[key])).name)
    staged = inputs / "configuration.json"
    staged.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return staged


@dataclass(frozen=True)
class ReferenceRun:
    """Where one ElastiSim run left its outputs.

    Attributes:
        out_dir: The run's folder (``input/`` staged project, ``output/`` ElastiSim's files).
        job_statistics: ElastiSim's ``job_statistics.csv``.
        outputs: Every output file ElastiSim wrote, by configuration key.
        seconds: Wall-clock time of the run.
    """

    out_dir: Path
    job_statistics: Path
    outputs: Mapping[str, Path]
    seconds: float


_SCHEDULER_DRIVER = """\
import importlib.util, logging, sys
spec = importlib.util.spec_from_file_location("algorithm", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
logging.disable(logging.INFO)
from elastisim_python import pass_algorithm
pass_algorithm(module.schedule, sys.argv[2])
"""


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)


def run_elastisim(
    project_dir: str | Path,
    out_dir: str | Path,
    *,
    binary: str | Path,
    interface_dir: str | Path,
    algorithm: str | Path | None = None,
    python: str | Path = sys.executable,
    timeout: float = 900.0,
) -> ReferenceRun:
    """Run ElastiSim on a project with the project's own Python scheduling algorithm.

    Args:
        project_dir: Folder with ``configuration.json``; the files it names are looked up
            as given (from this folder) or by file name in it.
        out_dir: Folder for the staged project and ElastiSim's outputs (created).
        binary: The ``elastisim`` executable (:func:`build_elastisim`).
        interface_dir: Folder holding the ``elastisim_python`` package (elastisim-python).
        algorithm: The scheduling algorithm file (default ``algorithm/algorithm.py`` or
            ``algorithm.py`` of the project).
        python: Interpreter for the algorithm (needs ``pyzmq``).
        timeout: Limit for the whole run (s); both processes are stopped after it.

    Raises:
        ElastiSimRunError: A missing file, a process that failed or ran out of time.
    """
    project, out = Path(project_dir).resolve(), Path(out_dir).resolve()
    exe = Path(binary).resolve()
    if not exe.is_file():
        raise ElastiSimRunError(f"{exe}: no ElastiSim binary (build it with build_elastisim)")
    if not (Path(interface_dir) / "elastisim_python").is_dir():
        raise ElastiSimRunError(f"{interface_dir}: no elastisim_python package in it")
    if algorithm is None:
        options = (project / "algorithm" / "algorithm.py", project / "algorithm.py")
        algorithm = next((p for p in options if p.is_file()), options[0])
    algo = Path(algorithm).resolve()
    if not algo.is_file():
        raise ElastiSimRunError(f"{algo}: scheduling algorithm not found")
    out.mkdir(parents=True, exist_ok=True)
    socket_dir = Path(tempfile.mkdtemp(prefix="es"))  # short: a socket path has ~100 chars
    url = f"ipc://{socket_dir / 'elastisim.ipc'}"
    config = _stage_project(project, out, url)
    env = {**os.environ, "PYTHONPATH": str(Path(interface_dir).resolve())}
    started = time.monotonic()
    with (out / "elastisim.log").open("wb") as sim_log, (out / "scheduler.log").open("wb") as log:
        sim = subprocess.Popen(
            [str(exe), str(config), "--log=root.thresh:warning"],
            cwd=out,
            stdout=sim_log,
            stderr=subprocess.STDOUT,
        )
        sched = subprocess.Popen(
            [str(python), "-c", _SCHEDULER_DRIVER, str(algo), url],
            cwd=out,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            codes = [
                p.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
                for p in (sim, sched)
            ]
        except subprocess.TimeoutExpired:
            codes = None
        finally:
            _stop(sim)
            _stop(sched)
            shutil.rmtree(socket_dir, ignore_errors=True)
    seconds = time.monotonic() - started
    if codes is None:
        raise ElastiSimRunError(f"ElastiSim run in {out}: no result within {timeout:g} s")
    if codes != [0, 0]:
        logs = (out / "elastisim.log", out / "scheduler.log")
        tails = "\n".join(f"--- {p.name}\n{_tail(p.read_text(errors='replace'))}" for p in logs)
        raise ElastiSimRunError(f"ElastiSim run in {out} failed (exit {codes}):\n{tails}")
    written = json.loads(config.read_text(encoding="utf-8"))
    outputs = {k: Path(written[k]) for k in OUTPUT_KEYS if k in written}
    stats = outputs.get("job_statistics")
    if stats is None or not stats.is_file():
        raise ElastiSimRunError(f"ElastiSim run in {out}: no job_statistics file written")
    return ReferenceRun(out, stats, outputs, seconds)


_OUR_COLUMNS = {"id": "id", "type": "type", "start": "start", "end": "end"}
_ELASTISIM_COLUMNS = {"ID": "id", "Type": "type", "Start Time": "start", "End Time": "end"}


def _job_frame(table: Any, what: str) -> pd.DataFrame:
    """Return ``id, type, start, end`` of our table or of an ElastiSim job_statistics table."""
    import pandas as pd

    if isinstance(table, str | Path):
        try:
            table = pd.read_csv(table)
        except (OSError, ValueError) as exc:
            raise ElastiSimRunError(f"{what} {table}: not a readable CSV ({exc})") from None
    elif hasattr(table, "columns") and not isinstance(table, pd.DataFrame):
        table = table.jobs  # a SimulationResult
    if not isinstance(table, pd.DataFrame):
        raise ElastiSimRunError(f"{what}: expected a DataFrame, a SimulationResult or a CSV path")
    for names in (_OUR_COLUMNS, _ELASTISIM_COLUMNS):
        if set(names) <= set(table.columns):
            frame = table[list(names)].rename(columns=names)
            break
    else:
        raise ElastiSimRunError(
            f"{what}: needs columns {sorted(_OUR_COLUMNS)} or {sorted(_ELASTISIM_COLUMNS)}, "
            f"has {list(table.columns)}"
        )
    if frame["id"].duplicated().any():
        raise ElastiSimRunError(f"{what}: job ids repeat")
    frame = frame.astype({"id": "int64", "start": "float64", "end": "float64"})
    return frame.set_index("id").sort_index()


@dataclass(frozen=True)
class JobComparison:
    """Our jobs beside ElastiSim's.

    Attributes:
        jobs: Per job (index ``id``): ``type``, ``start``, ``start_ref``, ``start_diff``
            (ours - ElastiSim's, s), ``makespan``, ``makespan_ref``, ``makespan_error``
            (ours / ElastiSim's - 1) and ``within`` (``|makespan_error| <= tolerance``).
        shares: Share of jobs ``within``, per type and ``overall``.
        first_start_mismatch: Id of the earliest job (by ElastiSim's start time) whose
            start differs by more than ``start_tolerance``; ``None`` if none does.
        tolerance: Relative makespan tolerance used.
        start_tolerance: Start-time tolerance used (s).
    """

    jobs: pd.DataFrame
    shares: pd.Series
    first_start_mismatch: int | None
    tolerance: float
    start_tolerance: float

    def summary(self) -> str:
        """Return the shares and the first start mismatch as a few readable lines."""
        parts = [f"{name} {share:.3f}" for name, share in self.shares.items()]
        first = self.first_start_mismatch
        where = "none" if first is None else f"job {first}"
        return (
            f"makespan within {self.tolerance:.0%} of ElastiSim's: " + ", ".join(parts) + "\n"
            f"first job starting > {self.start_tolerance:g} s apart: {where}"
        )


def compare_jobs(
    ours: Any,
    reference: Any,
    *,
    tolerance: float = 0.05,
    start_tolerance: float = 1.0,
) -> JobComparison:
    """Compare our jobs with ElastiSim's ``job_statistics.csv``, job by job.

    Makespan is end - start, as ElastiSim reports it. Jobs are matched by id (both
    number the jobs in submission order); jobs present on one side only are an error.

    Args:
        ours: A :class:`~hpcnb.batchsim.simulation.SimulationResult`, its ``jobs`` table,
            or a table (or CSV path) in ElastiSim's ``job_statistics`` layout.
        reference: ElastiSim's ``job_statistics.csv`` (path or DataFrame).
        tolerance: Relative makespan difference that counts as agreement.
        start_tolerance: Start-time difference (s) above which starts differ.

    Raises:
        ElastiSimRunError: A table lacks the columns, or the job ids differ.
    """
    import pandas as pd

    mine = _job_frame(ours, "our jobs")
    ref = _job_frame(reference, "reference")
    if not mine.index.equals(ref.index):
        only = sorted(set(mine.index) ^ set(ref.index))[:5]
        raise ElastiSimRunError(f"the two tables hold different jobs (e.g. ids {only})")
    jobs = pd.DataFrame({"type": ref["type"].astype(str)})
    jobs["start"], jobs["start_ref"] = mine["start"], ref["start"]
    jobs["start_diff"] = jobs["start"] - jobs["start_ref"]
    jobs["makespan"] = mine["end"] - mine["start"]
    jobs["makespan_ref"] = ref["end"] - ref["start"]
    scale = jobs["makespan_ref"].abs().where(jobs["makespan_ref"] != 0, 1.0)
    jobs["makespan_error"] = (jobs["makespan"] - jobs["makespan_ref"]) / scale
    jobs["within"] = jobs["makespan_error"].abs() <= tolerance
    shares = jobs.groupby("type")["within"].mean()
    shares["overall"] = jobs["within"].mean()
    late = jobs[jobs["start_diff"].abs() > start_tolerance]
    first = None
    if len(late):
        first = int(late.sort_values(["start_ref"], kind="stable").index[0])
    return JobComparison(jobs, shares.astype(float), first, tolerance, start_tolerance)


def _simulate_project(
    project: Path, perturb: Mapping[str, float] | None = None
) -> SimulationResult:
    """Simulate an ElastiSim project here with the ElastiSim example's FCFS policy.

    Args:
        project: Folder with ``configuration.json`` (or a ``jobs.json``).
        perturb: Platform fields to multiply by a factor (``{"node_flops": 1 + 1e-12}``).
    """
    import dataclasses

    from hpcnb.batchsim.elastisim import read_elastisim
    from hpcnb.batchsim.policies import ElastiSimFCFS
    from hpcnb.batchsim.simulation import simulate

    config = project / "configuration.json"
    jobs = _find(project, "jobs.json", "jobs file") if not config.is_file() else None
    if jobs is None:
        name = json.loads(config.read_text(encoding="utf-8")).get("jobs_file", "jobs.json")
        jobs = _find(project, str(name), "jobs_file")
    workload = read_elastisim(jobs)
    platform = workload.platform
    if perturb:
        known = {f.name for f in dataclasses.fields(platform)}
        unknown = sorted(set(perturb) - known)
        if unknown:
            raise InvalidInputError(
                f"perturb: {unknown} are not platform fields (expected some of {sorted(known)})"
            )
        changes = {key: getattr(platform, key) * factor for key, factor in perturb.items()}
        platform = dataclasses.replace(platform, **changes)
    options: dict[str, Any] = dict(workload.simulation_options())
    return simulate(workload.jobs, platform, ElastiSimFCFS(), **options)


def self_agreement(
    project: str | Path, perturb: Mapping[str, float], *, tolerance: float = 0.05
) -> JobComparison:
    """Compare a project's simulation with itself on a platform changed by a hair.

    Shared-PFS workloads are sensitive to the last bits of their inputs: a rate changed
    by one part in 10¹² moves checkpoints by nanoseconds, the moves grow as jobs share
    the PFS, and after enough time another job sees different free nodes at a scheduling
    point. The shares of this comparison are the agreement one can expect between two
    faithful simulators that round differently (ElastiSim's own runs under such a change
    agree to the same degree), so they bound what :func:`compare_jobs` can show.

    Args:
        project: Folder with ``configuration.json`` (or a ``jobs.json``).
        perturb: Platform fields and the factors to multiply them by
            (``{"pfs_write_bandwidth": 1 + 1e-12}``).
        tolerance: Relative makespan tolerance (as in :func:`compare_jobs`).

    Raises:
        ElastiSimRunError: The project's files are missing.
        InvalidInputError: A name in ``perturb`` is not a field of the platform.
    """
    folder = Path(project)
    base = _simulate_project(folder)
    changed = _simulate_project(folder, perturb)
    return compare_jobs(changed, base, tolerance=tolerance)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (see the module docstring).

    Args:
        argv: Arguments (default ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m hpcnb.batchsim.reference")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile ElastiSim from local sources")
    b.add_argument("src")
    b.add_argument("build")
    b.add_argument("--jobs", type=int, default=2)
    r = sub.add_parser("run", help="run ElastiSim on a project")
    r.add_argument("project")
    r.add_argument("out")
    r.add_argument("--binary", required=True)
    r.add_argument("--interface", required=True, help="folder with elastisim_python")
    r.add_argument("--algorithm", default=None)
    r.add_argument("--timeout", type=float, default=900.0)
    c = sub.add_parser("compare", help="simulate a project here and compare with ElastiSim")
    c.add_argument("project")
    c.add_argument("reference", help="ElastiSim's job_statistics.csv")
    c.add_argument("--tolerance", type=float, default=0.05)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build_elastisim(args.src, args.build, jobs=args.jobs))
        elif args.command == "run":
            run = run_elastisim(
                args.project,
                args.out,
                binary=args.binary,
                interface_dir=args.interface,
                algorithm=args.algorithm,
                timeout=args.timeout,
            )
            print(f"{run.job_statistics} ({run.seconds:.1f} s)")
        else:
            result = _simulate_project(Path(args.project))
            print(compare_jobs(result, args.reference, tolerance=args.tolerance).summary())
    except HpcnbError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
