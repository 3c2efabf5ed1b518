"""Tracing a model into the IR: torch.fx symbolic trace, shape propagation, op kinds and costs.

:func:`trace` asks the op registry (:mod:`hpcnb.ir.ops`) for each call's kind and
costs, and hands the graph the channel analysis of :mod:`hpcnb.ir.groups`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from hpcnb.errors import InvalidInputError, InvalidTypeError
from hpcnb.ir.costs import tensor_bytes
from hpcnb.ir.graph import Graph, IRTraceError, Node, TensorMeta
from hpcnb.ir.groups import analyse_channels
from hpcnb.ir.leaf import is_ir_leaf
from hpcnb.ir.ops import OpCall, is_registered_module, op_kind, op_spec, target_name

__all__ = ["trace"]

LeafSpec = type | str


class _ScopedTracer(fx.Tracer):
    """fx tracer that remembers the enclosing module of every node and names failing modules."""

    def __init__(self, leaf_types: tuple[type, ...], leaf_names: frozenset[str]) -> None:
        super().__init__()
        self.leaf_types = leaf_types
        self.leaf_names = leaf_names
        self._ir_scope: list[str] = []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_names:
            return True
        if self.leaf_types and isinstance(m, self.leaf_types):
            return True
        if is_ir_leaf(m) or is_registered_module(m):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(
        self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        path = self.path_of_module(m)
        self._ir_scope.append(path)
        try:
            return super().call_module(m, forward, args, kwargs)
        except IRTraceError:
            raise
        except Exception as err:  # fx raises TraceError, TypeError, ... from user code
            raise IRTraceError(_explain(path, type(m).__name__, err)) from err
        finally:
            self._ir_scope.pop()

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.meta["scope"] = self._ir_scope[-1] if self._ir_scope else ""
        return node


def _explain(path: str, cls: str, err: Exception) -> str:
    where = f"module '{path}' ({cls})" if path else f"the top-level forward of {cls}"
    hint = (
        f"trace(model, inputs, leaf_modules=({path!r},)) or leaf_modules=({cls},)"
        if path
        else "move the data-dependent part into a sub-module and pass it in leaf_modules"
    )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (
        f"torch.fx cannot trace {where}: {type(err).__name__}: {first}. "
        "Data-dependent control flow (if/for on tensor values or shapes) cannot be traced "
        f"symbolically; treat the module as an opaque leaf: {hint}."
    )


class _Recorder(fx.Interpreter):
    """Runs the traced module once, keeping every node's concrete output (tensors as meta)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}
        self.args: dict[str, tuple[Any, ...]] = {}
        self.kwargs: dict[str, dict[str, Any]] = {}

    def run_node(self, n: fx.Node) -> Any:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        self.args[n.name] = tuple(_meta(a) for a in args)
        self.kwargs[n.name] = {k: _meta(v) for k, v in kwargs.items()}
        try:
            out = super().run_node(n)
        except Exception as err:
            where = n.meta.get("scope", "") or n.name
            raise IRTraceError(
                f"shape propagation failed at node '{n.name}' (in module '{where}', "
                f"target {target_name(n.target)}): {type(err).__name__}: {err}"
            ) from err
        self.values[n.name] = _meta(out)
        return out


def _meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorMeta(value)
    if isinstance(value, tuple | list):
        return type(value)(_meta(v) for v in value)
    return value


def _tensors(value: Any) -> list[TensorMeta]:
    if isinstance(value, TensorMeta):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    return []


def _split_leaves(
    leaf_modules: Iterable[LeafSpec], model: nn.Module
) -> tuple[tuple[type, ...], frozenset[str]]:
    names = {path for path, _ in model.named_modules()}
    types: list[type] = []
    paths: set[str] = set()
    for item in leaf_modules:
        if isinstance(item, type):
            types.append(item)
        elif isinstance(item, str):
            if item not in names:
                raise InvalidInputError(
                    f"leaf_modules: {item!r} is not a sub-module path of {type(model).__name__}"
                )
            paths.add(item)
        else:
            raise InvalidTypeError(f"leaf_modules: expected module types or paths, got {item!r}")
    return tuple(types), frozenset(paths)


