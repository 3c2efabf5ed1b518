"""The op registry: everything ``hpcnb.ir`` knows about one op, registered in one place.

An *op* is a module type (``nn.Conv2d``), a function object (one you wrapped
with ``torch.fx.wrap``, say) or a function / method name (``"relu"`` stands for
``torch.relu``, ``F.relu`` and ``x.relu()`` alike). Its :class:`OpSpec` holds

* ``kind`` - the op kind, a name registered in the kinds table (:mod:`hpcnb.ir.kinds`;
  a new kind is one :func:`hpcnb.ir.kinds.register_kind`);
* ``flops(call)`` - FLOPs of one call, from an :class:`OpCall` (module, shapes,
  concrete arguments); None: 0 FLOPs;
* ``bytes(call)`` - ``(bytes read, bytes written)`` where the default (tensor
  inputs plus the module's own parameters read, tensor outputs written) is wrong;
* ``channel_rule(analysis, node, in_axes)`` - how channel axes flow through the
  op (see :mod:`hpcnb.ir.rules`); None: the mapping is unknown and the op's axes
  are not prunable;
* ``refresh(module)`` - re-size a module after :func:`hpcnb.ir.extract` sliced
  its parameters (it may return a replacement module).

:func:`hpcnb.ir.trace` reads the kind and the costs, the channel analysis the
rule, extraction the refresh. The PyTorch ops are registered in
:mod:`hpcnb.ir.torch_ops` with the same :func:`register_op` a user calls, so
supporting a new op is one registration. A registered module type is traced as
a leaf (fx does not trace into it). Modules that describe themselves use the
leaf protocol of :mod:`hpcnb.ir.leaf` instead.

Worked example - a learned per-channel gate, ``x * sigmoid(w)``:

>>> import torch
>>> from torch import nn
>>> from hpcnb.ir import trace
>>> from hpcnb.ir.ops import OpSpec, register_op
>>> class Gate(nn.Module):
...     def __init__(self, channels):
...         super().__init__()
...         self.w = nn.Parameter(torch.zeros(channels))
...     def forward(self, x):
...         return x * torch.sigmoid(self.w)
>>> def gate_channels(analysis, node, in_axes):
...     x = in_axes[0]  # the input's per-axis segments
...     analysis.unify(x[-1], analysis.param("w", 0))  # names relative to the module
...     return x  # the output has the input's axes
>>> register_op(Gate, OpSpec("mul", flops=lambda call: 2 * call.out_numel,
...                          channel_rule=gate_channels))
>>> model = nn.Sequential(nn.Linear(4, 6), Gate(6), nn.Linear(6, 2))
>>> graph = trace(model, torch.randn(3, 4))
>>> [(n.kind, n.flops) for n in graph.nodes if n.module == "1"]
[('mul', 36)]
>>> [(g.size, g.modules) for g in graph.prunable_groups()]
[(6, ('0', '1', '2'))]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import torch.fx as fx
from torch import nn

from hpcnb.errors import InvalidInputError, InvalidTypeError
from hpcnb.ir.graph import IRTraceError
from hpcnb.ir.kinds import get_kind
from hpcnb.ir.leaf import is_ir_leaf

if TYPE_CHECKING:
    from hpcnb.ir.channels import ChannelAnalysis

__all__ = [
    "OpCall",
    "OpSpec",
    "expect_module",
    "op_kind",
    "op_spec",
    "register_op",
    "target_name",
]

Shape = tuple[int, ...]
M = TypeVar("M", bound=nn.Module)

#: Names whose non-tensor results (sizes, shape arithmetic) get kind "size".
_SIZE_NAMES = frozenset(
    {"size", "dim", "numel", "getattr", "getitem", "add", "mul", "sub", "floordiv"}
)


@dataclass(frozen=True)
class OpCall:
    """One call of an op, as its cost formulas see it.

    Attributes:
        target: The fx target (module path, function, or method name).
        module: The called module (``call_module`` nodes), else None.
        in_shapes: Shapes of the tensor inputs, in argument order.
        out_shape: Shape of the (first) output tensor.
        args: Concrete positional arguments (tensors as :class:`hpcnb.ir.graph.TensorMeta`).
        bytes_read: Default bytes read (tensor inputs plus the module's parameters/buffers).
        bytes_written: Default bytes written (tensor outputs).
    """

    target: Any
    module: nn.Module | None
    in_shapes: tuple[Shape, ...]
    out_shape: Shape
    args: tuple[Any, ...] = ()
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def out_numel(self) -> int:
        """Elements of the output tensor (0 without one)."""
        return math.prod(self.out_shape) if self.out_shape else 0


#: ``flops(call)``: FLOPs of one call.
FlopsFormula = Callable[[OpCall], int]
#: ``bytes(call)``: ``(bytes read, bytes written)``.
BytesFormula = Callable[[OpCall], tuple[int, int]]
#: ``rule(analysis, fx_node, in_axes)``: the output's per-axis segments.
ChannelRule: TypeAlias = "Callable[[ChannelAnalysis, fx.Node, list[Any]], Any]"
#: ``refresh(module)``: re-size a sliced module in place, or return its replacement.
Refresh = Callable[[nn.Module], nn.Module | None]


@dataclass(frozen=True)
class OpSpec:
    """What the IR knows about one op (see the module docstring).

    Attributes:
        kind: Op kind, a name registered in :mod:`hpcnb.ir.kinds`.
        flops: FLOPs of one call (None: 0).
        bytes: Bytes read and written (None: the defaults of :class:`OpCall`).
        channel_rule: Channel mapping (None: unknown, the op's axes are fixed).
        refresh: Re-sizes a module after extraction sliced it (None: nothing to do).
    """

    kind: str
    flops: FlopsFormula | None = None
    bytes: BytesFormula | None = None
    channel_rule: ChannelRule | None = None
    refresh: Refresh | None = None

    def __post_init__(self) -> None:
        get_kind(self.kind, where="OpSpec")


_MODULES: dict[type, OpSpec] = {}
_FUNCTIONS: dict[Any, OpSpec] = {}
_NAMES: dict[str, OpSpec] = {}

OpTarget = type | str | Callable[..., Any]


def register_op(
    target: OpTarget | Iterable[OpTarget], spec: OpSpec, *, replace: bool = False
) -> None:
    """Register ``spec`` for a module type, a function, a name, or a tuple/list of them.

    Module types match their subclasses too (the most specific registration wins); a
    registered type itself is traced as a leaf. A target registered already is refused
    unless ``replace`` is set, so no registration is overwritten by accident.

    Args:
        target: ``nn.Module`` subclass, function object, function/method name, or a
            tuple/list of these.
        spec: What the IR should know about the op.
        replace: Replace an existing registration of the same target.

    Raises:
        InvalidTypeError: For a target of another kind or a spec that is not an
            :class:`OpSpec`.
        UnknownKindError: The spec's kind is not registered in :mod:`hpcnb.ir.kinds`.
        InvalidInputError: A target is registered already and ``replace`` is not set
            (nothing of this call is registered then).
    """
    if not isinstance(spec, OpSpec):
        raise InvalidTypeError(f"register_op: spec must be an OpSpec, got {type(spec).__name__}")
    get_kind(spec.kind, where=f"register_op({target!r})")
    targets = list(target) if isinstance(target, tuple | list) else [target]
    tables: list[dict[Any, OpSpec]] = []
    for t in targets:
        if isinstance(t, type):
            if not issubclass(t, nn.Module):
                raise InvalidTypeError(f"register_op: {t.__name__} is a type but not an nn.Module")
            tables.append(_MODULES)
        elif isinstance(t, str):
            tables.append(_NAMES)
        elif callable(t):
            tables.append(_FUNCTIONS)
        else:
            raise InvalidTypeError(
                f"register_op: expected a module type, function or name, got {t!r}"
            )
        if t in tables[-1] and not replace:
            raise InvalidInputError(
                f"register_op: {t!r} is registered already (kind {tables[-1][t].kind!r}); "
                "pass replace=True to replace it"
            )
    for t, table in zip(targets, tables, strict=True):
        table[t] = spec


def expect_module(module: nn.Module | None, cls: type[M], what: str) -> M:
    """``module``, checked to be a ``cls`` (a rule, formula or refresh registered for it).

    Args:
        module: The module a rule, formula or refresh was handed.
        cls: The module type it was registered for.
        what: What asks, for the message (``"conv_rule at 'layer1.0.conv1'"``).

    Raises:
        IRTraceError: ``module`` is not a ``cls`` (the op was registered for a module
            type its function does not handle).

    Example:
        >>> expect_module(nn.Linear(2, 3), nn.Linear, "linear refresh").out_features
        3
    """
    if not isinstance(module, cls):
        raise IRTraceError(
            f"{what}: expected a {cls.__name__}, got {type(module).__name__}; register "
            "this op with a function written for its module type"
        )
    return module


def target_name(target: Any) -> str:
    """A short name for an fx call target (function, builtin, or method name).

    Args:
        target: The fx target: a function, a builtin, or a method name.
    """
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", repr(target))
    return name.strip("_") if name.startswith("__") else name


def _leaf_flops(call: OpCall) -> int:
    module = call.module
    assert is_ir_leaf(module)  # the spec is built for leaves only (op_spec)
    return int(module.ir_flops(list(call.in_shapes), call.out_shape))


def _leaf_channels(analysis: ChannelAnalysis, node: fx.Node, in_axes: list[Any]) -> Any:
    module = analysis.module_of(node)
    assert is_ir_leaf(module)
    return module.ir_channels(analysis, in_axes)


def _leaf_refresh(module: nn.Module) -> None:
    assert is_ir_leaf(module)
    module.ir_refresh()


def op_spec(target: Any, module: nn.Module | None = None) -> OpSpec | None:
    """The registered spec of a call (None when the op is unknown).

    Args:
        target: The fx target (ignored for modules).
        module: The called module, for ``call_module`` nodes.

    Returns:
        For an :class:`~hpcnb.ir.leaf.IRLeaf` module a spec that asks the module;
        else the registration of the module's type (or nearest base), of the
        function object, or of its name.

    Raises:
        UnknownKindError: An IR leaf declares an ``ir_kind`` that is not registered.
    """
    if module is not None:
        if is_ir_leaf(module):
            kind = module.ir_kind
            get_kind(kind, where=f"IR leaf {type(module).__name__} (ir_kind)")
            return OpSpec(kind, _leaf_flops, None, _leaf_channels, _leaf_refresh)
        for cls in type(module).__mro__:
            if cls in _MODULES:
                return _MODULES[cls]
        return None
    try:
        spec = _FUNCTIONS.get(target)
    except TypeError:  # an unhashable target
        spec = None
    return spec if spec is not None else _NAMES.get(target_name(target))


def is_registered_module(module: nn.Module) -> bool:
    """Whether ``module``'s exact type was registered (such modules are traced as leaves).

    Args:
        module: A module of the traced model.
    """
    return type(module) in _MODULES


def op_kind(op: str, target: Any, module: nn.Module | None, out_is_tensor: bool) -> str:
    """The op kind of an fx node.

    Args:
        op: fx opcode.
        target: fx target (module path, function or method name).
        module: The called module for ``call_module`` nodes.
        out_is_tensor: Whether the node produced a tensor (or tuple of tensors).

    Returns:
        A kind from :data:`hpcnb.ir.kinds.KINDS`: the registered kind, "size" for
        arithmetic on sizes, "other" for an unknown op.
    """
    if op == "placeholder":
        return "input"
    if op == "output":
        return "output"
    if op == "get_attr":
        return "param"
    if op != "call_module" and not out_is_tensor:
        return "size" if target_name(target) in _SIZE_NAMES else "other"
    spec = op_spec(target, module)
    return spec.kind if spec is not None else "other"
