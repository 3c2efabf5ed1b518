"""Plots: Gantt chart, utilisation over time, per-policy bars, speed, DL model fit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from hpcnb.batchsim.simulation import SimulationResult

__all__ = [
    "plot_dl_fit",
    "plot_gantt",
    "plot_policy_bars",
    "plot_speed",
    "plot_speed_scale",
    "plot_utilization",
]

_TYPE_COLOURS = {
    "rigid": "tab:blue",
    "moldable": "tab:green",
    "malleable": "tab:orange",
    "evolving": "tab:purple",
    "adaptive": "tab:red",
}


# Legends go right of the axes, off the data.
_OUTSIDE: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}


def _axes(ax: Axes | None, size: tuple[float, float]) -> Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


def plot_gantt(
    result: SimulationResult, ax: Axes | None = None, max_jobs: int = 150, hours: bool = True
) -> Axes:
    """Draw one bar per job from start to end (wait as a thin grey line before it).

    Bars are coloured by job type; the bar height grows with the job's size, so the
    resizes of malleable and evolving jobs show as steps along the bar.

    Args:
        result: A simulation result.
        ax: Axes to draw on (new figure if ``None``).
        max_jobs: Only the first ``max_jobs`` jobs (submit order) are drawn.
        hours: Time axis in hours (else seconds).
    """
    ax = _axes(ax, (9, 4))
    df = result.jobs.head(max_jobs)
    scale = 3600.0 if hours else 1.0
    biggest = max(1, int(df["max_nodes"].max())) if len(df) else 1
    y = np.arange(len(df))
    ax.hlines(y, df["submit"] / scale, df["start"] / scale, colors="0.7", linewidth=0.8)
    log = result.resize_log
    changes = {jid: grp.sort_values("time") for jid, grp in log.groupby("id")} if len(log) else {}
    rows, lefts, widths, heights, colours = [], [], [], [], []
    for k, job in enumerate(df.itertuples(index=False)):
        times, sizes = [job.start], [job.nodes]
        if job.id in changes:
            times += list(changes[job.id]["time"])
            sizes += list(changes[job.id]["new"])
        times.append(job.end)
        for t0, t1, size in zip(times[:-1], times[1:], sizes, strict=True):
            rows.append(k)
            lefts.append(t0 / scale)
            widths.append((t1 - t0) / scale)
            heights.append(0.2 + 0.7 * size / biggest)
            colours.append(_TYPE_COLOURS.get(job.type, "tab:gray"))
    ax.barh(rows, widths, left=lefts, height=heights, color=colours)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=c)
        for t, c in _TYPE_COLOURS.items()
        if t in set(df["type"])
    ]
    ax.legend(handles, [t for t in _TYPE_COLOURS if t in set(df["type"])], **_OUTSIDE)
    ax.set_xlabel(f"time ({'h' if hours else 's'})")
    ax.set_ylabel("job (submit order)")
    ax.invert_yaxis()
    ax.set_title(f"Gantt chart, {result.scheduler} (first {len(df)} jobs)")
    return ax


def plot_utilization(
    results: Mapping[str, SimulationResult] | SimulationResult,
    ax: Axes | None = None,
    hours: bool = True,
) -> Axes:
    """Draw allocated nodes (as a fraction of the machine) over time, one line per result.

    Args:
        results: Results by label (the legend), or one result labelled by its scheduler.
        ax: Axes to draw on (default: a new figure).
        hours: Time axis in hours (``True``) or seconds.

    Returns:
        The axes.
    """
    ax = _axes(ax, (9, 3.5))
    if isinstance(results, SimulationResult):
        results = {results.scheduler: results}
    scale = 3600.0 if hours else 1.0
    for label, res in results.items():
        ax.step(
            res.usage_times / scale,
            res.usage_nodes / res.num_nodes,
            where="post",
            label=label,
            linewidth=0.9,
        )
    ax.set_xlabel(f"time ({'h' if hours else 's'})")
    ax.set_ylabel("allocated nodes (fraction)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small", **_OUTSIDE)
    return ax


def plot_policy_bars(
    table: pd.DataFrame,
    metric: str,
    group: str = "scheduler",
    hue: str | None = "malleable_fraction",
    ax: Axes | None = None,
    unit: str = "",
) -> Axes:
    """Draw grouped bars of ``metric`` per ``group`` (one bar per ``hue`` value).

    Args:
        table: One row per simulation with columns ``group``, ``hue`` and ``metric``.
        metric: Column to plot.
        group: Column giving the x groups.
        hue: Column giving the bars inside a group (``None``: one bar per group).
        ax: Axes to draw on.
        unit: Unit shown on the y label.
    """
    ax = _axes(ax, (9, 3.5))
    groups: Sequence = list(dict.fromkeys(table[group]))
    hues: Sequence = [None] if hue is None else list(dict.fromkeys(table[hue]))
    width = 0.8 / len(hues)
    for k, h in enumerate(hues):
        sub = table if h is None else table[table[hue] == h]
        values = [sub.loc[sub[group] == g, metric].mean() for g in groups]
        ax.bar(
            np.arange(len(groups)) + k * width,
            values,
            width,
            label=None if h is None else f"{hue} = {h}",
        )
    ax.set_xticks(np.arange(len(groups)) + width * (len(hues) - 1) / 2, groups, rotation=20)
    ax.set_ylabel(f"{metric.replace('_', ' ')}{f' ({unit})' if unit else ''}")
    ax.set_xlabel(group.replace("_", " "))
    if hue is not None:
        ax.legend(fontsize="x-small", **_OUTSIDE)
    return ax


def plot_speed(speed: pd.DataFrame, ax: Axes | None = None, trace: str = "") -> Axes:
    """Draw wall-clock time against jobs simulated (log–log) for the kernel and the engine.

    Args:
        speed: The table of :func:`~hpcnb.batchsim.experiments.speed_vs_jobs`.
        ax: Axes to draw on.
        trace: Name of the trace, shown in the title.
    """
    ax = _axes(ax, (6, 3.5))
    jobs = speed["jobs"].to_numpy(dtype=float)
    for column, marker, label in (
        ("compiled_jobs_per_s", "o-", "compiled kernel"),
        ("engine_jobs_per_s", "s-", "general engine"),
    ):
        rate = speed[column].to_numpy(dtype=float)
        ok = np.isfinite(rate)
        ax.loglog(jobs[ok], jobs[ok] / rate[ok], marker, label=label)
    ref = jobs / jobs[0] * (jobs[0] / speed["compiled_jobs_per_s"].iloc[0])
    ax.loglog(jobs, ref, "k:", linewidth=0.8, label="linear in jobs")
    ax.set_xlabel("jobs simulated")
    ax.set_ylabel("wall-clock time (s)")
    ax.set_title(f"Rigid EASY: cost vs trace length{f' ({trace})' if trace else ''}")
    ax.legend(fontsize="small", **_OUTSIDE)
    return ax


def plot_dl_fit(tests: Mapping[str, pd.DataFrame], width: float = 3.2) -> Figure:
    """Draw model against measured training throughput, one panel per DL model.

    Args:
        tests: Per model, a table with ``num_replicas, local_bsz, step_time, predicted``
            (the second output of :func:`~hpcnb.batchsim.dl.scaling_validation`).
        width: Width of one panel (inches).
    """
    fig, axes = plt.subplots(1, len(tests), figsize=(width * len(tests), 3), squeeze=False)
    for ax, (name, test) in zip(axes[0], tests.items(), strict=True):
        samples = test["num_replicas"] * test["local_bsz"]
        measured = samples / test["step_time"]
        ax.scatter(measured, samples / test["predicted"], s=6)
        limit = [0, float(measured.max()) * 1.05]
        ax.plot(limit, limit, "k--", linewidth=0.8)
        ax.set_xlabel("measured (samples/s)")
        ax.set_ylabel("model (samples/s)")
        ax.set_title(name)
    fig.tight_layout()
    return fig


def plot_speed_scale(table: pd.DataFrame, anchor: float = 100.0) -> Figure:
    """Draw jobs/s and the real-time ratio against trace length and machine size.

    Args:
        table: The table of :func:`~hpcnb.batchsim.experiments.speed_vs_scale`.
        anchor: A real-time ratio to mark (the Slurm simulator's ~100x real time).
    """
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    for ax, sweep, xlabel in (
        (axes[0], "jobs", "jobs simulated"),
        (axes[1], "nodes", "nodes of the machine"),
    ):
        part = table[table["sweep"] == sweep]
        x = part[sweep].to_numpy(dtype=float)
        ax.loglog(x, part["jobs_per_s"], "o-", color="tab:blue", label="jobs / s")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("simulated jobs per second", color="tab:blue")
        twin = ax.twinx()
        twin.loglog(x, part["realtime_ratio"], "s--", color="tab:red", label="real-time ratio")
        twin.axhline(anchor, color="tab:red", linestyle=":", linewidth=0.8)
        twin.set_ylabel("simulated s per wall s", color="tab:red")
        fixed = part["nodes" if sweep == "jobs" else "jobs"].iloc[0]
        ax.set_title(
            f"{'on' if sweep == 'jobs' else 'with'} {fixed:,} "
            f"{'nodes' if sweep == 'jobs' else 'jobs'}",
            fontsize="small",
        )
    fig.suptitle(f"Rigid EASY (compiled kernel); dotted: {anchor:g}x real time", fontsize="small")
    fig.tight_layout()
    return fig
