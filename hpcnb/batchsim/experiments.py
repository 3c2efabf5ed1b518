"""Experiment helpers for notebook 05: data loading with fallbacks, sweeps, speed runs.

Each loader returns real data from ``HPCNB_DATA`` when present and otherwise a
stand-in, as a :class:`LoadedData` whose ``label`` names what was actually used
(``"synthetic (Lublin model, stand-in for HPC2N)"``) and whose ``source`` goes into the
records computed from it: ``"real"``, ``"synthetic"`` for a stand-in of missing real
data, or ``"generated"`` where the input is a published model's output on purpose (the
Lublin-256 model trace, or our Lublin–Feitelson generator in its place).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import pandas as pd

from hpcnb.batchsim.dl import STEP_EXPRESSION, StepTimeModel, read_dl_tables
from hpcnb.batchsim.jobs import Job, JobType, RunContext, WorkModel
from hpcnb.batchsim.platform import Platform, Segment, simgrid_platform_xml
from hpcnb.batchsim.policies import make_scheduler
from hpcnb.batchsim.scheduler import Scheduler
from hpcnb.batchsim.simulation import SimulationResult, check_invariants, simulate
from hpcnb.batchsim.swf import SWFTrace, read_swf
from hpcnb.batchsim.workloads import MalleablePolicy, jobs_from_swf, lublin_feitelson
from hpcnb.data import DataNotFoundError, data_path, stand_in_notice
from hpcnb.errors import InvalidInputError
from hpcnb.progress import progress
from hpcnb.timing import Timing

__all__ = [
    "ELASTISIM_EXAMPLE_OVERALL",
    "ELASTISIM_EXAMPLE_TURNAROUND",
    "NETWORK_VARIANTS",
    "LoadedData",
    "TrainingWork",
    "command_seconds",
    "dl_network_jobs",
    "jobs_per_second",
    "load_dl_tables",
    "load_dl_workload",
    "load_elastisim_example",
    "load_trace",
    "malleability_gains",
    "network_comparison",
    "policy_sweep",
    "replicate_workload",
    "speed_vs_jobs",
    "speed_vs_scale",
    "synthetic_dl_table",
    "turnaround_by_type",
    "backlog_scaling",
    "long_queue_trace",
    "loglog_slope",
    "write_synthetic_elastisim_project",
]


T = TypeVar("T")


@dataclass
class LoadedData(Generic[T]):
    """A loaded input and where it came from.

    Attributes:
        value: The data (a trace, a path, ...).
        real: Whether it came from ``HPCNB_DATA``.
        message: What was used, to print.
        label: Name of what was used, for titles and tables: the data set's name when
            real, ``"synthetic (..., stand-in for <name>)"`` otherwise
            (``"generated (..., in place of <name>)"`` for a generated input).
        generated: The input is a model's output made on purpose (a published model
            trace, or the same model's generator in its place), so records computed from
            it are ``source="generated"`` whether it was read or generated here.
    """

    value: T
    real: bool
    message: str
    label: str = ""
    generated: bool = False

    @property
    def source(self) -> str:
        """``"real"``, ``"generated"`` or ``"synthetic"``: the ``source`` of its records."""
        if self.generated:
            return "generated"
        return "real" if self.real else "synthetic"

    def show(self) -> None:
        """Print what was loaded; for a synthetic stand-in, also a notice on fetching the data."""
        print(self.message)
        if not self.real and not self.generated:
            stand_in_notice(self.label.removeprefix("synthetic (").removesuffix(")"), self.message)


def _stand_in_label(what: str, name: str) -> str:
    """Return the label of a synthetic stand-in: ``"synthetic (<what>, stand-in for <name>)"``."""
    return f"synthetic ({what}, stand-in for {name})"


def load_trace(
    relative: str,
    fallback_nodes: int,
    fallback_jobs: int,
    seed: int,
    name: str | None = None,
    generated: bool = False,
) -> LoadedData[SWFTrace]:
    """Read an SWF trace from ``HPCNB_DATA`` or generate a Lublin–Feitelson workload.

    Args:
        relative: Path of the trace inside the data folder.
        fallback_nodes: Machine size of the generated workload.
        fallback_jobs: Jobs of the generated workload.
        seed: Seed of the generated workload.
        name: The trace's name for titles (default: the file name's stem).
        generated: The trace itself is a Lublin–Feitelson model's output (a published
            model trace): read or generated here, it is a generated input
            (``source="generated"``), not a stand-in for a recorded trace.

    Returns:
        The trace, labelled ``name`` when read, ``"synthetic (Lublin model, stand-in for
        <name>)"`` when generated in place of a recorded trace, and ``"generated (Lublin
        model, in place of <name>)"`` when generated in place of a model trace.
    """
    name = name or Path(relative).name.split(".")[0]
    try:
        path = data_path(relative)
    except DataNotFoundError as exc:
        trace = lublin_feitelson(fallback_jobs, fallback_nodes, seed)
        label = (
            f"generated (Lublin model, in place of {name})"
            if generated
            else _stand_in_label("Lublin model", name)
        )
        return LoadedData(
            trace,
            False,
            f"{exc}\n-> using a Lublin-Feitelson workload "
            f"({fallback_jobs} jobs, {fallback_nodes} nodes) instead: {label}",
            label,
            generated,
        )
    trace = read_swf(path)
    return LoadedData(
        trace, True, f"read {len(trace)} jobs from {relative} ({name})", name, generated
    )


def load_dl_tables(seed: int = 0) -> LoadedData[dict[str, pd.DataFrame]]:
    """Read the measured step-time tables of every model in ``dl/``, or a synthetic one.

    Args:
        seed: Seed of the noise of the synthetic table.

    Returns:
        ``{model name: table}`` (see :func:`~hpcnb.batchsim.dl.read_dl_tables`); without
        the data, one table ``"synthetic"`` from :func:`synthetic_dl_table`.
    """
    name = "Pollux measured step times"
    try:
        root = data_path("dl")
    except DataNotFoundError as exc:
        label = _stand_in_label("known step-time model", name)
        tables = {"synthetic": synthetic_dl_table(seed)}
        return LoadedData(tables, False, f"{exc}\n-> using {label}", label)
    tables = {
        p.name: read_dl_tables(p)
        for p in sorted(root.iterdir())
        if (p / "scalability.csv").exists()
    }
    return LoadedData(
        tables, True, f"read the tables of {len(tables)} models: {sorted(tables)}", name
    )


def load_dl_workload(
    number: int = 1, seed: int = 0, synthetic_jobs: int = 60
) -> LoadedData[tuple[pd.DataFrame, np.ndarray]]:
    """Read a Pollux DL-job workload and Philly job durations, or generate both.

    Args:
        number: Pollux workload number (``dl/workloads/workload-<number>.csv``).
        seed: Seed of the generated workload and durations.
        synthetic_jobs: Jobs of the generated workload.

    Returns:
        ``(workload, durations)``: the workload table (``name, time, application,
        num_replicas, batch_size``) and an array of job durations (s). The synthetic
        workload's jobs all use the application ``"synthetic"`` (the synthetic table).
    """
    name = f"Pollux workload {number} + Philly durations"
    try:
        workload = pd.read_csv(data_path(f"dl/workloads/workload-{number}.csv"))
        durations = pd.read_csv(data_path("dl/philly.csv"))["duration"].to_numpy(float)
    except DataNotFoundError as exc:
        rng = np.random.default_rng(seed)
        n = synthetic_jobs
        workload = pd.DataFrame(
            {
                "name": [f"job-{i}" for i in range(n)],
                "time": np.sort(rng.uniform(0, 8 * 3600, n)).round(),
                "application": "synthetic",
                "num_replicas": rng.integers(1, 17, n),
                "batch_size": rng.choice([256, 512, 1024], n),
            }
        )
        label = _stand_in_label("random DL jobs, log-normal durations", name)
        return LoadedData(
            (workload, rng.lognormal(7, 1.2, 5000)), False, f"{exc}\n-> using {label}", label
        )
    return LoadedData((workload, durations), True, f"read {len(workload)} jobs of {name}", name)


def load_elastisim_example(
    fallback_folder: str | Path, num_jobs: int = 500, seed: int = 0
) -> LoadedData[Path]:
    """Return the path of the ElastiSim example's ``jobs.json``, or of a synthetic project.

    Without the data, :func:`write_synthetic_elastisim_project` writes a project of the
    same shape into ``fallback_folder``.

    Args:
        fallback_folder: Folder for the generated project.
        num_jobs: Jobs of the generated project.
        seed: Seed of the generated project.
    """
    name = "ElastiSim example project"
    try:
        path = data_path("elastisim-example/jobs.json")
    except DataNotFoundError as exc:
        path = write_synthetic_elastisim_project(fallback_folder, num_jobs, seed)
        label = _stand_in_label(f"generated project of {num_jobs} jobs", name)
        return LoadedData(path, False, f"{exc}\n-> using {label}", label)
    return LoadedData(path, True, f"reading the {name} ({path.parent.name})", name)


def jobs_per_second(
    jobs: Sequence[Job],
    platform: Platform,
    scheduler: Scheduler,
    repeats: int = 5,
    **options: Any,
) -> tuple[float, list[float]]:
    """Return the median simulated jobs per second after one warm-up run, and all times.

    Each time is the simulator's own wall-clock (:attr:`SimulationResult.wall_seconds`,
    which leaves out building the result table), gathered as a :class:`hpcnb.timing.Timing`.

    Args:
        jobs: The workload.
        platform: The machine.
        scheduler: The scheduler (used for every run).
        repeats: Timed runs after the warm-up (at least 1).
        **options: Keyword arguments of :func:`simulate` for every run (``compiled=False``
            times the general engine where the compiled kernel would apply).

    Returns:
        ``(median jobs per second, wall-clock seconds of each timed run)``.
    """
    simulate(jobs, platform, scheduler, **options)  # warm-up (JIT, caches)
    runs = range(max(1, repeats))
    timing = Timing.of([simulate(jobs, platform, scheduler, **options).wall_seconds for _ in runs])
    return len(jobs) / timing.median, list(timing.samples)


def long_queue_trace(trace: SWFTrace, base_jobs: int, copies: int) -> SWFTrace:
    """Return a trace with ``copies`` copies of each of its first ``base_jobs`` jobs.

    Every copy keeps its job's submit time and gets a unique id (copy ``k`` adds ``k``
    times the largest id plus one); on the same machine the queue then grows in
    proportion to the number of jobs: a fixed backlog ratio, the case where a scheduling
    pass that scans the queue costs O(n) per event. Rows stay in submit order (each job
    followed by its copies).

    Args:
        trace: The trace.
        base_jobs: Jobs taken from its start (at least 1).
        copies: Copies of each (at least 1).

    Raises:
        InvalidInputError: ``base_jobs`` or ``copies`` below 1.
    """
    if base_jobs < 1 or copies < 1:
        raise InvalidInputError(f"base_jobs={base_jobs}, copies={copies}: expected >= 1 each")
    base = trace.head(base_jobs)
    step = float(np.max(base.fields["job_id"], initial=0.0)) + 1.0
    fields = {k: np.repeat(v, copies) for k, v in base.fields.items()}
    fields["job_id"] = fields["job_id"] + np.tile(np.arange(copies) * step, len(base))
    return SWFTrace(
        fields,
        dict(base.header),
        list(base.header_lines),
        [],
        f"{trace.source} (first {len(base)} jobs x {copies})",
        None,
        0,
    )


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Return the least-squares slope of ``log y`` against ``log x`` (1: linear growth).

    Args:
        x: Positive abscissae (jobs).
        y: Positive values (seconds), one per ``x``.

    Raises:
        InvalidInputError: Fewer than two points, or a value that is not positive.
    """
    lx, ly = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if lx.size < 2 or lx.shape != ly.shape or np.any(lx <= 0) or np.any(ly <= 0):
        raise InvalidInputError("loglog_slope: expected >= 2 pairs of positive values")
    return float(np.polyfit(np.log(lx), np.log(ly), 1)[0])


