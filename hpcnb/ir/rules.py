"""Per-op channel rules for the traversal in :mod:`hpcnb.ir.groups`, and the rule dispatcher.

A rule ``rule(a, node, in_axes)`` takes the per-axis segments of a node's
inputs and returns those of its output, calling ``a.unify`` (these axes are
the same channels), ``a.fix`` (these channels cannot be sliced) and
``a.param`` (this parameter axis; inside a module's rule, names are relative to
the module) on the :class:`~hpcnb.ir.channels.ChannelAnalysis` ``a``. Records
needed to re-size constant arguments at extraction time are stored in
``a.records``. Which rule serves which op is registered in
:mod:`hpcnb.ir.torch_ops` (see :mod:`hpcnb.ir.ops`); :func:`apply_rule` looks it up.
"""

from __future__ import annotations

import math
from typing import Any

import torch.fx as fx
from torch import nn
from torch.nn.modules.conv import _ConvNd

from hpcnb.ir.channels import Axes, ChannelAnalysis, Segment, length, slice_segments
from hpcnb.ir.graph import IRTraceError, TensorMeta
from hpcnb.ir.ops import expect_module, op_spec, target_name

__all__ = ["apply_rule", "fallback", "same_axes"]


def _shape(value: Any) -> tuple[int, ...] | None:
    return value.shape if isinstance(value, TensorMeta) else None


def _tensor_shape(value: Any, node: fx.Node) -> tuple[int, ...]:
    """The shape of a tensor argument of ``node`` (an :class:`IRTraceError` otherwise)."""
    if not isinstance(value, TensorMeta):
        raise IRTraceError(
            f"channel rule at '{node.name}': expected a tensor argument, got {type(value).__name__}"
        )
    return value.shape


def _fresh_axes(a: ChannelAnalysis, node: fx.Node, value: Any, reason: str, tag: str = "") -> Any:
    if isinstance(value, TensorMeta):
        return [a.fresh((node.name, tag, i), d, reason) for i, d in enumerate(value.shape)]
    if isinstance(value, tuple | list):
        return [_fresh_axes(a, node, v, reason, f"{tag}{i}.") for i, v in enumerate(value)]
    return None


def _arg_axes(a: ChannelAnalysis, arg: Any) -> Any:
    if isinstance(arg, fx.Node):
        return a.axes.get(arg.name)
    if isinstance(arg, tuple | list):
        return [_arg_axes(a, x) for x in arg]
    return None


def fallback(a: ChannelAnalysis, node: fx.Node, reason: str) -> Any:
    """Unknown channel mapping: fix every input axis and give the output fresh fixed axes.

    Args:
        a: The channel analysis.
        node: The fx node whose mapping is unknown.
        reason: Why its channels cannot be pruned (reported on the groups it touches).

    Returns:
        Fresh, fixed segments for every axis of the node's output (None for non-tensors).
    """
    for inp in node.all_input_nodes:
        a.fix_axes(a.axes.get(inp.name), reason)
    return _fresh_axes(a, node, a.graph.values.get(node.name), reason)


def _broadcast(
    a: ChannelAnalysis, node: fx.Node, tensors: list[tuple[Axes, tuple[int, ...]]]
) -> Axes:
    out_shape = a.graph.values[node.name].shape
    out: Axes = []
    for i in range(len(out_shape)):
        k = len(out_shape) - i  # position from the right
        same = [ax[len(shape) - k] for ax, shape in tensors if len(shape) >= k]
        full = [s for s in same if length(s) == out_shape[i]]
        if out_shape[i] > 1:
            for s in same:
                if length(s) == 1:
                    a.fix(s, f"axis broadcast at '{node.name}'")
        for other in full[1:]:
            a.unify(full[0], other)
        out.append(full[0] if full else a.fresh((node.name, "b", i), out_shape[i], "broadcast"))
    return out


