"""Op-kind classification and per-node cost formulas (FLOPs, see :mod:`hpcnb.ir.graph`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hpcnb.ir.leaf import is_ir_leaf

__all__ = ["classify", "node_flops"]

Shape = tuple[int, ...]

#: Element-wise activation modules (kind ``activation``).
ACTIVATION_MODULES: tuple[type, ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Softplus,
    nn.LeakyReLU,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.ELU,
    nn.Mish,
)
#: Pooling modules (kind ``pool``).
POOL_MODULES: tuple[type, ...] = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
)
SOFTMAX_MODULES: tuple[type, ...] = (nn.Softmax, nn.LogSoftmax)
DROPOUT_MODULES: tuple[type, ...] = (nn.Dropout, nn.Dropout1d, nn.Dropout2d)

_MODULE_KINDS: tuple[tuple[tuple[type, ...], str], ...] = (
    (
        (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d),
        "conv",
    ),
    ((nn.Linear,), "linear"),
    (
        (
            nn.BatchNorm1d,
            nn.BatchNorm2d,
            nn.BatchNorm3d,
            nn.LayerNorm,
            nn.GroupNorm,
            nn.RMSNorm,
            nn.InstanceNorm1d,
            nn.InstanceNorm2d,
        ),
        "norm",
    ),
    (ACTIVATION_MODULES, "activation"),
    (SOFTMAX_MODULES, "softmax"),
    (POOL_MODULES, "pool"),
    (DROPOUT_MODULES, "dropout"),
    ((nn.Identity,), "identity"),
    ((nn.Embedding,), "embedding"),
    ((nn.MultiheadAttention,), "attention"),
    ((nn.Flatten, nn.Unflatten), "reshape"),
)

_ACT_NAMES = {
    "relu",
    "relu6",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "softplus",
    "leaky_relu",
    "hardswish",
    "hardsigmoid",
    "elu",
    "mish",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "neg",
    "abs",
    "clamp",
    "pow",
    "square",
    "reciprocal",
    "sin",
    "cos",
}
_NAME_KINDS = {
    "add": "add",
    "sub": "add",
    "iadd": "add",
    "isub": "add",
    "mul": "mul",
    "truediv": "mul",
    "div": "mul",
    "imul": "mul",
    "cat": "concat",
    "concat": "concat",
    "stack": "concat",
    "chunk": "split",
    "split": "split",
    "unbind": "split",
    "tensor_split": "split",
    "getitem": "getitem",
    "matmul": "matmul",
    "bmm": "matmul",
    "mm": "matmul",
    "einsum": "matmul",
    "linear": "linear",
    "conv1d": "conv",
    "conv2d": "conv",
    "conv3d": "conv",
    "softmax": "softmax",
    "log_softmax": "softmax",
    "layer_norm": "norm",
    "batch_norm": "norm",
    "group_norm": "norm",
    "rms_norm": "norm",
    "dropout": "dropout",
    "max_pool1d": "pool",
    "max_pool2d": "pool",
    "avg_pool1d": "pool",
    "avg_pool2d": "pool",
    "adaptive_avg_pool1d": "pool",
    "adaptive_avg_pool2d": "pool",
    "adaptive_max_pool2d": "pool",
    "mean": "reduce",
    "sum": "reduce",
    "amax": "reduce",
    "amin": "reduce",
    "scaled_dot_product_attention": "attention",
    "embedding": "embedding",
}
_RESHAPE_NAMES = {
    "view",
    "reshape",
    "flatten",
    "permute",
    "transpose",
    "contiguous",
    "expand",
    "expand_as",
    "unsqueeze",
    "squeeze",
    "t",
    "pad",
    "float",
    "to",
    "type_as",
    "clone",
    "detach",
}
_SIZE_NAMES = {"size", "dim", "numel", "getattr"}


def target_name(target: Any) -> str:
    """A short name for an fx call target (function, builtin, or method name)."""
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", repr(target))
    return name.strip("_") if name.startswith("__") else name


def classify(op: str, target: Any, module: nn.Module | None, out_is_tensor: bool) -> str:
    """The op kind of an fx node.

    Args:
        op: fx opcode.
        target: fx target (module path, function or method name).
        module: The called module for ``call_module`` nodes.
        out_is_tensor: Whether the node produced a tensor (or tuple of tensors).

    Returns:
        A kind from :data:`hpcnb.ir.graph.KINDS`.
    """
    if op == "placeholder":
        return "input"
    if op == "output":
        return "output"
    if op == "get_attr":
        return "param"
    if op == "call_module":
        assert module is not None
        if is_ir_leaf(module):
            return module.ir_kind
        for types, name in _MODULE_KINDS:
            if isinstance(module, types):
                return name
        return "other"
    name = target_name(target)
    if not out_is_tensor:
        return (
            "size"
            if name in _SIZE_NAMES | {"getitem", "add", "mul", "sub", "floordiv"}
            else ("other")
        )
    if name in _NAME_KINDS:
        return _NAME_KINDS[name]
    if name in _RESHAPE_NAMES:
        return "reshape"
    if name in _ACT_NAMES:
        return "activation"
    return "other"


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def _einsum_flops(equation: str, shapes: Sequence[Shape]) -> int:
    lhs = equation.replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs.split(","), shapes, strict=False):
        for letter, dim in zip(term, shape, strict=False):
            sizes[letter] = dim
    return 2 * _numel(list(sizes.values())) * max(1, len(shapes) - 1)


def _torch_mha_flops(m: nn.MultiheadAttention, in_shapes: Sequence[Shape]) -> int:
    q = in_shapes[0]
    k = in_shapes[1] if len(in_shapes) > 1 else q
    if len(q) == 3:
        (b, lq, e), (_, lk, _) = (
            (q, k) if m.batch_first else ((q[1], q[0], q[2]), (k[1], k[0], k[2]))
        )
    else:
        (lq, e), (lk, _), b = q, k, 1
    proj = 2 * b * e * m.embed_dim * (lq + 2 * lk) + 2 * b * lq * m.embed_dim * m.embed_dim
    return proj + 2 * 2 * b * lq * lk * m.embed_dim


def _conv_flops(weight: Shape, out_shape: Shape) -> int:
    # weight (out, in/groups, *kernel): each output element needs in/groups * kernel MACs.
    return 2 * _numel(out_shape) * _numel(weight[1:])


def node_flops(
    kind: str,
    target: Any,
    module: nn.Module | None,
    in_shapes: Sequence[Shape],
    out_shape: Shape,
    args: Sequence[Any],
) -> int:
    """FLOPs of one node (multiply-add = 2; bias additions excluded for conv/linear).

    Args:
        kind: The node's kind.
        target: fx target.
        module: The called module for ``call_module`` nodes.
        in_shapes: Shapes of the tensor inputs.
        out_shape: Shape of the (first) output tensor.
        args: Concrete positional arguments (tensors and constants).

    Returns:
        FLOPs.
    """
    out = _numel(out_shape) if out_shape else 0
    if is_ir_leaf(module):
        return int(module.ir_flops(list(in_shapes), out_shape))
    if kind == "conv":
        if isinstance(module, nn.modules.conv._ConvTransposeNd):
            # every input element meets (out / groups) * kernel weights
            return 2 * _numel(in_shapes[0]) * _numel(module.weight.shape[1:])
        if module is not None:
            return _conv_flops(tuple(module.weight.shape), out_shape)
        return _conv_flops(tuple(args[1].shape), out_shape)
    if kind == "linear":
        weight = module.weight.shape if module is not None else args[1].shape
        return 2 * out * int(weight[1])
    if kind == "matmul":
        name = target_name(target)
        if name == "einsum":
            return _einsum_flops(str(args[0]), in_shapes)
        return 2 * out * int(in_shapes[0][-1])
    if isinstance(module, nn.MultiheadAttention):
        return _torch_mha_flops(module, in_shapes)
    if kind == "attention":
        q, k, v = in_shapes[:3]
        batch = _numel(q[:-2])
        return 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])
    if kind == "norm":
        batch_norm = isinstance(module, nn.modules.batchnorm._BatchNorm) or target is F.batch_norm
        return (2 if batch_norm else 5) * out
    if kind in ("activation", "add", "mul"):
        return out
    if kind == "softmax":
        return 3 * out
    if kind == "reduce":
        return _numel(in_shapes[0]) if in_shapes else 0
    if kind == "pool":
        kernel = getattr(module, "kernel_size", None)
        if kernel is None and module is None and len(args) > 1 and "adaptive" not in str(target):
            kernel = args[1]
        if kernel is None:
            return _numel(in_shapes[0])
        ks = kernel if isinstance(kernel, tuple | list) else (kernel,) * (len(out_shape) - 2)
        return out * _numel(ks)
    return 0


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements."""
    return t.numel() * t.element_size()