def backlog_scaling(
    trace: SWFTrace,
    nodes: int,
    base_jobs: int,
    copies: Sequence[int],
    repeats: int = 5,
    engine_max_jobs: int = 40_000,
    engine_repeats: int = 3,
    schedulers: Sequence[str] = ("fcfs", "easy"),
) -> pd.DataFrame:
    """Time rigid replays of :func:`long_queue_trace` traces of growing size.

    The compiled kernel takes the trace's columns (:func:`simulate_rigid`, result table
    included); the general engine (``compiled=False``) runs the traces of at most
    ``engine_max_jobs`` jobs. Each size and path is run once untimed, then ``repeats``
    (``engine_repeats``) times, rounds interleaved across sizes.

    Args:
        trace: The source trace.
        nodes: Machine size.
        base_jobs: Jobs of the trace copied.
        copies: Copies per trace size.
        repeats: Timed runs of the compiled kernel per size.
        engine_max_jobs: Largest trace the general engine runs.
        engine_repeats: Timed runs of the general engine per size.
        schedulers: ``"fcfs"`` and/or ``"easy"``.

    Returns:
        One row per timed run: ``scheduler, path ("compiled" | "general"), jobs, copies,
        round, seconds, max_queue`` (the longest queue of that schedule).
    """
    import time

    from hpcnb.batchsim.simulation import simulate_rigid
    from hpcnb.batchsim.workloads import rigid_arrays_from_swf

    cases = []
    for k in copies:
        long = long_queue_trace(trace, base_jobs, k)
        rows = rigid_arrays_from_swf(long, nodes)
        cols = (rows.ids, rows.submit, rows.size, rows.runtime, rows.walltime, rows.user)
        jobs: list[Job] = []  # Job objects only where the general engine runs
        if len(rows) <= engine_max_jobs:
            jobs = jobs_from_swf(long, nodes).jobs
        cases.append((k, cols, jobs))
    platform = Platform(nodes)
    out = []

    def run(name: str, path: str, k: int, cols: tuple[np.ndarray, ...], jobs: list[Job]) -> float:
        sched = make_scheduler(name)
        t0 = time.perf_counter()
        if path == "compiled":
            ids, submit, size, runtime, walltime, user = cols
            res = simulate_rigid(ids, submit, size, runtime, walltime, user, platform, sched)
        else:
            res = simulate(jobs, platform, sched, compiled=False)
        seconds = time.perf_counter() - t0
        queue[(name, path, k)] = _max_queue(res)
        return seconds

    queue: dict[tuple[str, str, int], int] = {}
    plan = [
        (name, path, k, cols, jobs)
        for name in schedulers
        for k, cols, jobs in cases
        for path in ("compiled", "general")
        if path == "compiled" or jobs
    ]
    for case in plan:
        run(*case)  # warm-up: compile, caches
    for r in range(max(repeats, engine_repeats)):
        for name, path, k, cols, jobs in plan:
            if r >= (repeats if path == "compiled" else engine_repeats):
                continue
            seconds = run(name, path, k, cols, jobs)
            out.append(
                {
                    "scheduler": name,
                    "path": path,
                    "jobs": len(cols[0]),
                    "copies": k,
                    "round": r,
                    "seconds": seconds,
                    "max_queue": queue[(name, path, k)],
                }
            )
    return pd.DataFrame(out)


