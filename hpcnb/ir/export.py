"""Exports of an IR graph: PyTorch Geometric ``Data``, networkx, and a matplotlib drawing.

The one-hot op kind of :func:`to_pyg` has one slot per kind of the kinds table
(:data:`hpcnb.ir.kinds.KINDS`, in registration order), read when the export runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from hpcnb.errors import InvalidInputError
from hpcnb.ir.graph import Graph, Node
from hpcnb.ir.kinds import kind_names

if TYPE_CHECKING:
    import networkx as nx
    from matplotlib.axes import Axes
    from torch_geometric.data import Data

__all__ = ["PYG_FEATURES", "draw_graph", "to_networkx", "to_pyg"]

#: Names of the numeric node features that follow the one-hot op kind in :func:`to_pyg`.
PYG_FEATURES: tuple[str, ...] = (
    "log_out_numel",
    "log_in_numel",
    "log_out_channels",
    "log_out_spatial",
    "out_ndim",
    "log_params",
    "log_flops",
    "log_bytes_read",
    "log_bytes_written",
)


def _channels_and_spatial(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) >= 3 and len(shape) <= 5:
        return shape[1], math.prod(shape[2:])  # (N, C, *spatial)
    if shape:
        return shape[-1], math.prod(shape[1:-1]) if len(shape) > 2 else 1
    return 0, 0


def node_features(node: Node, kinds: Sequence[str] | None = None) -> list[float]:
    """One-hot op kind followed by the log-scaled numbers named in :data:`PYG_FEATURES`.

    Args:
        node: The IR node.
        kinds: The kinds of the one-hot slots, in order (default: the registered kinds).
    """
    onehot = [1.0 if node.kind == k else 0.0 for k in (kind_names() if kinds is None else kinds)]
    channels, spatial = _channels_and_spatial(node.out_shape)
    numbers = [
        math.log1p(math.prod(node.out_shape) if node.out_shape else 0),
        math.log1p(sum(math.prod(s) for s in node.in_shapes)),
        math.log1p(channels),
        math.log1p(spatial),
        float(len(node.out_shape)),
        math.log1p(node.params),
        math.log1p(node.flops),
        math.log1p(node.bytes_read),
        math.log1p(node.bytes_written),
    ]
    return onehot + numbers


def _kept(graph: Graph, drop_kinds: Iterable[str]) -> list[Node]:
    drop = set(drop_kinds)
    return [n for n in graph.nodes if n.kind not in drop]


def _edges(graph: Graph, nodes: list[Node]) -> list[tuple[int, int]]:
    """Edges between kept nodes; paths through dropped nodes are bridged."""
    index = {n.name: i for i, n in enumerate(nodes)}
    by_name = {n.name: n for n in graph.nodes}
    edges: list[tuple[int, int]] = []
    for n in nodes:
        stack, seen = list(n.inputs), set()
        while stack:
            src = stack.pop()
            if src in seen:
                continue
            seen.add(src)
            if src in index:
                edges.append((index[src], index[n.name]))
            elif src in by_name:
                stack.extend(by_name[src].inputs)
    return edges


def to_pyg(graph: Graph, drop_kinds: Iterable[str] = ("size",)) -> Data:
    """Convert ``graph`` to a ``torch_geometric.data.Data``.

    Args:
        graph: The IR graph.
        drop_kinds: Node kinds to leave out (edges through them are bridged).

    Returns:
        ``Data`` with ``x`` (nodes x (registered kinds + len(PYG_FEATURES))), ``edge_index``
        (2 x edges, producer -> consumer), ``names``, ``kinds`` and ``modules``.
    """
    from torch_geometric.data import Data

    nodes = _kept(graph, drop_kinds)
    kinds = kind_names()
    x = torch.tensor([node_features(n, kinds) for n in nodes], dtype=torch.float32)
    edges = _edges(graph, nodes)
    edge_index = (
        torch.tensor(edges, dtype=torch.long).t().contiguous()
        if edges
        else torch.zeros(2, 0, dtype=torch.long)
    )
    data = Data(x=x, edge_index=edge_index)
    data.names = [n.name for n in nodes]
    data.kinds = [n.kind for n in nodes]
    data.modules = [n.module for n in nodes]
    return data


def to_networkx(graph: Graph, drop_kinds: Iterable[str] = ()) -> nx.DiGraph:
    """Convert ``graph`` to a ``networkx.DiGraph`` keyed by node name with all node fields.

    Args:
        graph: The IR graph.
        drop_kinds: Node kinds to leave out (edges through them are bridged).

    Returns:
        The directed graph (producer -> consumer).
    """
    import networkx as nx

    nodes = _kept(graph, drop_kinds)
    g = nx.DiGraph()
    for n in nodes:
        g.add_node(n.name, **asdict(n))
    for src, dst in _edges(graph, nodes):
        g.add_edge(nodes[src].name, nodes[dst].name)
    return g


def _layers(g: Any) -> dict[str, int]:
    import networkx as nx

    depth: dict[str, int] = {}
    for name in nx.topological_sort(g):
        preds = list(g.predecessors(name))
        depth[name] = 1 + max((depth[p] for p in preds), default=-1)
    return depth


def draw_graph(
    graph: Graph,
    ax: Axes | None = None,
    *,
    drop_kinds: Iterable[str] = ("size", "getitem", "identity", "dropout"),
    label: str = "kind",
    max_nodes: int = 400,
) -> Axes:
    """Draw ``graph`` left to right, one column per topological depth, coloured by kind.

    Args:
        graph: The IR graph.
        ax: Axes to draw on (a new figure when None).
        drop_kinds: Kinds left out of the picture.
        label: Node label: "kind", "name", "module" or "" (none).
        max_nodes: Refuse to draw larger graphs (the picture would be unreadable).

    Returns:
        The axes.

    Raises:
        InvalidInputError: The graph has more than ``max_nodes`` nodes, or ``label`` is
            not one of the four choices.
    """
    import matplotlib.pyplot as plt

    g = to_networkx(graph, drop_kinds)
    if g.number_of_nodes() > max_nodes:
        raise InvalidInputError(
            f"draw_graph: {g.number_of_nodes()} nodes > max_nodes={max_nodes}; "
            "draw a smaller model or raise max_nodes"
        )
    if label not in ("kind", "name", "module", ""):
        raise InvalidInputError(f"draw_graph: label={label!r}, expected kind/name/module/''")
    depth = _layers(g)
    columns: dict[int, list[str]] = {}
    for name in g.nodes:
        columns.setdefault(depth[name], []).append(name)
    pos = {}
    for d, names in columns.items():
        for i, name in enumerate(names):
            pos[name] = (d, i - (len(names) - 1) / 2)
    if ax is None:
        width = min(24.0, 2.0 + 0.35 * (max(columns) + 1))
        _, ax = plt.subplots(figsize=(width, 3.5))
    cmap = plt.get_cmap("tab20")
    colour = {k: cmap(i % 20) for i, k in enumerate(kind_names())}
    from matplotlib.patches import FancyArrowPatch

    for src, dst in g.edges:
        (x0, y0), (x1, y1) = pos[src], pos[dst]
        if x1 - x0 > 1 and abs(y1 - y0) < 1e-9:  # a skip connection: bend it to show it
            ax.add_patch(
                FancyArrowPatch(
                    (x0, y0),
                    (x1, y1),
                    connectionstyle=f"arc3,rad={-0.6 / (x1 - x0) ** 0.5:.3f}",
                    arrowstyle="-",
                    color="0.55",
                    lw=0.8,
                    zorder=1,
                )
            )
        else:
            ax.plot([x0, x1], [y0, y1], color="0.7", lw=0.8, zorder=1)
    kinds_seen = []
    for name, (xx, yy) in pos.items():
        kind = g.nodes[name]["kind"]
        ax.scatter(
            [xx],
            [yy],
            s=90,
            color=colour[kind],
            zorder=2,
            edgecolors="k",
            linewidths=0.4,
            label=kind if kind not in kinds_seen else None,
        )
        kinds_seen.append(kind)
        if label:
            text = g.nodes[name][label] or name
            ax.annotate(
                text, (xx, yy), fontsize=6, rotation=45, xytext=(3, 3), textcoords="offset points"
            )
    ax.set_xlabel("topological depth (ops from the input)")
    ax.set_ylabel("parallel branches")
    ax.set_yticks([])
    ax.margins(y=0.25)
    ax.set_title(f"{type(graph.gm).__name__}: {g.number_of_nodes()} ops")
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax
