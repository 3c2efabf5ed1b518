"""The IR data model: :class:`Node`, :class:`Graph`, :class:`ChannelGroup`, :class:`ParamSlice`.

Pure data: this module imports no other module of :mod:`hpcnb.ir`. A :class:`Graph`
is the result of :func:`hpcnb.ir.trace`: a list of nodes in topological order,
one per ``torch.fx`` node, each with an op kind from the kinds table
(:mod:`hpcnb.ir.kinds`, where the vocabulary is listed), shapes, parameter count,
FLOPs and bytes.

FLOPs: a multiply-add counts 2. Convolution, linear, matmul and attention
count ``2 * MACs`` and exclude bias additions, exactly as
``torch.utils.flop_counter.FlopCounterMode``; elementwise ops count one FLOP
per output element (norms 2 for batch norm, 5 for layer/RMS/group norm,
softmax 3, pooling the window size per output element, reductions one per
input element). Shape ops, dropout, identity, embedding lookups and params
cost 0 FLOPs (they are costed, not unsupported). Bytes read are the bytes of
the input tensors plus the node's own parameters and buffers; bytes written
are the bytes of its output tensors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.fx as fx

from hpcnb.errors import HpcnbError, UnknownNameError

__all__ = [
    "Block",
    "ChannelFacts",
    "ChannelGroup",
    "Graph",
    "IRTraceError",
    "Node",
    "ParamSlice",
    "TensorMeta",
    "find_blocks",
]


class IRTraceError(HpcnbError, RuntimeError):
    """A model could not be traced or analysed; the message names the module and the reason."""


class TensorMeta:
    """Shape, dtype and byte size of a tensor seen during shape propagation."""

    __slots__ = ("dtype", "nbytes", "shape")

    def __init__(self, t: torch.Tensor) -> None:
        self.shape = tuple(int(s) for s in t.shape)
        self.dtype = str(t.dtype).removeprefix("torch.")
        self.nbytes = t.numel() * t.element_size()

    def __repr__(self) -> str:
        return f"TensorMeta({self.shape}, {self.dtype})"


@dataclass
class Node:
    """One IR node (one ``torch.fx`` node).

    Attributes:
        name: The fx node name (unique in the graph).
        kind: Op kind, a name from :data:`hpcnb.ir.kinds.KINDS`.
        op: The fx opcode ("placeholder", "call_module", "call_function", ...).
        target: Readable target (module class name, function or method name).
        module: Module path ("layer1.0.conv1"), or the enclosing module path for
            functions called inside a module's forward ("" at the top level).
        inputs: Names of the nodes this node reads.
        in_shapes: Shapes of the tensor inputs, in order.
        out_shape: Shape of the (first) tensor output; () for non-tensors.
        out_shapes: Shapes of all tensor outputs (tuples for chunk/split).
        dtype: dtype of the (first) output tensor, e.g. "float32"; "" for non-tensors.
        in_dtypes: dtypes of the tensor inputs, in the order of ``in_shapes``.
        params: Number of parameter elements owned by the node's module.
        flops: FLOPs of one call (multiply-add = 2).
        bytes_read: Bytes of tensor inputs plus own parameters/buffers.
        bytes_written: Bytes of tensor outputs.
        attrs: Hyper-parameters of the op, e.g. ``kernel_size``, ``stride``, ``padding``,
            ``groups``, ``in_channels``/``out_channels`` (conv), ``in_features``/``out_features``
            (linear), ``heads``/``head_dim`` (attention), ``dim`` (cat/split/softmax).
    """

    name: str
    kind: str
    op: str
    target: str
    module: str = ""
    inputs: list[str] = field(default_factory=list)
    in_shapes: list[tuple[int, ...]] = field(default_factory=list)
    out_shape: tuple[int, ...] = ()
    out_shapes: list[tuple[int, ...]] = field(default_factory=list)
    dtype: str = ""
    in_dtypes: list[str] = field(default_factory=list)
    params: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParamSlice:
    """The part of a parameter (or buffer) tensor that one channel group slices.

    Group element ``i`` covers indices ``offset + i*unit ... offset + (i+1)*unit - 1``
    of axis ``axis`` of tensor ``param`` (``unit`` is 1 except for attention
    heads, where it is the head width).

    Attributes:
        param: Qualified name in the model's ``state_dict`` ("layer1.0.conv1.weight").
        axis: Tensor axis that is sliced.
        offset: First index covered along ``axis``.
        length: Number of group elements covered (equals the group's size).
        unit: Tensor indices per group element.
    """

    param: str
    axis: int
    offset: int
    length: int
    unit: int = 1

    def indices(self, keep: list[int] | None = None) -> list[int]:
        """Tensor indices along ``axis`` for the kept group elements (all when None)."""
        elems = range(self.length) if keep is None else keep
        return [self.offset + i * self.unit + j for i in elems for j in range(self.unit)]


@dataclass(frozen=True)
class ChannelGroup:
    """Dimensions that must shrink together (found by graph traversal).

    Attributes:
        id: Stable id ("g0", "g1", ... in order of first appearance).
        size: Number of channels / hidden units / heads.
        kind: "channel" (conv feature maps), "hidden" (linear features) or "head".
        members: The parameter slices the group ties together.
        prunable: False when the group touches the model input or output, or an
            op whose channel mapping is unknown (e.g. a channel shuffle reshape).
        reason: Why the group is not prunable ("" when it is).
        modules: Module paths of the members, in order, without repeats.
    """

    id: str
    size: int
    kind: str
    members: tuple[ParamSlice, ...]
    prunable: bool
    reason: str = ""
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Block:
    """A skippable residual block ``out = x + f(x)``.

    Attributes:
        id: Module path of the block (unique; e.g. "layers.1" or "blocks.0.attn").
        add: Name of the fx node computing the sum.
        skip: Name of the fx node holding ``x``.
        modules: Module paths called on the residual branch ``f``.
    """

    id: str
    add: str
    skip: str
    modules: tuple[str, ...]


class ChannelFacts(Protocol):
    """What a graph keeps of its channel analysis (:class:`hpcnb.ir.channels.ChannelAnalysis`).

    Attributes:
        groups: Every channel group, prunable or not, in order of first appearance.
    """

    groups: list[ChannelGroup]


@dataclass
class Graph:
    """A traced model: nodes in topological order plus the fx module they came from.

    Attributes:
        nodes: IR nodes in topological order.
        gm: The ``torch.fx.GraphModule`` produced by tracing.
        leaf_modules: Module paths traced as leaves.
        values: Per fx node, its output seen during shape propagation (tensors as
            ``TensorMeta``, other values as is).
        call_args: Per fx node, its concrete positional arguments (same convention).
        call_kwargs: Per fx node, its concrete keyword arguments.
        channel_analyser: Computes the channel analysis on first use of :meth:`groups`
            (:func:`hpcnb.ir.trace` sets :func:`hpcnb.ir.groups.analyse_channels`).
    """

    nodes: list[Node]
    gm: fx.GraphModule
    leaf_modules: tuple[str, ...] = ()
    values: dict[str, Any] = field(default_factory=dict, repr=False)
    call_args: dict[str, tuple[Any, ...]] = field(default_factory=dict, repr=False)
    call_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    channel_analyser: Callable[[Graph], ChannelFacts] | None = field(default=None, repr=False)
    _channels: ChannelFacts | None = field(default=None, init=False, repr=False)

    def node(self, name: str) -> Node:
        """The node called ``name``.

        Args:
            name: The fx node name.

        Raises:
            UnknownNameError: No node has that name (the message lists some that do).
        """
        for n in self.nodes:
            if n.name == name:
                return n
        raise UnknownNameError(
            f"no node {name!r}; nodes are {[n.name for n in self.nodes][:20]} ..."
        )

    def total_flops(self) -> int:
        """Sum of node FLOPs (ops of kind "other" are excluded; see :meth:`unsupported`)."""
        return sum(n.flops for n in self.nodes)

    def total_params(self) -> int:
        """Number of parameter elements used by the graph (shared parameters once)."""
        return int(sum(p.numel() for p in self.gm.parameters()))

    def activation_bytes(self) -> int:
        """Sum of the output bytes of all nodes (activation memory of one forward)."""
        return sum(n.bytes_written for n in self.nodes if n.kind not in ("output", "size"))

    def flops_by_kind(self) -> dict[str, int]:
        """Total FLOPs per op kind (kinds with no nodes are omitted)."""
        out: Counter[str] = Counter()
        for n in self.nodes:
            out[n.kind] += n.flops
        return dict(out)

    def flops_by_module(self, depth: int | None = None) -> dict[str, int]:
        """Total FLOPs per module path, optionally truncated to ``depth`` path components.

        Args:
            depth: Keep only the first ``depth`` dotted components (None: full path).

        Returns:
            ``{module path: flops}``; top-level functions are under "".
        """
        out: Counter[str] = Counter()
        for n in self.nodes:
            path = n.module if depth is None else ".".join(n.module.split(".")[:depth])
            out[path] += n.flops
        return dict(out)

    def count_by_kind(self) -> dict[str, int]:
        """Number of nodes per op kind."""
        return dict(Counter(n.kind for n in self.nodes))

    def unsupported(self) -> list[Node]:
        """Nodes of kind "other": ops whose cost is unknown (never silently zero)."""
        return [n for n in self.nodes if n.kind == "other"]

    def channels(self) -> ChannelFacts:
        """The channel analysis of this graph, computed on first use and kept.

        Raises:
            IRTraceError: If the graph has no ``channel_analyser`` (it was not made by trace).
        """
        if self._channels is None:
            if self.channel_analyser is None:
                raise IRTraceError(
                    "this Graph has no channel_analyser; build it with hpcnb.ir.trace "
                    "or pass channel_analyser=hpcnb.ir.groups.analyse_channels"
                )
            self._channels = self.channel_analyser(self)
        return self._channels

    def groups(self) -> list[ChannelGroup]:
        """Channel-dependency groups found by traversing the graph (cached).

        Returns:
            Every group, prunable or not, in order of first appearance.
        """
        return self.channels().groups

    def group(self, group_id: str) -> ChannelGroup:
        """The group with id ``group_id``.

        Args:
            group_id: A group id ("g0", "g1", ...).

        Raises:
            UnknownNameError: No group has that id.
        """
        for g in self.groups():
            if g.id == group_id:
                return g
        raise UnknownNameError(
            f"no channel group {group_id!r}; ids are g0..g{len(self.groups()) - 1}"
        )

    def prunable_groups(self) -> list[ChannelGroup]:
        """The groups with ``prunable`` True."""
        return [g for g in self.groups() if g.prunable]

    def output_group(self, node_name: str) -> ChannelGroup | None:
        """The group of a conv/linear node's output channels (its weight's axis 0), if any."""
        node = self.node(node_name)
        weight = f"{node.module}.weight" if node.module else "weight"
        for g in self.groups():
            if any(m.param == weight and m.axis == 0 and m.unit == 1 for m in g.members):
                return g
        return None

    def blocks(self) -> list[str]:
        """Ids of skippable residual blocks (output = input + f(input)), in graph order."""
        return [b.id for b in find_blocks(self)]

    def __repr__(self) -> str:
        return (
            f"Graph({type(self.gm).__name__}: {len(self.nodes)} nodes, "
            f"{self.total_params():,} params, {self.total_flops() / 1e6:.2f} MFLOPs)"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One dict per node (name, kind, module, shapes, params, FLOPs, bytes) for pandas."""
        return [
            {
                "name": n.name,
                "kind": n.kind,
                "module": n.module,
                "target": n.target,
                "in_shapes": n.in_shapes,
                "out_shape": n.out_shape,
                "params": n.params,
                "flops": n.flops,
                "bytes_read": n.bytes_read,
                "bytes_written": n.bytes_written,
            }
            for n in self.nodes
        ]

    def summary(self) -> str:
        """A short text table: nodes, params, FLOPs, top kinds."""
        kinds = sorted(self.flops_by_kind().items(), key=lambda kv: -kv[1])[:6]
        lines = [
            f"{len(self.nodes)} nodes, {self.total_params():,} params, "
            f"{self.total_flops() / 1e6:.2f} MFLOPs, {self.activation_bytes() / 1e6:.2f} MB act",
            "FLOPs by kind: " + ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in kinds),
        ]
        if self.unsupported():
            lines.append("unsupported: " + ", ".join(n.name for n in self.unsupported()))
        return "\n".join(lines)


