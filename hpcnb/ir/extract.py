"""Subnet extraction, keep counts, channel importance and function-preserving reorder.

:func:`extract` copies the traced ``GraphModule``, slices every parameter
tensor along the axes the channel groups name (real smaller tensors, no
masks), re-sizes the modules (each op's registered ``refresh``, see
:mod:`hpcnb.ir.ops`) and the constant arguments of split / slice / view nodes,
and optionally removes skippable residual blocks (``x + f(x)`` becomes ``x``;
the blocks are found by :func:`hpcnb.ir.graph.find_blocks`). The channel
analysis it follows is an explicit argument (the graph's own by default).
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.fx as fx
from torch import nn

from hpcnb.errors import InvalidInputError, InvalidTypeError, UnknownNameError
from hpcnb.ir.channels import ChannelAnalysis, slice_segments
from hpcnb.ir.graph import ChannelGroup, Graph, ParamSlice, find_blocks
from hpcnb.ir.groups import analyse_channels
from hpcnb.ir.ops import op_spec

__all__ = ["extract", "importance", "normalize_keep", "reorder", "uniform_keep"]


def normalize_keep(
    graph: Graph,
    keep: Mapping[str, int | Sequence[int]],
    groups: Sequence[ChannelGroup] | None = None,
) -> dict[str, list[int]]:
    """Validate ``keep`` and turn counts into index lists (a count k means the first k).

    Args:
        graph: The traced graph.
        keep: ``{group id: k or [indices]}``.
        groups: The channel groups (default: ``graph.groups()``).

    Returns:
        ``{group id: kept indices}`` for the groups that lose channels.

    Raises:
        UnknownNameError: For an unknown group id.
        InvalidTypeError: For a keep value that is neither a count nor a list of indices.
        InvalidInputError: For a non-prunable group or indices out of range / repeated /
            empty.
    """
    out: dict[str, list[int]] = {}
    by_id = {g.id: g for g in (graph.groups() if groups is None else groups)}
    for gid, spec in keep.items():
        if gid not in by_id:
            raise UnknownNameError(f"keep: unknown group {gid!r}; groups are g0..g{len(by_id) - 1}")
        group = by_id[gid]
        if isinstance(spec, torch.Tensor) or hasattr(spec, "tolist"):
            spec = spec.tolist()  # tensors and numpy arrays / scalars
        if isinstance(spec, numbers.Integral):
            idx = list(range(int(spec)))
        elif isinstance(spec, Sequence) and all(isinstance(i, numbers.Integral) for i in spec):
            idx = [int(i) for i in spec]
        else:
            raise InvalidTypeError(
                f"keep[{gid!r}]: expected a count or a list of indices, got {spec!r}"
            )
        if idx == list(range(group.size)):
            continue
        if not group.prunable:
            raise InvalidInputError(f"keep[{gid!r}]: group is not prunable ({group.reason})")
        if not idx or len(idx) > group.size:
            raise InvalidInputError(
                f"keep[{gid!r}]: expected 1..{group.size} channels, got {len(idx)}"
            )
        if len(set(idx)) != len(idx) or min(idx) < 0 or max(idx) >= group.size:
            raise InvalidInputError(
                f"keep[{gid!r}]: indices must be distinct and in 0..{group.size - 1}, got {idx}"
            )
        out[gid] = idx
    return out


def uniform_keep(
    graph: Graph, ratio: float, kinds: Iterable[str] = ("channel", "hidden", "head")
) -> dict[str, int]:
    """Keep counts for every prunable group of the given kinds: ``max(1, round(ratio * size))``.

    Args:
        graph: A traced graph.
        ratio: Width multiplier in (0, 1].
        kinds: Group kinds to shrink (others are kept whole).

    Returns:
        ``{group id: count}`` suitable for :func:`extract`.

    Raises:
        InvalidInputError: ``ratio`` is not in (0, 1].
    """
    if not 0.0 < ratio <= 1.0:
        raise InvalidInputError(f"uniform_keep: ratio={ratio} must be in (0, 1]")
    wanted = set(kinds)
    return {
        g.id: max(1, round(ratio * g.size))
        for g in graph.groups()
        if g.prunable and g.kind in wanted
    }


def _index_plan(
    groups: Sequence[ChannelGroup], keep: dict[str, list[int]]
) -> dict[tuple[str, int], list[tuple[ParamSlice, list[int]]]]:
    plan: dict[tuple[str, int], list[tuple[ParamSlice, list[int]]]] = {}
    for g in groups:
        if g.id in keep:
            for m in g.members:
                plan.setdefault((m.param, m.axis), []).append((m, keep[g.id]))
    return plan


def _axis_indices(size: int, pieces: list[tuple[ParamSlice, list[int]]]) -> list[int]:
    starts = {m.offset: (m, k) for m, k in pieces}
    out: list[int] = []
    pos = 0
    while pos < size:
        if pos in starts:
            m, k = starts[pos]
            out.extend(m.indices(k))
            pos += m.length * m.unit
        else:
            out.append(pos)
            pos += 1
    return out


def _owner(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return (root.get_submodule(path) if path else root), attr


def _refresh(gm: fx.GraphModule, path: str, module: nn.Module) -> None:
    """Re-size a module whose parameters were sliced (its op's ``refresh``), or replace it."""
    spec = op_spec(None, module)
    if spec is None or spec.refresh is None:
        return
    replacement = spec.refresh(module)
    if replacement is not None and replacement is not module:
        parent, _, name = path.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, name, replacement)


