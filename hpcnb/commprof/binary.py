"""What a compiled program says about itself: functions, globals, line table and loops.

:func:`read_binary` reads an ELF executable built with ``-g`` through GNU binutils (no
Python ELF library is needed): ``nm -lS`` gives the functions and the global and static
data objects with their sizes and the file:line of their definitions, ``objdump
--dwarf=decodedline`` gives the line table (instruction address -> file:line), and
``objdump -d`` gives the instructions, from which loops are recovered.

Loops from back edges (the textbook construction): each function's
instructions are cut into basic blocks, the control-flow graph links them by direct jumps
and fall-through, dominators come from ``networkx.immediate_dominators``, an edge
``u -> h`` whose target ``h`` dominates ``u`` is a back edge, and its natural loop is ``h``
plus every block that reaches ``u`` without passing through ``h`` (a backward jump that is
not a back edge, e.g. to a shared exit block, is no loop). The loop's source line is the
line of its latch branch, which gcc attributes to the loop's ``for``/``while`` header (the
condition and increment). Loops of the same function that map to the same file:line are one
source loop (a loop the compiler versioned or peeled); loops nest when one's body holds
the other's. An instruction belongs to the innermost loop whose body holds it. Indirect
jumps (switch tables) have no known targets, so loops through them are missed.

Addresses are those of the file (a position-independent executable is loaded at a bias
that the profiler learns at run time, :mod:`hpcnb.commprof.valgrind`).
"""

from __future__ import annotations

import bisect
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcnb.errors import HpcnbError

__all__ = [
    "BINUTILS",
    "BinaryError",
    "BinaryInfo",
    "DataSymbol",
    "Function",
    "Loop",
    "NoDebugInfoError",
    "read_binary",
]

#: The binutils programs :func:`read_binary` runs.
BINUTILS = ("nm", "objdump", "readelf")

_TIMEOUT = 120.0
_FUNC = re.compile(r"^([0-9a-f]+) <(.+)>:$")
_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
_TARGET = re.compile(r"^([0-9a-f]+) <")
_LINE = re.compile(r"^(\S+)\s+(\d+)\s+(0x[0-9a-f]+)")
_NM = re.compile(r"^([0-9a-f]+) ([0-9a-f]+) ([A-Za-z]) (\S+)(?:\t(\S+):(\d+))?$")


class BinaryError(HpcnbError, ValueError):
    """A program file cannot be read (not an ELF executable, or a binutils tool failed)."""


class NoDebugInfoError(BinaryError):
    """The program has no debug line table: it was not built with ``-g``."""


@dataclass(frozen=True)
class Function:
    """A function of the program (file addresses ``[lo, hi)``)."""

    name: str
    lo: int
    hi: int


@dataclass(frozen=True)
class DataSymbol:
    """A global or static data object of the program.

    Attributes:
        name: Symbol name.
        address: File address.
        size: Bytes.
        site: ``file:line`` of its definition (``"?"`` when the debug info has none).
    """

    name: str
    address: int
    size: int
    site: str


@dataclass(frozen=True)
class Loop:
    """A source loop recovered from back edges.

    Attributes:
        index: Loop number (order of the header address).
        function: Enclosing function.
        file: Source file of the latch branch.
        line: Source line of the latch branch (the loop header's line).
        ranges: Address ranges ``[(first, last instruction)]`` of the loop body's blocks
            (all natural loops of the same header and source line together).
        parent: Index of the enclosing loop, or -1.
    """

    index: int
    function: str
    file: str
    line: int
    ranges: tuple[tuple[int, int], ...]
    parent: int

    @property
    def location(self) -> str:
        """``file:line`` of the loop."""
        return f"{self.file}:{self.line}"


