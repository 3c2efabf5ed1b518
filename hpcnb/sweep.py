"""Parameter sweeps: the Cartesian product of a grid as papermill runs on Dask.

Each grid point is one papermill execution (see :func:`hpcnb.runner.execute_notebook`)
submitted as a task to Dask distributed: a ``LocalCluster`` of worker processes by
default, or an existing scheduler when an address is given, so the same sweep goes
from a laptop to a cluster. Records are gathered into one CSV (parameters as
columns) and ``records.json``; each grid point is reported as it completes and
``sweep.csv`` grows row by row, so a long sweep shows progress and keeps partial results.
At the end the folder gets a ``report.md`` (:func:`hpcnb.report.render_report`) that
states each grid point's parameters beside its status, records and claims.

Only point ``--scheduler`` at a Dask scheduler you trust: its workers execute the notebooks.

A local cluster's workers start with Dask's ``distributed.nanny.pre-spawn-environ``
settings (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to 1
unless Dask's configuration says otherwise), so each grid point's kernel runs single-threaded
math libraries; the Dask nanny writes these into the environment of the process that starts
it, and :func:`sweep` puts the caller's environment back when the cluster is closed.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from hpcnb.launch import InterruptedRunError, sigterm_as_interrupt, stop_marked
from hpcnb.parameters import ParameterError, coerce, load_yaml_bounded, notebook_parameters
from hpcnb.report import render_report
from hpcnb.runfolder import locked_run_folder
from hpcnb.runner import (
    check_timeout,
    execute_notebook,
    resolve_notebook,
    timestamped_dir,
    write_run,
)

__all__ = [
    "MAX_GRID_BYTES",
    "MAX_POINTS",
    "SWEEP_TOKEN_VAR",
    "expand_grid",
    "grid_size",
    "load_grid",
    "plan_sweep",
    "sweep",
]

#: Environment variable marking every process of a local sweep (workers, papermill,
#: kernels), so an interrupted sweep can stop them all.
SWEEP_TOKEN_VAR = "HPCNB_SWEEP_TOKEN"


#: Largest grid file read, in bytes.
MAX_GRID_BYTES = 1 << 20
#: Default largest number of grid points a sweep runs (``--max-points`` raises it).
MAX_POINTS = 1000


def load_grid(path: str | Path) -> dict[str, list[Any]]:
    """Read a YAML grid: a mapping of parameter name to a list of values (or one value).

    The file is at most :data:`MAX_GRID_BYTES` and is parsed with the bounds of
    :func:`hpcnb.parameters.load_yaml_bounded` (no anchors or aliases, bounded depth and
    node count, no repeated name).

    Raises:
        ParameterError: The file is missing, a folder, too large, not UTF-8, not valid
            YAML within those bounds, or not such a mapping.
    """
    path = Path(path)
    try:
        if path.is_dir():
            raise ParameterError(f"--grid {path}: is a folder, not a YAML file")
        size = path.stat().st_size
        if size > MAX_GRID_BYTES:
            raise ParameterError(
                f"--grid {path}: {size} bytes, more than the {MAX_GRID_BYTES} a grid may have"
            )
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ParameterError(f"--grid {path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ParameterError(f"--grid {path}: not UTF-8 text (byte {exc.start})") from None
    grid = load_yaml_bounded(text, f"--grid {path}")
    if not isinstance(grid, dict) or not grid:
        raise ParameterError(f"--grid {path}: expected a mapping NAME: [values, ...]")
    return {str(k): (v if isinstance(v, list) else [v]) for k, v in grid.items()}


def grid_size(grid: Mapping[str, Sequence[Any]]) -> int:
    """Return the number of points of a grid: the product of its list lengths."""
    return math.prod(len(values) for values in grid.values())


def expand_grid(
    grid: Mapping[str, list[Any]], *, max_points: int | None = None
) -> list[dict[str, Any]]:
    """Return the Cartesian product of a grid as a list of parameter dicts.

    Args:
        grid: Parameter name → list of values.
        max_points: Refuse a grid of more points (counted before any is formed).

    Raises:
        ParameterError: A parameter has an empty list of values, or the grid has more
            than ``max_points`` points.
    """
    for name, values in grid.items():
        if not values:
            raise ParameterError(f"grid parameter {name} has no values")
    count = grid_size(grid)
    if max_points is not None and count > max_points:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in grid.items())
        raise ParameterError(
            f"the grid has {count} points ({sizes}), more than --max-points {max_points}"
        )
    names = list(grid)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid.values())]


def plan_sweep(
    notebook: str | Path,
    grid: Mapping[str, list[Any]],
    *,
    smoke: bool = False,
    max_points: int = MAX_POINTS,
) -> tuple[Path, list[dict[str, Any]]]:
    """Check a grid against a notebook and return ``(notebook path, typed points)``.

    The notebook is parsed once; every name is checked before any point is formed, each
    value is validated once, and the number of points is computed before the product.

    Args:
        notebook: Notebook path or stem.
        grid: Parameter name to the list of its values.
        smoke: Add ``SMOKE=True`` to every point.
        max_points: Largest number of points accepted.

    Raises:
        FileNotFoundError: The notebook does not exist.
        ParameterError: An unknown name, a value that does not fit its parameter, an
            empty list, or more than ``max_points`` points.
    """
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
        raise ParameterError(f"--max-points {max_points!r}: need a whole number of at least 1")
    path = resolve_notebook(notebook)
    params = notebook_parameters(path)
    base = {"SMOKE": True} if smoke else {}
    by_name = {p.name: p for p in params}
    unknown = sorted(set(grid) - set(by_name))
    if unknown:
        valid = ", ".join(f"{p.name}: {p.type}" for p in params)
        raise ParameterError(
            f"{path}: unknown grid parameter(s) {', '.join(unknown)}; valid: {valid}"
        )
    typed = {name: [coerce(by_name[name], v) for v in values] for name, values in grid.items()}
    points = expand_grid(typed, max_points=max_points)
    return path, [{**point, **base} for point in points]


def sweep(
    notebook: str | Path,
    grid: Mapping[str, list[Any]],
    *,
    workers: int = 2,
    scheduler: str | None = None,
    out: str | Path | None = None,
    smoke: bool = False,
    timeout: float | None = None,
    connect_timeout: float = 10.0,
    max_points: int = MAX_POINTS,
) -> pd.DataFrame:
    """Run a notebook over every point of a parameter grid on Dask distributed.

    Args:
        notebook: Notebook path or stem.
        grid: Parameter name → list of values.
        workers: Worker processes of the local cluster (ignored with ``scheduler``).
        scheduler: Address of an existing Dask scheduler (``tcp://host:8786``).
        out: Output folder (default ``papermill_runs/<UTC timestamp>``).
        smoke: Add ``SMOKE=True`` to every point.
        timeout: Per-run wall-clock limit in seconds.
        connect_timeout: Seconds allowed to reach ``scheduler`` (handshake included).
        max_points: Refuse a grid of more points (default :data:`MAX_POINTS`).

    Returns:
        One row per grid point: its parameters, ``status``, ``seconds`` and records.
        The same table is written to ``<out>/sweep.csv``, a markdown report of the grid
        points to ``<out>/report.md``; ``table.attrs["run_folder"]`` is the folder.

    Raises:
        ParameterError: Before anything runs, when a grid name or value, the number of
            points, the worker count or the timeout does not fit, or the scheduler cannot
            be reached or is not a Dask scheduler.
        RunFolderError: The output folder is not empty or is in use.
        InterruptedRunError: Ctrl-C or SIGTERM: every grid point in flight was stopped
            (with a local cluster, every worker, papermill and kernel), ``sweep.csv``
            lists the finished points and marks the others ``interrupted``.
    """
    from tqdm.auto import tqdm

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ParameterError(f"workers must be a whole number of at least 1, got {workers!r}")
    timeout = check_timeout(timeout)
    path, points = plan_sweep(notebook, grid, smoke=smoke, max_points=max_points)
    client = _connect(scheduler, connect_timeout) if scheduler is not None else None
    out_dir = Path(out) if out is not None else timestamped_dir()
    rows: list[dict[str, Any] | None] = [None] * len(points)
    token = uuid.uuid4().hex
    interrupted = False
    with locked_run_folder(out_dir) as folder, sigterm_as_interrupt():
        cluster = None
        saved_environ = dict(os.environ)  # the token and Dask's nanny settings go into it
        try:
            if client is None:
                cluster, client = _local_cluster(workers, token)
            futures = {
                client.submit(
                    execute_notebook,
                    str(path),
                    str((folder / f"{path.stem}__{i:03d}.ipynb").resolve()),
                    params,
                    timeout=timeout,
                    progress=False,
                    pure=False,
                ): i
                for i, params in enumerate(points)
            }
            bar = tqdm(total=len(futures), desc=f"sweep {path.stem}", unit="run")
            _gather(futures, points, rows, folder, bar)
            bar.close()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            _shut_down(client, cluster, token)
            if os.environ != saved_environ:
                os.environ.clear()
                os.environ.update(saved_environ)
        if interrupted:
            for i, point in enumerate(points):
                if rows[i] is None:
                    rows[i] = {
                        **point,
                        "run": f"{path.stem}__{i:03d}",
                        "status": "interrupted",
                        "seconds": 0.0,
                        "error": "sweep interrupted (Ctrl-C or SIGTERM)",
                    }
    table = pd.DataFrame([r for r in rows if r is not None])
    table.to_csv(out_dir / "sweep.csv", index=False)
    if (out_dir / "run.json").is_file():
        (out_dir / "report.md").write_text(render_report(out_dir), encoding="utf-8")
    table.attrs["run_folder"] = str(out_dir)
    if interrupted:
        done = sum(r is not None and r["status"] != "interrupted" for r in rows)
        raise InterruptedRunError(
            f"sweep interrupted: {done} of {len(points)} grid points finished; "
            f"{out_dir / 'sweep.csv'} lists them"
        )
    return table


def _gather(
    futures: dict[Any, int],
    points: list[dict[str, Any]],
    rows: list[dict[str, Any] | None],
    folder: Path,
    bar: Any,
) -> None:
    """Collect results as they complete; write the run files and ``sweep.csv`` after each."""
    from dask.distributed import as_completed

    for future in as_completed(futures):
        i = futures[future]
        result = future.result()
        result.notebook = f"{result.notebook}__{i:03d}"
        write_run(folder, [result])
        rows[i] = {
            **points[i],
            "run": result.notebook,
            "status": result.status,
            "seconds": round(result.seconds, 3),
            "error": result.error,
            **result.records,
        }
        bar.update(1)
        bar.write(f"{result.notebook}: {result.status} in {result.seconds:.1f} s {points[i]}")
        pd.DataFrame([r for r in rows if r is not None]).to_csv(folder / "sweep.csv", index=False)


def _local_cluster(workers: int, token: str) -> tuple[Any, Any]:
    """Start a local cluster whose every process carries ``token`` in its environment."""
    from multiprocessing import resource_tracker

    from dask.distributed import Client, LocalCluster

    resource_tracker.ensure_running()  # this process's helper, started before the marking
    # Inherited by workers (those the nanny restarts too), papermill and kernels; sweep()
    # puts the caller's environment back when the cluster is closed.
    os.environ[SWEEP_TOKEN_VAR] = token
    cluster = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
    )
    return cluster, Client(cluster)


def _shut_down(client: Any, cluster: Any, token: str) -> None:
    """Close the client and the local cluster; stop whatever the local sweep left running."""
    with contextlib.suppress(Exception):
        if client is not None:
            client.close(timeout=10)
    with contextlib.suppress(Exception):
        if cluster is not None:
            cluster.close(timeout=10)
    if cluster is not None:
        stop_marked(SWEEP_TOKEN_VAR, token)


def _connect(scheduler: str, timeout: float) -> Any:
    """Connect to a Dask scheduler within ``timeout`` seconds, handshake included.

    A probe first opens one connection on a private event loop, asks the peer who it is
    and needs the answer of a Dask scheduler, all under ``timeout``; a silent port, a peer
    sending garbage or an HTTP server fail there and leave nothing running. Only then is
    the client created.

    Raises:
        ParameterError: Nothing answers, the peer is not a Dask scheduler, or the
            connection is not complete within ``timeout`` (one line naming the address).
    """
    import asyncio

    from dask.distributed import Client
    from distributed.comm import connect

    async def identify() -> Any:
        comm = await connect(scheduler, timeout=timeout)
        try:
            await comm.write({"op": "identity"})
            return await comm.read()
        finally:
            await comm.close()

    def refuse(reason: str) -> ParameterError:
        reason = " ".join(reason.split())[:200]
        return ParameterError(
            f"--scheduler {scheduler}: no Dask scheduler reachable within {timeout:g} s ({reason})"
        )

    try:
        identity = asyncio.run(asyncio.wait_for(identify(), timeout))
    except TimeoutError:
        raise refuse("no Dask handshake: is it a Dask scheduler?") from None
    except Exception as exc:  # any failure of a foreign peer becomes one line
        raise refuse(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(identity, dict) or identity.get("type") != "Scheduler":
        raise refuse(f"the peer is not a Dask scheduler (it answered {str(identity)[:60]!r})")
    try:
        return Client(scheduler, timeout=timeout)
    except Exception as exc:
        raise refuse(f"{type(exc).__name__}: {exc}") from None