def _slice_tensors(
    gm: fx.GraphModule, groups: Sequence[ChannelGroup], keep: dict[str, list[int]]
) -> None:
    touched: set[str] = set()
    for (pname, axis), pieces in _index_plan(groups, keep).items():
        owner, attr = _owner(gm, pname)
        tensor = getattr(owner, attr)
        idx = torch.tensor(
            _axis_indices(tensor.shape[axis], pieces), dtype=torch.long, device=tensor.device
        )
        new = tensor.detach().index_select(axis, idx).clone()
        if attr in owner._parameters:
            owner._parameters[attr] = nn.Parameter(new, requires_grad=tensor.requires_grad)
        else:
            owner._buffers[attr] = new
        touched.add(pname.rpartition(".")[0])
    modules = dict(gm.named_modules())
    owners = {prefix for path in touched for prefix in _prefixes(path) if prefix in modules}
    for path in sorted(owners, key=lambda p: (-p.count(".") - bool(p), p)):  # children first
        _refresh(gm, path, modules[path])


def _prefixes(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(len(parts), -1, -1)]


def _patch_args(gm: fx.GraphModule, analysis: ChannelAnalysis, keep: dict[str, list[int]]) -> None:
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, rec in analysis.records.items():
        node = nodes.get(name)
        if node is None:
            continue
        if rec[0] == "split":
            _, dim, pieces = rec
            sizes = [analysis.kept(p, keep) for p in pieces]
            if sizes == [sum(e - s for _, s, e in p) for p in pieces]:
                continue
            x = node.args[0] if node.args else node.kwargs["input"]
            node.target = "split" if node.op == "call_method" else torch.split
            node.args = (x, sizes)
            node.kwargs = {"dim": dim}
        elif rec[0] == "getitem":
            index = node.args[1]
            items = list(index) if isinstance(index, tuple) else [index]
            for pos, segs, start, stop in rec[1]:
                new_start = analysis.kept(slice_segments(segs, 0, start), keep)
                new_stop = new_start + analysis.kept(slice_segments(segs, start, stop), keep)
                if (new_start, new_stop) != (start, stop):
                    items[pos] = slice(new_start, new_stop)
            node.args = (node.args[0], tuple(items) if isinstance(index, tuple) else items[0])
        elif rec[0] == "reshape":
            out_axes = rec[1]
            args = list(node.args)
            flat = args[1:]
            if len(flat) == 1 and isinstance(flat[0], tuple | list):
                dims, wrap = list(flat[0]), True
            else:
                dims, wrap = flat, False
            if len(dims) != len(out_axes):
                continue
            for i, d in enumerate(dims):
                if isinstance(d, int) and d != -1 and out_axes[i]:
                    dims[i] = analysis.kept(out_axes[i], keep)
            node.args = (args[0], tuple(dims)) if wrap else (args[0], *dims)


def _analysis_of(graph: Graph, channels: ChannelAnalysis | None) -> ChannelAnalysis:
    """``channels``, else the graph's own analysis, else a fresh one."""
    if channels is not None:
        return channels
    if graph.channel_analyser is not None:
        facts = graph.channels()
        if isinstance(facts, ChannelAnalysis):
            return facts
    return analyse_channels(graph)


