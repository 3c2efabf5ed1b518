"""The op-kind table: every kind an IR node can have, with its feature group and FLOP counting.

Each :class:`Kind` says which op group its nodes count in for the runtime features of
:mod:`hpcnb.perfmodel.features` (``group``), whether
``torch.utils.flop_counter.FlopCounterMode`` counts the FLOPs of such ops (``counted``;
the IR's FLOPs of these kinds match it) and whether such a node launches a compute kernel
of its own (``kernel``). Adding a kind is one :func:`register_kind` call, before the
first :class:`~hpcnb.ir.ops.OpSpec` of that kind is registered; the built-in kinds below
are registered with the same call.

============ ============ ======= ====== ==================================================
kind         group        counted kernel ops
============ ============ ======= ====== ==================================================
input        elementwise  no      no     a graph input (placeholder)
output       elementwise  no      no     the graph output
param        elementwise  no      no     a parameter or buffer used directly (``get_attr``)
conv         conv         yes     yes    ``nn.Conv1d/2d/3d``, ``F.conv*``
linear       matmul       yes     yes    ``nn.Linear``, ``F.linear``
matmul       matmul       yes     yes    ``torch.matmul``, ``@``, ``bmm``, ``mm``, ``einsum``
attention    matmul       yes     yes    a multi-head attention leaf (projections and core)
norm         norm         no      yes    batch/layer/group/RMS norm
activation   activation   no      yes    ReLU, GELU, SiLU, sigmoid, tanh, softplus, ...
softmax      activation   no      yes    softmax / log-softmax
pool         pool         no      yes    max / average / adaptive pooling
add          elementwise  no      yes    ``+``, ``-`` (elementwise, broadcasting)
mul          elementwise  no      yes    ``*``, ``/`` (elementwise, broadcasting)
concat       elementwise  no      yes    ``torch.cat`` / ``stack``
split        elementwise  no      no     ``chunk``, ``split``, ``unbind``
getitem      elementwise  no      no     indexing / slicing / picking a tuple element
reshape      elementwise  no      no     view, reshape, flatten, permute, transpose, ...
reduce       elementwise  no      no     mean, sum, amax over axes
embedding    elementwise  no      yes    ``nn.Embedding``
scan         elementwise  no      yes    a sequential-scan leaf (selective SSM)
dropout      elementwise  no      no     dropout (identity at inference)
identity     elementwise  no      no     ``nn.Identity``
size         elementwise  no      no     ``x.size()``, ``x.shape`` and arithmetic on sizes
other        elementwise  no      no     anything the IR cannot cost (:meth:`Graph.unsupported`)
============ ============ ======= ====== ==================================================

The groups (:data:`GROUPS`) are ``conv`` (convolutions: dense or grouped by the module's
``groups``), ``matmul`` (linear layers, matrix products, attention), ``norm``,
``activation``, ``pool`` and ``elementwise`` (element-wise and data-movement ops; kinds
that launch no kernel are listed there too, and never counted as launches).

:data:`KINDS` and :data:`COUNTED_KINDS` are live views of the table: they list the
registered kinds, in registration order, at the moment they are read.

>>> from hpcnb.ir.kinds import KINDS, get_kind
>>> get_kind("softmax")
Kind(name='softmax', group='activation', counted=False, kernel=True)
>>> len(KINDS), KINDS[:3], "conv" in KINDS
(24, ('input', 'output', 'param'), True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from hpcnb.errors import HpcnbError
from hpcnb.plugins import Registry

__all__ = [
    "COUNTED_KINDS",
    "GROUPS",
    "KINDS",
    "Kind",
    "KindNames",
    "UnknownKindError",
    "get_kind",
    "kind_names",
    "register_kind",
    "unregister_kind",
]

#: The feature groups a kind can belong to (see the module docstring).
GROUPS: tuple[str, ...] = ("conv", "matmul", "norm", "activation", "pool", "elementwise")


class UnknownKindError(HpcnbError, ValueError):
    """An op kind that is not in the kinds table (the message names it and the known ones)."""


@dataclass(frozen=True)
class Kind:
    """One op kind of the IR.

    Attributes:
        name: The kind's name, as :attr:`hpcnb.ir.graph.Node.kind` holds it.
        group: Its feature group, one of :data:`GROUPS`.
        counted: Whether ``FlopCounterMode`` counts the FLOPs of ops of this kind.
        kernel: Whether a node of this kind launches a compute kernel of its own (False
            for graph ends, views, shape queries and ops folded into their neighbours).
        doc: Which ops have this kind, in a few words.
    """

    name: str
    group: str
    counted: bool = False
    kernel: bool = True
    doc: str = field(default="", compare=False, repr=False)


def _check(obj: Any) -> str | None:
    if not isinstance(obj, Kind):
        return f"expected a Kind, got {type(obj).__name__}"
    if obj.group not in GROUPS:
        return f"group {obj.group!r} is not one of {GROUPS}"
    return None


_TABLE: Registry[Kind] = Registry("op kind", check=_check)
_ORDER: list[str] = []  # registration order (the one-hot order of hpcnb.ir.export)


def register_kind(
    name: str,
    *,
    group: str,
    counted: bool = False,
    kernel: bool = True,
    doc: str = "",
    replace: bool = False,
) -> Kind:
    """Add an op kind to the table (a kind registered already is refused unless ``replace``).

    Registering the same kind again with the same fields is allowed (a module imported
    twice); a different kind under a taken name needs ``replace=True``.

    Args:
        name: The kind's name (non-empty, no ``:``).
        group: Its feature group, one of :data:`GROUPS`.
        counted: Whether ``FlopCounterMode`` counts the FLOPs of ops of this kind.
        kernel: Whether a node of this kind launches a compute kernel of its own.
        doc: Which ops have this kind, in a few words.
        replace: Replace a kind of that name instead of refusing it.

    Returns:
        The registered :class:`Kind`.

    Raises:
        hpcnb.plugins.PluginError: The name is malformed or taken (without ``replace``),
            or ``group`` is not one of :data:`GROUPS`.

    Example:
        >>> gate = register_kind("gate_doc", group="activation")
        >>> get_kind("gate_doc").group, "gate_doc" in KINDS
        ('activation', True)
        >>> unregister_kind("gate_doc")
    """
    kind = Kind(name, group, counted=counted, kernel=kernel, doc=doc)
    if name in _TABLE and _TABLE.get(name) == kind and not replace:
        return _TABLE.get(name)
    _TABLE.register(name, kind, replace=replace)
    if name not in _ORDER:
        _ORDER.append(name)
    return kind


def unregister_kind(name: str) -> None:
    """Remove a kind from the table (nothing happens when it is not registered).

    Ops registered with that kind stay registered; their nodes then carry a kind that
    :func:`get_kind` refuses, so remove a kind only together with its ops' uses.

    Args:
        name: A registered kind.
    """
    _TABLE.unregister(name)
    if name in _ORDER:
        _ORDER.remove(name)


def get_kind(name: str, where: str = "") -> Kind:
    """The registered kind ``name``.

    Args:
        name: A kind name (``"conv"``, ``"norm"``, ...).
        where: What asks, to begin the error message with (``"OpSpec"``).

    Raises:
        UnknownKindError: ``name`` is not registered (the message lists the kinds).

    Example:
        >>> get_kind("convolution", where="OpSpec")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hpcnb.ir.kinds.UnknownKindError: OpSpec: op kind 'convolution' is not registered; ...
    """
    if not isinstance(name, str) or name not in _TABLE:
        prefix = f"{where}: " if where else ""
        raise UnknownKindError(
            f"{prefix}op kind {name!r} is not registered; kinds are {', '.join(_ORDER)} "
            "(add one with hpcnb.ir.register_kind)"
        )
    return _TABLE.get(name)


def kind_names(select: Callable[[Kind], bool] | None = None) -> tuple[str, ...]:
    """The registered kind names in registration order, optionally only those ``select`` keeps.

    Args:
        select: Keeps a kind when it returns True (None: every kind).
    """
    if select is None:
        return tuple(_ORDER)
    return tuple(n for n in _ORDER if select(_TABLE.get(n)))


class KindNames(Sequence[str]):
    """A live, read-only sequence of registered kind names (``tuple(view)`` takes a snapshot).

    Args:
        select: Keeps a kind when it returns True (None: every kind).
        label: Shown by ``repr``.
    """

    def __init__(self, select: Callable[[Kind], bool] | None = None, label: str = "") -> None:
        self._select = select
        self._label = label

    def _names(self) -> tuple[str, ...]:
        return kind_names(self._select)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KindNames):
            return self._names() == other._names()
        return self._names() == other

    def __repr__(self) -> str:
        return f"{self._label}{self._names()!r}"


#: The registered kind names, in registration order (a live view).
KINDS: KindNames = KindNames(label="KINDS")
#: The kinds whose FLOPs ``FlopCounterMode`` counts (and the IR's must match; a live view).
COUNTED_KINDS: KindNames = KindNames(lambda k: k.counted, label="COUNTED_KINDS")


#: The built-in kinds, in registration order: (name, group, counted, kernel, doc).
_BUILTIN_KINDS: tuple[tuple[str, str, bool, bool, str], ...] = (
    ("input", "elementwise", False, False, "a graph input (placeholder)"),
    ("output", "elementwise", False, False, "the graph output"),
    ("param", "elementwise", False, False, "a parameter or buffer used directly"),
    ("conv", "conv", True, True, "convolutions"),
    ("linear", "matmul", True, True, "nn.Linear, F.linear"),
    ("matmul", "matmul", True, True, "matmul, bmm, mm, einsum"),
    ("attention", "matmul", True, True, "multi-head attention"),
    ("norm", "norm", False, True, "batch/layer/group/RMS norm"),
    ("activation", "activation", False, True, "ReLU, GELU, SiLU, sigmoid, ..."),
    ("softmax", "activation", False, True, "softmax / log-softmax"),
    ("pool", "pool", False, True, "max / average / adaptive pooling"),
    ("add", "elementwise", False, True, "+, - (broadcasting)"),
    ("mul", "elementwise", False, True, "*, / (broadcasting)"),
    ("concat", "elementwise", False, True, "torch.cat / stack"),
    ("split", "elementwise", False, False, "chunk, split, unbind"),
    ("getitem", "elementwise", False, False, "indexing, slicing, tuple elements"),
    ("reshape", "elementwise", False, False, "view, reshape, permute, ..."),
    ("reduce", "elementwise", False, False, "mean, sum, amax over axes"),
    ("embedding", "elementwise", False, True, "nn.Embedding"),
    ("scan", "elementwise", False, True, "a sequential-scan leaf (selective SSM)"),
    ("dropout", "elementwise", False, False, "dropout (identity at inference)"),
    ("identity", "elementwise", False, False, "nn.Identity"),
    ("size", "elementwise", False, False, "sizes and arithmetic on them"),
    ("other", "elementwise", False, False, "ops the IR cannot cost"),
)


def _register_builtins() -> None:
    for name, group, counted, kernel, doc in _BUILTIN_KINDS:
        register_kind(name, group=group, counted=counted, kernel=kernel, doc=doc)


_register_builtins()