def _max_queue(result: SimulationResult) -> int:
    """The longest queue of a schedule: jobs submitted and not yet started, at its peak."""
    jobs = result.jobs
    times = np.concatenate([jobs["submit"].to_numpy(), jobs["start"].to_numpy()])
    delta = np.concatenate([np.ones(len(jobs)), -np.ones(len(jobs))])
    order = np.lexsort((delta, times))  # at one time, starts before submissions
    return int(np.max(np.cumsum(delta[order]), initial=0))


def speed_vs_jobs(
    trace: SWFTrace,
    counts: Iterable[int],
    num_nodes: int,
    repeats: int = 3,
    engine_max_jobs: int = 3000,
) -> pd.DataFrame:
    """Time rigid EASY on the first ``n`` jobs, compiled kernel and general engine.

    The general engine is only run up to ``engine_max_jobs`` jobs.

    Args:
        trace: The trace whose leading jobs are simulated.
        counts: Numbers of leading jobs to time.
        num_nodes: Nodes of the machine.
        repeats: Timed runs of the compiled kernel per count (the engine runs once).
        engine_max_jobs: Largest count the general engine is timed on.

    Returns:
        Columns ``jobs, compiled_jobs_per_s, engine_jobs_per_s`` (NaN above
        ``engine_max_jobs``).
    """
    rows = []
    platform = Platform(num_nodes)
    for n in progress(list(counts), desc="speed vs jobs"):
        jobs = jobs_from_swf(trace.head(n), num_nodes).jobs
        kernel, _ = jobs_per_second(jobs, platform, make_scheduler("easy"), repeats)
        engine = np.nan
        if n <= engine_max_jobs:
            engine, _ = jobs_per_second(jobs, platform, make_scheduler("easy"), 1, compiled=False)
        rows.append({"jobs": len(jobs), "compiled_jobs_per_s": kernel, "engine_jobs_per_s": engine})
    return pd.DataFrame(rows)


