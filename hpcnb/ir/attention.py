"""``nn.MultiheadAttention`` as a prunable op: its channel rule, and the module extraction swaps in.

The rule gives the attention two independent channel groups, as
Torch-Pruning does for the packed projection:

* the *embedding width* - the columns of ``in_proj_weight`` (the width of query,
  key and value, so the residual stream a block reads) and, on the way out, the
  rows of ``out_proj`` (the residual stream it writes);
* the *heads* - for each head its ``head_dim`` rows of the q, k and v blocks of
  ``in_proj_weight`` / ``in_proj_bias`` and its ``head_dim`` columns of
  ``out_proj.weight``. Pruning a head keeps ``head_dim``.

``nn.MultiheadAttention`` itself needs the embedding width equal to ``heads x
head_dim`` and to the output width, so once extraction has sliced one of them
the refresh returns a :class:`SlicedMultiheadAttention` holding the same
(sliced) tensors: the same computation with the three widths free, registered
with the same rule, so the extracted model traces and prunes again.
Modules with separate key/value widths (``kdim``/``vdim``), ``bias_k``/``bias_v``
or ``add_zero_attn`` keep fixed (not prunable) channels.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.nn import functional as F

from hpcnb.ir.channels import ChannelAnalysis
from hpcnb.ir.ops import expect_module
from hpcnb.ir.rules import fallback

__all__ = ["SlicedMultiheadAttention", "mha_refresh", "mha_rule", "sliced_refresh"]


def _tie_attention(
    ctx: ChannelAnalysis, q: Any, k: Any, v: Any, heads: int, head_dim: int
) -> list[Any]:
    """Tie q/k/v widths to the in-projection columns; declare the heads; return the output."""
    width = ctx.param("in_proj_weight", 1)
    for axes in (q, k, v):
        ctx.unify(axes[-1], width)
    out_width = ctx.param("out_proj.weight", 0)
    ctx.unify(out_width, ctx.param("out_proj.bias", 0))
    inner = heads * head_dim
    ctx.virtual(
        "heads",
        heads,
        [
            *(("in_proj_weight", 0, j * inner, head_dim) for j in range(3)),
            *(("in_proj_bias", 0, j * inner, head_dim) for j in range(3)),
            ("out_proj.weight", 1, 0, head_dim),
        ],
        kind="head",
    )
    return [*q[:-1], out_width]


_QKV = ("query", "key", "value")


def mha_rule(a: ChannelAnalysis, node: fx.Node, in_axes: list[Any]) -> Any:
    """Channel rule of ``nn.MultiheadAttention`` and :class:`SlicedMultiheadAttention`.

    Args:
        a: The channel analysis (parameter names relative to the attention module).
        node: The ``call_module`` node.
        in_axes: Per positional argument, its per-axis segments.

    Returns:
        The segments of the output and of the attention weights (None without them).
    """
    m = a.module_of(node)
    if not isinstance(m, SlicedMultiheadAttention):
        m = expect_module(m, nn.MultiheadAttention, f"mha_rule at '{node.name}'")
        if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
            why = (
                f"nn.MultiheadAttention '{node.target}' with kdim/vdim, bias_k/bias_v or zero attn"
            )
            return fallback(a, node, why)
    qkv = list(in_axes[:3])
    for i in range(len(qkv), 3):
        arg = node.kwargs.get(_QKV[i])
        qkv.append(a.axes.get(arg.name) if isinstance(arg, fx.Node) else None)
    if any(axes is None for axes in qkv):
        return fallback(a, node, f"nn.MultiheadAttention '{node.target}' without q, k, v")
    q, k, v = qkv
    out = _tie_attention(a, q, k, v, m.num_heads, m.head_dim)
    weights = a.graph.values[node.name][1]
    if weights is None:
        return [out, None]
    reason = "attention weights"
    return [out, [a.fresh((node.name, "w", i), d, reason) for i, d in enumerate(weights.shape)]]


def mha_refresh(module: nn.Module) -> nn.Module:
    """The sliced ``nn.MultiheadAttention`` as a :class:`SlicedMultiheadAttention`.

    Args:
        module: An ``nn.MultiheadAttention`` whose tensors extraction has sliced.
    """
    m = expect_module(module, nn.MultiheadAttention, "mha_refresh")
    return SlicedMultiheadAttention(
        m.in_proj_weight,
        m.in_proj_bias,
        m.out_proj,
        head_dim=m.head_dim,
        batch_first=m.batch_first,
        dropout=m.dropout,
    )


def sliced_refresh(module: nn.Module) -> None:
    """Re-size a sliced :class:`SlicedMultiheadAttention`.

    Args:
        module: The :class:`SlicedMultiheadAttention` whose tensors extraction has sliced.
    """
    expect_module(module, SlicedMultiheadAttention, "sliced_refresh").resize()


def _additive(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """A boolean mask (True = masked out) as -inf additions; a float mask as is."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros_like(mask, dtype=like.dtype).masked_fill(mask, float("-inf"))
    return mask.to(like.dtype)


