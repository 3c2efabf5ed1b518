"""nn.MultiheadAttention is prunable: embedding width and whole heads, packed in-projection."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hpcnb.ir import extract, importance, reorder, trace, uniform_keep
from hpcnb.ir.attention import SlicedMultiheadAttention


class TinyTransformer(nn.Module):
    """Embedding -> x + MHA(x) -> (LayerNorm) -> mean over tokens -> linear head."""

    def __init__(self, norm: bool = True, batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(11, 16)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=batch_first)
        self.norm = nn.LayerNorm(16) if norm else nn.Identity()
        self.head = nn.Linear(16, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if not self.batch_first:
            x = x.transpose(0, 1)
        y, _ = self.attn(x, x, x, need_weights=False)
        x = self.norm(x + y)
        return self.head(x.mean(dim=1 if self.batch_first else 0))


def _model(**kwargs) -> nn.Module:
    torch.manual_seed(0)
    model = TinyTransformer(**kwargs).eval()
    with torch.no_grad():
        model.attn.in_proj_bias.normal_(0, 0.1)
        model.attn.out_proj.bias.normal_(0, 0.1)
    return model


def _groups(graph):
    width = next(
        g for g in graph.groups() if any(m.param == "head.weight" for m in g.members if m.axis == 1)
    )
    (heads,) = [g for g in graph.groups() if g.kind == "head"]
    return width, heads


TOKENS = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_groups_width_and_heads(batch_first: bool) -> None:
    graph = trace(_model(batch_first=batch_first), TOKENS)
    width, heads = _groups(graph)
    assert width.prunable and width.size == 16
    members = {(m.param, m.axis) for m in width.members}
    assert {
        ("embed.weight", 1),
        ("attn.in_proj_weight", 1),
        ("attn.out_proj.weight", 0),
        ("attn.out_proj.bias", 0),
        ("norm.weight", 0),
        ("head.weight", 1),
    } <= members
    assert heads.prunable and heads.size == 4
    for j in range(3):
        assert any(m.param == "attn.in_proj_weight" and m.offset == 16 * j for m in heads.members)
    assert any(m.param == "attn.out_proj.weight" and m.axis == 1 for m in heads.members)


def test_mha_fewer_heads_equals_zeroing_their_output_columns() -> None:
    model = _model()
    graph = trace(model, TOKENS)
    _, heads = _groups(graph)
    with torch.no_grad():
        ref = model(TOKENS)
        assert torch.allclose(extract(model, graph, {})(TOKENS), ref, atol=1e-6)
        small = extract(model, graph, {heads.id: [3, 1]})
        masked = copy.deepcopy(model)
        masked.attn.out_proj.weight[:, 0:4] = 0.0  # head 0
        masked.attn.out_proj.weight[:, 8:12] = 0.0  # head 2
        assert torch.allclose(small(TOKENS), masked(TOKENS), atol=1e-5)
    attn = small.get_submodule("attn")
    assert isinstance(attn, SlicedMultiheadAttention) and attn.num_heads == 2
    assert attn.head_dim == 4 and attn.in_proj_weight.shape == (24, 16)
    assert trace(small, TOKENS).total_flops() < graph.total_flops()


@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_narrower_width_equals_zeroing_the_residual_channels(batch_first: bool) -> None:
    model = _model(norm=False, batch_first=batch_first)
    graph = trace(model, TOKENS)
    width, _ = _groups(graph)
    keep = [0, 2, 3, 5, 7, 8, 11, 12, 13, 15]
    dropped = [i for i in range(16) if i not in keep]
    with torch.no_grad():
        small = extract(model, graph, {width.id: keep})
        masked = copy.deepcopy(model)
        masked.attn.in_proj_weight[:, dropped] = 0.0  # every reader of the residual stream
        masked.head.weight[:, dropped] = 0.0
        assert torch.allclose(small(TOKENS), masked(TOKENS), atol=1e-5)
    attn = small.get_submodule("attn")
    assert attn.embed_dim == 10 and attn.num_heads == 4 and attn.out_proj.weight.shape == (10, 16)
    small_graph = trace(small, TOKENS)
    assert small_graph.total_flops() < graph.total_flops()
    assert {g.size for g in small_graph.prunable_groups()} == {10, 4}  # prunable again


def test_mha_with_layer_norm_uniform_half_runs_and_reorder_keeps_function() -> None:
    model = _model()
    graph = trace(model, TOKENS)
    keep = uniform_keep(graph, 0.5)
    assert sorted(graph.group(g).kind for g in keep) == ["channel", "head"]
    with torch.no_grad():
        ref = model(TOKENS)
        small = extract(model, graph, keep)
        assert small(TOKENS).shape == ref.shape
        assert trace(small, TOKENS).total_flops() < graph.total_flops()
        assert set(importance(model, graph)) == {g.id for g in graph.groups()}
        reorder(model, graph)
        assert torch.allclose(model(TOKENS), ref, atol=1e-5)


def test_sliced_attention_matches_torch_with_masks_and_weights() -> None:
    torch.manual_seed(1)
    tokens = torch.randn(3, 5, 8)  # (batch, sequence, width)
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[:, -1] = True
    for batch_first in (True, False):
        mha = nn.MultiheadAttention(8, 2, batch_first=batch_first).eval()
        sliced = SlicedMultiheadAttention(
            mha.in_proj_weight, mha.in_proj_bias, mha.out_proj, head_dim=4, batch_first=batch_first
        ).eval()
        x = tokens if batch_first else tokens.transpose(0, 1)
        with torch.no_grad():
            for kwargs in (
                {},
                {"attn_mask": causal},
                {"attn_mask": causal.float() * -1e4},
                {"key_padding_mask": pad},
                {"average_attn_weights": False},
            ):
                want = mha(x, x, x, **kwargs)
                got = sliced(x, x, x, **kwargs)
                assert torch.allclose(got[0], want[0], atol=1e-5), kwargs
                assert torch.allclose(got[1], want[1], atol=1e-5), kwargs
            assert sliced(x, x, x, need_weights=False)[1] is None
            one = tokens[0]
            assert torch.allclose(sliced(one, one, one)[0], mha(one, one, one)[0], atol=1e-5)
