"""Loop tree, inclusive matrices and the communication-pattern classifier.

A thread×thread matrix ``M[w, r]`` counts communication events from writer ``w`` to
reader ``r``. The classifier looks only at which cells carry at least
``threshold`` (default 10 %) of the largest cell ("edges"; this drops the
stray events of signature-memory collisions) and applies these rules in
order; the first that matches names the pattern:

1. **none**: no events at all (or no edge).
2. **broadcast / master–worker** (``broadcast``) and **reduction / gather**
   (``reduction``) as a star: one hub thread is an end of every edge. Edges only into the
   hub: reduction; otherwise (out of the hub, or both ways): broadcast / master–worker.
3. **reduction** as a tree: every thread sends to at most one other thread, the edges form
   no cycle and some thread receives from two or more (combining tree).
4. **pipeline / wavefront** (``pipeline``): all edges join consecutive ids
   ``t -> t+1`` in one direction only, without the wrap-around edge.
5. **butterfly**: every edge joins ``t`` and ``t xor 2^s``, edges go both ways, and at
   least two distinct strides ``2^s`` occur.
6. **ring**: all edges join ``t`` and ``t ± 1 (mod T)`` and the wrap-around edge
   between ``T-1`` and ``0`` is present.
7. **nearest-neighbour**: edges go both ways, every thread talks to at most four others
   and at least 90 % of events flow between ids that differ by 1 or by one other fixed
   stride (a 1-D or 2-D grid of threads).
8. **all-to-all**: at least 60 % of the ordered thread pairs carry an edge.
9. **irregular**: anything else.

Example:
    >>> import numpy as np
    >>> classify_pattern(5 * np.eye(4, k=1, dtype=int))  # t -> t+1
    'pipeline'
    >>> classify_pattern(5 * np.roll(np.eye(4, dtype=int), 1, axis=1))  # and 3 -> 0
    'ring'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcnb.commprof.instrument import Region
from hpcnb.errors import InvalidInputError

__all__ = [
    "PATTERNS",
    "LoopNode",
    "classify_pattern",
    "inclusive",
    "loop_tree",
    "render_tree",
]

#: Pattern names the classifier can return.
PATTERNS = (
    "none",
    "broadcast",
    "reduction",
    "pipeline",
    "butterfly",
    "ring",
    "nearest-neighbour",
    "all-to-all",
    "irregular",
)


def inclusive(regions: list[Region], exclusive: np.ndarray) -> np.ndarray:
    """Sum each region's matrix with those of all loops nested in it.

    Args:
        regions: Regions in id order (parents before children).
        exclusive: ``[R, T, T]`` per-region matrices attributed to the innermost region.

    Returns:
        ``[R, T, T]`` inclusive matrices (region 0 = the whole kernel).
    """
    inc = exclusive.astype(np.int64).copy()
    for r in sorted(regions, key=lambda x: x.rid, reverse=True):
        if r.parent >= 0:
            inc[r.parent] += inc[r.rid]
    return inc


def _edges(m: np.ndarray, threshold: float) -> np.ndarray:
    m = m.copy()
    np.fill_diagonal(m, 0)
    top = m.max()
    e = m >= threshold * top if top > 0 else np.zeros_like(m, bool)
    return e


def _has_cycle(e: np.ndarray) -> bool:
    T = e.shape[0]
    state = [0] * T
    for s in range(T):
        if state[s]:
            continue
        stack = [(s, 0)]
        state[s] = 1
        while stack:
            v, k = stack.pop()
            nxt = np.flatnonzero(e[v])
            if k < len(nxt):
                stack.append((v, k + 1))
                u = int(nxt[k])
                if state[u] == 1:
                    return True
                if state[u] == 0:
                    state[u] = 1
                    stack.append((u, 0))
            else:
                state[v] = 2
    return False


def classify_pattern(m: np.ndarray, threshold: float = 0.1) -> str:
    """Classify a thread×thread matrix into one of :data:`PATTERNS` (rules in module doc).

    Args:
        m: Square ``[writer, reader]`` matrix of communication events.
        threshold: Share of the largest cell below which a cell is not an edge.

    Returns:
        The pattern's name.

    Raises:
        InvalidInputError: ``m`` is not a square matrix.
    """
    m = np.asarray(m, dtype=float)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise InvalidInputError(f"expected a square thread x thread matrix, got shape {m.shape}")
    T = m.shape[0]
    e = _edges(m, threshold)
    n_edges = int(e.sum())
    if n_edges == 0:
        return "none"
    w, r = np.nonzero(e)
    pairs = list(zip(w.tolist(), r.tolist(), strict=True))
    for hub in range(T):
        if all(hub in p for p in pairs) and n_edges >= 2:
            return "reduction" if all(b == hub for _, b in pairs) else "broadcast"
    out_deg, in_deg = e.sum(axis=1), e.sum(axis=0)
    if out_deg.max() <= 1 and in_deg.max() >= 2 and not _has_cycle(e):
        return "reduction"
    fwd = all(b == a + 1 for a, b in pairs)
    bwd = all(a == b + 1 for a, b in pairs)
    if fwd or bwd:
        return "pipeline"
    sym = e | e.T
    both = (e & e.T).sum() / max(1, n_edges)
    xor = [a ^ b for a, b in pairs]
    if all(x & (x - 1) == 0 for x in xor) and len(set(xor)) >= 2 and both >= 0.9:
        return "butterfly"
    ringish = all((b - a) % T in (1, T - 1) for a, b in pairs)
    if ringish and T > 2 and (e[T - 1, 0] or e[0, T - 1]):
        return "ring"
    if both >= 0.9 and sym.sum(axis=1).max() <= 4:
        d = np.abs(np.subtract.outer(np.arange(T), np.arange(T)))
        tot = m.sum()
        on1 = m[d == 1].sum()
        best = max((m[d == s].sum() for s in range(2, T)), default=0.0)
        if (on1 + best) >= 0.9 * tot:
            return "nearest-neighbour"
    if n_edges >= 0.6 * T * (T - 1):
        return "all-to-all"
    return "irregular"


@dataclass(frozen=True)
class LoopNode:
    """A node of the loop tree: a region with its communication and pattern.

    Attributes:
        region: The region.
        depth: Nesting depth (0 for the kernel).
        exclusive: Events attributed to this loop itself.
        inclusive: Events of this loop and the loops nested in it.
        accesses: Reads plus writes executed in this loop itself.
        pattern: Classifier output on the inclusive matrix.
        matrix: The inclusive thread×thread matrix.
    """

    region: Region
    depth: int
    exclusive: int
    inclusive: int
    accesses: int
    pattern: str
    matrix: np.ndarray


def loop_tree(
    regions: list[Region], exclusive: np.ndarray, accesses: np.ndarray | None = None
) -> list[LoopNode]:
    """Return the loop tree in pre-order, one :class:`LoopNode` per region.

    Args:
        regions: The kernel's regions (parents before children).
        exclusive: Exclusive events per region, ``[region, writer, reader]``.
        accesses: ``[region, 0=reads / 1=writes]`` access counts (0 for all when ``None``).
    """
    inc = inclusive(regions, exclusive)
    children: dict[int, list[Region]] = {}
    for r in regions:
        children.setdefault(r.parent, []).append(r)
    out: list[LoopNode] = []

    def walk(r: Region, depth: int) -> None:
        acc = int(accesses[r.rid].sum()) if accesses is not None else 0
        out.append(
            LoopNode(
                r,
                depth,
                int(exclusive[r.rid].sum()),
                int(inc[r.rid].sum()),
                acc,
                classify_pattern(inc[r.rid]),
                inc[r.rid],
            )
        )
        for c in sorted(children.get(r.rid, []), key=lambda x: x.line):
            walk(c, depth + 1)

    for root in children.get(-1, []):
        walk(root, 0)
    return out


def render_tree(nodes: list[LoopNode]) -> str:
    """Format a loop tree as indented text lines."""
    lines = []
    for n in nodes:
        pad = "  " * n.depth
        lines.append(
            f"{pad}L{n.region.line:<4} {n.region.text:<40.40} incl={n.inclusive:<7} "
            f"excl={n.exclusive:<7} acc={n.accesses:<8} {n.pattern}"
        )
    return "\n".join(lines)