def trace(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    leaf_modules: Iterable[LeafSpec] = (),
) -> Graph:
    """Trace ``model`` with torch.fx and annotate every node with kind, shapes and costs.

    Args:
        model: The model (put it in eval mode for inference costs).
        example_inputs: One tensor, or a tuple of tensors, for ``model.forward``.
        leaf_modules: Module types or sub-module paths to keep opaque (not traced into);
            unknown leaves get kind "other".

    Returns:
        The IR graph.

    Raises:
        IRTraceError: If fx cannot trace a module (the message names it and suggests
            ``leaf_modules``) or shape propagation fails.
        InvalidTypeError: ``model`` is not an ``nn.Module``, or a leaf is neither a
            module type nor a path.
        InvalidInputError: A leaf path names no sub-module of ``model``.
        UnknownKindError: An IR leaf declares an ``ir_kind`` that is not registered.
    """
    if not isinstance(model, nn.Module):
        raise InvalidTypeError(f"trace: model must be an nn.Module, got {type(model).__name__}")
    inputs = (
        (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    )
    leaf_types, leaf_names = _split_leaves(leaf_modules, model)
    tracer = _ScopedTracer(leaf_types, leaf_names)
    try:
        fx_graph = tracer.trace(model)
    except IRTraceError:
        raise
    except Exception as err:
        raise IRTraceError(_explain("", type(model).__name__, err)) from err
    gm = fx.GraphModule(tracer.root, fx_graph, type(model).__name__)
    recorder = _propagate(gm, inputs)
    modules = dict(gm.named_modules())
    nodes: list[Node] = []
    for n in gm.graph.nodes:
        nodes.append(_make_node(n, gm, modules, recorder))
    leaves = tuple(
        p
        for p, m in model.named_modules()
        if p in leaf_names or (leaf_types and isinstance(m, leaf_types))
    )
    return Graph(
        nodes=nodes,
        gm=gm,
        leaf_modules=leaves,
        values=recorder.values,
        call_args=recorder.args,
        call_kwargs=recorder.kwargs,
        channel_analyser=analyse_channels,
    )


_META_ABOVE = 1e9  # parameters x input elements; below this a real forward is cheaper


def _propagate(gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> _Recorder:
    """Run the graph once, recording every node's output shape.

    Large models are propagated on the ``meta`` device (a weight-free copy: no
    arithmetic, so a ResNet-50 at 224x224 takes a fraction of a second); small ones
    (parameters x input elements below ``_META_ABOVE``) run for real, which is faster
    than meta dispatch. Ops that need real data (data-dependent shapes, ``.item()``
    in a leaf) fall back to a real run. After a real run, buffers (train-mode
    BatchNorm statistics) are restored.
    """
    work = sum(p.numel() for p in gm.parameters()) * sum(
        t.numel() for t in inputs if isinstance(t, torch.Tensor)
    )
    if work > _META_ABOVE and all(isinstance(t, torch.Tensor) for t in inputs):
        try:
            memo: dict[int, Any] = {}
            for p in gm.parameters():
                memo[id(p)] = nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)
            for b in gm.buffers():
                memo[id(b)] = b.to("meta")
            meta = copy.deepcopy(gm, memo)  # no weight data is copied
            recorder = _Recorder(meta)
            with torch.no_grad():
                recorder.run(*(t.to("meta") for t in inputs))
            return recorder
        except Exception:  # any meta failure means: run for real
            pass
    recorder = _Recorder(gm)
    saved = {name: b.clone() for name, b in gm.named_buffers()}
    try:
        with torch.no_grad():
            recorder.run(*inputs)
    finally:
        with torch.no_grad():
            for name, b in gm.named_buffers():
                b.copy_(saved[name])
    return recorder


def _make_node(
    n: fx.Node, gm: fx.GraphModule, modules: dict[str, nn.Module], rec: _Recorder
) -> Node:
    value = rec.values.get(n.name)
    outs = _tensors(value) if n.op != "output" else []
    module = modules.get(str(n.target)) if n.op == "call_module" else None
    kind = op_kind(n.op, n.target, module, bool(outs) or n.op == "output")
    inputs = [a.name for a in n.all_input_nodes]
    read_metas = [m for a in n.all_input_nodes for m in _tensors(rec.values.get(a.name))]
    call = (*rec.args.get(n.name, ()), *rec.kwargs.get(n.name, {}).values())
    in_metas = _tensors(list(call))  # in argument order, repeats included (q, k, k)
    if kind == "getitem" and not isinstance(call[0], TensorMeta):
        in_metas = read_metas = list(outs)  # picking one element of a tuple
    in_shapes = [m.shape for m in in_metas]
    out_shape = outs[0].shape if outs else ()
    params = 0
    own_bytes = 0
    if module is not None:
        params = sum(p.numel() for p in module.parameters())
        own_bytes = sum(tensor_bytes(t) for t in (*module.parameters(), *module.buffers()))
    path = str(n.target) if n.op == "call_module" else n.meta.get("scope", "")
    if n.op == "get_attr":
        tensor = _fetch_attr(gm, str(n.target))
        path = str(n.target).rpartition(".")[0]
        if isinstance(tensor, nn.Parameter):
            params = tensor.numel()
    bytes_read = sum(m.nbytes for m in read_metas) + own_bytes
    bytes_written = 0 if kind in ("param", "size", "output") else sum(o.nbytes for o in outs)
    if kind == "param":
        bytes_read = sum(o.nbytes for o in outs)
    flops = 0
    spec = (
        op_spec(n.target, module)
        if n.op in ("call_module", "call_function", "call_method")
        else None
    )
    if spec is not None and kind not in ("size", "other") and (spec.flops or spec.bytes):
        op_call = OpCall(
            n.target,
            module,
            tuple(in_shapes),
            out_shape,
            rec.args.get(n.name, ()),
            int(bytes_read),
            int(bytes_written),
        )
        try:
            flops = spec.flops(op_call) if spec.flops else 0
            if spec.bytes:
                bytes_read, bytes_written = spec.bytes(op_call)
        except Exception as err:
            raise IRTraceError(
                f"cannot cost node '{n.name}' (kind {kind}, module '{path}'): "
                f"{type(err).__name__}: {err}"
            ) from err
    return Node(
        name=n.name,
        kind=kind,
        op=n.op,
        target=type(module).__name__ if module is not None else target_name(n.target),
        module=path,
        inputs=inputs,
        in_shapes=in_shapes,
        out_shape=out_shape,
        out_shapes=[o.shape for o in outs],
        dtype=outs[0].dtype if outs else "",
        in_dtypes=[m.dtype for m in in_metas],
        params=params,
        flops=int(flops),
        bytes_read=int(bytes_read),
        bytes_written=int(bytes_written),
        attrs=_attrs(module, n, rec),
    )


_MODULE_ATTRS = (
    "in_channels",
    "out_channels",
    "kernel_size",
    "stride",
    "padding",
    "dilation",
    "groups",
    "in_features",
    "out_features",
    "num_features",
    "normalized_shape",
    "num_groups",
    "output_size",
    "num_embeddings",
    "embedding_dim",
    "heads",
    "head_dim",
    "embed_dim",
    "num_heads",
    "p",
)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return tuple(_plain(v) for v in value)
    return value if isinstance(value, int | float | str | bool) or value is None else str(value)


def _attrs(module: nn.Module | None, n: fx.Node, rec: _Recorder) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if module is not None:
        for key in _MODULE_ATTRS:
            if hasattr(module, key):
                out[key] = _plain(getattr(module, key))
        if "kernel_size" in out and isinstance(out["kernel_size"], int):
            out["kernel_size"] = (out["kernel_size"],)
        if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            out["bias"] = module.bias is not None
            out["depthwise"] = module.groups > 1 and module.groups == module.in_channels
        elif isinstance(module, nn.Linear):
            out["bias"] = module.bias is not None
    else:
        kwargs = rec.kwargs.get(n.name, {})
        for key in ("dim", "dims", "keepdim"):
            if key in kwargs:
                out[key] = _plain(kwargs[key])
        args = rec.args.get(n.name, ())
        if n.op == "call_function" and target_name(n.target) in ("chunk", "split"):
            out.setdefault("dim", _plain(args[2]) if len(args) > 2 else 0)
    return out


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