def _reshape(
    a: ChannelAnalysis, node: fx.Node, x: Axes, ins: tuple[int, ...], outs: tuple[int, ...]
) -> Axes:
    """Map axes through a reshape: an axis passes when it maps one-to-one, else it is fixed."""
    reason = f"reshape at '{node.name}' mixes a channel axis with another axis"
    out: Axes = [
        a.fresh((node.name, "r", i), d, reason) if d == 1 else [] for i, d in enumerate(outs)
    ]
    ii = [i for i, d in enumerate(ins) if d != 1]
    oo = [i for i, d in enumerate(outs) if d != 1]
    if math.prod(ins) != math.prod(outs):
        return fallback(a, node, reason)
    p = q = 0
    while p < len(ii) and q < len(oo):
        gi, go = [ii[p]], [oo[q]]
        pi, po = ins[ii[p]], outs[oo[q]]
        while pi != po:
            if pi < po:
                p += 1
                gi.append(ii[p])
                pi *= ins[ii[p]]
            else:
                q += 1
                go.append(oo[q])
                po *= outs[oo[q]]
        if len(gi) == 1 and len(go) == 1:
            out[go[0]] = x[gi[0]]
        elif len(gi) == 1 and len(x[gi[0]]) == 1:
            _split_axis(a, node, x[gi[0]], [outs[j] for j in go], out, go)
        elif len(go) == 1:
            _merge_axes(a, node, [x[i] for i in gi], [ins[i] for i in gi], out, go[0])
        else:
            for i in gi:
                a.fix(x[i], reason)
            for j in go:
                out[j] = a.fresh((node.name, "r", j), outs[j], reason)
        p += 1
        q += 1
    return out


