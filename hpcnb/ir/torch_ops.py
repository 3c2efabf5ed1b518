"""The PyTorch ops ``hpcnb.ir`` understands: one :func:`~hpcnb.ir.ops.register_op` per op family.

Each registration binds an op (module types, or function / method names) to
its kind, FLOP formula (:mod:`hpcnb.ir.costs`), channel rule
(:mod:`hpcnb.ir.rules`) and, for modules that extraction re-sizes, a refresh.
Importing :mod:`hpcnb.ir` runs these registrations; a user's own op is
registered the same way (see :mod:`hpcnb.ir.ops`).

>>> from torch import nn
>>> from hpcnb.ir.ops import op_spec
>>> op_spec(None, nn.Conv2d(1, 2, 3)).kind, op_spec("relu").kind, op_spec("view").kind
('conv', 'activation', 'reshape')
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.conv import _ConvNd

from hpcnb.ir.attention import SlicedMultiheadAttention, mha_refresh, mha_rule, sliced_refresh
from hpcnb.ir.costs import (
    attention_flops,
    batch_norm_flops,
    conv_flops,
    conv_transpose_flops,
    einsum_flops,
    elementwise_flops,
    linear_flops,
    matmul_flops,
    mha_flops,
    norm_flops,
    pool_flops,
    reduce_flops,
    softmax_flops,
)
from hpcnb.ir.ops import OpSpec, expect_module, register_op
from hpcnb.ir.rules import (
    batch_norm_rule,
    concat_rule,
    conv_rule,
    conv_transpose_rule,
    elementwise_rule,
    embedding_rule,
    expand_rule,
    flatten_rule,
    functional_norm_rule,
    getitem_rule,
    group_norm_rule,
    layer_norm_rule,
    linear_function_rule,
    linear_rule,
    matmul_rule,
    pad_rule,
    permute_rule,
    pool2d_rule,
    pool_rule,
    reduce_rule,
    reshape_rule,
    same_axes,
    sdpa_rule,
    split_rule,
    t_rule,
    transpose_rule,
    unbind_rule,
)

__all__: list[str] = []

# --- modules -----------------------------------------------------------------------------


def _resize_conv(module: nn.Module) -> None:
    m = expect_module(module, _ConvNd, "conv refresh")
    out_c = m.weight.shape[0]
    if m.groups > 1 and m.groups == m.in_channels == m.out_channels:
        m.groups = m.in_channels = out_c
    else:
        m.in_channels = m.weight.shape[1] * m.groups
    m.out_channels = out_c


def _resize_conv_t(module: nn.Module) -> None:
    m = expect_module(module, _ConvNd, "transposed conv refresh")
    m.in_channels = m.weight.shape[0]
    m.out_channels = m.weight.shape[1] * m.groups


def _resize_linear(module: nn.Module) -> None:
    m = expect_module(module, nn.Linear, "linear refresh")
    m.out_features, m.in_features = m.weight.shape


def _resize_batch_norm(module: nn.Module) -> None:
    m = expect_module(module, _NormBase, "batch norm refresh")
    ref = m.weight if m.weight is not None else m.running_mean
    assert ref is not None  # a sliced norm has a weight or running statistics
    m.num_features = ref.shape[0]


def _resize_layer_norm(module: nn.Module) -> None:
    if isinstance(module, nn.RMSNorm):
        m: nn.LayerNorm | nn.RMSNorm = module
    else:
        m = expect_module(module, nn.LayerNorm, "layer norm refresh")
    if m.weight is not None:
        m.normalized_shape = tuple(m.weight.shape)


def _resize_embedding(module: nn.Module) -> None:
    m = expect_module(module, nn.Embedding, "embedding refresh")
    m.embedding_dim = m.weight.shape[1]


register_op(
    (nn.Conv1d, nn.Conv2d, nn.Conv3d),
    OpSpec("conv", conv_flops, channel_rule=conv_rule, refresh=_resize_conv),
)
register_op(
    (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d),
    OpSpec("conv", conv_transpose_flops, channel_rule=conv_transpose_rule, refresh=_resize_conv_t),
)
register_op(
    nn.Linear,
    OpSpec("linear", linear_flops, channel_rule=linear_rule, refresh=_resize_linear),
)
register_op(
    (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d),
    OpSpec("norm", batch_norm_flops, channel_rule=batch_norm_rule, refresh=_resize_batch_norm),
)
register_op(
    (nn.LayerNorm, nn.RMSNorm),
    OpSpec("norm", norm_flops, channel_rule=layer_norm_rule, refresh=_resize_layer_norm),
)
register_op(nn.GroupNorm, OpSpec("norm", norm_flops, channel_rule=group_norm_rule))
register_op((nn.InstanceNorm1d, nn.InstanceNorm2d), OpSpec("norm", norm_flops))
register_op(
    (
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
    ),
    OpSpec("activation", elementwise_flops, channel_rule=same_axes),
)
register_op(
    (nn.Softmax, nn.LogSoftmax),
    OpSpec("softmax", softmax_flops, channel_rule=same_axes),
)
register_op(
    (
        nn.MaxPool1d,
        nn.MaxPool2d,
        nn.AvgPool1d,
        nn.AvgPool2d,
        nn.AdaptiveAvgPool1d,
        nn.AdaptiveAvgPool2d,
        nn.AdaptiveMaxPool2d,
    ),
    OpSpec("pool", pool_flops, channel_rule=pool_rule),
)
register_op((nn.Dropout, nn.Dropout1d, nn.Dropout2d), OpSpec("dropout", channel_rule=same_axes))
register_op(nn.Identity, OpSpec("identity", channel_rule=same_axes))
register_op(
    nn.Embedding,
    OpSpec("embedding", channel_rule=embedding_rule, refresh=_resize_embedding),
)
register_op(
    nn.MultiheadAttention,
    OpSpec("attention", mha_flops, channel_rule=mha_rule, refresh=mha_refresh),
)
register_op(
    SlicedMultiheadAttention,
    OpSpec("attention", mha_flops, channel_rule=mha_rule, refresh=sliced_refresh),
)
register_op(nn.Flatten, OpSpec("reshape", channel_rule=flatten_rule))
register_op(nn.Unflatten, OpSpec("reshape"))

# --- functions and methods (by name: torch.relu, F.relu and x.relu() alike) --------------

_ACTIVATIONS = (
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
)
register_op(_ACTIVATIONS, OpSpec("activation", elementwise_flops, channel_rule=elementwise_rule))
register_op(
    ("add", "sub", "iadd", "isub"),
    OpSpec("add", elementwise_flops, channel_rule=elementwise_rule),
)
register_op(
    ("mul", "truediv", "div", "imul"),
    OpSpec("mul", elementwise_flops, channel_rule=elementwise_rule),
)
# Element-wise ops we do not cost (kind "other") but whose channels we follow.
register_op(
    ("where", "masked_fill", "maximum", "minimum"),
    OpSpec("other", channel_rule=elementwise_rule),
)
register_op(
    ("softmax", "log_softmax"),
    OpSpec("softmax", softmax_flops, channel_rule=elementwise_rule),
)
register_op("dropout", OpSpec("dropout", channel_rule=elementwise_rule))
register_op(
    ("contiguous", "float", "to", "type_as", "clone", "detach"),
    OpSpec("reshape", channel_rule=elementwise_rule),
)
register_op(
    ("view", "reshape", "flatten", "squeeze", "unsqueeze"),
    OpSpec("reshape", channel_rule=reshape_rule),
)
register_op("permute", OpSpec("reshape", channel_rule=permute_rule))
register_op(("transpose", "swapaxes"), OpSpec("reshape", channel_rule=transpose_rule))
register_op("t", OpSpec("reshape", channel_rule=t_rule))
register_op(("expand", "expand_as"), OpSpec("reshape", channel_rule=expand_rule))
register_op("pad", OpSpec("reshape", channel_rule=pad_rule))
register_op(("cat", "concat", "stack"), OpSpec("concat", channel_rule=concat_rule))
register_op(("chunk", "split", "tensor_split"), OpSpec("split", channel_rule=split_rule))
register_op("unbind", OpSpec("split", channel_rule=unbind_rule))
register_op("getitem", OpSpec("getitem", channel_rule=getitem_rule))
register_op(("matmul", "bmm", "mm"), OpSpec("matmul", matmul_flops, channel_rule=matmul_rule))
register_op("einsum", OpSpec("matmul", einsum_flops))
register_op("linear", OpSpec("linear", linear_flops, channel_rule=linear_function_rule))
register_op(("conv1d", "conv2d", "conv3d"), OpSpec("conv", conv_flops))
register_op(("group_norm", "rms_norm"), OpSpec("norm", norm_flops))
register_op("layer_norm", OpSpec("norm", norm_flops, channel_rule=functional_norm_rule))
register_op(
    "batch_norm",
    OpSpec("norm", batch_norm_flops, channel_rule=functional_norm_rule),
)
register_op(
    ("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d"),
    OpSpec("pool", pool_flops, channel_rule=pool2d_rule),
)
register_op(("max_pool1d", "avg_pool1d", "adaptive_avg_pool1d"), OpSpec("pool", pool_flops))
register_op(
    ("mean", "sum", "amax", "amin"),
    OpSpec("reduce", reduce_flops, channel_rule=reduce_rule),
)
register_op(
    "scaled_dot_product_attention",
    OpSpec("attention", attention_flops, channel_rule=sdpa_rule),
)
register_op("embedding", OpSpec("embedding"))