def extract(
    model: nn.Module,
    graph: Graph,
    keep: Mapping[str, int | Sequence[int]] | None = None,
    *,
    skip_blocks: Iterable[str] = (),
    channels: ChannelAnalysis | None = None,
) -> fx.GraphModule:
    """A real, smaller copy of ``model``: sliced weights, re-sized modules, skipped blocks.

    Args:
        model: The model ``graph`` was traced from (its current weights are used).
        graph: Its IR graph.
        keep: ``{group id: k or [indices]}``; a count k keeps the first k channels.
            Groups not named are kept whole.
        skip_blocks: Ids from :meth:`Graph.blocks` to remove (``x + f(x)`` -> ``x``).
        channels: The channel analysis of ``graph`` (default: the graph's own, computed
            on first use by :func:`hpcnb.ir.groups.analyse_channels`).

    Returns:
        An independent ``torch.fx.GraphModule`` whose forward runs on the same inputs.

    Raises:
        UnknownNameError: ``keep`` names an unknown group or ``skip_blocks`` an unknown
            block.
        InvalidTypeError: A keep value is neither a count nor a list of indices.
        InvalidInputError: ``keep`` shrinks a group that is not prunable, or its indices are
            out of range, repeated or empty.
    """
    analysis = _analysis_of(graph, channels)
    keep_idx = normalize_keep(graph, keep or {}, analysis.groups)
    blocks = {b.id: b for b in find_blocks(graph)}
    skip = list(skip_blocks)
    for b in skip:
        if b not in blocks:
            raise UnknownNameError(f"skip_blocks: unknown block {b!r}; blocks are {sorted(blocks)}")
    gm = copy.deepcopy(fx.GraphModule(model, copy.deepcopy(graph.gm.graph), type(model).__name__))
    if keep_idx:
        _slice_tensors(gm, analysis.groups, keep_idx)
        _patch_args(gm, analysis, keep_idx)
    nodes = {n.name: n for n in gm.graph.nodes}
    replaced: dict[str, fx.Node] = {}
    order = {b.id: i for i, b in enumerate(blocks.values())}
    for b in sorted(set(skip), key=order.__getitem__):  # graph order: a skip may be a skipped add
        add = nodes[blocks[b].add]
        target = nodes[blocks[b].skip]
        while target.name in replaced:
            target = replaced[target.name]
        add.replace_all_uses_with(target)
        replaced[add.name] = target
        gm.graph.erase_node(add)
    if skip:
        gm.graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    return gm


def importance(model: nn.Module, graph: Graph) -> dict[str, torch.Tensor]:
    """Per-channel L1 norm of every group, summed over the weight slices it ties.

    Only weight tensors with >= 2 axes (conv/linear/attention weights) count; groups
    without such a member use all members (norm scales, embeddings).

    Args:
        model: The model ``graph`` was traced from (its current weights are scored).
        graph: Its IR graph.

    Returns:
        ``{group id: scores of shape (size,)}`` for every group.
    """
    state: dict[str, torch.Tensor] = dict(model.named_parameters())
    state.update(dict(model.named_buffers()))
    scores: dict[str, torch.Tensor] = {}
    for g in graph.groups():
        members = [m for m in g.members if m.param in state and state[m.param].dim() >= 2]
        members = members or [m for m in g.members if m.param in state]
        total = torch.zeros(g.size)
        for m in members:
            t = state[m.param].detach().abs().float()
            t = t.movedim(m.axis, 0)[m.offset : m.offset + m.length * m.unit]
            total += t.reshape(m.length, -1).sum(dim=1).cpu()
        scores[g.id] = total
    return scores


@torch.no_grad()
def reorder(
    model: nn.Module, graph: Graph, scores: Mapping[str, torch.Tensor] | None = None
) -> dict[str, list[int]]:
    """Permute the channels of every prunable group in place, most important first.

    Every tensor slice a group ties is permuted the same way, so the model's function
    is unchanged, and keeping the first k channels keeps the k most important ones.

    Args:
        model: The model ``graph`` was traced from (modified in place).
        graph: Its IR graph.
        scores: Per-group scores (default: :func:`importance`).

    Returns:
        ``{group id: permutation}`` (new position i holds old channel perm[i]).
    """
    scores = dict(scores) if scores is not None else importance(model, graph)
    state: dict[str, torch.Tensor] = dict(model.named_parameters())
    state.update(dict(model.named_buffers()))
    perms: dict[str, list[int]] = {}
    for g in graph.groups():
        if not g.prunable or g.id not in scores:
            continue
        perm = torch.argsort(scores[g.id], descending=True, stable=True).tolist()
        perms[g.id] = perm
        for m in g.members:
            _permute(state[m.param], m, perm)
    return perms


def _permute(tensor: torch.Tensor, m: ParamSlice, perm: list[int]) -> None:
    src = torch.tensor(m.indices(perm), dtype=torch.long, device=tensor.device)
    dst = torch.arange(m.offset, m.offset + m.length * m.unit, device=tensor.device)
    tensor.index_copy_(m.axis, dst, tensor.index_select(m.axis, src))