def _split_axis(
    a: ChannelAnalysis,
    node: fx.Node,
    segs: list[Segment],
    sizes: list[int],
    out: Axes,
    go: list[int],
) -> None:
    """One axis reshaped into (n0, ..., nk): outer axes become derived unit spaces."""
    reason = f"reshape at '{node.name}' splits this axis: only whole units can be pruned"
    a.whole_units(segs, reason)
    total = math.prod(sizes)
    for t, j in enumerate(go[:-1]):
        unit = math.prod(sizes[t + 1 :])
        period = sizes[t] * unit
        out[j] = a.derive(segs, unit, period, total // period)
    out[go[-1]] = a.fresh((node.name, "inner", go[-1]), sizes[-1], "innermost axis of a split")


def _merge_axes(
    a: ChannelAnalysis, node: fx.Node, axes: Axes, sizes: list[int], out: Axes, j: int
) -> None:
    """Axes (n0, ..., nk) merged into one: each outer axis ties to a derived unit space."""
    total = math.prod(sizes)
    merged = [(a.space(("anon", node.name, "merged", j), total), 0, total)]
    a.whole_units(merged, f"reshape at '{node.name}' merges axes: only whole units can be pruned")
    for t, segs in enumerate(axes[:-1]):
        unit = math.prod(sizes[t + 1 :])
        period = sizes[t] * unit
        a.unify(segs, a.derive(merged, unit, period, total // period))
    a.fix(axes[-1], f"innermost axis of a merge at '{node.name}'")
    out[j] = merged


def _getitem(
    a: ChannelAnalysis, node: fx.Node, x: Any, index: Any, in_shape: tuple[int, ...] | None
) -> Any:
    if not isinstance(index, tuple):
        index = (index,)
    if any(not isinstance(i, int | slice | type(None) | type(Ellipsis)) for i in index):
        return fallback(a, node, f"advanced indexing at '{node.name}'")
    if in_shape is None or x is None:
        return fallback(a, node, f"indexing a value that is not a tensor at '{node.name}'")
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    out: Axes = []
    axis = 0
    slices = []
    for pos, item in enumerate(index):
        if item is Ellipsis:
            for _ in range(len(in_shape) - n_real):
                out.append(x[axis])
                axis += 1
        elif item is None:
            out.append(a.fresh((node.name, "none", pos), 1, "new axis"))
        elif isinstance(item, int):
            idx = item % in_shape[axis]
            a.fix(slice_segments(x[axis], idx, idx + 1), f"single index at '{node.name}'")
            axis += 1
        else:
            start, stop, step = item.indices(in_shape[axis])
            if step != 1:
                a.fix(x[axis], f"strided slice at '{node.name}'")
                out.append(a.fresh((node.name, "s", pos), len(range(start, stop, step)), "strided"))
            else:
                out.append(slice_segments(x[axis], start, stop))
                slices.append((pos, x[axis][:], start, stop))
            axis += 1
    out.extend(x[axis:])
    a.records[node.name] = ("getitem", slices)
    return out


def _dim(d: int, ndim: int) -> int:
    return d % ndim


# --- module rules (parameter names relative to the module) -------------------------------


def _spatial(a: ChannelAnalysis, node: fx.Node) -> Axes:
    value = a.graph.values[node.name]
    return [a.fresh((node.name, "sp", i), d, "spatial") for i, d in enumerate(value.shape)]


def _tie_bias(a: ChannelAnalysis, m: nn.Module, out_c: list[Segment]) -> None:
    if getattr(m, "bias", None) is not None:
        a.unify(out_c, a.param("bias", 0))


def _fix_channels(a: ChannelAnalysis, reason: str, *channels: list[Segment]) -> None:
    """Fix the channel axes a convolution cannot tie (its input's and its weight's)."""
    for segs in channels:
        a.fix(segs, reason)


def _conv_output(
    a: ChannelAnalysis, m: nn.Module, x: Axes, out_c: list[Segment], spatial: Axes
) -> Axes:
    """The output axes (batch, ``out_c``, new spatial axes); the bias ties to ``out_c``."""
    _tie_bias(a, m, out_c)
    return [x[0], out_c, *spatial[2:]]


def conv_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``nn.ConvNd``: output channels are the weight's rows; depthwise and grouped ties.

    Args:
        a: The channel analysis; ``weight`` and ``bias`` name the convolution's own.
        node: The ``call_module`` node of the convolution.
        args: The input's per-axis segments (N, C, spatial...) as the only element.
    """
    m, x = expect_module(a.module_of(node), _ConvNd, f"conv_rule at '{node.name}'"), args[0]
    path = str(node.target)
    spatial = _spatial(a, node)
    w = a.param("weight", 0)
    if m.groups == 1:
        a.unify(x[1], a.param("weight", 1))
        out_c = w
    elif m.groups == m.in_channels == m.out_channels:
        a.unify(x[1], w)
        out_c = x[1]
    elif m.in_channels // m.groups > 1 and m.out_channels // m.groups > 1:
        # Grouped conv: every input chunk meets the same weight columns and every
        # output chunk must keep the same rows, so chunk j is tied to chunk 0.
        cin, cout = m.in_channels // m.groups, m.out_channels // m.groups
        w_in = a.param("weight", 1)
        for j in range(m.groups):
            a.unify(slice_segments(x[1], j * cin, (j + 1) * cin), w_in)
            if j:
                a.unify(slice_segments(w, j * cout, (j + 1) * cout), slice_segments(w, 0, cout))
        out_c = w
    else:
        _fix_channels(a, f"grouped convolution '{path}' (groups={m.groups})", x[1], w)
        out_c = w
    return _conv_output(a, m, x, out_c, spatial)


def conv_transpose_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``nn.ConvTransposeNd``: the weight is (in, out / groups, ...).

    Args:
        a: The channel analysis; ``weight`` and ``bias`` name the transposed convolution's own.
        node: The ``call_module`` node of the transposed convolution.
        args: The input's per-axis segments (N, C, spatial...) as the only element.
    """
    m = expect_module(a.module_of(node), _ConvNd, f"conv_transpose_rule at '{node.name}'")
    x = args[0]
    spatial = _spatial(a, node)
    out_c = a.param("weight", 1)
    if m.groups == 1:
        a.unify(x[1], a.param("weight", 0))
    else:
        reason = f"grouped transposed convolution '{node.target}' (groups={m.groups})"
        _fix_channels(a, reason, x[1], out_c)
        out_c = a.fresh((node.name, "out"), a.graph.values[node.name].shape[1], reason)
    return _conv_output(a, m, x, out_c, spatial)


def linear_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``nn.Linear``: the last axis meets the weight's columns, leaves as its rows.

    Args:
        a: The channel analysis; ``weight`` and ``bias`` name the linear layer's own.
        node: The ``call_module`` node of the linear layer.
        args: The input's per-axis segments (features last) as the only element.
    """
    x = args[0]
    a.unify(x[-1], a.param("weight", 1))
    out_c = a.param("weight", 0)
    _tie_bias(a, a.module_of(node), out_c)
    return [*x[:-1], out_c]


def batch_norm_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """Batch norm: per-channel scale, shift and statistics on axis 1.

    Args:
        a: The channel analysis; the affine parameters and running statistics are the norm's own.
        node: The ``call_module`` node of the batch norm.
        args: The input's per-axis segments (channels on axis 1) as the only element.
    """
    x = args[0]
    for name in ("weight", "bias", "running_mean", "running_var"):
        a.unify(x[1], a.param(name, 0))
    return list(x)


def layer_norm_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """Layer / RMS norm over the last axis: per-channel scale and shift.

    Args:
        a: The channel analysis; ``weight`` and ``bias`` name the norm's own.
        node: The ``call_module`` node of the layer or RMS norm.
        args: The input's per-axis segments (normalised axes last) as the only element.
    """
    m, x = a.module_of(node), args[0]
    if not isinstance(m, nn.RMSNorm):
        m = expect_module(m, nn.LayerNorm, f"layer_norm_rule at '{node.name}'")
    shape = tuple(m.normalized_shape)
    if len(shape) != 1 or getattr(m, "weight", None) is None:
        for segs in x[len(x) - len(shape) :]:
            a.fix(segs, f"norm '{node.target}' without a per-channel weight")
    for name in ("weight", "bias"):
        a.unify(x[-1], a.param(name, 0))
    return list(x)


def group_norm_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """Group norm: statistics over groups of channels, so the channels are fixed.

    Args:
        a: The channel analysis; ``weight`` and ``bias`` name the norm's own.
        node: The ``call_module`` node of the group norm.
        args: The input's per-axis segments (channels on axis 1) as the only element.
    """
    x = args[0]
    a.fix(x[1], f"group norm '{node.target}' (groups of channels)")
    for name in ("weight", "bias"):
        a.unify(x[1], a.param(name, 0))
    return list(x)


def embedding_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``nn.Embedding``: a new last axis, the weight's columns; the vocabulary is fixed.

    Args:
        a: The channel analysis; ``weight`` names the embedding table.
        node: The ``call_module`` node of the embedding.
        args: The segments of the index tensor's axes as the only element.
    """
    a.fix(a.param("weight", 0), f"embedding vocabulary '{node.target}'")
    return [*args[0], a.param("weight", 1)]


def pool_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """Pooling module: channels pass, the 1 or 2 spatial axes are new.

    Args:
        a: The channel analysis (for the new spatial axes).
        node: The ``call_module`` node of the pooling layer (its class name tells 1-d from 2-d).
        args: The input's per-axis segments (N, C, spatial...) as the only element.
    """
    k = 1 if "1d" in type(a.module_of(node)).__name__ else 2
    x, spatial = args[0], _spatial(a, node)
    return [*x[: len(x) - k], *spatial[len(spatial) - k :]]


def same_axes(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """Element-wise or identity module: the output has the input's axes.

    Args:
        a: The channel analysis (unused: nothing is tied).
        node: The node whose output has its input's shape.
        args: The input's per-axis segments first; further arguments are ignored.
    """
    return list(args[0])


def flatten_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``nn.Flatten``: a reshape.

    Args:
        a: The channel analysis.
        node: The ``call_module`` node of the flatten (input and output shapes come from the trace).
        args: The input's per-axis segments as the only element.
    """
    return _reshape(a, node, args[0], _in_shape(a, node), a.graph.values[node.name].shape)


# --- function and method rules -----------------------------------------------------------


def getitem_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``x[index]`` (basic indexing and slices) or picking an element of a tuple.

    Args:
        a: The channel analysis (its traced call arguments hold the index).
        node: The ``operator.getitem`` node.
        args: The indexed value's segments (per axis, or per tuple element) first.
    """
    cargs = a.graph.call_args.get(node.name, ())
    x = args[0] if args else None
    if isinstance(cargs[0], tuple | list):
        return x[cargs[1]] if x is not None else None
    return _getitem(a, node, x, cargs[1], _shape(cargs[0]))


def elementwise_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """Element-wise ops with broadcasting: equal axes are tied.

    Args:
        a: The channel analysis (its traced call arguments give the operand shapes).
        node: The element-wise call; tensor keyword arguments are operands too.
        args: Per positional operand, its per-axis segments (None for scalars).
    """
    cargs = a.graph.call_args.get(node.name, ())
    tensors: list[tuple[Axes, tuple[int, ...]]] = []
    for ax, c in zip(args, cargs, strict=False):
        shape = _shape(c)
        if shape is not None:
            tensors.append((ax, shape))
    for key, kval in node.kwargs.items():
        shape = _shape(a.graph.call_kwargs[node.name].get(key))
        if isinstance(kval, fx.Node) and shape is not None:
            tensors.append((a.axes[kval.name], shape))
    return _broadcast(a, node, tensors)


def _in_shape(a: ChannelAnalysis, node: fx.Node) -> tuple[int, ...]:
    cargs = a.graph.call_args.get(node.name, ())
    return _tensor_shape(cargs[0] if cargs else None, node)


def reshape_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """View / reshape / flatten / squeeze / unsqueeze.

    Args:
        a: The channel analysis (the traced shapes before and after come from it).
        node: The view / reshape / flatten / squeeze / unsqueeze call.
        args: The reshaped tensor's per-axis segments first; the sizes are ignored.
    """
    out = _reshape(a, node, args[0], _in_shape(a, node), a.graph.values[node.name].shape)
    a.records[node.name] = ("reshape", out)
    return out


def permute_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``permute``: axes reordered.

    Args:
        a: The channel analysis (its traced call arguments hold the dims).
        node: The ``permute`` call.
        args: The permuted tensor's per-axis segments first; the dims are ignored.
    """
    x, cargs = args[0], a.graph.call_args.get(node.name, ())
    dims = cargs[1] if len(cargs) == 2 and isinstance(cargs[1], tuple | list) else cargs[1:]
    dims = dims if dims else _kw(node, a, 1, "dims", dims)
    return [x[_dim(d, len(x))] for d in dims]


def transpose_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``transpose`` / ``swapaxes``: two axes swapped.

    Args:
        a: The channel analysis (its traced call arguments hold the two dims).
        node: The ``transpose`` / ``swapaxes`` call.
        args: The transposed tensor's per-axis segments first; the dims are ignored.
    """
    x = args[0]
    d0, d1 = _dim(_kw(node, a, 1, "dim0", 0), len(x)), _dim(_kw(node, a, 2, "dim1", 1), len(x))
    out = list(x)
    out[d0], out[d1] = out[d1], out[d0]
    return out


def t_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``t``: a matrix transposed.

    Args:
        a: The channel analysis (unused: nothing is tied).
        node: The ``t`` call.
        args: The matrix's two axes' segments as the only element.
    """
    return list(reversed(args[0]))


def expand_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``expand`` / ``expand_as``: new leading axes, size-1 axes broadcast.

    Args:
        a: The channel analysis (the traced shapes before and after come from it).
        node: The ``expand`` / ``expand_as`` call.
        args: The expanded tensor's per-axis segments first; the sizes are ignored.
    """
    x, in_shape, shape = args[0], _in_shape(a, node), a.graph.values[node.name].shape
    k = len(shape) - len(in_shape)
    out = [a.fresh((node.name, "e", i), d, "expanded") for i, d in enumerate(shape[:k])]
    for i, d in enumerate(in_shape):
        if d == shape[k + i]:
            out.append(x[i])
        else:
            a.fix(x[i], f"axis broadcast at '{node.name}'")
            out.append(a.fresh((node.name, "e", k + i), shape[k + i], "expanded"))
    a.records[node.name] = ("reshape", out)
    return out


def pad_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``F.pad``: padded axes are fixed, the others pass.

    Args:
        a: The channel analysis (the traced shapes before and after come from it).
        node: The ``F.pad`` call.
        args: The padded tensor's per-axis segments first; the pad widths are ignored.
    """
    x, in_shape = args[0], _in_shape(a, node)
    out = []
    for i, d in enumerate(a.graph.values[node.name].shape):
        if d == in_shape[i]:
            out.append(x[i])
        else:
            a.fix(x[i], f"padding at '{node.name}'")
            out.append(a.fresh((node.name, "p", i), d, "padded"))
    return out


def concat_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``cat`` concatenates segment lists along ``dim``; ``stack`` adds a new axis.

    Args:
        a: The channel analysis (its traced call arguments hold ``dim``).
        node: The ``cat`` / ``stack`` call.
        args: First, per tensor in the sequence, its per-axis segments; the dim is ignored.
    """
    stack = target_name(node.target) == "stack"
    seq, cargs = args[0], a.graph.call_args.get(node.name, ())
    dim = _dim(_kw(node, a, 1, "dim", 0), len(_tensor_shape(cargs[0][0], node)) + stack)
    out = list(seq[0])
    if stack:
        out.insert(dim, a.fresh((node.name, "stack"), len(seq), "stacked"))
    else:
        out[dim] = [s for ax in seq for s in ax[dim]]
    for ax in seq[1:]:
        for i in range(len(ax)):
            if stack or i != dim:
                a.unify(seq[0][i], ax[i])
    return out


def split_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``chunk`` / ``split`` / ``tensor_split``: pieces slice the segment list.

    Args:
        a: The channel analysis (its traced call arguments hold ``dim``).
        node: The ``chunk`` / ``split`` / ``tensor_split`` call.
        args: The split tensor's per-axis segments first; the sizes and dim are ignored.
    """
    x, in_shape = args[0], _in_shape(a, node)
    dim = _dim(_kw(node, a, 2, "dim", 0), len(in_shape))
    pieces, pos = [], 0
    for piece in a.graph.values[node.name]:
        size = piece.shape[dim]
        segs = slice_segments(x[dim], pos, pos + size)
        a.atoms(segs)
        axes = list(x)
        axes[dim] = segs
        pieces.append(axes)
        pos += size
    a.records[node.name] = ("split", dim, [p[dim] for p in pieces])
    return pieces


def unbind_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``unbind``: every element of the axis is picked (and fixed).

    Args:
        a: The channel analysis (its traced call arguments hold ``dim``).
        node: The ``unbind`` call.
        args: The unbound tensor's per-axis segments first; the dim is ignored.
    """
    x, in_shape = args[0], _in_shape(a, node)
    dim = _dim(_kw(node, a, 1, "dim", 0), len(in_shape))
    out = []
    for j in range(in_shape[dim]):
        a.fix(slice_segments(x[dim], j, j + 1), f"unbind at '{node.name}'")
        out.append([*x[:dim], *x[dim + 1 :]])
    return out


def matmul_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``matmul`` / ``bmm`` / ``mm``: the inner axes tie, batch axes broadcast.

    Args:
        a: The channel analysis (its traced call arguments give the operand shapes).
        node: The ``matmul`` / ``bmm`` / ``mm`` call.
        args: The left and the right operand's per-axis segments.
    """
    x, b = args[0], args[1]
    cargs = a.graph.call_args.get(node.name, ())
    sa, sb = _tensor_shape(cargs[0], node), _tensor_shape(cargs[1], node)
    if len(sa) < 2 or len(sb) < 2:
        return fallback(a, node, f"vector matmul at '{node.name}'")
    a.unify(x[-1], b[-2])
    batch = _broadcast_batch(a, node, x[:-2], sa[:-2], b[:-2], sb[:-2])
    return [*batch, x[-2], b[-1]]


def linear_function_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``F.linear(x, w, b)``.

    Args:
        a: The channel analysis.
        node: The ``F.linear`` call.
        args: The input's, the weight's (out, in) and, when given, the bias's per-axis segments.
    """
    x, w = args[0], args[1]
    a.unify(x[-1], w[1])
    if len(args) > 2 and args[2] is not None:
        a.unify(w[0], args[2][0])
    return [*x[:-1], w[0]]


def reduce_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``mean`` / ``sum`` / ``amax`` / ``amin`` over ``dim`` (all axes when None).

    Args:
        a: The channel analysis (its traced call arguments hold ``dim`` and ``keepdim``).
        node: The ``mean`` / ``sum`` / ``amax`` / ``amin`` call.
        args: The reduced tensor's per-axis segments first; dim and keepdim are ignored.
    """
    x = args[0]
    dims = _kw(node, a, 1, "dim", None)
    keep = _kw(node, a, 2, "keepdim", False)
    if dims is None:
        return []
    dims = {_dim(d, len(x)) for d in (dims if isinstance(dims, tuple | list) else (dims,))}
    out = []
    for i, segs in enumerate(x):
        if i not in dims:
            out.append(segs)
        elif keep:
            out.append(a.fresh((node.name, "k", i), 1, "reduced"))
    return out


def pool2d_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """Functional 2-d pooling: channels pass, the two spatial axes are new.

    Args:
        a: The channel analysis (for the new spatial axes).
        node: The functional 2-d pooling call.
        args: The input's per-axis segments (N, C, H, W) first; the pooling sizes are ignored.
    """
    return [*args[0][:-2], *_spatial(a, node)[-2:]]


def sdpa_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``scaled_dot_product_attention(q, k, v)``: q/k widths and k/v lengths tie.

    Args:
        a: The channel analysis.
        node: The ``scaled_dot_product_attention`` call.
        args: The query's, key's and value's per-axis segments (then the mask's, ignored).
    """
    q, k, v = args[:3]
    a.unify(q[-1], k[-1])
    a.unify(k[-2], v[-2])
    for i in range(len(q) - 2):
        a.unify(q[i], k[i])
        a.unify(q[i], v[i])
    return [*q[:-1], v[-1]]


def functional_norm_rule(a: ChannelAnalysis, node: fx.Node, args: list[Any]) -> Any:
    """``F.layer_norm`` / ``F.batch_norm``: weights are arguments, so the axes are fixed.

    Args:
        a: The channel analysis (every input axis is fixed in it).
        node: The ``F.layer_norm`` / ``F.batch_norm`` call.
        args: Per positional argument, its per-axis segments (unused: all inputs are fixed).
    """
    return fallback(a, node, f"functional norm at '{node.name}'")


# --- dispatch ----------------------------------------------------------------------------


def apply_rule(a: ChannelAnalysis, node: fx.Node) -> Any:
    """Per-axis segments of ``node``'s output (None for non-tensor values).

    Placeholders, the output and parameters are handled here; calls use the
    ``channel_rule`` registered for their op (:func:`hpcnb.ir.ops.op_spec`), a
    module's rule with parameter names relative to the module. Unknown ops fix
    their axes.

    Args:
        a: The channel analysis of the pass.
        node: The fx node whose output segments are wanted.
    """
    value = a.graph.values.get(node.name)
    if node.op == "placeholder":
        return _fresh_axes(a, node, value, "model input")
    if node.op == "output":
        a.fix_axes(_arg_axes(a, node.args[0]), "model output")
        return None
    if node.op == "get_attr":
        if not isinstance(value, TensorMeta):
            return None
        return [a.param(str(node.target), i) for i in range(len(value.shape))]
    if value is None or not (isinstance(value, TensorMeta) or _has_tensor(value)):
        return None
    args = [_arg_axes(a, x) for x in node.args]
    if node.op == "call_module":
        path = str(node.target)
        module = a.module_of(node)
        spec = op_spec(node.target, module)
        if spec is None or spec.channel_rule is None:
            why = f"leaf module '{path}' ({type(module).__name__}) with unknown channels"
            return fallback(a, node, why)
        with a.with_prefix(f"{path}."):
            return spec.channel_rule(a, node, args)
    spec = op_spec(node.target)
    if spec is None or spec.channel_rule is None:
        name = target_name(node.target)
        return fallback(a, node, f"op '{name}' at '{node.name}' with unknown channel mapping")
    return spec.channel_rule(a, node, args)


def _has_tensor(value: Any) -> bool:
    if isinstance(value, TensorMeta):
        return True
    return isinstance(value, tuple | list) and any(_has_tensor(v) for v in value)


def _kw(node: fx.Node, a: ChannelAnalysis, pos: int, name: str, default: Any) -> Any:
    cargs = a.graph.call_args.get(node.name, ())
    if len(cargs) > pos:
        return cargs[pos]
    return a.graph.call_kwargs.get(node.name, {}).get(name, default)


def _broadcast_batch(
    a: ChannelAnalysis, node: fx.Node, xa: Axes, sa: tuple[int, ...], xb: Axes, sb: tuple[int, ...]
) -> Axes:
    n = max(len(sa), len(sb))
    out: Axes = []
    for i in range(n):
        k = n - i
        ca = xa[len(sa) - k] if len(sa) >= k else None
        cb = xb[len(sb) - k] if len(sb) >= k else None
        da = sa[len(sa) - k] if ca is not None else 1
        db = sb[len(sb) - k] if cb is not None else 1
        if ca is not None and cb is not None and da == db:
            a.unify(ca, cb)
        pick = ca if ca is not None and da >= db else cb
        assert pick is not None  # at least one operand has this axis
        out.append(pick)
    return out
