"""Per-op channel rules for the traversal in :mod:`hpcnb.ir.groups`.

Each rule takes the per-axis segments of a node's inputs and returns those of
its output, calling ``unify`` (these axes are the same channels), ``fix``
(these channels cannot be sliced) and ``param`` (this parameter axis) on the
analysis. Records needed to re-size constant arguments at extraction time are
stored in ``analysis.records``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch.fx as fx
from torch import nn

from hpcnb.ir.costs import (
    _ACT_NAMES,
    ACTIVATION_MODULES,
    DROPOUT_MODULES,
    POOL_MODULES,
    SOFTMAX_MODULES,
    target_name,
)
from hpcnb.ir.groups import length, slice_segments
from hpcnb.ir.leaf import is_ir_leaf
from hpcnb.ir.trace import TensorMeta

if TYPE_CHECKING:
    from hpcnb.ir.groups import Analysis, Axes

__all__ = ["apply_rule"]

_ELEMENTWISE = _ACT_NAMES | {
    "add",
    "sub",
    "mul",
    "truediv",
    "div",
    "iadd",
    "isub",
    "imul",
    "softmax",
    "log_softmax",
    "dropout",
    "contiguous",
    "float",
    "to",
    "type_as",
    "clone",
    "detach",
    "where",
    "masked_fill",
    "maximum",
    "minimum",
}
# Modules that keep every axis of their input (element-wise or identity).
_PASS_MODULES = ACTIVATION_MODULES + SOFTMAX_MODULES + DROPOUT_MODULES + (nn.Identity,)


def _shape(value: Any) -> tuple[int, ...] | None:
    return value.shape if isinstance(value, TensorMeta) else None


def _fresh_axes(a: Analysis, node: fx.Node, value: Any, reason: str, tag: str = "") -> Any:
    if isinstance(value, TensorMeta):
        return [a.fresh((node.name, tag, i), d, reason) for i, d in enumerate(value.shape)]
    if isinstance(value, tuple | list):
        return [_fresh_axes(a, node, v, reason, f"{tag}{i}.") for i, v in enumerate(value)]
    return None


def _arg_axes(a: Analysis, arg: Any) -> Any:
    if isinstance(arg, fx.Node):
        return a.axes.get(arg.name)
    if isinstance(arg, tuple | list):
        return [_arg_axes(a, x) for x in arg]
    return None


def _fallback(a: Analysis, node: fx.Node, reason: str) -> Any:
    for inp in node.all_input_nodes:
        a.fix_axes(a.axes.get(inp.name), reason)
    return _fresh_axes(a, node, a.graph.values.get(node.name), reason)


def _broadcast(a: Analysis, node: fx.Node, tensors: list[tuple[Axes, tuple[int, ...]]]) -> Axes:
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
    a: Analysis, node: fx.Node, x: Axes, ins: tuple[int, ...], outs: tuple[int, ...]
) -> Axes:
    """Map axes through a reshape: an axis passes when it maps one-to-one, else it is fixed."""
    reason = f"reshape at '{node.name}' mixes a channel axis with another axis"
    out: Axes = [
        a.fresh((node.name, "r", i), d, reason) if d == 1 else [] for i, d in enumerate(outs)
    ]
    ii = [i for i, d in enumerate(ins) if d != 1]
    oo = [i for i, d in enumerate(outs) if d != 1]
    if math.prod(ins) != math.prod(outs):
        return _fallback(a, node, reason)
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
    a: Analysis, node: fx.Node, segs: list, sizes: list[int], out: Axes, go: list[int]
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
    a: Analysis, node: fx.Node, axes: list, sizes: list[int], out: Axes, j: int
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


def _getitem(a: Analysis, node: fx.Node, x: Any, index: Any, in_shape: tuple[int, ...]) -> Any:
    if not isinstance(index, tuple):
        index = (index,)
    if any(not isinstance(i, int | slice | type(None) | type(Ellipsis)) for i in index):
        return _fallback(a, node, f"advanced indexing at '{node.name}'")
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


def _module_rule(a: Analysis, node: fx.Node, m: nn.Module, args: list[Any]) -> Any:
    path = str(node.target)
    value = a.graph.values.get(node.name)
    x = args[0] if args else None
    if is_ir_leaf(m):
        out = m.ir_channels(a.with_prefix(f"{path}."), args)
        a.with_prefix("")
        return out
    p = f"{path}."
    if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d):
        spatial = [a.fresh((node.name, "sp", i), d, "spatial") for i, d in enumerate(value.shape)]
        w = a.with_prefix(p).param("weight", 0)
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
            reason = f"grouped convolution '{path}' (groups={m.groups})"
            a.fix(x[1], reason)
            a.fix(w, reason)
            out_c = w
        if m.bias is not None:
            a.unify(out_c, a.param("bias", 0))
        a.with_prefix("")
        return [x[0], out_c, *spatial[2:]]
    if isinstance(m, nn.modules.conv._ConvTransposeNd):
        spatial = [a.fresh((node.name, "sp", i), d, "spatial") for i, d in enumerate(value.shape)]
        a.with_prefix(p)
        out_c = a.param("weight", 1)
        if m.groups == 1:
            a.unify(x[1], a.param("weight", 0))
        else:
            reason = f"grouped transposed convolution '{path}' (groups={m.groups})"
            a.fix(x[1], reason)
            a.fix(out_c, reason)
            out_c = a.fresh((node.name, "out"), value.shape[1], reason)
        if m.bias is not None:
            a.unify(out_c, a.param("bias", 0))
        a.with_prefix("")
        return [x[0], out_c, *spatial[2:]]
    if isinstance(m, nn.Linear):
        a.with_prefix(p)
        a.unify(x[-1], a.param("weight", 1))
        out_c = a.param("weight", 0)
        if m.bias is not None:
            a.unify(out_c, a.param("bias", 0))
        a.with_prefix("")
        return [*x[:-1], out_c]
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        a.with_prefix(p)
        for name in ("weight", "bias", "running_mean", "running_var"):
            a.unify(x[1], a.param(name, 0))
        a.with_prefix("")
        return list(x)
    if isinstance(m, nn.LayerNorm | nn.RMSNorm):
        shape = tuple(m.normalized_shape)
        if len(shape) != 1 or getattr(m, "weight", None) is None:
            for segs in x[len(x) - len(shape) :]:
                a.fix(segs, f"norm '{path}' without a per-channel weight")
        a.with_prefix(p)
        for name in ("weight", "bias"):
            a.unify(x[-1], a.param(name, 0))
        a.with_prefix("")
        return list(x)
    if isinstance(m, nn.GroupNorm):
        a.fix(x[1], f"group norm '{path}' (groups of channels)")
        a.with_prefix(p)
        for name in ("weight", "bias"):
            a.unify(x[1], a.param(name, 0))
        a.with_prefix("")
        return list(x)
    if isinstance(m, nn.Embedding):
        a.with_prefix(p)
        a.fix(a.param("weight", 0), f"embedding vocabulary '{path}'")
        out_c = a.param("weight", 1)
        a.with_prefix("")
        return [*x, out_c]
    if isinstance(m, POOL_MODULES):
        k = 1 if "1d" in type(m).__name__ else 2
        spatial = [a.fresh((node.name, "sp", i), d, "spatial") for i, d in enumerate(value.shape)]
        return [*x[: len(x) - k], *spatial[len(spatial) - k :]]
    if isinstance(m, _PASS_MODULES):
        return list(x)
    if isinstance(m, nn.Flatten):
        return _reshape(a, node, x, a.graph.values[node.args[0].name].shape, value.shape)
    return _fallback(a, node, f"leaf module '{path}' ({type(m).__name__}) with unknown channels")


def apply_rule(a: Analysis, node: fx.Node, modules: dict[str, nn.Module]) -> Any:
    """Per-axis segments of ``node``'s output (None for non-tensor values)."""
    values = a.graph.values
    value = values.get(node.name)
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
        return _module_rule(a, node, modules[str(node.target)], args)
    return _function_rule(a, node, args)


