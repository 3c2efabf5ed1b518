"""Figures of notebook 02: the graph, learning curves, keep ratios, budget sweep, latency."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from hpcnb.pruning.agents import learning_curve
from hpcnb.pruning.hiergraph import HierarchicalGraph

__all__ = [
    "plot_budget_sweep",
    "plot_flops_vs_latency",
    "plot_hierarchical_graph",
    "plot_keep_ratios",
    "plot_learning_curves",
]


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


def plot_flops_vs_latency(table: pd.DataFrame, title: str = "") -> Figure:
    """Scatter of FLOPs kept against measured speed-up, one point per method.

    Args:
        table: Rows with ``model``, ``flops_ratio``, ``speedup``, ``speedup_low`` and
            ``speedup_high`` (e.g. one size and batch of
            :func:`~hpcnb.pruning.latency.latency_table_by_size` joined with FLOPs).
        title: Axes title.
    """
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for _, row in table.iterrows():
        err = [[row.speedup - row.speedup_low], [row.speedup_high - row.speedup]]
        ax.errorbar(row.flops_ratio, row.speedup, yerr=err, fmt="o", capsize=3)
        ax.annotate(
            str(row.model),
            (row.flops_ratio, row.speedup),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    xs = np.linspace(max(0.05, float(table.flops_ratio.min()) * 0.8), 1.0, 50)
    ax.plot(xs, 1 / xs, "k--", lw=1, label="speed-up = 1 / FLOPs kept")
    ax.set_xlabel("FLOPs kept (pruned / original)")
    ax.set_ylabel("measured speed-up (original / pruned latency)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_budget_sweep(table: pd.DataFrame, title: str = "") -> Figure:
    """Accuracy after fine-tuning against the FLOPs budget, one line per method.

    Args:
        table: A :func:`~hpcnb.pruning.compare.sweep_table`.
        title: Axes title.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    flat = table.reset_index()
    for method, rows in flat.groupby("method"):
        rows = rows.sort_values("budget")
        ax.plot(rows.budget, rows.accuracy, "o-", label=str(method))
    ax.set_xlabel("FLOPs budget (fraction kept)")
    ax.set_ylabel("test accuracy after fine-tuning (mean over seeds)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig
