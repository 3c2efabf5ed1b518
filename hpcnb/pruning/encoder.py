"""Multi-stage GNN encoder (PyG ``MessagePassing``) and the SB3 features extractor.

Stage 1 embeds every op's level-1 channel graph with two weighted GCN layers (PyG's
``GCNConv``: edge weights, a unit self-loop on every node that has none, symmetric
normalisation ``w_ij / sqrt(d_i d_j)`` by weighted degree) and mean-pools it to one
vector per op. Stage 2 runs edge-conditioned message passing
(:class:`EdgeConditionedConv`) on the level-2 network graph, where the feature of edge
``u -> v`` is the stage-1 embedding of op ``v`` (plus a direction flag: messages flow both
with and against the data flow). A readout gives a graph embedding (mean and max over
feature maps) and one embedding per prunable group (mean over the feature maps the group
sets), which :class:`GNNFeaturesExtractor` hands to the PPO policy and value heads.

Shapes for a batch of ``B`` observations of one network (``N`` nodes, ``E`` edges,
``K2`` level-1 nodes, ``G`` groups, hidden width ``H``):

* ``op_x (B, N, K2, F1)``, ``op_adj (B, N, K2, K2)`` -> stage 1 -> ``op_emb (B, N, H1)``
* ``node_x (B, N, F2)``, ``edge_index (B, 2, E)`` -> stage 2 -> ``node_emb (B, N, H)``
* readout -> ``graph_emb (B, 2H)``, ``group_emb (B, G, H)``
* extractor output ``(B, 2H + G*H + G + 1)`` (``keep`` and ``step`` appended).
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import Tensor, nn
from torch_geometric.nn import GCNConv, MessagePassing
from torch_geometric.utils import scatter

from hpcnb.errors import InvalidInputError

__all__ = ["EdgeConditionedConv", "GNNFeaturesExtractor", "MultiStageGNN"]


def _gcn_layer(in_channels: int, out_channels: int) -> GCNConv:
    """A PyG ``GCNConv`` whose weight is drawn as ``nn.Linear`` draws its own.

    ``GCNConv`` draws a Glorot weight (twice, once per ``reset_parameters``); that draw
    runs on a forked CPU generator and the weight is then drawn with ``nn.Linear``'s
    default (Kaiming uniform, ``a = sqrt(5)``), so a seed gives the same stage-1 weights
    and the same random stream for the layers built after it as a plain linear map.
    The bias starts at zero.
    """
    with torch.random.fork_rng(devices=[]):
        conv = GCNConv(in_channels, out_channels)
    nn.init.kaiming_uniform_(conv.lin.weight, a=math.sqrt(5))
    return conv


class EdgeConditionedConv(MessagePassing):
    """Message passing whose messages depend on edge features (stage 2).

    ``m_ij = ReLU(W_m [h_j ; e_ij])``, ``h_i' = ReLU(W_r h_i + mean_j m_ij)``.

    Shapes: ``x (V, F_in)``, ``edge_index (2, M)``, ``edge_attr (M, F_e)`` -> ``(V, F_out)``.
    """

    def __init__(self, in_channels: int, edge_channels: int, out_channels: int) -> None:
        super().__init__(aggr="mean")
        self.msg = nn.Linear(in_channels + edge_channels, out_channels)
        self.root = nn.Linear(in_channels, out_channels)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        """Apply the layer (see class docstring for shapes).

        Args:
            x: Node features ``(V, F_in)``.
            edge_index: Edges as ``(2, M)`` source and target node ids.
            edge_attr: Edge features ``(M, F_e)``.
        """
        return torch.relu(self.root(x) + self.propagate(edge_index, x=x, edge_attr=edge_attr))

    def message(self, x_j: Tensor, edge_attr: Tensor) -> Tensor:
        """Message from neighbour ``j`` conditioned on the edge feature.

        Args:
            x_j: Features of each edge's source node ``(M, F_in)``.
            edge_attr: Edge features ``(M, F_e)``.
        """
        return torch.relu(self.msg(torch.cat([x_j, edge_attr], dim=-1)))


class MultiStageGNN(nn.Module):
    """Two-stage encoder of the hierarchical graph (see module docstring for shapes).

    Args:
        level1_features: ``F1``.
        level2_features: ``F2`` (including the dynamic keep column).
        hidden: ``H``, width of both stages.
        stage2_layers: Number of :class:`EdgeConditionedConv` layers.
    """

    def __init__(
        self, level1_features: int, level2_features: int, hidden: int = 32, stage2_layers: int = 3
    ) -> None:
        super().__init__()
        self.hidden = hidden
        self.stage1 = nn.ModuleList(
            [_gcn_layer(level1_features, hidden), _gcn_layer(hidden, hidden)]
        )
        self.node_in = nn.Linear(level2_features, hidden)
        self.stage2 = nn.ModuleList(
            [EdgeConditionedConv(hidden, hidden + 1, hidden) for _ in range(stage2_layers)]
        )

    def embed_ops(self, op_x: Tensor, op_adj: Tensor) -> Tensor:
        """Stage 1: embed every operation's level-1 graph, ``(B, N, H)``.

        Args:
            op_x: Level-1 node features ``(B, N, K2, F1)``.
            op_adj: Level-1 adjacency matrices ``(B, N, K2, K2)``.
        """
        b, n, k2, f1 = op_x.shape
        x = op_x.reshape(b * n * k2, f1)
        graph, src, dst = torch.nonzero(op_adj.reshape(b * n, k2, k2) > 0, as_tuple=True)
        weight = op_adj.reshape(b * n, k2, k2)[graph, src, dst]
        edge_index = torch.stack([graph * k2 + src, graph * k2 + dst])
        for i, conv in enumerate(self.stage1):
            x = conv(x, edge_index, weight)
            if i + 1 < len(self.stage1):
                x = torch.relu(x)
        return x.reshape(b, n, k2, self.hidden).mean(dim=2)

    def forward(self, obs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Return ``(node_emb (B, N, H), op_emb (B, N, H))`` of a batch of observations."""
        op_emb = self.embed_ops(obs["op_x"], obs["op_adj"])
        b, n, _ = obs["node_x"].shape
        edges = obs["edge_index"].long()  # (B, 2, E)
        offset = (torch.arange(b, device=edges.device) * n).view(b, 1, 1)
        flat = (edges + offset).permute(1, 0, 2).reshape(2, -1)  # (2, B*E)
        src, dst = flat
        op_flat = op_emb.reshape(b * n, self.hidden)
        edge_feat = op_flat[dst]  # edge u->v carries op v's level-1 embedding
        both = torch.cat([flat, flat.flip(0)], dim=1)
        direction = torch.cat([torch.ones(src.numel(), 1), -torch.ones(src.numel(), 1)]).to(op_flat)
        attr = torch.cat([torch.cat([edge_feat, edge_feat]), direction], dim=1)
        h = torch.relu(self.node_in(obs["node_x"].reshape(b * n, -1)))
        for conv in self.stage2:
            h = conv(h, both, attr)
        return h.reshape(b, n, self.hidden), op_emb


