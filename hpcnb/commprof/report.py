"""Tables and files of a program's communication profile: matrix, objects, loops, report.

:func:`object_table` classifies every data object by how threads share it, word by word
(``word_bytes`` words of the profile):

* ``unused``: no thread touched it;
* ``private``: one thread touched it;
* ``partitioned``: several threads, but every word was touched by one thread only;
* ``read-shared``: some words were touched by several threads, none of them written;
* ``single-writer``: every word touched by several threads has at most one writer
  (producer–consumer, broadcast);
* ``multi-writer``: some word is written by two or more threads.

A cache line (``line_bytes``, 64) of an object is *falsely shared* when two threads touch
it, one of them writes it, and the two never touch the same word of it: their traffic on
that line is only coherence, no data flows between them (a third thread, say the main
thread reading every result at the end, does not change that).

:func:`write_outputs` writes ``communication.csv`` (rows: writer thread, columns: reader
thread; words read by the column thread that the row thread wrote last), ``objects.csv``,
``loops.csv`` and ``report.md`` into a folder.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcnb.commprof.analysis import classify_pattern, loop_tree
from hpcnb.commprof.valgrind import ProgramProfile

__all__ = [
    "SHARING_CLASSES",
    "LoopRow",
    "ObjectRow",
    "active_threads",
    "loop_pattern",
    "loop_table",
    "object_table",
    "write_outputs",
]

SHARING_CLASSES = (
    "unused",
    "private",
    "partitioned",
    "read-shared",
    "single-writer",
    "multi-writer",
)


@dataclass(frozen=True)
class ObjectRow:
    """One data object's sharing summary.

    Attributes:
        name: Object name.
        kind: ``global``, ``heap`` or ``stack``.
        site: Definition or allocation site.
        bytes: Size.
        threads: Threads that touched it.
        sharing: One of :data:`SHARING_CLASSES`.
        false_sharing_lines: Falsely shared cache lines.
        events: Communication events on its words.
    """

    name: str
    kind: str
    site: str
    bytes: int
    threads: int
    sharing: str
    false_sharing_lines: int
    events: int


@dataclass(frozen=True)
class LoopRow:
    """One recovered loop with its communication and pattern."""

    location: str
    function: str
    depth: int
    accesses: int
    events: int
    pattern: str


def _popcount(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    return np.array([bin(int(v)).count("1") for v in x], np.int64)


def _events_per_element(pp: ProgramProfile) -> np.ndarray:
    """Communication events per element (same rule as the exact shadow memory)."""
    tr = pp.profile.trace
    n = pp.profile.n_elements
    out = np.zeros(n, np.int64)
    if tr is None or not len(tr):
        return out
    writer = np.full(n, -1, np.int64)
    seen = np.zeros(n, np.uint64)
    for t, e, w in zip(tr[:, 0].tolist(), tr[:, 2].tolist(), tr[:, 4].tolist(), strict=True):
        if w:
            writer[e] = t
            seen[e] = 0
        elif writer[e] >= 0 and writer[e] != t and not int(seen[e]) >> t & 1:
            seen[e] = int(seen[e]) | (1 << t)
            out[e] += 1
    return out


def _falsely_shared(access: np.ndarray, write: np.ndarray, nthreads: int) -> bool:
    """Whether two threads touch a line's words, one writing, without a word in common."""
    words = [{w for w, m in enumerate(access.tolist()) if int(m) >> t & 1} for t in range(nthreads)]
    writes = [any(int(m) >> t & 1 for m in write.tolist()) for t in range(nthreads)]
    for t in range(nthreads):
        if not writes[t] or not words[t]:
            continue
        for u in range(nthreads):
            if u != t and words[u] and not words[t] & words[u]:
                return True
    return False


