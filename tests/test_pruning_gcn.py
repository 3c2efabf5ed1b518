"""Stage 1 of the pruning encoder (PyG's GCNConv) against a dense GCN on random graphs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcnb.pruning.encoder import MultiStageGNN


def _random_graph(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Node features, edges (repeats, isolated nodes, at most one self-loop per node) and
    positive weights."""
    gen = torch.Generator().manual_seed(seed)
    v = int(torch.randint(1, 25, (1,), generator=gen))
    m = int(torch.randint(0, 4 * v, (1,), generator=gen))
    x = torch.randn(v, 5, generator=gen, dtype=torch.float64)
    edge_index = torch.randint(0, v, (2, m), generator=gen)
    looped: set[int] = set()
    keep = []
    for src, dst in edge_index.T.tolist():
        keep.append(src != dst or src not in looped)
        if src == dst:
            looped.add(src)
    edge_index = edge_index[:, torch.tensor(keep, dtype=torch.bool)]
    m = edge_index.shape[1]
    weight = torch.rand(m, generator=gen, dtype=torch.float64) * 3 + 0.01
    return x, edge_index, weight


def _dense_gcn(x, edge_index, weight, lin_weight, bias):
    """``D^-1/2 A D^-1/2 X W^T + b`` where ``A[dst, src]`` sums the edge weights and a
    node without a self-loop gets one of weight 1."""
    v = x.shape[0]
    adj = torch.zeros(v, v, dtype=x.dtype)
    loop = torch.ones(v, dtype=x.dtype)
    for (src, dst), w in zip(edge_index.T.tolist(), weight.tolist(), strict=True):
        if src == dst:
            loop[src] = w
        else:
            adj[dst, src] += w
    adj += torch.diag(loop)
    inv_sqrt = adj.sum(dim=1).pow(-0.5)
    norm = inv_sqrt[:, None] * adj * inv_sqrt[None, :]
    return norm @ x @ lin_weight.T + bias


@pytest.mark.parametrize("seed", range(50))
def test_stage1_layer_is_a_weighted_gcn(seed):
    x, edge_index, weight = _random_graph(seed)
    conv = MultiStageGNN(5, 3, hidden=7).stage1[0].double()
    with torch.no_grad():
        conv.bias.normal_()
    expected = _dense_gcn(x, edge_index, weight, conv.lin.weight, conv.bias)
    assert torch.allclose(conv(x, edge_index, weight), expected, atol=1e-6, rtol=0)


def test_embed_ops_runs_each_op_graph_on_its_own():
    """Stage 1 of a batch equals the dense GCN of each op's own channel graph."""
    torch.manual_seed(3)
    b, n, k2, f1, h = 2, 3, 4, 5, 6
    op_x = torch.randn(b, n, k2, f1)
    op_adj = torch.rand(b, n, k2, k2) * (torch.rand(b, n, k2, k2) > 0.5)
    gnn = MultiStageGNN(f1, 3, hidden=h)
    with torch.no_grad():
        for conv in gnn.stage1:
            conv.bias.normal_()
    got = gnn.embed_ops(op_x, op_adj)
    for i in range(b):
        for j in range(n):
            src, dst = torch.nonzero(op_adj[i, j] > 0, as_tuple=True)
            edges, w = torch.stack([src, dst]), op_adj[i, j][src, dst]
            first, second = gnn.stage1
            y = torch.relu(_dense_gcn(op_x[i, j], edges, w, first.lin.weight, first.bias))
            y = _dense_gcn(y, edges, w, second.lin.weight, second.bias)
            assert torch.allclose(got[i, j], y.mean(dim=0), atol=1e-5), (i, j)


def test_seed_gives_linear_default_weights_and_stream():
    """A seed draws stage 1 as two bias-free ``nn.Linear`` maps and leaves the stream
    where they would, so the stage-2 layers built after it get the same weights too."""
    torch.manual_seed(11)
    gnn = MultiStageGNN(5, 3, hidden=7)
    after = torch.rand(4)
    torch.manual_seed(11)
    first, second = nn.Linear(5, 7, bias=False), nn.Linear(7, 7, bias=False)
    node_in = nn.Linear(3, 7)
    for _ in gnn.stage2:  # each EdgeConditionedConv: message map, then root map
        nn.Linear(7 + 8, 7)
        nn.Linear(7, 7)
    expected_after = torch.rand(4)
    assert torch.equal(gnn.stage1[0].lin.weight, first.weight)
    assert torch.equal(gnn.stage1[1].lin.weight, second.weight)
    assert torch.equal(gnn.node_in.weight, node_in.weight)
    assert all(torch.count_nonzero(conv.bias) == 0 for conv in gnn.stage1)
    assert torch.equal(after, expected_after)
