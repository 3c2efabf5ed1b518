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
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from hpcnb.parameters import ParameterError
from hpcnb.report import render_report
from hpcnb.runfolder import locked_run_folder
from hpcnb.runner import check_timeout, execute_notebook, prepare, timestamped_dir, write_run

__all__ = ["expand_grid", "load_grid", "sweep"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a mapping with a repeated key."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_grid(path: str | Path) -> dict[str, list[Any]]:
    """Read a YAML grid: a mapping of parameter name to a list of values (or one value).

    Raises:
        ParameterError: The file is not such a mapping, or repeats a name.
    """
    path = Path(path)
    try:
        grid = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
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
    connect_timeout: float = 10.0,
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
        connect_timeout: Seconds allowed to reach ``scheduler``.

    Returns:
        One row per grid point: its parameters, ``status``, ``seconds`` and records.
        The same table is written to ``<out>/sweep.csv``, a markdown report of the grid
        points to ``<out>/report.md``; ``table.attrs["run_folder"]`` is the folder.

    Raises:
        ParameterError: Before anything runs, when a grid name or value, the worker count
            or the timeout does not fit, or the scheduler cannot be reached.
        RunFolderError: The output folder is not empty or is in use.
    """
    from dask.distributed import Client, LocalCluster, as_completed
    from tqdm.auto import tqdm

    if workers < 1:
        raise ParameterError(f"workers must be at least 1, got {workers}")
    timeout = check_timeout(timeout)
    points = expand_grid(grid)
    plans = [prepare([notebook], point, smoke=smoke)[0] for point in points]
    out_dir = Path(out) if out is not None else timestamped_dir()
    rows: list[dict[str, Any] | None] = [None] * len(points)
    with locked_run_folder(out_dir) as folder:
        cluster = None
        if scheduler is None:
            cluster = LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
            )
            client = Client(cluster)
        else:
            try:
                client = Client(scheduler, timeout=connect_timeout)
            except OSError as exc:
                raise ParameterError(
                    f"--scheduler {scheduler}: no Dask scheduler reachable within "
                    f"{connect_timeout:g} s ({exc})"
                ) from exc
        try:
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
                for i, (path, params) in enumerate(plans)
            }
            bar = tqdm(total=len(futures), desc=f"sweep {Path(str(notebook)).stem}", unit="run")
            for future in as_completed(futures):
                i = futures[future]
                result = future.result()
                result.notebook = f"{result.notebook}__{i:03d}"
                write_run(folder, [result])
                rows[i] = {
                    **points[i], "run": result.notebook, "status": result.status,
                    "seconds": round(result.seconds, 3), "error": result.error, **result.records,
                }  # fmt: skip
                bar.update(1)
                bar.write(
                    f"{result.notebook}: {result.status} in {result.seconds:.1f} s {points[i]}"
                )
                pd.DataFrame([r for r in rows if r is not None]).to_csv(
                    folder / "sweep.csv", index=False
                )
            bar.close()
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
    table = pd.DataFrame([r for r in rows if r is not None])
    table.to_csv(out_dir / "sweep.csv", index=False)
    if (out_dir / "run.json").is_file():
        (out_dir / "report.md").write_text(render_report(out_dir), encoding="utf-8")
    table.attrs["run_folder"] = str(out_dir)
    return table
