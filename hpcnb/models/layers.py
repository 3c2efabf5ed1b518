"""Building blocks shared by the zoo models.

Two of them are *IR leaf operators* (:class:`MultiHeadSelfAttention` and
:class:`SelectiveScan`): `hpcnb.ir` does not trace into them but asks them for
their op kind, FLOPs and channel mapping. The protocol they implement is
:class:`hpcnb.ir.leaf.IRLeaf`, documented in :mod:`hpcnb.ir.leaf`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

from hpcnb.errors import InvalidInputError

if TYPE_CHECKING:
    from hpcnb.ir.channels import ChannelAnalysis

__all__ = [
    "ChannelShuffle",
    "MultiHeadSelfAttention",
    "SelectiveScan",
    "channel_shuffle",
]


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Interleave the channels of ``x`` (N, C, H, W) across ``groups`` (ShuffleNet).

    Args:
        x: Feature map of shape (N, C, H, W) with C divisible by ``groups``.
        groups: Number of channel groups to interleave.

    Returns:
        The shuffled feature map, same shape as ``x``.
    """
    n, c, h, w = x.size()
    x = x.view(n, groups, c // groups, h, w)
    x = x.transpose(1, 2).contiguous()
    return x.view(n, c, h, w)


class ChannelShuffle(nn.Module):
    """Module wrapper of :func:`channel_shuffle`.

    Args:
        groups: Number of channel groups to interleave.
    """

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shuffle the channels of ``x``."""
        return channel_shuffle(x, self.groups)


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention with per-head prunable q/k/v/out projections.

    The fused ``qkv`` projection holds rows ``[q heads | k heads | v heads]``,
    each head ``head_dim`` rows; ``proj`` maps ``heads * head_dim`` back to ``dim``.

    Args:
        dim: Model (embedding) width.
        heads: Number of attention heads.
        head_dim: Width of one head; ``dim // heads`` when None.
    """

    ir_kind = "attention"

    def __init__(self, dim: int, heads: int, head_dim: int | None = None) -> None:
        super().__init__()
        if heads <= 0 or dim <= 0:
            raise InvalidInputError(f"MultiHeadSelfAttention: dim={dim}, heads={heads} must be > 0")
        self.dim = dim
        self.heads = heads
        self.head_dim = head_dim if head_dim is not None else dim // heads
        if self.head_dim <= 0:
            raise InvalidInputError(
                f"MultiHeadSelfAttention: head_dim from dim={dim}, heads={heads} is 0"
            )
        inner = self.heads * self.head_dim
        self.qkv = nn.Linear(dim, 3 * inner)
        self.proj = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the tokens of ``x`` (B, N, dim)."""
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        attn = attn.softmax(dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, self.heads * self.head_dim)
        return self.proj(out)

    def ir_flops(self, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]) -> int:
        """FLOPs of one call: projections, scores and weighted sum (multiply-add = 2).

        Softmax and scaling are not counted (as ``FlopCounterMode``).

        Args:
            in_shapes: Shapes of the inputs; the first is the tokens ``(B, N, dim)``.
            out_shape: Shape of the output (equal to the input's).
        """
        b, n, d = in_shapes[0]
        inner = self.heads * self.head_dim
        proj = 2 * b * n * d * 3 * inner + 2 * b * n * inner * d
        core = 2 * 2 * b * self.heads * n * n * self.head_dim
        return proj + core

    def ir_channels(self, ctx: ChannelAnalysis, in_axes: list[list[Any]]) -> list[Any]:
        """Tie the input/output width to the projections; one head group (see ``IRLeaf``).

        Args:
            ctx: The channel analysis, parameter names relative to this module.
            in_axes: Per input, its per-axis segment lists (one input: the tokens).
        """
        x = in_axes[0]
        inner = self.heads * self.head_dim
        ctx.unify(x[-1], ctx.param("qkv.weight", 1))
        out_width = ctx.param("proj.weight", 0)
        ctx.unify(out_width, ctx.param("proj.bias", 0))
        heads = ctx.virtual(
            "heads",
            self.heads,
            [
                ("qkv.weight", 0, 0, self.head_dim),
                ("qkv.weight", 0, inner, self.head_dim),
                ("qkv.weight", 0, 2 * inner, self.head_dim),
                ("qkv.bias", 0, 0, self.head_dim),
                ("qkv.bias", 0, inner, self.head_dim),
                ("qkv.bias", 0, 2 * inner, self.head_dim),
                ("proj.weight", 1, 0, self.head_dim),
            ],
            kind="head",
        )
        del heads
        return [*x[:-1], out_width]

    def ir_refresh(self) -> None:
        """Recompute ``dim`` and ``heads`` from the (possibly sliced) weights."""
        self.dim = self.qkv.weight.shape[1]
        self.heads = self.proj.weight.shape[1] // self.head_dim
        self.qkv.in_features = self.qkv.weight.shape[1]
        self.qkv.out_features = self.qkv.weight.shape[0]
        self.proj.in_features = self.proj.weight.shape[1]
        self.proj.out_features = self.proj.weight.shape[0]


class SelectiveScan(nn.Module):
    """Mamba-style selective state-space scan written as a plain PyTorch loop.

    ``h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * x_t``,
    ``y_t = <h_t, C_t> + D * x_t`` with ``A = -exp(A_log)`` of shape (E, N).

    Args:
        inner: Channel width E.
        state: State size N per channel.
    """

    ir_kind = "scan"

    def __init__(self, inner: int, state: int) -> None:
        super().__init__()
        a = torch.arange(1, state + 1, dtype=torch.float32).repeat(inner, 1)
        self.A_log = nn.Parameter(torch.log(a))
        self.D = nn.Parameter(torch.ones(inner))

    def forward(
        self, x: torch.Tensor, delta: torch.Tensor, b: torch.Tensor, c: torch.Tensor
    ) -> torch.Tensor:
        """Scan the sequence ``x`` and return ``y`` of the same shape.

        Args:
            x: Inputs ``(B, L, E)``.
            delta: Step sizes ``(B, L, E)``.
            b: Input projections ``B_t`` ``(B, L, N)``.
            c: Output projections ``C_t`` ``(B, L, N)``.
        """
        a = -torch.exp(self.A_log)
        h = x.new_zeros(x.shape[0], x.shape[2], a.shape[1])
        ys = []
        for t in range(x.shape[1]):
            d_t = delta[:, t, :, None]
            h = torch.exp(d_t * a) * h + d_t * b[:, t, None, :] * x[:, t, :, None]
            ys.append((h * c[:, t, None, :]).sum(-1))
        return torch.stack(ys, dim=1) + x * self.D

    def ir_flops(self, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]) -> int:
        """Elementwise FLOPs: 8 per (batch, step, channel, state) plus 2 per output for ``D``.

        Args:
            in_shapes: Shapes of ``x``, ``delta``, ``b`` and ``c``.
            out_shape: Shape of the output (that of ``x``).
        """
        bsz, length, inner = in_shapes[0]
        state = in_shapes[2][-1]
        return 8 * bsz * length * inner * state + 2 * bsz * length * inner

    def ir_channels(self, ctx: ChannelAnalysis, in_axes: list[list[Any]]) -> list[Any]:
        """Tie x, delta, A rows and D to one width; B, C and A columns to the state size.

        Args:
            ctx: The channel analysis, parameter names relative to this module.
            in_axes: Per input (``x``, ``delta``, ``b``, ``c``), its per-axis segment lists.
        """
        x, delta, b, c = in_axes
        for axis in range(len(x) - 1):
            for other in (delta, b, c):
                ctx.unify(x[axis], other[axis])
        width = ctx.param("A_log", 0)
        ctx.unify(width, x[-1])
        ctx.unify(width, delta[-1])
        ctx.unify(width, ctx.param("D", 0))
        state = ctx.param("A_log", 1)
        ctx.unify(state, b[-1])
        ctx.unify(state, c[-1])
        return [*x[:-1], width]

    def ir_refresh(self) -> None:
        """Nothing to recompute: all sizes are read from the tensors."""


def init_weights(module: nn.Module) -> None:
    """Initialise conv/linear/norm weights of ``module`` in place (Kaiming/truncated normal).

    Args:
        module: Any module; its sub-modules are visited.
    """
    for m in module.modules():
        if isinstance(m, nn.Conv1d | nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02 if m.in_features > 16 else 0.2)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d | nn.LayerNorm) and m.weight is not None:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def pad_causal(x: torch.Tensor, kernel: int) -> torch.Tensor:
    """Left-pad the last axis of ``x`` by ``kernel - 1`` for a causal 1-d convolution.

    Args:
        x: Inputs ``(..., L)``.
        kernel: Kernel size of the convolution.
    """
    return F.pad(x, (kernel - 1, 0))