_PASS_KINDS = ("identity", "dropout")


def _strip(node: fx.Node, kinds: dict[str, str]) -> fx.Node:
    while kinds.get(node.name) in _PASS_KINDS and node.all_input_nodes:
        node = node.all_input_nodes[0]
    return node


def _ancestors(node: fx.Node) -> set[str]:
    seen: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for a in n.all_input_nodes:
            if a.name not in seen:
                seen.add(a.name)
                stack.append(a)
    return seen


def _common_prefix(paths: Sequence[str]) -> str:
    parts = [p.split(".") for p in paths if p]
    if not parts:
        return ""
    prefix = []
    for items in zip(*parts, strict=False):
        if len(set(items)) != 1:
            break
        prefix.append(items[0])
    return ".".join(prefix)


def find_blocks(graph: Graph) -> list[Block]:
    """Residual blocks whose output is ``x + f(x)`` with ``x`` an ancestor of ``f(x)``.

    Args:
        graph: A traced graph.

    Returns:
        The blocks in graph order.
    """
    kinds = {n.name: n.kind for n in graph.nodes}
    targets = {n.name: n.target for n in graph.nodes}
    values = graph.values
    found: list[tuple[fx.Node, fx.Node, list[str]]] = []
    for node in graph.gm.graph.nodes:
        if kinds.get(node.name) != "add" or targets.get(node.name) not in ("add", "iadd"):
            continue
        ops = [a for a in node.args if isinstance(a, fx.Node)]
        if len(ops) != 2:
            continue
        shapes = [getattr(values.get(o.name), "shape", None) for o in ops]
        out = getattr(values.get(node.name), "shape", None)
        if shapes[0] != out or shapes[1] != out:
            continue
        for skip_op, branch in ((ops[0], ops[1]), (ops[1], ops[0])):
            x = _strip(skip_op, kinds)
            anc = _ancestors(branch)
            if x.name not in anc:
                continue
            between = [
                n.target
                for n in graph.gm.graph.nodes
                if n.op == "call_module"
                and (n.name in anc or n is branch)
                and x.name in _ancestors(n)
            ]
            if between:
                found.append((node, x, [str(t) for t in between]))
                break
    prefixes = [add.meta.get("scope") or _common_prefix(mods) or add.name for add, _, mods in found]
    blocks = []
    for (add, x, mods), prefix in zip(found, prefixes, strict=True):
        ident = prefix
        if prefixes.count(prefix) > 1:
            rest = mods[-1][len(prefix) :].lstrip(".").split(".")[0] if prefix else add.name
            ident = f"{prefix}.{rest}" if prefix else add.name
        blocks.append(Block(ident, add.name, x.name, tuple(mods)))
    return blocks