def object_table(pp: ProgramProfile, line_bytes: int = 64) -> list[ObjectRow]:
    """Sharing class, falsely shared lines and events of every object (module docstring).

    Args:
        pp: The program's profile.
        line_bytes: Cache-line size for false sharing.
    """
    tr = pp.profile.trace
    n = pp.profile.n_elements
    wmask = np.zeros(n, np.uint64)
    amask = np.zeros(n, np.uint64)
    if tr is not None and len(tr):
        bits = np.left_shift(np.uint64(1), tr[:, 0].astype(np.uint64))
        np.bitwise_or.at(amask, tr[:, 2], bits)
        wr = tr[:, 4] == 1
        np.bitwise_or.at(wmask, tr[wr, 2], bits[wr])
    events = _events_per_element(pp)
    wb = pp.word_bytes
    rows = []
    for o in pp.objects:
        nw = -(-o.size // wb)
        sl = slice(o.first, o.first + nw)
        a, w = amask[sl], wmask[sl]
        union = int(np.bitwise_or.reduce(a)) if nw else 0
        nthreads = bin(union).count("1")
        na, nwr = _popcount(a), _popcount(w)
        multi = na >= 2
        if nthreads == 0:
            cls = "unused"
        elif nthreads == 1:
            cls = "private"
        elif not multi.any():
            cls = "partitioned"
        elif (nwr >= 2).any():
            cls = "multi-writer"
        elif (nwr[multi] == 0).all():
            cls = "read-shared"
        else:
            cls = "single-writer"
        fs = 0
        if nthreads >= 2:
            lines = (o.address + np.arange(nw) * wb) // line_bytes
            for ln in np.unique(lines[(a != 0)]):
                k = np.flatnonzero(lines == ln)
                fs += _falsely_shared(a[k], w[k], pp.nthreads)
        rows.append(
            ObjectRow(o.name, o.kind, o.site, o.size, nthreads, cls, fs, int(events[sl].sum()))
        )
    return rows


def active_threads(pp: ProgramProfile) -> np.ndarray:
    """``[region, thread]``: whether the thread accessed an object in the region or a loop in it."""
    p = pp.profile
    act = np.zeros((len(p.regions), p.nthreads), bool)
    if p.trace is not None and len(p.trace):
        act[p.trace[:, 1], p.trace[:, 0]] = True
    for r in sorted(p.regions, key=lambda x: x.rid, reverse=True):
        if r.parent >= 0:
            act[r.parent] |= act[r.rid]
    return act


def loop_pattern(
    pp: ProgramProfile, rid: int, matrix: np.ndarray, active: np.ndarray | None = None
) -> str:
    """Pattern of a region's matrix among the threads active in it.

    Active: threads that accessed an object in the region, or whose writes were read in it.
    A pthreads program's main thread often only creates and joins the workers; classifying
    the workers' sub-matrix names the pattern the workers form (as the Numba profiler,
    whose virtual threads are all workers, does).

    Args:
        pp: The program's profile.
        rid: The region.
        matrix: The region's ``[writer, reader]`` matrix.
        active: Mask of the active threads (found from the trace when ``None``).
    """
    act_r = (active_threads(pp) if active is None else active)[rid]
    act = np.flatnonzero(act_r | (matrix.sum(axis=0) > 0) | (matrix.sum(axis=1) > 0))
    if len(act) < 2:
        return classify_pattern(matrix)
    return classify_pattern(matrix[np.ix_(act, act)])


def loop_table(pp: ProgramProfile) -> list[LoopRow]:
    """Every recovered loop (pre-order) with its inclusive events and pattern."""
    p = pp.profile
    act = active_threads(pp)
    out = []
    for node in loop_tree(p.regions, p.exact, p.accesses):
        if node.region.rid == 0:
            continue
        lp = pp.binary.loops[node.region.rid - 1]
        pattern = loop_pattern(pp, node.region.rid, node.matrix, act)
        out.append(
            LoopRow(lp.location, lp.function, node.depth, node.accesses, node.inclusive, pattern)
        )
    return out


def _write_csv(path: Path, header: list[str], rows: Sequence[Sequence[str | int]]) -> None:
    with path.open("w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(header)
        wr.writerows(rows)


def write_outputs(pp: ProgramProfile, out: str | Path, threads_hint: int | None = None) -> Path:
    """Write ``communication.csv``, ``objects.csv``, ``loops.csv`` and ``report.md``.

    Args:
        pp: The program's profile.
        out: Folder to write into (created).
        threads_hint: Threads expected; the report names a mismatch.

    Returns:
        The folder.
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    m = pp.matrix()
    T = m.shape[0]
    _write_csv(
        folder / "communication.csv",
        ["writer\\reader", *map(str, range(T))],
        [[t, *m[t].tolist()] for t in range(T)],
    )
    objs = object_table(pp)
    _write_csv(
        folder / "objects.csv",
        ["object", "kind", "site", "bytes", "threads", "sharing", "false_sharing_lines", "events"],
        [
            [o.name, o.kind, o.site, o.bytes, o.threads, o.sharing, o.false_sharing_lines, o.events]
            for o in objs
        ],
    )
    loops = loop_table(pp)
    _write_csv(
        folder / "loops.csv",
        ["loop", "function", "depth", "accesses", "events", "pattern"],
        [[r.location, r.function, r.depth, r.accesses, r.events, r.pattern] for r in loops],
    )
    lines = [
        f"# Communication profile of `{' '.join(pp.command)}`",
        "",
        f"Threads: {pp.nthreads} (main thread 0, others in creation order; valgrind slots "
        f"{pp.valgrind_threads}). Words of {pp.word_bytes} bytes.",
    ]
    if threads_hint is not None and threads_hint != len(pp.valgrind_threads):
        lines.append(
            f"**Note:** {len(pp.valgrind_threads)} threads ran, {threads_hint} were expected."
        )
    lines += [
        "",
        f"Communicated words: {int(m.sum())}; whole-program pattern among the active threads: "
        f"**{loop_pattern(pp, 0, m)}**.",
        "",
        "## Matrix (rows write, columns read)",
        "",
        "| w\\r | " + " | ".join(map(str, range(T))) + " |",
        "|---" * (T + 1) + "|",
        *[f"| {t} | " + " | ".join(map(str, m[t].tolist())) + " |" for t in range(T)],
        "",
        "## Data objects",
        "",
        "| object | site | bytes | threads | sharing | false-sharing lines | events |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {o.name} | {o.site} | {o.bytes} | {o.threads} | {o.sharing} | "
            f"{o.false_sharing_lines} | {o.events} |"
            for o in objs
            if o.threads
        ],
        "",
        "## Loops",
        "",
        "| loop | function | depth | accesses | events | pattern |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r.location} | {r.function} | {r.depth} | {r.accesses} | {r.events} | {r.pattern} |"
            for r in loops
        ],
    ]
    fs = [o for o in objs if o.false_sharing_lines]
    if fs:
        lines += ["", "## Advice", ""]
        lines += [
            f"* `{o.name}` ({o.site}): {o.false_sharing_lines} cache line(s) written by one "
            "thread and touched by another on different words (false sharing): pad each "
            "thread's part to a cache line (e.g. `_Alignas(64)`) or accumulate in a private "
            "variable and write once."
            for o in fs
        ]
    (folder / "report.md").write_text("\n".join(lines) + "\n")
    return folder