class SlicedMultiheadAttention(nn.Module):
    """Multi-head attention whose embedding width, heads and output width are independent.

    Computes what ``nn.MultiheadAttention`` computes (same parameter names, same
    call signature and results) for ``in_proj_weight`` of shape
    ``(3 * heads * head_dim, width)`` and ``out_proj`` of shape
    ``(out_width, heads * head_dim)``.

    Args:
        in_proj_weight: Packed q/k/v projection, rows ``[q heads | k heads | v heads]``.
        in_proj_bias: Its bias (or None).
        out_proj: The output projection.
        head_dim: Width of one head.
        batch_first: Whether inputs are (batch, sequence, width).
        dropout: Dropout probability on the attention weights (training only).
    """

    def __init__(
        self,
        in_proj_weight: nn.Parameter,
        in_proj_bias: nn.Parameter | None,
        out_proj: nn.Linear,
        *,
        head_dim: int,
        batch_first: bool,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.in_proj_weight = in_proj_weight
        self.in_proj_bias = in_proj_bias
        self.out_proj = out_proj
        self.head_dim = head_dim
        self.batch_first = batch_first
        self.dropout = dropout
        self.resize()

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend like ``nn.MultiheadAttention.forward`` (``is_causal`` needs ``attn_mask``).

        Args:
            query: Queries, (L, E), (B, L, E) or (L, B, E) as ``batch_first`` says.
            key: Keys, shaped like ``query`` with their own length.
            value: Values, shaped like ``key``.
            key_padding_mask: (B, S) keys to ignore (True or -inf: masked out), or None.
            need_weights: Also return the attention weights.
            attn_mask: (L, S) or (B * heads, L, S) mask added to the scores, or None.
            average_attn_weights: Average the returned weights over the heads.
            is_causal: A hint that ``attn_mask`` is the causal mask (it is not built here).

        Returns:
            The output and the attention weights (None unless ``need_weights``).
        """
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
        elif not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        b, lq, _ = query.shape
        lk = key.shape[1]
        w = self.in_proj_weight.chunk(3)
        bias = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        q, k, v = (
            F.linear(t, w_i, b_i).view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)
            for t, w_i, b_i in zip((query, key, value), w, bias, strict=True)
        )
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = _additive(attn_mask, scores)
        if mask is not None:
            scores = scores + (mask.view(b, self.num_heads, lq, lk) if mask.dim() == 3 else mask)
        pad = _additive(key_padding_mask, scores)
        if pad is not None:
            scores = scores + pad.view(b, 1, 1, lk)
        attn = scores.softmax(dim=-1)
        if self.training and self.dropout > 0:
            attn = F.dropout(attn, self.dropout)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, lq, self.num_heads * self.head_dim)
        out = self.out_proj(out)
        if unbatched:
            out = out[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        weights = attn.mean(dim=1) if average_attn_weights else attn
        return out, weights[0] if unbatched else weights

    def resize(self) -> None:
        """Recompute ``num_heads``, ``embed_dim`` and the projection sizes from the tensors."""
        self.num_heads = self.in_proj_weight.shape[0] // (3 * self.head_dim)
        self.embed_dim = self.in_proj_weight.shape[1]
        self.out_proj.out_features, self.out_proj.in_features = self.out_proj.weight.shape