def _shape(space: gym.spaces.Dict, key: str) -> tuple[int, ...]:
    shape = space[key].shape
    if shape is None:
        raise InvalidInputError(f"observation space {key!r} has no shape")
    return shape


class GNNFeaturesExtractor(BaseFeaturesExtractor):
    """SB3 features extractor: the multi-stage GNN plus a graph and per-group readout.

    Args:
        observation_space: The ``Dict`` space of :class:`~hpcnb.pruning.env.PruningEnv`.
        hidden: GNN width ``H``.
        stage2_layers: Stage-2 message-passing layers.
    """

    def __init__(
        self, observation_space: gym.spaces.Dict, hidden: int = 32, stage2_layers: int = 3
    ) -> None:
        f1 = _shape(observation_space, "op_x")[2]
        f2 = _shape(observation_space, "node_x")[1]
        groups = _shape(observation_space, "keep")[0]
        super().__init__(observation_space, features_dim=2 * hidden + groups * hidden + groups + 1)
        self.num_groups = groups
        self.gnn = MultiStageGNN(f1, f2, hidden=hidden, stage2_layers=stage2_layers)

    def forward(self, observations: dict[str, Tensor]) -> Tensor:
        """Map a batch of observations to ``(B, features_dim)``."""
        node_emb, _ = self.gnn(observations)
        b, n, h = node_emb.shape
        graph_emb = torch.cat([node_emb.mean(dim=1), node_emb.max(dim=1).values], dim=1)
        group = observations["node_group"].long()  # (B, N), -1 = none
        index = torch.where(group < 0, torch.full_like(group, self.num_groups), group)
        index = index + (torch.arange(b, device=group.device) * (self.num_groups + 1)).view(b, 1)
        pooled = scatter(
            node_emb.reshape(b * n, h),
            index.reshape(-1),
            dim=0,
            dim_size=b * (self.num_groups + 1),
            reduce="mean",
        ).reshape(b, self.num_groups + 1, h)[:, : self.num_groups]
        return torch.cat(
            [graph_emb, pooled.reshape(b, -1), observations["keep"], observations["step"]], dim=1
        )
