"""Figures of notebook 02: the graph, learning curves, keep ratios, budget sweep, latency."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from hpcnb.pruning.agents import PolicySearchResult, learning_curve
from hpcnb.pruning.hiergraph import HierarchicalGraph

__all__ = [
    "plot_budget_sweep",
    "plot_flops_vs_latency",
    "plot_hierarchical_graph",
    "plot_keep_ratios",
    "plot_learning_curves",
    "plot_search_progress",
]

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_hierarchical_graph(graph: HierarchicalGraph, op: int | None = None) -> Figure:
    """Draw level 2 (feature maps coloured by prunable group) and one op's level-1 graph.

    Args:
        graph: The hierarchical graph.
        op: Index of the node whose level-1 channel graph is drawn (default: the node
            with the most level-1 edges, i.e. a dense convolution).
    """
    fig, (ax2, ax1) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    g = nx.DiGraph()
    g.add_nodes_from(range(graph.num_nodes))
    g.add_edges_from(graph.edge_index.T.tolist())
    depth = {n: 0 for n in g.nodes}
    for n in nx.topological_sort(g):
        for s in g.successors(n):
            depth[s] = max(depth[s], depth[n] + 1)
    lanes: dict[int, int] = {}
    pos = {}
    for n in sorted(g.nodes):
        lane = lanes.get(depth[n], 0)
        lanes[depth[n]] = lane + 1
        pos[n] = (depth[n], -lane)
    colours = [graph.node_group[n] if graph.node_group[n] >= 0 else -1 for n in g.nodes]
    nx.draw_networkx(
        g,
        pos,
        ax=ax2,
        node_size=60,
        with_labels=False,
        node_color=colours,
        cmap="tab20",
        vmin=-1,
        vmax=max(graph.num_groups, 1),
        arrowsize=6,
        width=0.6,
    )
    ax2.set_title(f"level 2: {graph.num_nodes} feature maps, {graph.num_groups} prunable groups")
    ax2.set_xlabel("topological depth (edges = operations)")
    if op is None:
        op = int(np.argmax((graph.op_adj > 0).sum(axis=(1, 2))))
    im = ax1.imshow(graph.op_adj[op], cmap="viridis")
    k = graph.op_adj.shape[1] // 2
    ax1.set_xticks(
        range(2 * k), [f"in{i}" for i in range(k)] + [f"out{i}" for i in range(k)], rotation=90
    )
    ax1.set_yticks(range(2 * k), [f"in{i}" for i in range(k)] + [f"out{i}" for i in range(k)])
    name = graph.names[op] if graph.names else str(op)
    ax1.set_title(f"level 1: {name}", fontsize=10)
    ax1.set_xlabel("channel bin (by filter L2 norm)")
    fig.colorbar(im, ax=ax1, label="mean |W| between bins (normalised)")
    fig.tight_layout()
    return fig


def plot_learning_curves(curves: Mapping[str, Sequence[float]], window: int = 20) -> Figure:
    """Plot the running mean of episode rewards of several agents.

    Args:
        curves: Label -> episode rewards in training order.
        window: Running-mean window in episodes.
    """
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rewards in curves.items():
        r = np.asarray(rewards, dtype=float)
        ax.plot(np.arange(1, r.size + 1), learning_curve(r, window), label=label)
    ax.set_xlabel("episode")
    ax.set_ylabel(f"reward, mean of last {window} episodes")
    ax.set_title("learning curves (reward = held-out accuracy; budget missed = -1)")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_keep_ratios(
    ratios: Mapping[str, Sequence[float]], group_labels: Sequence[str], title: str = ""
) -> Figure:
    """Grouped bar chart of per-group keep ratios of several methods.

    Args:
        ratios: Method -> keep ratio per group.
        group_labels: One label per group (e.g. group id and size).
        title: Axes title.
    """
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(group_labels) * max(len(ratios), 1) / 2), 4))
    width = 0.8 / max(len(ratios), 1)
    x = np.arange(len(group_labels))
    for i, (label, values) in enumerate(ratios.items()):
        ax.bar(x + i * width - 0.4 + width / 2, values, width, label=label)
    ax.set_xticks(x, group_labels, rotation=45, ha="right")
    ax.set_ylabel("keep ratio (kept / original channels)")
    ax.set_xlabel("prunable group (IR id, size)")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def plot_flops_vs_latency(table: pd.DataFrame, title: str = "", ax: Axes | None = None) -> Figure:
    """Scatter of FLOPs kept against measured speed-up, one marker and colour per model.

    Models are told apart by marker, colour and legend entry, never by text beside the
    points, so labels cannot overlap where methods land close together.

    Args:
        table: Rows with ``model``, ``flops_ratio``, ``speedup``, ``speedup_low`` and
            ``speedup_high`` (e.g. one size and batch of
            :func:`~hpcnb.pruning.latency.latency_table_by_size` joined with FLOPs).
        title: Axes title.
        ax: Axes to draw on (a new figure if ``None``).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, (_, row) in enumerate(table.iterrows()):
        err = [[row.speedup - row.speedup_low], [row.speedup_high - row.speedup]]
        ax.errorbar(
            row.flops_ratio,
            row.speedup,
            yerr=err,
            fmt=_MARKERS[i % len(_MARKERS)],
            color=f"C{i % 10}",
            capsize=3,
            ms=7,
            label=str(row.model),
        )
    xs = np.linspace(max(0.05, float(table.flops_ratio.min()) * 0.8), 1.0, 50)
    ax.plot(xs, 1 / xs, "k--", lw=1, label="speed-up = 1 / FLOPs kept")
    ax.set_xlabel("FLOPs kept (pruned / original)")
    ax.set_ylabel("measured speed-up (original / pruned latency)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig = cast(Figure, ax.figure)  # an Axes made by plt.subplots sits on a Figure
    fig.tight_layout()
    return fig


def plot_budget_sweep(table: pd.DataFrame, title: str = "", main: str | None = None) -> Figure:
    """Accuracy after fine-tuning against the FLOPs budget, and each gap to the main method.

    Left: one line per method, with the accuracy's interval as error bars where the table
    has ``accuracy_low`` / ``accuracy_high``. Right (when ``main`` is given): the paired
    gap ``main - method`` at each budget with its interval, and zero.

    Args:
        table: A :func:`~hpcnb.pruning.compare.sweep_table`.
        title: Figure title.
        main: The method the table's gaps are taken against (``None``: no gap panel).
    """
    fig, axes = plt.subplots(1, 2 if main else 1, figsize=(12 if main else 6.5, 4.5), squeeze=False)
    flat = table.reset_index()
    budgets = sorted(flat.budget.unique())
    step = 0.06 * (min(np.diff(budgets)) if len(budgets) > 1 else 0.1)
    methods = list(dict.fromkeys(flat.method))
    for i, method in enumerate(methods):
        rows = flat[flat.method == method].sort_values("budget")
        x = rows.budget + (i - (len(methods) - 1) / 2) * step  # side by side, not on top
        style = {"fmt": _MARKERS[i % len(_MARKERS)] + "-", "color": f"C{i % 10}", "capsize": 3}
        if {"accuracy_low", "accuracy_high"} <= set(rows):
            err = [rows.accuracy - rows.accuracy_low, rows.accuracy_high - rows.accuracy]
            axes[0][0].errorbar(x, rows.accuracy, yerr=err, label=str(method), **style)
        else:
            axes[0][0].plot(x, rows.accuracy, style["fmt"], color=style["color"], label=str(method))
        if main and method != main:
            err = [rows.gap - rows.gap_low, rows.gap_high - rows.gap]
            axes[0][1].errorbar(
                x, 100 * rows.gap, yerr=100 * np.asarray(err), label=str(method), **style
            )
    axes[0][0].set_xlabel("FLOPs budget (fraction kept)")
    axes[0][0].set_ylabel("test accuracy after fine-tuning")
    axes[0][0].legend(fontsize=8)
    if main:
        ax = axes[0][1]
        ax.axhline(0, color="k", lw=1)
        ax.set_xlabel("FLOPs budget (fraction kept)")
        ax.set_ylabel(f"{main} minus method (points)")
        ax.set_title("paired gaps with 95 % intervals")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_search_progress(
    results: Mapping[str, PolicySearchResult],
    references: Mapping[str, tuple[float, float]] | None = None,
    window: int = 20,
) -> Figure:
    """What a search learns: the running mean of each episode's reward and accuracy.

    Left: the reward of every training episode (running mean over ``window``); right:
    the held-out accuracy of the episodes that met the budget (running mean over the
    last ``window`` such episodes). Dashed lines mark reference policies (uniform ratios,
    say) scored the same way.

    Args:
        results: Label -> a search's result (its ``episode_rewards`` and
            ``episode_accuracies``).
        references: Label -> ``(accuracy, reward)`` of a reference policy.
        window: Running-mean window in episodes.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for i, (label, result) in enumerate(results.items()):
        rewards = np.asarray(result.episode_rewards, dtype=float)
        left.plot(
            np.arange(1, rewards.size + 1),
            learning_curve(rewards, window),
            color=f"C{i}",
            label=label,
        )
        acc = np.asarray(result.episode_accuracies, dtype=float)
        done = np.flatnonzero(~np.isnan(acc))
        if done.size:
            right.plot(done + 1, learning_curve(acc[done], window), color=f"C{i}", label=label)
    for j, (label, (accuracy, reward)) in enumerate((references or {}).items()):
        style = {"color": f"C{len(results) + j}", "ls": "--", "lw": 1.5}
        left.axhline(reward, label=label, **style)
        right.axhline(accuracy, label=label, **style)
    left.set_xlabel("episode")
    left.set_ylabel(f"reward, mean of last {window} episodes")
    left.set_title("reward (budget missed: failure reward)")
    right.set_xlabel("episode")
    right.set_ylabel(f"validation accuracy, mean of last {window}")
    right.set_title("accuracy of the episodes that met the budget (recalibrated)")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig
