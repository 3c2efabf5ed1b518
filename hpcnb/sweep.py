"""Parameter sweeps: the Cartesian product of a grid as papermill runs on Dask.

Each grid point is one papermill execution (see :func:`hpcnb.runner.execute_notebook`)
submitted as a task to Dask distributed: a ``LocalCluster`` of worker processes by
default, or an existing scheduler when an address is given, so the same sweep goes
from a laptop to a cluster. Records are gathered into one CSV (parameters as
columns) and ``records.json``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from hpcnb.parameters import ParameterError
from hpcnb.runner import NotebookResult, execute_notebook, prepare, timestamped_dir, write_run

__all__ = ["expand_grid", "load_grid", "sweep"]


def load_grid(path: str | Path) -> dict[str, list[Any]]:
    """Read a YAML grid: a mapping of parameter name to a list of values (or one value).

    Raises:
        ParameterError: The file is not such a mapping.
    """
    path = Path(path)
    try:
        grid = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ParameterError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(grid, dict) or not grid:
        raise ParameterError(f"{path}: expected a mapping NAME: [values, ...]")
    return {str(k): (v if isinstance(v, list) else [v]) for k, v in grid.items()}


def expand_grid(grid: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Return the Cartesian product of a grid as a list of parameter dicts.

    Raises:
        ParameterError: A parameter has an empty list of values.
    """
    for name, values in grid.items():
        if not values:
            raise ParameterError(f"grid parameter {name} has no values")
    names = list(grid)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid.values())]


def sweep(
    notebook: str | Path,
    grid: Mapping[str, list[Any]],
    *,
    workers: int = 2,
    scheduler: str | None = None,
    out: str | Path | None = None,
    smoke: bool = False,
    timeout: float | None = None,
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

    Returns:
        One row per grid point: its parameters, ``status``, ``seconds`` and records.
        The same table is written to ``<out>/sweep.csv``.

    Raises:
        ParameterError: Before anything runs, when a grid name or value does not fit.
    """
    from dask.distributed import Client, LocalCluster

    points = expand_grid(grid)
    plans = [prepare([notebook], point, smoke=smoke)[0] for point in points]
    out_dir = Path(out) if out is not None else timestamped_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    cluster = None
    if scheduler is None:
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = Client(cluster)
    else:
        client = Client(scheduler)
    try:
        futures = [
            client.submit(
                execute_notebook,
                str(path),
                str((out_dir / f"{path.stem}__{i:03d}.ipynb").resolve()),
                params,
                timeout=timeout,
                progress=False,
                pure=False,
            )
            for i, (path, params) in enumerate(plans)
        ]
        results: list[NotebookResult] = client.gather(futures)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    for i, result in enumerate(results):
        result.notebook = f"{result.notebook}__{i:03d}"
    write_run(out_dir, results)
    rows = []
    for point, result in zip(points, results, strict=True):
        rows.append(
            {**point, "run": result.notebook, "status": result.status,
             "seconds": round(result.seconds, 3), "error": result.error, **result.records}
        )  # fmt: skip
    table = pd.DataFrame(rows)
    table.to_csv(out_dir / "sweep.csv", index=False)
    return table
