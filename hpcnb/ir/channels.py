"""Channel spaces and segments: the state of a channel-dependency traversal (ChannelAnalysis).

See :mod:`hpcnb.ir.groups` for how the traversal uses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from hpcnb.ir.graph import ChannelGroup, Graph, ParamSlice

__all__ = ["Axes", "ChannelAnalysis", "Segment", "length", "slice_segments"]

Segment = tuple[int, int, int]  # (space id, start, end)
Axes = list[list[Segment]]  # per tensor axis, its segments
Atom = tuple[int, int, int]


@dataclass
class Space:
    """A channel space: ``size`` elements, optionally mapped onto parameter slices."""

    key: tuple[Any, ...]
    size: int
    members: list[tuple[str, int, int, int]] = field(default_factory=list)  # param, axis, off, unit
    kind: str = "channel"
    fixed: str = ""


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Atom, Atom] = {}

    def find(self, a: Atom) -> Atom:
        self.parent.setdefault(a, a)
        root = a
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[a] != root:
            self.parent[a], a = root, self.parent[a]
        return root

    def union(self, a: Atom, b: Atom) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


class ChannelAnalysis:
    """State of the channel traversal; also the ``ctx`` handed to leaf operators and rules.

    Attributes:
        graph: The IR graph.
        modules: The graph module's sub-modules, by path.
        spaces: All spaces, by id.
        groups: The resulting channel groups (after :meth:`run`).
        axes: Per fx node name, the output's per-axis segments (tuple outputs: a list of them).
        records: Per fx node name, what extraction needs to re-size the node's constant args.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.spaces: list[Space] = []
        self._space_ids: dict[tuple[Any, ...], int] = {}
        self._cuts: dict[int, set[int]] = {}
        self._changed = False
        self._uf = _UnionFind()
        self._fixed: dict[Atom, str] = {}
        self._whole_units: dict[Atom, str] = {}
        self.derived: dict[int, tuple[int, int, int, int, int]] = {}
        self._prefix = ""
        self.axes: dict[str, Any] = {}
        self.records: dict[str, Any] = {}
        self.groups: list[ChannelGroup] = []
        self.atom_group: dict[Atom, str] = {}
        self._classes: dict[Atom, list[Atom]] = {}
        self.passes = 0
        self.modules: dict[str, nn.Module] = dict(graph.gm.named_modules())
        self._params: dict[str, torch.Tensor] = dict(graph.gm.named_parameters())
        self._params.update(dict(graph.gm.named_buffers()))

    def module_of(self, node: fx.Node) -> nn.Module:
        """The module a ``call_module`` node calls.

        Args:
            node: A ``call_module`` node of the graph.
        """
        return self.modules[str(node.target)]

    # --- spaces --------------------------------------------------------------------------
    def space(self, key: tuple[Any, ...], size: int, kind: str = "channel") -> int:
        """Id of the space ``key``, created with ``size`` elements on first use.

        Args:
            key: The space's identity (``("param", name, axis)``, ``("anon", ...)``, ...).
            size: Its number of elements.
            kind: Group kind to report ("channel", or "head" for attention heads).
        """
        sid = self._space_ids.get(key)
        if sid is None:
            sid = len(self.spaces)
            self.spaces.append(Space(key, size, kind=kind))
            self._space_ids[key] = sid
        return sid

    def param(self, name: str, axis: int) -> list[Segment]:
        """Segments of axis ``axis`` of parameter/buffer ``name`` (relative to the current leaf).

        Args:
            name: Parameter or buffer name, relative to the prefix of :meth:`with_prefix`.
            axis: Tensor axis (negative counts from the end).

        Returns:
            One segment over the whole axis; [] when there is no such tensor (e.g. no bias).
        """
        full = f"{self._prefix}{name}"
        tensor = self._params.get(full)
        if tensor is None:
            return []
        axis = axis % tensor.dim()
        size = int(tensor.shape[axis])
        sid = self.space(("param", full, axis), size)
        if not self.spaces[sid].members:
            self.spaces[sid].members.append((full, axis, 0, 1))
        return [(sid, 0, size)] if size else []

    def virtual(
        self, name: str, size: int, members: Sequence[tuple[str, int, int, int]], kind: str
    ) -> list[Segment]:
        """Declare a virtual space (e.g. attention heads) of ``size`` units over param slices.

        Args:
            name: Name within the current leaf module.
            size: Number of units.
            members: ``(param, axis, offset, unit)`` relative to the leaf module.
            kind: Group kind to report ("head").

        Returns:
            The space's segments.
        """
        sid = self.space(("virtual", f"{self._prefix}{name}"), size, kind=kind)
        space = self.spaces[sid]
        if not space.members:
            space.members = [
                (f"{self._prefix}{p}", a, o, u)
                for p, a, o, u in members
                if f"{self._prefix}{p}" in self._params  # e.g. no bias
            ]
        return [(sid, 0, size)]

    def fresh(self, key: tuple[Any, ...], size: int, reason: str) -> list[Segment]:
        """Segments of an anonymous (parameter-free) space, fixed with ``reason``.

        Args:
            key: The space's identity (the node name and a tag, usually).
            size: Its number of elements.
            reason: Why the space cannot be pruned.
        """
        if size == 0:
            return []
        sid = self.space(("anon", *key), size)
        self.fix([(sid, 0, size)], reason)
        return [(sid, 0, size)]

    def derive(self, base: Sequence[Segment], unit: int, period: int, count: int) -> list[Segment]:
        """A space whose element ``i`` is the units ``base[j*period + i*unit : ... + unit]``.

        Used where a reshape splits a channel axis into (outer, ..., inner) axes (e.g. heads x
        head width) or merges such axes back: pruning element ``i`` of the derived space
        removes ``count`` units of ``unit`` elements of the base space.

        Args:
            base: A single segment ``(space, start, end)`` with ``end - start = count*period``.
            unit: Base elements per derived element and repeat.
            period: Base elements between repeats.
            count: Number of repeats.

        Returns:
            The derived space's segments (size ``period // unit``).
        """
        (sid, start, _end) = base[0]
        size = period // unit
        did = self.space(("derived", sid, start, unit, period, count), size)
        self.derived[did] = (sid, start, unit, period, count)
        return [(did, 0, size)]

    def whole_units(self, segs: Sequence[Segment], reason: str) -> None:
        """Mark ``segs`` as prunable only in whole units (through a derived space).

        Args:
            segs: The segments of the split or merged axis.
            reason: Reported when the axis is pruned other than in whole units.
        """
        for atom in self.atoms(segs):
            self._whole_units.setdefault(atom, reason)

    # --- cuts, atoms, unify, fix ------------------------------------------------------------
    def _cut(self, sid: int, pos: int) -> None:
        if 0 < pos < self.spaces[sid].size:
            cuts = self._cuts.setdefault(sid, set())
            if pos not in cuts:
                cuts.add(pos)
                self._changed = True

    def atoms(self, segs: Sequence[Segment]) -> list[Atom]:
        """Split segments into atomic intervals under the current cuts."""
        out: list[Atom] = []
        for sid, start, end in segs:
            self._cut(sid, start)
            self._cut(sid, end)
            points = sorted(p for p in self._cuts.get(sid, ()) if start < p < end)
            edges = [start, *points, end]
            out.extend((sid, a, b) for a, b in itertools.pairwise(edges))
        return out

    def unify(self, a: Sequence[Segment], b: Sequence[Segment]) -> None:
        """Tie two equally long segment lists element by element (no-op if either has length 1).

        Lists of different lengths (neither 1) cannot be aligned: both are fixed.

        Args:
            a: One axis's segments.
            b: The other axis's segments.
        """
        la, lb = length(a), length(b)
        if not a or not b or (la != lb and 1 in (la, lb)):
            return  # broadcasting (or an empty axis): nothing to tie
        if la != lb:
            self.fix(a, f"cannot align axes of length {la} and {lb}")
            self.fix(b, f"cannot align axes of length {la} and {lb}")
            return
        atoms_a, atoms_b = self.atoms(a), self.atoms(b)
        for x, y in ((atoms_a, atoms_b), (atoms_b, atoms_a)):
            pos, bounds = 0, set()
            for _, s, e in x:
                pos += e - s
                bounds.add(pos)
            pos = 0
            for sid, s, e in y:
                for p in sorted(bounds):
                    if pos < p < pos + (e - s):
                        self._cut(sid, s + p - pos)
                pos += e - s
        if self._changed:
            return  # retry on the next pass, once both sides are cut alike
        for atom_a, atom_b in zip(atoms_a, atoms_b, strict=True):
            self._uf.union(atom_a, atom_b)

    def fix(self, segs: Sequence[Segment], reason: str) -> None:
        """Mark the atoms of ``segs`` as not prunable, with ``reason``.

        Args:
            segs: The segments to fix.
            reason: Why they cannot be pruned (reported on their groups).
        """
        for atom in self.atoms(segs):
            self._fixed.setdefault(atom, reason)

    def fix_axes(self, axes: Any, reason: str) -> None:
        """Fix every axis of a (possibly nested) per-axis segment structure.

        Args:
            axes: Per-axis segments, a nested list of them (tuple outputs), or None.
            reason: Why they cannot be pruned.
        """
        if axes is None:
            return
        if axes and isinstance(axes[0], list) and (not axes[0] or isinstance(axes[0][0], tuple)):
            for segs in axes:
                self.fix(segs, reason)
        else:
            for item in axes:
                self.fix_axes(item, reason)

    # --- passes and groups ----------------------------------------------------------------
    def start_pass(self) -> None:
        """Forget the ties of the previous pass (cuts are kept: they only accumulate)."""
        self._changed = False
        self._uf = _UnionFind()
        self._fixed = {}
        self._whole_units = {}
        self.axes = {}
        self.records = {}
        self.passes += 1

    @property
    def changed(self) -> bool:
        """Whether the current pass made a new cut (another pass is needed)."""
        return self._changed

    @contextmanager
    def with_prefix(self, prefix: str) -> Iterator[ChannelAnalysis]:
        """Within the block, :meth:`param` and :meth:`virtual` names are relative to ``prefix``.

        Args:
            prefix: A module path followed by a dot ("layer1.0.conv1."), or "".

        Yields:
            This analysis.
        """
        saved, self._prefix = self._prefix, prefix
        try:
            yield self
        finally:
            self._prefix = saved

    def build_groups(self) -> None:
        """Turn the union-find classes of the last pass into :attr:`groups`."""
        classes: dict[Atom, list[Atom]] = {}
        for sid, space in enumerate(self.spaces):
            for atom in self.atoms([(sid, 0, space.size)]):
                classes.setdefault(self._uf.find(atom), []).append(atom)
        self._classes = classes
        ordered = sorted(classes.values(), key=min)
        modules = {p for p, _ in self.graph.gm.named_modules()}
        linear_like = {
            p for p, m in self.graph.gm.named_modules() if type(m).__name__ in ("Linear",)
        }
        self.groups, self.atom_group = [], {}
        for atoms in ordered:
            members: dict[ParamSlice, None] = {}
            kinds = set()
            reasons = [self._fixed[a] for a in atoms if a in self._fixed]
            reasons += [self._whole_units[a] for a in atoms if a in self._whole_units]
            n_direct = n_derived = 0
            for atom in sorted(atoms):
                sid, s, e = atom
                space = self.spaces[sid]
                kinds.add(space.kind)
                for pname, axis, off, unit in space.members:
                    members[ParamSlice(pname, axis, off + s * unit, e - s, unit)] = None
                    n_direct += 1
                if sid in self.derived:
                    found, why = self._derived_members(atom)
                    members.update(dict.fromkeys(found))
                    reasons += why
                    n_derived += len(found)
            if not members:
                continue
            owners = []
            for m in members:
                owner = m.param.rpartition(".")[0]
                owner = owner if owner in modules else ""
                if owner not in owners:
                    owners.append(owner)
            if "head" in kinds or (n_derived and not n_direct):
                kind = "head"
            elif all(o in linear_like for o in owners if o):
                kind = "hidden"
            else:
                kind = "channel"
            gid = f"g{len(self.groups)}"
            for a in atoms:
                self.atom_group[a] = gid
            self.groups.append(
                ChannelGroup(
                    id=gid,
                    size=atoms[0][2] - atoms[0][1],
                    kind=kind,
                    members=tuple(members),
                    prunable=not reasons,
                    reason=reasons[0] if reasons else "",
                    modules=tuple(owners),
                )
            )

    def _derived_members(self, atom: Atom) -> tuple[list[ParamSlice], list[str]]:
        """Parameter slices behind a derived atom: every base unit it covers, via class-mates."""
        did, i0, i1 = atom
        sid, start, unit, period, count = self.derived[did]
        base_atoms = self.atoms([(sid, 0, self.spaces[sid].size)])
        found: list[ParamSlice] = []
        why: list[str] = []
        for j in range(count):
            lo, hi = start + j * period + i0 * unit, start + j * period + i1 * unit
            host = next((b for b in base_atoms if b[1] <= lo and hi <= b[2]), None)
            if host is None:
                why.append("units of a split axis are cut by another slice")
                continue
            for mate in self._classes[self._uf.find(host)]:
                if mate in self._fixed:
                    why.append(self._fixed[mate])
                if mate[0] in self.derived:
                    why.append("nested unit structure")
                    continue
                pos = mate[1] + (lo - host[1])
                for pname, axis, off, u in self.spaces[mate[0]].members:
                    found.append(ParamSlice(pname, axis, off + pos * u, i1 - i0, u * unit))
        return found, why

    def kept(self, segs: Sequence[Segment], keep: dict[str, list[int]]) -> int:
        """Length of ``segs`` after keeping ``keep[group]`` elements of each pruned group.

        Args:
            segs: Segments of an axis.
            keep: ``{group id: kept indices}`` of the groups that lose elements.
        """
        total = 0
        for atom in self.atoms(segs):
            gid = self.atom_group.get(atom)
            if gid in keep:
                total += len(keep[gid])
            else:
                total += atom[2] - atom[1] - self._removed_units(atom, keep)
        return total

    def _removed_units(self, atom: Atom, keep: dict[str, list[int]]) -> int:
        """Elements of ``atom`` removed because a derived space over it (or a mate) is pruned."""
        for mate in self._classes.get(self._uf.find(atom), [atom]):
            removed = 0
            for did, (sid, start, unit, period, count) in self.derived.items():
                if sid != mate[0]:
                    continue
                for d_atom in self.atoms([(did, 0, self.spaces[did].size)]):
                    gid = self.atom_group.get(d_atom)
                    if gid not in keep:
                        continue
                    kept_set = set(keep[gid])
                    for i in range(d_atom[1], d_atom[2]):
                        if i - d_atom[1] in kept_set:
                            continue
                        for j in range(count):
                            lo = start + j * period + i * unit
                            removed += max(0, min(lo + unit, mate[2]) - max(lo, mate[1]))
            if removed:
                return removed
        return 0


def length(segs: Sequence[Segment]) -> int:
    """Total number of elements covered by ``segs``."""
    return sum(e - s for _, s, e in segs)


def slice_segments(segs: Sequence[Segment], start: int, stop: int) -> list[Segment]:
    """The sub-list of ``segs`` covering elements ``start:stop``.

    Args:
        segs: Segments of an axis, in order.
        start: First element covered.
        stop: One past the last element covered.
    """
    out: list[Segment] = []
    pos = 0
    for sid, s, e in segs:
        n = e - s
        lo, hi = max(start, pos), min(stop, pos + n)
        if lo < hi:
            out.append((sid, s + lo - pos, s + hi - pos))
        pos += n
    return out
