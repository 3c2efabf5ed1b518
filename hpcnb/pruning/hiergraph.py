"""The hierarchical (two-level) graph of a network, as the GNN-RL agent observes it.

Reconstruction of the multi-stage graph of Yu, Mazaheri & Jannesari (ICML 2022):

* **Level 2** is the whole network: one node per feature map (the output tensor of an IR
  node), one directed edge per data dependency ``u -> v`` (``v`` consumes ``u``). The
  edge stands for the operation ``v`` that turns ``u`` into ``v``'s feature map.
* **Level 1** is one small graph per operation: ``K`` input-channel bins and ``K``
  output-channel bins (``2K`` nodes). For convolutions and linear layers the bins are
  channel quantiles by filter L2 norm and the bipartite edge weights are the mean
  ``|W|`` between bins, so the level-1 graph is the layer's channel-level computation;
  element-wise operations connect bin ``i`` to bin ``i``. The GNN embeds each level-1
  graph (stage 1) and uses the embedding as the feature of the level-2 edges that stand
  for that operation (stage 2).

Node features are ``"random"`` (as in the paper's public code: fixed Gaussian features)
or ``"weights"`` (bin statistics of the filter norms plus the op kind).

Shapes (``N`` feature maps, ``E`` edges, ``K2 = 2K`` level-1 nodes, ``G`` groups):
``op_x (N, K2, F1)``, ``op_adj (N, K2, K2)``, ``node_x (N, F2)``, ``edge_index (2, E)``,
``node_group (N,)``. The observation adds the dynamic keep ratio of each node's group as
the last column of ``node_x``, plus ``keep (G,)`` and ``step (1,)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from hpcnb.errors import InvalidInputError

__all__ = ["KIND_VOCAB", "LEVEL1_FEATURES", "HierarchicalGraph", "kind_one_hot"]

KIND_VOCAB = (
    "input",
    "conv",
    "linear",
    "norm",
    "activation",
    "pool",
    "add",
    "concat",
    "reshape",
    "output",
    "other",
)
"""Op kinds with their own one-hot slot; every other IR kind maps to ``"other"``."""

LEVEL1_FEATURES = 6 + len(KIND_VOCAB)
"""Width ``F1`` of level-1 node features: 6 bin statistics + the op-kind one-hot."""


def kind_one_hot(kind: str) -> np.ndarray:
    """Return the one-hot vector of an op kind over :data:`KIND_VOCAB`."""
    out = np.zeros(len(KIND_VOCAB), dtype=np.float32)
    out[KIND_VOCAB.index(kind) if kind in KIND_VOCAB else KIND_VOCAB.index("other")] = 1.0
    return out


@dataclass(frozen=True)
class HierarchicalGraph:
    """Static part of the two-level graph plus the per-node group map.

    Attributes:
        op_x: ``(N, K2, F1)`` level-1 node features of each op's channel graph.
        op_adj: ``(N, K2, K2)`` symmetric, non-negative level-1 edge weights.
        node_x: ``(N, F2)`` static level-2 node (feature map) features.
        edge_index: ``(2, E)`` level-2 edges ``producer -> consumer`` (int64).
        node_group: ``(N,)`` prunable group that sets the node's channel count, ``-1``
            when none does.
        num_groups: Number ``G`` of prunable groups.
        names: ``(N,)`` IR node names, for plots and errors.
    """

    op_x: np.ndarray
    op_adj: np.ndarray
    node_x: np.ndarray
    edge_index: np.ndarray
    node_group: np.ndarray
    num_groups: int
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = self.node_x.shape[0]
        if self.op_x.ndim != 3 or self.op_x.shape[0] != n:
            raise InvalidInputError(
                f"HierarchicalGraph.op_x: shape {self.op_x.shape}, expected ({n}, K2, F1)"
            )
        k2 = self.op_x.shape[1]
        if self.op_adj.shape != (n, k2, k2):
            raise InvalidInputError(
                f"HierarchicalGraph.op_adj: shape {self.op_adj.shape}, expected ({n}, {k2}, {k2})"
            )
        if self.edge_index.ndim != 2 or self.edge_index.shape[0] != 2:
            raise InvalidInputError(
                f"HierarchicalGraph.edge_index: shape {self.edge_index.shape}, expected (2, E)"
            )
        if self.edge_index.size and (self.edge_index.min() < 0 or self.edge_index.max() >= n):
            raise InvalidInputError(f"HierarchicalGraph.edge_index: node ids must be in [0, {n})")
        if self.node_group.shape != (n,):
            raise InvalidInputError(
                f"HierarchicalGraph.node_group: shape {self.node_group.shape}, expected ({n},)"
            )
        if (
            self.node_group.min(initial=-1) < -1
            or self.node_group.max(initial=-1) >= self.num_groups
        ):
            raise InvalidInputError(
                f"HierarchicalGraph.node_group: entries must be in [-1, {self.num_groups})"
            )

    @property
    def num_nodes(self) -> int:
        """Number ``N`` of level-2 nodes (feature maps)."""
        return int(self.node_x.shape[0])

    def observation_space(self) -> spaces.Dict:
        """Return the gymnasium ``Dict`` space of :meth:`observation`."""
        n, k2, f1 = self.op_x.shape
        f2 = self.node_x.shape[1] + 1
        e = self.edge_index.shape[1]
        big = np.float32(1e6)
        return spaces.Dict(
            {
                "node_x": spaces.Box(-big, big, (n, f2), np.float32),
                "op_x": spaces.Box(-big, big, (n, k2, f1), np.float32),
                "op_adj": spaces.Box(0.0, big, (n, k2, k2), np.float32),
                "edge_index": spaces.Box(0.0, float(max(n - 1, 0)), (2, e), np.float32),
                "node_group": spaces.Box(
                    -1.0, float(max(self.num_groups - 1, 0)), (n,), np.float32
                ),
                "keep": spaces.Box(0.0, 1.0, (self.num_groups,), np.float32),
                "step": spaces.Box(0.0, 1.0, (1,), np.float32),
            }
        )

    def observation(self, keep: np.ndarray, step_fraction: float) -> dict[str, np.ndarray]:
        """Return the observation at per-group keep ratios ``keep``.

        Args:
            keep: ``(G,)`` current keep ratios in ``[0, 1]``.
            step_fraction: Steps taken / step limit, in ``[0, 1]``.
        """
        keep = np.asarray(keep, dtype=np.float32)
        if keep.shape != (self.num_groups,):
            raise InvalidInputError(
                f"observation: keep of shape {keep.shape}, expected ({self.num_groups},)"
            )
        node_keep = np.append(keep, np.float32(1.0))[self.node_group]
        return {
            "node_x": np.concatenate([self.node_x, node_keep[:, None]], axis=1).astype(np.float32),
            "op_x": self.op_x.astype(np.float32),
            "op_adj": self.op_adj.astype(np.float32),
            "edge_index": self.edge_index.astype(np.float32),
            "node_group": self.node_group.astype(np.float32),
            "keep": np.clip(keep, 0.0, 1.0),
            "step": np.array([np.clip(step_fraction, 0.0, 1.0)], dtype=np.float32),
        }


def level1_channel_graph(
    weight: np.ndarray | None, kind: str, channels: int, bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(features (2K, F1), adjacency (2K, 2K))`` of one op's level-1 graph.

    Args:
        weight: The op's weight (``(C_out, C_in/groups, ...)`` for conv/linear, ``(C,)`` for
            norms) or ``None`` for parameter-free ops.
        kind: The op kind (one-hot encoded into every node).
        channels: Output channel count (used when there is no weight).
        bins: ``K``, channel bins per side.
    """
    k = bins
    feats = np.zeros((2 * k, LEVEL1_FEATURES), dtype=np.float32)
    adj = np.zeros((2 * k, 2 * k), dtype=np.float32)
    feats[:, 6:] = kind_one_hot(kind)
    feats[k:, 0] = 1.0  # output-side flag
    eye = np.arange(k)
    if weight is None or weight.ndim == 0:
        adj[eye, k + eye] = 1.0
        feats[:, 4] = 1.0 / k
        feats[:, 5] = np.log2(channels + 1) / 10.0
    else:
        w = np.abs(weight.reshape(weight.shape[0], -1) if weight.ndim > 1 else weight[:, None])
        out_norm = np.sqrt((w**2).sum(axis=1))
        out_bins = np.array_split(np.argsort(-out_norm, kind="stable"), k)
        scale = float(out_norm.max()) or 1.0
        for b, idx in enumerate(out_bins):
            vals = out_norm[idx] / scale if len(idx) else np.zeros(1)
            feats[k + b, 1:4] = (vals.mean(), vals.std(), w[idx].mean() if len(idx) else 0.0)
            feats[k + b, 4] = len(idx) / max(len(out_norm), 1)
        feats[k:, 5] = np.log2(weight.shape[0] + 1) / 10.0
        if weight.ndim >= 2 and weight.shape[1] > 1:
            w3 = np.abs(weight.reshape(weight.shape[0], weight.shape[1], -1)).mean(axis=2)
            in_norm = np.sqrt((w3**2).sum(axis=0))
            in_bins = np.array_split(np.argsort(-in_norm, kind="stable"), k)
            in_scale = float(in_norm.max()) or 1.0
            for b, idx in enumerate(in_bins):
                vals = in_norm[idx] / in_scale if len(idx) else np.zeros(1)
                feats[b, 1:4] = (vals.mean(), vals.std(), w3[:, idx].mean() if len(idx) else 0.0)
                feats[b, 4] = len(idx) / max(len(in_norm), 1)
            feats[:k, 5] = np.log2(weight.shape[1] + 1) / 10.0
            for bo, io in enumerate(out_bins):
                for bi, ii in enumerate(in_bins):
                    if len(io) and len(ii):
                        adj[bi, k + bo] = w3[np.ix_(io, ii)].mean()
            adj /= adj.max() or 1.0
        else:  # norms and depthwise convolutions act channel by channel
            adj[eye, k + eye] = 1.0
            feats[:k, 1:6] = feats[k:, 1:6]
    adj = np.maximum(adj, adj.T)
    return feats, adj