def policy_sweep(
    trace: SWFTrace,
    num_nodes: int,
    schedulers: Sequence[str],
    fractions: Sequence[float],
    seed: int = 0,
    reconfiguration_cost: float = 30.0,
    label: str = "",
) -> tuple[pd.DataFrame, dict[tuple[str, float], SimulationResult]]:
    """Simulate every (scheduler, malleable fraction) pair; check invariants on each.

    Args:
        trace: The trace.
        num_nodes: Nodes of the machine.
        schedulers: Names of the schedulers (see :func:`~hpcnb.batchsim.make_scheduler`).
        fractions: Shares of the multi-node jobs made malleable.
        seed: Seed of the choice of malleable jobs.
        reconfiguration_cost: Seconds each resize of a converted job costs.
        label: Name of the workload, in the table and the progress bar.

    Returns:
        A table with one row per simulation (``workload, scheduler,
        malleable_fraction`` and the metrics) and the results by pair.
    """
    rows = []
    results: dict[tuple[str, float], SimulationResult] = {}
    pairs = [(f, s) for f in fractions for s in schedulers]
    for fraction, name in progress(pairs, desc=f"sweep {label}".strip()):
        policy = MalleablePolicy(fraction, seed=seed, reconfiguration_cost=reconfiguration_cost)
        jobs = jobs_from_swf(trace, num_nodes, policy).jobs
        result = simulate(jobs, Platform(num_nodes), make_scheduler(name))
        check_invariants(result, jobs)
        results[(name, fraction)] = result
        rows.append(
            {
                "workload": label,
                "scheduler": name,
                "malleable_fraction": fraction,
                **result.metrics(),
                "wall_s": result.wall_seconds,
            }
        )
    return pd.DataFrame(rows), results


def malleability_gains(
    trace: SWFTrace,
    num_nodes: int,
    schedulers: Sequence[str],
    fraction: float,
    seeds: Sequence[int],
    reconfiguration_cost: float = 30.0,
    label: str = "",
) -> pd.DataFrame:
    """Turnaround gain of malleability per scheduler, one row per (scheduler, seed).

    For every scheduler the all-rigid trace is simulated once; then, for each seed, a
    different seeded ``fraction`` of its multi-node jobs becomes malleable
    (:class:`~hpcnb.batchsim.workloads.MalleablePolicy`) and is simulated again. The gain is
    ``rigid mean turnaround / malleable mean turnaround`` (> 1: malleability helps).
    The seeds are the repetitions behind an interval of the gain (which jobs are
    malleable changes the schedule); every simulation passes the invariant check.

    Args:
        trace: The trace.
        num_nodes: Nodes of the machine.
        schedulers: Names of the schedulers.
        fraction: Share of the multi-node jobs made malleable.
        seeds: Seeds of the choice of malleable jobs, one simulation each.
        reconfiguration_cost: Seconds each resize of a converted job costs.
        label: Name of the workload, in the table and the progress bar.

    Returns:
        Columns ``workload, scheduler, seed, rigid_turnaround, malleable_turnaround,
        gain``.
    """
    platform = Platform(num_nodes)
    rigid_jobs = jobs_from_swf(trace, num_nodes).jobs
    rows = []
    for name in progress(list(schedulers), desc=f"gains {label}".strip()):
        rigid = simulate(rigid_jobs, platform, make_scheduler(name))
        check_invariants(rigid, rigid_jobs)
        base = rigid.metrics()["mean_turnaround"]
        for seed in seeds:
            policy = MalleablePolicy(fraction, seed=seed, reconfiguration_cost=reconfiguration_cost)
            jobs = jobs_from_swf(trace, num_nodes, policy).jobs
            result = simulate(jobs, platform, make_scheduler(name))
            check_invariants(result, jobs)
            mall = result.metrics()["mean_turnaround"]
            rows.append(
                {
                    "workload": label,
                    "scheduler": name,
                    "seed": seed,
                    "rigid_turnaround": base,
                    "malleable_turnaround": mall,
                    "gain": base / mall,
                }
            )
    return pd.DataFrame(rows)