@dataclass
class BinaryInfo:
    """Functions, data symbols, line table and loops of one executable.

    Attributes:
        path: The executable.
        pie: Whether it is position independent (loaded at a bias).
        functions: Functions sorted by address.
        symbols: Global and static data objects (non-empty ones).
        line_addresses: Sorted start addresses of the line-table rows.
        line_rows: ``(file, line)`` of each row.
        loops: Recovered loops, parents before children.
    """

    path: str
    pie: bool
    functions: list[Function]
    symbols: list[DataSymbol]
    line_addresses: list[int]
    line_rows: list[tuple[str, int]]
    loops: list[Loop]
    _fn_lo: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.functions.sort(key=lambda f: f.lo)
        self._fn_lo = [f.lo for f in self.functions]

    @property
    def text_range(self) -> tuple[int, int]:
        """File addresses ``[lo, hi)`` spanned by the program's functions."""
        return (self.functions[0].lo, self.functions[-1].hi) if self.functions else (0, 0)

    def function_at(self, addr: int) -> str:
        """Name of the function holding file address ``addr`` (``"?"`` outside all)."""
        k = bisect.bisect_right(self._fn_lo, addr) - 1
        if k >= 0 and addr < self.functions[k].hi:
            return self.functions[k].name
        return "?"

    def line_at(self, addr: int) -> tuple[str, int]:
        """``(file, line)`` of file address ``addr`` from the line table (``("?", 0)``)."""
        k = bisect.bisect_right(self.line_addresses, addr) - 1
        return self.line_rows[k] if k >= 0 else ("?", 0)

    def site(self, addr: int) -> str:
        """``file:line (function)`` of a file address."""
        file, line = self.line_at(addr)
        return f"{file}:{line} ({self.function_at(addr)})"

    def loop_at(self, addr: int) -> int:
        """Index of the innermost loop holding file address ``addr``, or -1."""
        best, width = -1, None
        for lp in self.loops:
            if any(lo <= addr <= hi for lo, hi in lp.ranges):
                w = sum(hi - lo + 1 for lo, hi in lp.ranges)
                if width is None or w < width:
                    best, width = lp.index, w
        return best

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form (for recorded runs)."""
        return {
            "path": self.path,
            "pie": self.pie,
            "functions": [asdict(f) for f in self.functions],
            "symbols": [asdict(s) for s in self.symbols],
            "line_addresses": self.line_addresses,
            "line_rows": [list(r) for r in self.line_rows],
            "loops": [asdict(lp) for lp in self.loops],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BinaryInfo:
        """Inverse of :meth:`to_dict`.

        Args:
            d: The dictionary, as :meth:`to_dict` wrote it or read back from JSON.
        """
        loops = [Loop(**{**x, "ranges": tuple(tuple(r) for r in x["ranges"])}) for x in d["loops"]]
        return cls(
            path=str(d["path"]),
            pie=bool(d["pie"]),
            functions=[Function(**x) for x in d["functions"]],
            symbols=[DataSymbol(**x) for x in d["symbols"]],
            line_addresses=[int(a) for a in d["line_addresses"]],
            line_rows=[(str(f), int(n)) for f, n in d["line_rows"]],
            loops=loops,
        )


def _tool(cmd: list[str], what: Path) -> str:
    from hpcnb.launch import LaunchError, run_bounded

    if shutil.which(cmd[0]) is None:
        raise BinaryError(f"{cmd[0]} not found: install binutils (apt-get install binutils)")
    try:
        res = run_bounded(cmd, timeout=_TIMEOUT)
    except LaunchError as exc:
        raise BinaryError(f"{what}: {cmd[0]} failed: {exc}") from None
    if res.returncode != 0:
        raise BinaryError(f"{what}: {' '.join(cmd)} failed: {res.stderr.strip()[-500:]}")
    return res.stdout


def _header(path: Path) -> bool:
    """Check the ELF header; return whether the file is position independent."""
    with path.open("rb") as fh:
        head = fh.read(18)
    if head[:4] != b"\x7fELF":
        raise BinaryError(f"{path}: not an ELF executable (compile the program first)")
    etype = int.from_bytes(head[16:18], "little")
    if etype not in (2, 3):
        raise BinaryError(f"{path}: ELF type {etype} is not an executable")
    return etype == 3


def _line_table(path: Path) -> tuple[list[int], list[tuple[str, int]]]:
    rows: list[tuple[int, str, int]] = []
    for ln in _tool(["objdump", "--dwarf=decodedline", str(path)], path).splitlines():
        m = _LINE.match(ln)
        if m:
            rows.append((int(m.group(3), 16), m.group(1), int(m.group(2))))
    rows.sort(key=lambda r: r[0])
    addrs: list[int] = []
    out: list[tuple[str, int]] = []
    for a, f, n in rows:
        if addrs and addrs[-1] == a:
            out[-1] = (f, n)  # the last row at an address wins (objdump's view order)
        else:
            addrs.append(a)
            out.append((f, n))
    return addrs, out


def _symbols(path: Path) -> tuple[list[Function], list[DataSymbol]]:
    funcs, data = [], []
    text = _tool(["nm", "-lS", "--defined-only", str(path)], path)
    for ln in text.splitlines():
        m = _NM.match(ln)
        if not m:
            continue
        addr, size, kind, name = int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4)
        if size == 0:
            continue
        if kind in "Tt":
            funcs.append(Function(name, addr, addr + size))
        elif kind in "BbDdRr" and m.group(5):
            # only objects the debug info places in the program's own sources
            site = f"{Path(m.group(5)).name}:{m.group(6)}"
            data.append(DataSymbol(name, addr, size, site))
    return funcs, data


_PREFIXES = {
    "notrack",
    "bnd",
    "rep",
    "repz",
    "repe",
    "repnz",
    "repne",
    "lock",
    "data16",
    "cs",
    "ds",
}
_ENDS = ("ret", "hlt", "ud2")


def _instructions(path: Path, funcs: list[Function]) -> dict[str, list[tuple[int, str, int]]]:
    """Per function: ``(address, mnemonic, direct jump target or -1)`` of each instruction."""
    names = {f.name for f in funcs}
    out: dict[str, list[tuple[int, str, int]]] = {}
    current: list[tuple[int, str, int]] | None = None
    for ln in _tool(["objdump", "-d", "--no-show-raw-insn", str(path)], path).splitlines():
        m = _FUNC.match(ln)
        if m:
            current = out.setdefault(m.group(2), []) if m.group(2) in names else None
            continue
        if current is None:
            continue
        m = _INSN.match(ln)
        if not m:
            continue
        words = m.group(2).split()
        while words and words[0] in _PREFIXES:
            words = words[1:]
        if not words:
            continue
        mnem = words[0]
        t = _TARGET.match(" ".join(words[1:])) if len(words) > 1 else None
        current.append((int(m.group(1), 16), mnem, int(t.group(1), 16) if t else -1))
    return out


def _dominators(order: list[int], preds: dict[int, list[int]]) -> dict[int, set[int]]:
    """Dominator sets of the blocks of ``order`` (reverse post-order, entry first).

    The immediate dominators come from :func:`networkx.immediate_dominators`; a block's
    dominators are itself plus those of its immediate dominator, which reverse
    post-order visits first.
    """
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(order)
    graph.add_edges_from((u, v) for v in order for u in preds[v])
    idom = nx.immediate_dominators(graph, order[0])
    dom: dict[int, set[int]] = {}
    for v in order:
        parent = idom.get(v, v)
        dom[v] = {v} if parent == v else dom[parent] | {v}
    return dom


def _natural_loops(
    insns: list[tuple[int, str, int]], lo: int, hi: int
) -> dict[int, tuple[list[tuple[int, int]], list[int]]]:
    """Natural loops of one function: header -> (body address ranges, latch branches).

    Blocks start at the function entry, at direct jump targets inside the function and
    after every jump or return. Successors: a conditional jump's target and fall-through,
    an unconditional jump's target, nothing after a return (or an indirect jump, whose
    targets objdump does not show). Dominators from :func:`_dominators`; an edge
    ``u -> h`` is a back edge when ``h`` dominates ``u``, and its natural loop is
    ``h`` plus every block that reaches ``u`` without passing through ``h``.
    """
    if not insns:
        return {}
    addrs = [a for a, _, _ in insns]
    leaders = {addrs[0]}
    for k, (_a, mnem, tgt) in enumerate(insns):
        if mnem.startswith(("j", "loop")) or mnem.startswith(_ENDS):
            if lo <= tgt < hi:
                leaders.add(tgt)
            if k + 1 < len(insns):
                leaders.add(addrs[k + 1])
    starts = sorted(x for x in leaders if x in set(addrs))
    index = {a: k for k, a in enumerate(addrs)}
    blocks: dict[int, tuple[int, list[int]]] = {}  # start -> (last insn address, successors)
    for b, s in enumerate(starts):
        end_k = (index[starts[b + 1]] if b + 1 < len(starts) else len(insns)) - 1
        last, mnem, tgt = insns[end_k]
        nxt = starts[b + 1] if b + 1 < len(starts) else None
        succ: list[int] = []
        if mnem.startswith(("j", "loop")):
            if tgt in blocks or lo <= tgt < hi:
                succ.append(tgt)
            if mnem != "jmp" and nxt is not None:
                succ.append(nxt)
        elif not mnem.startswith(_ENDS) and nxt is not None:
            succ.append(nxt)
        blocks[s] = (last, [x for x in succ if x in index and x in leaders])
    # reachable blocks in reverse post-order
    order: list[int] = []
    seen: set[int] = set()
    stack = [(starts[0], 0)]
    seen.add(starts[0])
    while stack:
        v, i = stack.pop()
        succ = blocks[v][1]
        if i < len(succ):
            stack.append((v, i + 1))
            if succ[i] not in seen:
                seen.add(succ[i])
                stack.append((succ[i], 0))
        else:
            order.append(v)
    order.reverse()
    pos = {v: k for k, v in enumerate(order)}
    preds: dict[int, list[int]] = {v: [] for v in order}
    for v in order:
        for w in blocks[v][1]:
            if w in preds:
                preds[w].append(v)
    dom = _dominators(order, preds)
    loops: dict[int, tuple[set[int], list[int]]] = {}
    for u in order:
        for h in blocks[u][1]:
            if h in pos and h in dom[u]:
                body, work = {h, u}, [u]
                while work:
                    x = work.pop()
                    if x == h:
                        continue
                    for y in preds[x]:
                        if y not in body:
                            body.add(y)
                            work.append(y)
                entry = loops.setdefault(h, (set(), []))
                entry[0].update(body)
                entry[1].append(blocks[u][0])
    # body blocks as address ranges, adjacent blocks merged
    following = {addrs[k]: addrs[k + 1] for k in range(len(addrs) - 1)}
    out: dict[int, tuple[list[tuple[int, int]], list[int]]] = {}
    for h, (body, latches) in loops.items():
        ranges: list[tuple[int, int]] = []
        for b in sorted(body):
            last = blocks[b][0]
            if ranges and following.get(ranges[-1][1]) == b:
                ranges[-1] = (ranges[-1][0], last)
            else:
                ranges.append((b, last))
        out[h] = (ranges, latches)
    return out


def _loops(path: Path, funcs: list[Function], info: BinaryInfo) -> list[Loop]:
    code = _instructions(path, funcs)
    found: list[tuple[str, str, int, list[tuple[int, int]]]] = []
    for f in funcs:
        for ranges, latches in _natural_loops(code.get(f.name, []), f.lo, f.hi).values():
            file, line = info.line_at(max(latches))
            found.append((f.name, file, line, ranges))
    groups: dict[tuple[str, str, int], set[tuple[int, int]]] = {}
    for fn, file, line, ranges in found:
        groups.setdefault((fn, file, line), set()).update(ranges)  # versions of one loop
    order = sorted(groups.items(), key=lambda kv: (min(r[0] for r in kv[1]), kv[0]))
    loops = [
        Loop(k, fn, file, line, tuple(sorted(ranges)), -1)
        for k, ((fn, file, line), ranges) in enumerate(order)
    ]
    bodies = [set(a for lo, hi in lp.ranges for a in range(lo, hi + 1)) for lp in loops]

    def width(k: int) -> int:
        return len(bodies[k])

    parent: dict[int, int] = {}
    for k, lp in enumerate(loops):
        outer = [
            q
            for q, other in enumerate(loops)
            if q != k and other.function == lp.function and bodies[k] < bodies[q]
        ]
        parent[k] = min(outer, key=width) if outer else -1
    depth = {}
    for k in range(len(loops)):
        d, p = 0, parent[k]
        while p >= 0:
            d, p = d + 1, parent[p]
        depth[k] = d
    ranked = sorted(range(len(loops)), key=lambda k: (depth[k], loops[k].ranges[0][0]))
    new = {k: i for i, k in enumerate(ranked)}
    return [
        Loop(
            new[k],
            loops[k].function,
            loops[k].file,
            loops[k].line,
            loops[k].ranges,
            new[parent[k]] if parent[k] >= 0 else -1,
        )
        for k in ranked
    ]


def read_binary(path: str | Path) -> BinaryInfo:
    """Read functions, data symbols, the line table and loops of an executable.

    Args:
        path: The executable (built with ``-g``).

    Raises:
        BinaryError: Not an ELF executable, or a binutils tool is missing or fails.
        NoDebugInfoError: The program has no line table (rebuild it with ``-g``).
    """
    p = Path(path)
    if not p.is_file():
        raise BinaryError(f"{p}: no such program file")
    pie = _header(p)
    funcs, data = _symbols(p)
    addrs, rows = _line_table(p)
    if not addrs:
        raise NoDebugInfoError(
            f"{p}: no debug line table (.debug_line): build the program with -g "
            "(e.g. gcc -g -O1 -pthread prog.c -o prog) so that accesses map to source lines"
        )
    info = BinaryInfo(str(p), pie, funcs, data, addrs, rows, [])
    info.loops = _loops(p, funcs, info)
    return info