def _has_tensor(value: Any) -> bool:
    if isinstance(value, TensorMeta):
        return True
    return isinstance(value, tuple | list) and any(_has_tensor(v) for v in value)


def _kw(node: fx.Node, a: Analysis, pos: int, name: str, default: Any) -> Any:
    cargs = a.graph.call_args.get(node.name, ())
    if len(cargs) > pos:
        return cargs[pos]
    return a.graph.call_kwargs.get(node.name, {}).get(name, default)


def _function_rule(a: Analysis, node: fx.Node, args: list[Any]) -> Any:
    name = target_name(node.target)
    values = a.graph.values
    value = values[node.name]
    cargs = a.graph.call_args.get(node.name, ())
    in_shape = _shape(cargs[0]) if cargs else None
    x = args[0] if args else None
    if name == "getitem":
        if isinstance(cargs[0], tuple | list):
            return x[cargs[1]] if x is not None else None
        return _getitem(a, node, x, cargs[1], in_shape)
    if name in _ELEMENTWISE:
        tensors = [
            (ax, _shape(c)) for ax, c in zip(args, cargs, strict=False) if _shape(c) is not None
        ]
        for key, kval in node.kwargs.items():
            kv = a.graph.call_kwargs[node.name].get(key)
            if isinstance(kval, fx.Node) and _shape(kv) is not None:
                tensors.append((a.axes[kval.name], _shape(kv)))
        return _broadcast(a, node, tensors)
    if name in ("view", "reshape", "flatten", "squeeze", "unsqueeze"):
        out = _reshape(a, node, x, in_shape, value.shape)
        a.records[node.name] = ("reshape", out)
        return out
    if name == "permute":
        dims = cargs[1] if len(cargs) == 2 and isinstance(cargs[1], tuple | list) else cargs[1:]
        dims = dims if dims else _kw(node, a, 1, "dims", dims)
        return [x[_dim(d, len(x))] for d in dims]
    if name in ("transpose", "swapaxes"):
        d0, d1 = _dim(_kw(node, a, 1, "dim0", 0), len(x)), _dim(_kw(node, a, 2, "dim1", 1), len(x))
        out = list(x)
        out[d0], out[d1] = out[d1], out[d0]
        return out
    if name == "t":
        return list(reversed(x))
    if name in ("expand", "expand_as"):
        shape = value.shape
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
    if name == "pad":
        out = []
        for i, d in enumerate(value.shape):
            if d == in_shape[i]:
                out.append(x[i])
            else:
                a.fix(x[i], f"padding at '{node.name}'")
                out.append(a.fresh((node.name, "p", i), d, "padded"))
        return out
    if name in ("cat", "concat", "stack"):
        seq = args[0]
        shapes = [_shape(c) for c in cargs[0]]
        dim = _dim(_kw(node, a, 1, "dim", 0), len(shapes[0]) + (name == "stack"))
        if name == "stack":
            others = seq
            new = a.fresh((node.name, "stack"), len(seq), "stacked")
            out = list(seq[0])
            out.insert(dim, new)
        else:
            others = seq
            out = list(seq[0])
            out[dim] = [s for ax in seq for s in ax[dim]]
        for ax in others[1:]:
            for i in range(len(ax)):
                if name == "stack" or i != dim:
                    a.unify(seq[0][i], ax[i])
        return out
    if name in ("chunk", "split", "tensor_split", "unbind"):
        if name == "unbind":
            dim = _dim(_kw(node, a, 1, "dim", 0), len(in_shape))
            out = []
            for j in range(in_shape[dim]):
                a.fix(slice_segments(x[dim], j, j + 1), f"unbind at '{node.name}'")
                out.append([*x[:dim], *x[dim + 1 :]])
            return out
        dim = _dim(_kw(node, a, 2, "dim", 0), len(in_shape))
        pieces, pos = [], 0
        for piece in value:
            size = piece.shape[dim]
            segs = slice_segments(x[dim], pos, pos + size)
            a.atoms(segs)
            axes = list(x)
            axes[dim] = segs
            pieces.append(axes)
            pos += size
        a.records[node.name] = ("split", dim, [p[dim] for p in pieces])
        return pieces
    if name in ("matmul", "bmm", "mm"):
        b = args[1]
        sa, sb = _shape(cargs[0]), _shape(cargs[1])
        if len(sa) < 2 or len(sb) < 2:
            return _fallback(a, node, f"vector matmul at '{node.name}'")
        a.unify(x[-1], b[-2])
        batch = _broadcast_batch(a, node, x[:-2], sa[:-2], b[:-2], sb[:-2])
        return [*batch, x[-2], b[-1]]
    if name == "linear":
        w = args[1]
        a.unify(x[-1], w[1])
        if len(args) > 2 and args[2] is not None:
            a.unify(w[0], args[2][0])
        return [*x[:-1], w[0]]
    if name in ("mean", "sum", "amax", "amin"):
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
    if name in ("adaptive_avg_pool2d", "avg_pool2d", "max_pool2d", "adaptive_max_pool2d"):
        spatial = [a.fresh((node.name, "sp", i), d, "spatial") for i, d in enumerate(value.shape)]
        return [*x[:-2], *spatial[-2:]]
    if name == "scaled_dot_product_attention":
        q, k, v = args[:3]
        a.unify(q[-1], k[-1])
        a.unify(k[-2], v[-2])
        for i in range(len(q) - 2):
            a.unify(q[i], k[i])
            a.unify(q[i], v[i])
        return [*q[:-1], v[-1]]
    if name in ("layer_norm", "batch_norm"):
        return _fallback(a, node, f"functional norm at '{node.name}'")
    return _fallback(a, node, f"op '{name}' at '{node.name}' with unknown channel mapping")


def _broadcast_batch(
    a: Analysis, node: fx.Node, xa: Axes, sa: tuple[int, ...], xb: Axes, sb: tuple[int, ...]
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
        out.append(ca if ca is not None and da >= db else cb)
    return out
