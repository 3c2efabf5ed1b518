"""FLOP formulas of the PyTorch ops, one function per op family (see :mod:`hpcnb.ir.graph`).

Each formula takes an :class:`hpcnb.ir.ops.OpCall` and returns the FLOPs of one
call (multiply-add = 2; bias additions excluded for conv/linear, as
``torch.utils.flop_counter.FlopCounterMode``). :mod:`hpcnb.ir.torch_ops` binds
them to the ops.

>>> from torch import nn
>>> from hpcnb.ir.ops import OpCall
>>> linear_flops(OpCall("fc", nn.Linear(8, 3), ((4, 8),), (4, 3)))  # 2 * 4*3 outputs * 8
192
>>> elementwise_flops(OpCall("relu", None, ((4, 8),), (4, 8)))
32
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from hpcnb.ir.attention import SlicedMultiheadAttention
from hpcnb.ir.ops import OpCall, expect_module, target_name

__all__ = [
    "attention_flops",
    "batch_norm_flops",
    "conv_flops",
    "conv_transpose_flops",
    "einsum_flops",
    "elementwise_flops",
    "linear_flops",
    "matmul_flops",
    "mha_flops",
    "norm_flops",
    "pool_flops",
    "projected_attention_flops",
    "reduce_flops",
    "softmax_flops",
    "tensor_bytes",
]

Shape = tuple[int, ...]


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def _weight_shape(call: OpCall) -> Shape:
    """The weight of a module call, or the second argument of a functional call."""
    if call.module is not None:
        weight = call.module.weight
        assert isinstance(weight, torch.Tensor)  # conv and linear modules own a weight
        return tuple(weight.shape)
    return tuple(call.args[1].shape)


def conv_flops(call: OpCall) -> int:
    """Convolution: each output element needs ``in/groups * kernel`` multiply-adds."""
    return 2 * call.out_numel * _numel(_weight_shape(call)[1:])


def conv_transpose_flops(call: OpCall) -> int:
    """Transposed convolution: every input element meets ``(out / groups) * kernel`` weights."""
    return 2 * _numel(call.in_shapes[0]) * _numel(_weight_shape(call)[1:])


def linear_flops(call: OpCall) -> int:
    """Linear layer: ``2 * out * in_features``."""
    return 2 * call.out_numel * int(_weight_shape(call)[1])


def matmul_flops(call: OpCall) -> int:
    """Matrix product: ``2 * out * inner``."""
    return 2 * call.out_numel * int(call.in_shapes[0][-1])


def einsum_flops(call: OpCall) -> int:
    """``einsum``: 2 per point of the product of every index size, per extra operand."""
    equation, shapes = str(call.args[0]), call.in_shapes
    lhs = equation.replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs.split(","), shapes, strict=False):
        for letter, dim in zip(term, shape, strict=False):
            sizes[letter] = dim
    return 2 * _numel(list(sizes.values())) * max(1, len(shapes) - 1)


def attention_flops(call: OpCall) -> int:
    """``scaled_dot_product_attention``: scores and weighted sum (softmax not counted)."""
    q, k, v = call.in_shapes[:3]
    batch = _numel(q[:-2])
    return 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])


def mha_flops(call: OpCall) -> int:
    """``nn.MultiheadAttention``: q/k/v and output projections, scores and weighted sum."""
    m = call.module
    if not isinstance(m, SlicedMultiheadAttention):
        m = expect_module(m, nn.MultiheadAttention, "mha_flops")
    inner = m.in_proj_weight.shape[0] // 3 if m.in_proj_weight is not None else m.embed_dim
    return projected_attention_flops(
        call.in_shapes, m.batch_first, inner, m.out_proj.weight.shape[0]
    )


def projected_attention_flops(
    in_shapes: Sequence[Shape], batch_first: bool, inner: int, out_width: int
) -> int:
    """FLOPs of attention with q/k/v projections to ``inner`` and an output projection.

    Args:
        in_shapes: Query, key (default: the query) shapes, (L, E) or batched.
        batch_first: Whether batched shapes are (B, L, E) rather than (L, B, E).
        inner: Width of the projected q, k and v (heads x head width).
        out_width: Width of the output projection.

    Returns:
        Projections plus scores plus weighted sum (softmax not counted).
    """
    q = in_shapes[0]
    k = in_shapes[1] if len(in_shapes) > 1 else q
    if len(q) == 3:
        (b, lq, e), (_, lk, _) = (q, k) if batch_first else ((q[1], q[0], q[2]), (k[1], k[0], k[2]))
    else:
        (lq, e), (lk, _), b = q, k, 1
    proj = 2 * b * e * inner * (lq + 2 * lk) + 2 * b * lq * inner * out_width
    return proj + 2 * 2 * b * lq * lk * inner


def norm_flops(call: OpCall) -> int:
    """Layer / group / RMS / instance norm: 5 per output element."""
    return 5 * call.out_numel


def batch_norm_flops(call: OpCall) -> int:
    """Batch norm (inference): scale and shift, 2 per output element."""
    return 2 * call.out_numel


def elementwise_flops(call: OpCall) -> int:
    """Element-wise ops (activations, add, mul): 1 per output element."""
    return call.out_numel


def softmax_flops(call: OpCall) -> int:
    """Softmax / log-softmax: 3 per output element."""
    return 3 * call.out_numel


def reduce_flops(call: OpCall) -> int:
    """Reductions (mean, sum, amax): 1 per input element."""
    return _numel(call.in_shapes[0]) if call.in_shapes else 0


def pool_flops(call: OpCall) -> int:
    """Pooling: the window size per output element (adaptive: 1 per input element)."""
    kernel = getattr(call.module, "kernel_size", None)
    adaptive = "adaptive" in target_name(call.target)
    if kernel is None and call.module is None and len(call.args) > 1 and not adaptive:
        kernel = call.args[1]
    if kernel is None:
        return _numel(call.in_shapes[0])
    ks = kernel if isinstance(kernel, tuple | list) else (kernel,) * (len(call.out_shape) - 2)
    return call.out_numel * _numel(ks)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements."""
    return t.numel() * t.element_size()