def synthetic_dl_table(seed: int = 0, noise: float = 0.05) -> pd.DataFrame:
    """Return a step-time table in the ``scalability.csv`` layout from a known model.

    Used when the measured tables are absent: a ResNet-like parameter set with
    multiplicative log-normal noise.

    Args:
        seed: Seed of the noise.
        noise: Standard deviation of the log of the noise factor.
    """
    truth = StepTimeModel(
        {"c0": 0.01, "c1": 8e-4, "lat": 1e-3, "bytes_over_bw": 0.08, "g": 2.5}, STEP_EXPRESSION
    )
    rng = np.random.default_rng(seed)
    rows = []
    for nodes in (6, 8, 12, 16):
        for replicas in range(nodes, 4 * nodes + 1, max(1, nodes // 2)):
            for bsz in (32, 64, 128, 256, 512):
                t = truth.step_time(nodes, replicas, bsz) * float(rng.lognormal(0, noise))
                rows.append((nodes, replicas, bsz, t, 0.0))
    return pd.DataFrame(
        rows, columns=["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"]
    )


_SYNTHETIC_MODEL = {
    "on_init": {"tasks": [{"type": "pfs_read", "bytes": "model_size", "pattern": "root_only"}]},
    "on_reconfiguration": {
        "tasks": [
            {"type": "pfs_read", "bytes": "model_size", "pattern": "root_only"},
            {"type": "cpu", "bytes": "model_size", "communication_pattern": "scatter"},
        ]
    },
    "phases": [
        {
            "iterations": "iterations",
            "evolving_request": "phase_iteration % 2 == 0 ? num_nodes - 4 : num_nodes + 4",
            "tasks": [
                {
                    "type": "cpu",
                    "flops": "flops/num_nodes^alpha",
                    "computation_pattern": "uniform",
                    "bytes": "communication_size",
                    "communication_pattern": "all_to_all",
                    "coupled": True,
                },
                {"type": "pfs_write", "bytes": "checkpoint_size", "pattern": "all_ranks"},
            ],
        }
    ],
}


def write_synthetic_elastisim_project(
    folder: str | Path, num_jobs: int = 500, seed: int = 0
) -> Path:
    """Write an ElastiSim-format project shaped like the example (jobs, model, platform).

    Job types, sizes and argument ranges mimic the example's; values are drawn from a
    seeded generator.

    Args:
        folder: Folder to write the project into (created if needed).
        num_jobs: Jobs of the project.
        seed: Seed of the generator.

    Returns:
        The path of ``jobs.json``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    types = rng.choice(
        ["rigid", "moldable", "malleable", "evolving", "adaptive"],
        num_jobs,
        p=[0.476, 0.326, 0.148, 0.038, 0.012],
    )
    submit = np.cumsum(rng.exponential(90.0, num_jobs)).round()
    jobs = []
    for kind, t in zip(types, submit, strict=True):
        job: dict[str, object] = {
            "type": str(kind),
            "submit_time": float(t),
            "application_model": "application_model.json",
        }
        if kind == "rigid":
            job["num_nodes"] = int(rng.integers(2, 17))
        else:
            job["num_nodes_min"], job["num_nodes_max"] = 2, 16
        job["arguments"] = {
            "iterations": int(rng.integers(10, 25)),
            "flops": float(rng.uniform(2e13, 2e14)),
            "model_size": float(rng.uniform(1e11, 4e11)),
            "checkpoint_size": float(rng.uniform(1e11, 4.5e11)),
            "communication_size": float(rng.uniform(2e10, 3e11)),
            "alpha": float(rng.uniform(0.75, 0.9)),
        }
        jobs.append(job)
    (folder / "jobs.json").write_text(json.dumps({"jobs": jobs}, indent=1), encoding="utf-8")
    (folder / "application_model.json").write_text(json.dumps(_SYNTHETIC_MODEL, indent=1))
    platform = simgrid_platform_xml(
        "0-127", "100Gf", "100Gbps", "50us", "80GBps", "50GBps", "500us"
    )
    (folder / "crossbar.xml").write_text(platform, encoding="utf-8")
    config = {"platform_file": "crossbar.xml", "scheduling_interval": 0}
    (folder / "configuration.json").write_text(json.dumps(config), encoding="utf-8")
    return folder / "jobs.json"


#: Mean turnaround per job type (s) that ElastiSim reports on its example project with the
#: example scheduling algorithm (peer figures reported by ElastiSim's authors, not
#: measured here), and the overall figures of the same run.
ELASTISIM_EXAMPLE_TURNAROUND: dict[str, float] = {
    "adaptive": 28908.0,
    "rigid": 28152.0,
    "malleable": 26609.0,
    "moldable": 28307.0,
    "evolving": 34521.0,
}
ELASTISIM_EXAMPLE_OVERALL: dict[str, float] = {
    "mean_wait": 24554.0,
    "mean_turnaround": 28225.0,
    "makespan": 113903.0,
}


def turnaround_by_type(
    runs: Mapping[str, SimulationResult], reference: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Tabulate mean turnaround per job type for several runs, beside a reference.

    Args:
        runs: Label -> result.
        reference: Mean turnaround per type to compare with (default: ElastiSim's figures
            on its example, :data:`ELASTISIM_EXAMPLE_TURNAROUND`).

    Returns:
        One row per job type: the reference, each run's mean turnaround and its relative
        error ``run / reference - 1`` (column ``<label> error``).
    """
    reference = ELASTISIM_EXAMPLE_TURNAROUND if reference is None else reference
    table = pd.DataFrame({"ElastiSim": pd.Series(reference, dtype=float)})
    for label, result in runs.items():
        means = result.jobs.groupby("type")["turnaround"].mean()
        table[label] = means.reindex(table.index)
        table[f"{label} error"] = table[label] / table["ElastiSim"] - 1
    return table


def command_seconds(args: Sequence[str], repeats: int = 5, timeout: float = 120.0) -> Timing:
    """Time a whole ``hpcnb`` command (interpreter start, imports, run, output files).

    Each sample runs ``python -m hpcnb.cli ARGS`` in a fresh process through
    :func:`hpcnb.launch.run_bounded`, timed by :func:`hpcnb.timing.median_time` (wall
    clock) after one untimed run.

    Args:
        args: Arguments of ``hpcnb`` (``["batchsim", "simulate", ...]``).
        repeats: Timed runs.
        timeout: Seconds one run may take.

    Raises:
        hpcnb.launch.LaunchError: The command failed (its stderr is in the message).
    """
    import sys

    from hpcnb.launch import run_bounded
    from hpcnb.timing import median_time

    cmd = [sys.executable, "-m", "hpcnb.cli", *args]
    return median_time(lambda: run_bounded(cmd, timeout=timeout, check=True), repeats=repeats)


def speed_vs_scale(
    job_counts: Sequence[int],
    node_counts: Sequence[int],
    fixed_nodes: int,
    fixed_jobs: int,
    seed: int = 0,
    scheduler: str = "easy",
) -> pd.DataFrame:
    """Time rigid simulation over trace length and machine size, with the real-time ratio.

    Two sweeps of Lublin–Feitelson workloads (the generator sizes jobs for the machine):
    ``job_counts`` jobs on ``fixed_nodes`` nodes, then ``fixed_jobs`` jobs on each of
    ``node_counts`` nodes. Each point is one run of the compiled kernel after a warm-up.

    Args:
        job_counts: Trace lengths of the first sweep.
        node_counts: Machine sizes of the second sweep.
        fixed_nodes: Machine size of the first sweep.
        fixed_jobs: Trace length of the second sweep.
        seed: Seed of the generated workloads.
        scheduler: Name of the scheduler.

    Returns:
        Rows ``sweep, jobs, nodes, seconds`` (the simulator's wall-clock),
        ``jobs_per_s`` and ``realtime_ratio`` (simulated span / wall seconds).
    """
    points = [("jobs", n, fixed_nodes) for n in job_counts]
    points += [("nodes", fixed_jobs, m) for m in node_counts]
    rows = []
    warm = jobs_from_swf(lublin_feitelson(100, 128, seed), 128).jobs
    simulate(warm, Platform(128), make_scheduler(scheduler))  # compile once
    for sweep, n, m in progress(points, desc="speed vs scale"):
        jobs = jobs_from_swf(lublin_feitelson(n, m, seed), m).jobs
        result = simulate(jobs, Platform(m), make_scheduler(scheduler))
        span = result.metrics()["makespan"]
        rows.append(
            {
                "sweep": sweep,
                "jobs": len(jobs),
                "nodes": m,
                "seconds": result.wall_seconds,
                "jobs_per_s": result.jobs_per_second,
                "realtime_ratio": span / result.wall_seconds,
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class TrainingWork(WorkModel):
    """Data-parallel training for the network experiment (our own design, not measured).

    ``units`` iterations; each computes ``compute_seconds / nodes`` (perfectly parallel)
    while a ring all-reduce of ``gradient_bytes`` runs (they overlap: the slower one sets
    the time). On a platform with a fat-tree or dragonfly topology the iteration is a
    ``compute`` + ``comm_allreduce`` pair that the engine runs over the job's links.
    """

    units: int
    compute_seconds: float
    gradient_bytes: float
    num_units: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_units", self.units)

    def unit_time(self, unit: int, nodes: int, ctx: RunContext) -> float:
        """Return one iteration alone on the network.

        Args:
            unit: The iteration (all take the same time).
            nodes: Nodes the job runs on.
            ctx: The machine (its link latency and bandwidth).
        """
        comm = ctx.platform.communication_time("allreduce", self.gradient_bytes, nodes)
        return max(self.compute_seconds / nodes, comm)

    def unit_segments(self, unit: int, nodes: int, ctx: RunContext) -> list[Segment]:
        """Return the iteration as a parallel task (with a topology) or a timed segment.

        Args:
            unit: The iteration.
            nodes: Nodes the job runs on.
            ctx: The machine (its topology decides the form).
        """
        topology = ctx.platform.topology
        if (
            nodes > 1
            and self.gradient_bytes > 0
            and topology is not None
            and topology.kind != "crossbar"
        ):
            return [
                ("compute", self.compute_seconds / nodes),
                ("comm_allreduce", self.gradient_bytes),
            ]
        return [("time", self.unit_time(unit, nodes, ctx))]


def dl_network_jobs(
    workload: pd.DataFrame,
    durations: np.ndarray,
    platform: Platform,
    seed: int = 0,
    gpus_per_node: int = 4,
    max_nodes: int = 16,
    comm_share: float = 0.8,
    units: int = 20,
) -> list[Job]:
    """Rigid data-parallel jobs whose all-reduce loads the network (own design).

    Each workload row (``time, num_replicas``) becomes a job of
    ``ceil(num_replicas / gpus_per_node)`` nodes (at most ``max_nodes``) that runs for a
    duration drawn (seeded) from ``durations`` alone on a non-blocking network; its
    gradients are sized so that one all-reduce takes ``comm_share`` of an iteration's
    compute there (hidden behind it), so contention that slows the all-reduce by more
    than ``1 / comm_share`` lengthens the job.

    Args:
        workload: One row per job with ``time`` and ``num_replicas``.
        durations: Run times (s) to draw from.
        platform: The machine (its link latency and bandwidth size the gradients).
        seed: Seed of the draw of durations.
        gpus_per_node: GPUs (replicas) per node.
        max_nodes: Largest size of a job.
        comm_share: All-reduce time as a share of an iteration's compute, alone.
        units: Iterations of each job.

    Returns:
        The jobs, numbered from 0 in the order of the rows.
    """
    rng = np.random.default_rng(seed)
    lat, bw = platform.link_latency, platform.link_bandwidth
    jobs = []
    for k, row in enumerate(workload.itertuples(index=False)):
        n = int(min(max_nodes, max(1, -(-int(row.num_replicas) // gpus_per_node))))
        step = float(rng.choice(durations)) / units
        gradient = 0.0
        if n > 1:
            gradient = max(0.0, (comm_share * step / (2 * (n - 1)) - lat) * n * bw)
        work = TrainingWork(units, step * n, gradient)
        jobs.append(Job(k, float(row.time), JobType.RIGID, n, work))
    return jobs


#: The network variants compared by :func:`network_comparison`:
#: label -> (allocation policy, network model).
NETWORK_VARIANTS: dict[str, tuple[str, str]] = {
    "contention-free": ("first-fit", "isolated"),
    "shared, first-fit": ("first-fit", "shared"),
    "shared, topology-aware": ("topology", "shared"),
}


def network_comparison(
    jobs: Sequence[Job],
    platform: Platform,
    scheduler: Callable[[], Scheduler],
    label: str = "",
    **options: Any,
) -> tuple[pd.DataFrame, dict[str, SimulationResult]]:
    """Simulate one workload under :data:`NETWORK_VARIANTS`; check invariants on each.

    Args:
        jobs: The workload.
        platform: The machine (with the topology whose links are shared).
        scheduler: Makes a fresh scheduler for each run (a scheduler class, for instance).
        label: Name of the workload, in the table.
        **options: More keyword arguments of :func:`~hpcnb.batchsim.simulate`.

    Returns:
        A table (``workload, variant, mean_wait, mean_turnaround, makespan``) and the
        results by variant.
    """
    rows, results = [], {}
    for variant, (allocation, network) in NETWORK_VARIANTS.items():
        result = simulate(
            jobs, platform, scheduler(), allocation=allocation, **{**options, "network": network}
        )
        check_invariants(result, jobs)
        results[variant] = result
        m = result.metrics()
        keys = ("mean_wait", "mean_turnaround", "makespan")
        rows.append({"workload": label, "variant": variant, **{k: m[k] for k in keys}})
    return pd.DataFrame(rows), results


def replicate_workload(
    jobs: Sequence[Job], platform: Platform, copies: int
) -> tuple[list[Job], Platform]:
    """Return ``copies`` copies of a workload on a machine ``copies`` times larger.

    Each copy keeps the submit times; the machine's nodes and PFS bandwidths are
    multiplied by ``copies``, so the load per node and per byte of PFS bandwidth stays
    that of the original (a job mix scaled up, for speed runs). Copy ``k`` offsets the job
    ids by ``k`` times the largest id plus one.

    Args:
        jobs: The workload.
        platform: Its machine.
        copies: Number of copies (>= 1).

    Returns:
        ``(jobs of all copies, the larger machine)``.
    """
    step = max((j.id for j in jobs), default=0) + 1
    scaled = [dataclasses.replace(j, id=j.id + k * step) for k in range(copies) for j in jobs]
    machine = dataclasses.replace(
        platform,
        num_nodes=platform.num_nodes * copies,
        hosts=(),
        pfs_read_bandwidth=platform.pfs_read_bandwidth * copies,
        pfs_write_bandwidth=platform.pfs_write_bandwidth * copies,
    )
    return scaled, machine
