"""Profile an unmodified pthreads or OpenMP program under valgrind (lackey).

The program is any executable built with ``-g``; nothing in it changes. Four sources of
facts are joined (our own design, documented here):

1. **valgrind's lackey tool** (``--trace-mem=yes``) writes every instruction address
   (``I``) and data access (``L``/``S``/``M`` address,size) the program executes; with
   ``--trace-sched=yes`` valgrind's scheduler writes ``SCHED[n]: acquired lock`` whenever
   its thread ``n`` starts running (valgrind runs one guest thread at a time), and with
   ``--trace-syscalls=yes`` every ``clone`` system call with its arguments. Lackey was
   chosen because its output is plain text with the instruction address before every data
   access, which is all a communication profile needs; it is a standard valgrind tool.
2. **Threads** are numbered in creation order, main thread 0: a ``clone`` of a new thread
   (flags with ``CLONE_THREAD``) takes the next number; the valgrind thread whose
   ``starting new thread`` record follows is matched to it by its first stack access,
   which lies at the ``child_stack`` argument of that clone (oldest pending clone when no
   stack matches; a thread that runs before its clone record takes the next number and the
   late record is recognised by its stack). A valgrind thread slot reused after a join is a
   new thread.
3. **Data objects**: globals and statics from the symbol table
   (:mod:`hpcnb.commprof.binary`, site = the definition's file:line); heap blocks from a
   small allocation logger (``csrc/allocation_logger.c``) that the project compiles at
   first use and preloads (``LD_PRELOAD``), site = the allocation call's file:line; and a
   window of the main thread's stack (``STACK_WINDOW`` bytes below the logger's
   constructor frame), where OpenMP programs keep shared locals. The logger writes each
   event with a sequence number to a file and stores the number to a mailbox variable, so
   the mailbox stores in the trace say when (and in which thread) an object came to life.
   Only heap blocks allocated from the program's own code are objects (not libc's or
   libgomp's internal ones).
4. **Code locations and loops**: the last instruction a thread executed inside the program
   (not in a library) gives the access's file:line, function and innermost loop, from the
   line table and the back edges of :mod:`hpcnb.commprof.binary`; an access in ``memset``
   called from a loop belongs to that loop.

Accesses to objects are split into words of ``word_bytes`` (8) and replayed, in trace
order, through the exact shadow memory of the Numba profiler
(:func:`hpcnb.commprof.shadow.replay_exact`): a communication event is a word read by one
thread that another thread wrote last (counted once per write and reader). OpenMP
programs are run with ``OMP_WAIT_POLICY=passive`` (unless set) so idle threads sleep
instead of spinning through millions of traced instructions.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hpcnb.commprof.binary import BINUTILS, BinaryInfo, read_binary
from hpcnb.commprof.instrument import Region
from hpcnb.commprof.runtime import MemoryConfig, Profile
from hpcnb.errors import HpcnbError

if TYPE_CHECKING:
    from hpcnb.launch import ProcessTree

__all__ = [
    "MAX_LOG_BYTES",
    "OUTPUT_TAIL_BYTES",
    "STACK_WINDOW",
    "DataObject",
    "ProgramProfile",
    "TraceError",
    "TraceRun",
    "allocation_logger",
    "filter_trace",
    "missing_tools",
    "parse_trace",
    "profile_program",
    "recorded_run",
    "run_program",
    "save_run",
]

#: Bytes of the main thread's stack below the logger's constructor frame taken as an object.
STACK_WINDOW = 1 << 20
#: Default limit on the size of a lackey log (bytes), enforced while valgrind runs: use
#: smaller inputs beyond it (the parse holds the log and one tuple per word access in
#: memory, a few times the log's size).
MAX_LOG_BYTES = 256 << 20
#: Bytes of the end of the program's standard output (and error) kept in a
#: :class:`TraceRun`; the whole output streams to a temporary file during the run.
OUTPUT_TAIL_BYTES = 64 << 10
#: Seconds between two looks at the lackey log's size while valgrind runs.
_POLL_S = 0.2
#: Recorded run shipped with the package (a 4-thread ring exchange, ``csrc/ring.c``).
RECORDED = "ring_t4"
_PIE_BASE = 0x108000  # where valgrind loads a position-independent main executable
_CLONE_VM, _CLONE_THREAD = 0x100, 0x10000

_SCHED_START = re.compile(r"SCHED\[(\d+)\]:\s+acquired lock \(thread_wrapper\(starting new")
_SCHED_EXIT = re.compile(r"SCHED\[(\d+)\]: release lock in VG_\(exit_thread\)")
_CLONE = re.compile(r"^SYSCALL\[\d+,(\d+)\]\(\d+\) sys_clone3? \( (0x)?([0-9a-f]+), 0x([0-9a-f]+)")


class TraceError(HpcnbError, RuntimeError):
    """Running or reading a valgrind trace failed (the message says what and where)."""


def missing_tools() -> list[str]:
    """Names of the tools (valgrind, gcc, binutils) that are not installed."""
    return [t for t in ("valgrind", "gcc", *BINUTILS) if shutil.which(t) is None]


def _csource(name: str) -> str:
    return resources.files("hpcnb.commprof").joinpath("csrc", name).read_text(encoding="utf-8")


def _logger_problem(so: Path, sidecar: Path) -> str | None:
    """Why the cached logger ``so`` cannot be used.

    Returns:
        ``""`` when its checksum matches, ``None`` when it has no checksum file yet (it is
        rebuilt without a warning), else the reason.
    """
    try:
        data = so.read_bytes()
        expected = sidecar.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        return f"it cannot be read ({exc})"
    if data[:4] != b"\x7fELF":
        return "it is not an ELF shared object"
    if hashlib.sha256(data).hexdigest() != expected:
        return "its SHA-256 differs from the one recorded when it was built"
    return ""


def allocation_logger() -> Path:
    """Compile the allocation logger (once per source and machine) and return the ``.so``.

    Cached under ``hpcnb.paths.cache_dir("commprof")`` keyed by the source's hash and
    :func:`hpcnb.paths.machine_key`, next to ``<name>.so.sha256``, the SHA-256 of the
    ``.so`` as built. A cached file whose checksum does not match (truncated, altered) is
    rebuilt with a warning naming it; one without a checksum file is rebuilt quietly. The
    compiler writes into a private temporary file that is then moved into place
    atomically, so processes building at once all succeed.

    Raises:
        TraceError: gcc is missing or fails.
    """
    from hpcnb.codecache import atomic_write
    from hpcnb.launch import run_bounded
    from hpcnb.paths import cache_dir, machine_key

    src = _csource("allocation_logger.c")
    key = hashlib.sha256((src + machine_key()).encode()).hexdigest()[:16]
    folder = cache_dir("commprof")
    out = folder / f"allocation_logger-{key}.so"
    sidecar = folder / f"{out.name}.sha256"
    if out.exists():
        problem = _logger_problem(out, sidecar)
        if problem == "":
            return out
        if problem is not None:
            warnings.warn(f"cached allocation logger {out}: {problem}; rebuilding it", stacklevel=2)
    if shutil.which("gcc") is None:
        raise TraceError("gcc not found: install it (apt-get install gcc) to build the logger")
    with tempfile.TemporaryDirectory(prefix=".build-", dir=folder) as tmp:
        c = Path(tmp, "allocation_logger.c")  # fixed name: the same bytes in every build
        c.write_text(src, encoding="utf-8")
        part = Path(tmp, out.name)
        cmd = ["gcc", "-O2", "-shared", "-fPIC", str(c), "-o", str(part)]
        res = run_bounded(cmd, timeout=120)
        if res.returncode:
            raise TraceError(f"gcc failed on the allocation logger:\n{res.stderr[-2000:]}")
        digest = hashlib.sha256(part.read_bytes()).hexdigest()
        os.replace(part, out)
    atomic_write(sidecar, digest + "\n")
    return out


@dataclass
class TraceRun:
    """One traced run of a program.

    Attributes:
        log: The lackey log (memory trace, scheduler and system-call records).
        allocations: The allocation logger's output.
        binary: Functions, symbols, line table and loops of the program.
        command: The program and its arguments.
        stdout: The program's standard output, at most its last :data:`OUTPUT_TAIL_BYTES`
            bytes; a longer output starts with a ``[... N earlier bytes of stdout
            dropped ...]`` line.
        stderr: The same for its standard error.
        stdout_bytes: Bytes the program wrote to its standard output in all.
        stderr_bytes: Bytes it wrote to its standard error in all.
    """

    log: str
    allocations: str
    binary: BinaryInfo
    command: list[str]
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0


def _output_tail(path: Path, name: str, limit: int = OUTPUT_TAIL_BYTES) -> tuple[str, int]:
    """The last ``limit`` bytes of the output file ``path`` as text, and its size."""
    size = path.stat().st_size if path.is_file() else 0
    if size == 0:
        return "", 0
    with path.open("rb") as handle:
        handle.seek(max(0, size - limit))
        text = handle.read(limit).decode("utf-8", errors="replace")
    if size > limit:
        text = f"[... {size - limit} earlier bytes of {name} dropped ...]\n{text}"
    return text, size


def _too_big(prog: str, size: int, limit: int) -> TraceError:
    return TraceError(
        f"{prog}: the lackey log reached {size} bytes, over max_log_bytes={limit} "
        f"({limit / (1 << 20):g} MiB), and valgrind was stopped; run the program on a "
        "smaller input or raise the limit (max_log_bytes=..., or --max-log-mib on the "
        "command line)"
    )


def _watch(tree: ProcessTree, log: Path, max_log_bytes: int, timeout: float) -> str | int:
    """Wait for ``tree``'s command, polling the log's size every :data:`_POLL_S` seconds.

    Returns:
        The exit status, ``"log"`` once the log exceeds ``max_log_bytes`` or
        ``"timeout"`` after ``timeout`` seconds (the caller stops the tree).
    """
    import subprocess
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return tree.proc.wait(timeout=max(0.0, min(_POLL_S, left)))
        except subprocess.TimeoutExpired:
            pass
        try:
            if log.stat().st_size > max_log_bytes:
                return "log"
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            return "timeout"


def run_program(
    command: Sequence[str],
    *,
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
    max_log_bytes: int = MAX_LOG_BYTES,
) -> TraceRun:
    """Run ``command`` (an unmodified ``-g`` program and its arguments) under lackey.

    The log's size is watched while valgrind runs: as soon as it passes
    ``max_log_bytes``, valgrind and every process it started are stopped. The program's
    standard output and error go to files in the run's temporary folder, of which only
    the last :data:`OUTPUT_TAIL_BYTES` bytes are kept; the folder is removed in any case.

    Args:
        command: The program and its arguments.
        timeout: Wall-clock limit of the valgrind run (s); everything is stopped after it.
        env: Extra environment variables for the program.
        max_log_bytes: Largest lackey log allowed (bytes); the run is stopped beyond it.

    Raises:
        BinaryError: The program is not an ELF executable; NoDebugInfoError: no ``-g``.
        TraceError: valgrind is missing, fails, runs past ``timeout`` or its log grows
            past ``max_log_bytes``.
    """
    from hpcnb.launch import ProcessTree

    if not command:
        raise TraceError("no program given")
    if max_log_bytes <= 0:
        raise ValueError(f"max_log_bytes={max_log_bytes}: expected a positive size")
    prog = shutil.which(command[0]) or command[0]
    binary = read_binary(prog)  # a clear error for a missing file or a build without -g
    if shutil.which("valgrind") is None:
        raise TraceError("valgrind not found: install it (apt-get install valgrind)")
    logger = allocation_logger()
    with tempfile.TemporaryDirectory(prefix="commprof-") as tmp:
        log, alloc = Path(tmp, "lackey.log"), Path(tmp, "alloc.log")
        out_path, err_path = Path(tmp, "stdout"), Path(tmp, "stderr")
        run_env = dict(os.environ)
        run_env.setdefault("OMP_WAIT_POLICY", "passive")
        run_env.update(env or {})
        run_env["LD_PRELOAD"] = " ".join(filter(None, [str(logger), run_env.get("LD_PRELOAD")]))
        run_env["HPCNB_COMMPROF_ALLOC_LOG"] = str(alloc)
        cmd = [
            "valgrind", "--tool=lackey", "--trace-mem=yes", "--trace-sched=yes",
            "--trace-syscalls=yes", f"--log-file={log}", prog, *command[1:],
        ]  # fmt: skip
        with out_path.open("wb") as out, err_path.open("wb") as err:
            tree = ProcessTree(cmd, env=run_env, stdout=out, stderr=err)
            try:
                status = _watch(tree, log, max_log_bytes, timeout)
            finally:  # also on Ctrl-C: valgrind and everything it started
                tree.stop()
        size = log.stat().st_size if log.is_file() else 0
        if status == "timeout":
            raise TraceError(
                f"{prog}: valgrind ran past {timeout:g} s and was stopped with everything "
                "it started; raise the timeout or run the program on a smaller input"
            )
        if status == "log" or size > max_log_bytes:
            raise _too_big(prog, size, max_log_bytes)
        stdout, n_out = _output_tail(out_path, "stdout")
        stderr, n_err = _output_tail(err_path, "stderr")
        if status:
            raise TraceError(
                f"{prog}: exited with status {status} under valgrind:\n{stderr[-2000:]}"
            )
        if not log.is_file():
            raise TraceError(f"{prog}: valgrind wrote no log ({log})")
        text = log.read_text(errors="replace")
        allocs = alloc.read_text() if alloc.is_file() else ""
    return TraceRun(text, allocs, binary, [prog, *command[1:]], stdout, stderr, n_out, n_err)


@dataclass(frozen=True)
class DataObject:
    """A data object of the traced program.

    Attributes:
        name: Symbol name, ``heap#k`` or ``stack of thread 0``.
        kind: ``global``, ``heap`` or ``stack``.
        site: Definition or allocation site ``file:line`` (function for heap blocks).
        address: Run-time start address.
        size: Bytes.
        first: First element (word) index in the profile's shadow memory.
    """

    name: str
    kind: str
    site: str
    address: int
    size: int
    first: int


@dataclass
class ProgramProfile:
    """A communication profile of a traced program.

    Attributes:
        profile: The :class:`~hpcnb.commprof.runtime.Profile` (region 0 = the program,
            region ``k + 1`` = loop ``k`` of the binary); its trace rows are words.
        objects: The data objects (in shadow order).
        binary: The program's tables.
        valgrind_threads: The valgrind thread slot of each logical thread.
        word_bytes: Bytes per word.
        command: The traced command.
        parallel_from: Trace row of the first access by a thread other than the main one
            (rows before it are the program's serial start, e.g. reading its input).
        row_functions: Per trace row, the index in ``binary.functions`` of the function
            of the last program instruction the accessing thread executed (-1: none yet).
    """

    profile: Profile
    objects: list[DataObject]
    binary: BinaryInfo
    valgrind_threads: list[int]
    word_bytes: int
    command: list[str] = field(default_factory=list)
    parallel_from: int = 0
    row_functions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def rows_in(self, functions: set[str]) -> np.ndarray:
        """Mask of the trace rows made by code of the named functions."""
        names = {f.name: k for k, f in enumerate(self.binary.functions)}
        idx = [names[f] for f in functions if f in names]
        return np.isin(self.row_functions, idx)

    @property
    def nthreads(self) -> int:
        """Logical threads (main thread included)."""
        return self.profile.nthreads

    def matrix(self) -> np.ndarray:
        """Whole-program ``[writer, reader]`` matrix of communicated words."""
        return self.profile.exact.sum(axis=0)

    def compact_profile(self) -> Profile:
        """The profile with its trace's addresses packed close together (for locality).

        Objects are laid end to end, each keeping its offset within a 4096-byte page, so
        word and cache-line structure stay as in the run while the address range shrinks
        from the process's (heap, stack, globals far apart) to the objects' total size.
        """
        p = self.profile
        tr = None if p.trace is None else p.trace.copy()
        if tr is not None and len(tr):
            owner = self.object_of_element()[tr[:, 2]]
            base, shift = 0, np.zeros(len(self.objects), np.int64)
            for k, o in enumerate(self.objects):
                start = base + (o.address % 4096)
                shift[k] = start - o.address
                base = -(-(start + o.size) // 4096) * 4096
            tr[:, 3] += shift[owner]
        return Profile(
            kernel=p.kernel, regions=p.regions, nthreads=p.nthreads, exact=p.exact,
            exact_bytes=p.exact_bytes, signature=p.signature, accesses=p.accesses, trace=tr,
            n_elements=p.n_elements, itemsizes=p.itemsizes, memory=p.memory,
        )  # fmt: skip

    def object_of_element(self) -> np.ndarray:
        """Object index of every shadow element."""
        out = np.empty(self.profile.n_elements, np.int64)
        for k, o in enumerate(self.objects):
            out[o.first : o.first + -(-o.size // self.word_bytes)] = k
        return out


def _parse_allocs(text: str) -> tuple[dict[str, int], list[tuple[str, int, int, int]]]:
    head: dict[str, int] = {}
    events: list[tuple[str, int, int, int]] = []
    for ln in text.splitlines():
        f = ln.split()
        if not f:
            continue
        if f[0] in ("BASE", "MAILBOX", "STACK") and len(f) == 2:
            head[f[0]] = int(f[1], 16)
        elif f[0] == "A" and len(f) == 5:
            events.append(("A", int(f[2], 16), int(f[3]), int(f[4], 16)))
        elif f[0] == "F" and len(f) == 3:
            events.append(("F", int(f[2], 16), 0, 0))
        else:
            raise TraceError(f"allocation log line {ln!r}: unexpected format")
    return head, events


class _Objects:
    """Live data objects sorted by address, with word-index allocation."""

    def __init__(self, word_bytes: int) -> None:
        self.wb = word_bytes
        self.all: list[DataObject] = []
        self.live: dict[int, int] = {}  # start address -> object index
        self.next_element = 0
        self._starts = np.zeros(0, np.int64)
        self._ends = np.zeros(0, np.int64)
        self._ids = np.zeros(0, np.int64)

    def add(self, name: str, kind: str, site: str, address: int, size: int) -> None:
        obj = DataObject(name, kind, site, address, size, self.next_element)
        self.next_element += -(-size // self.wb)
        self.all.append(obj)
        self.live[address] = len(self.all) - 1
        self._index()

    def remove(self, address: int) -> None:
        if self.live.pop(address, None) is not None:
            self._index()

    def _index(self) -> None:
        ids = sorted(self.live.values(), key=lambda k: self.all[k].address)
        self._ids = np.array(ids, np.int64)
        self._starts = np.array([self.all[k].address for k in ids], np.int64)
        self._ends = np.array([self.all[k].address + self.all[k].size for k in ids], np.int64)
        self.starts = self._starts.tolist()
        self.ends = self._ends.tolist()
        self.ids = ids


def _near_stack(pairs: list[tuple[int, int]], value: int, keys_are_stacks: bool) -> int:
    """Index of the pair whose stack top lies at most 1 MiB above its first access, or -1.

    The pairs' keys are stack tops (``value`` is an access) or accesses (``value`` a top).
    """
    for k, (x, _) in enumerate(pairs):
        top, addr = (x, value) if keys_are_stacks else (value, x)
        if 0 <= top - addr < (1 << 20):
            return k
    return -1


class _Threads:
    """Logical thread numbers (creation order) for valgrind's thread slots.

    A ``clone`` record hands out the next number; the slot whose first access lies just
    below that clone's ``child_stack`` gets it. A thread that runs before its clone record
    appears (or without one) takes the next number at its first access, and the clone
    record that comes later with its stack is then recognised and not counted again.
    """

    def __init__(self) -> None:
        self.next_id = 1
        self.pending: list[tuple[int, int]] = []  # (child_stack, id) of clones not yet started
        self.unclaimed: list[tuple[int, int]] = []  # (first address, id) started unannounced
        self.slots = [1]  # valgrind slot of each logical thread (-1: never ran)

    def clone(self, stack: int) -> None:
        k = _near_stack(self.unclaimed, stack, keys_are_stacks=False)
        if k >= 0:
            self.unclaimed.pop(k)
            return
        self.pending.append((stack, self.next_id))
        self.next_id += 1

    def start(self, slot: int, addr: int) -> int:
        k = _near_stack(self.pending, addr, keys_are_stacks=True)
        if k >= 0:
            t = self.pending.pop(k)[1]
        elif self.pending:
            t = self.pending.pop(0)[1]
        else:
            t = self.next_id
            self.next_id += 1
            self.unclaimed.append((addr, t))
        while len(self.slots) <= t:
            self.slots.append(-1)
        self.slots[t] = slot
        return t


def parse_trace(
    run: TraceRun, *, word_bytes: int = 8, threads_hint: int | None = None
) -> ProgramProfile:
    """Turn a traced run into a :class:`ProgramProfile` (see the module docstring).

    Args:
        run: The traced run.
        word_bytes: Granularity of the shadow memory (8: a double or a long).
        threads_hint: Expected threads (main included); the matrices get at least this
            many rows and a mismatch is reported by :func:`hpcnb.commprof.report`.

    Raises:
        TraceError: The log holds no trace, or the allocation log is malformed.
    """
    import bisect

    from hpcnb.commprof.shadow import replay_exact

    if word_bytes not in (1, 2, 4, 8, 16):
        raise ValueError(f"word_bytes={word_bytes}: expected 1, 2, 4, 8 or 16")
    b = run.binary
    head, events = _parse_allocs(run.allocations)
    base = head.get("BASE", _PIE_BASE if b.pie else 0)
    mailbox = head.get("MAILBOX", -1)
    lo, hi = b.text_range
    text_lo, text_hi = lo + base, hi + base
    objs = _Objects(word_bytes)
    for s in b.symbols:
        objs.add(s.name, "global", s.site, s.address + base, s.size)
    if "STACK" in head:
        top = head["STACK"] + 4096
        objs.add("stack of thread 0", "stack", "main thread", top - STACK_WINDOW, STACK_WINDOW)
    heap_count = 0
    loop_region: dict[int, tuple[int, int]] = {}
    fn_index = {f.name: k for k, f in enumerate(b.functions)}

    def region_of(addr: int) -> tuple[int, int]:
        r = loop_region.get(addr)
        if r is None:
            fa = addr - base
            r = loop_region[addr] = (b.loop_at(fa) + 1, fn_index.get(b.function_at(fa), -1))
        return r

    vg_to_logical: dict[int, int] = {1: 0}
    threads = _Threads()
    main_started = False
    unmatched: set[int] = set()
    region: dict[int, tuple[int, int]] = {}
    rows: list[tuple[int, int, int, int, int, int]] = []
    cur_vg, cur = 1, 0
    n_event = 0
    n_lines = 0
    parallel_from = -1
    starts, ends, ids = objs.starts, objs.ends, objs.ids
    wb = word_bytes
    for line in io.StringIO(run.log):
        c = line[:1]
        if c == "I":
            n_lines += 1
            a = int(line[3 : line.index(",")], 16)
            if text_lo <= a < text_hi:
                region[cur_vg] = region_of(a)
            continue
        if c == " ":
            kind = line[1:2]
            comma = line.find(",")
            if kind not in ("L", "S", "M") or comma < 0:
                continue
            n_lines += 1
            a = int(line[3:comma], 16)
            if cur_vg in unmatched:
                unmatched.discard(cur_vg)
                t = threads.start(cur_vg, a)
                vg_to_logical[cur_vg] = t
                cur = t
                if parallel_from < 0:
                    parallel_from = len(rows)
            if cur < 0:
                continue
            if a == mailbox and kind != "L":
                ev = events[n_event] if n_event < len(events) else None
                n_event += 1
                if ev is None:
                    continue
                if ev[0] == "A" and text_lo <= ev[3] < text_hi:
                    heap_count += 1
                    site = b.site(ev[3] - base - 1)
                    objs.add(f"heap#{heap_count}", "heap", site, ev[1], ev[2])
                elif ev[0] == "F":
                    objs.remove(ev[1])
                starts, ends, ids = objs.starts, objs.ends, objs.ids
                continue
            k = bisect.bisect_right(starts, a) - 1
            if k < 0 or a >= ends[k]:
                continue
            o = objs.all[ids[k]]
            size = int(line[comma + 1 :])
            w0 = (a - o.address) // wb
            w1 = min((a + size - 1 - o.address) // wb, (o.size - 1) // wb)
            reg, fn = region.get(cur_vg, (0, -1))
            for w in range(w0, w1 + 1):
                e, ad = o.first + w, o.address + w * wb
                if kind != "S":
                    rows.append((cur, reg, e, ad, 0, fn))
                if kind != "L":
                    rows.append((cur, reg, e, ad, 1, fn))
            continue
        if c == "-":
            m = _SCHED_START.search(line)
            if m:
                cur_vg = int(m.group(1))
                region[cur_vg] = (0, -1)
                if cur_vg != 1 or main_started:
                    unmatched.add(cur_vg)
                    vg_to_logical.pop(cur_vg, None)
                    cur = -1
                else:
                    cur, main_started = 0, True
                continue
            m = _SCHED_EXIT.search(line)
            if m:
                vg_to_logical.pop(int(m.group(1)), None)
                continue
            if "acquired lock" in line:
                m2 = re.search(r"SCHED\[(\d+)\]", line)
                if m2:
                    cur_vg = int(m2.group(1))
                    cur = vg_to_logical.get(cur_vg, -1)
            continue
        if c == "S":
            m = _CLONE.match(line)
            if m:
                flags = int(m.group(3), 16)
                if flags & _CLONE_VM and flags & _CLONE_THREAD:
                    threads.clone(int(m.group(4), 16))
            if "acquired lock" in line:  # a scheduler record continuing a syscall line
                m2 = re.search(r"SCHED\[(\d+)\]:\s+acquired lock", line)
                if m2:
                    cur_vg = int(m2.group(1))
                    cur = vg_to_logical.get(cur_vg, -1)
    if n_lines == 0:
        raise TraceError(
            f"{' '.join(run.command)}: the valgrind log holds no memory trace "
            "(expected lackey --trace-mem=yes output)"
        )
    vg_threads = threads.slots
    T = max(len(vg_threads), threads_hint or 0, 1)
    if T > 64:
        raise TraceError(f"{T} threads: the exact shadow memory holds at most 64")
    regions = [Region(0, 0, -1, "program", " ".join(Path(run.command[0]).name.split()))]
    for lp in b.loops:
        regions.append(
            Region(lp.index + 1, lp.line, lp.parent + 1, "loop", f"{lp.location} ({lp.function})")
        )
    tr = np.array(rows, np.int64).reshape(-1, 6)
    trace = np.zeros((len(tr), 6), np.int64)
    trace[:, :5] = tr[:, :5]
    acc = np.zeros((len(regions), 2), np.int64)
    if len(trace):
        np.add.at(acc, (trace[:, 1], trace[:, 4]), 1)
    p = Profile(
        kernel=Path(run.command[0]).name, regions=regions, nthreads=T,
        exact=np.zeros((len(regions), T, T), np.int64),
        exact_bytes=np.zeros((len(regions), T, T), np.int64), signature=None,
        accesses=acc, trace=trace, n_elements=max(1, objs.next_element),
        itemsizes=[word_bytes] * len(objs.all), memory=MemoryConfig(),
    )  # fmt: skip
    p.exact = replay_exact(p)
    p.exact_bytes = word_bytes * p.exact
    return ProgramProfile(
        p, objs.all, b, vg_threads, word_bytes, list(run.command),
        parallel_from if parallel_from >= 0 else len(rows), tr[:, 5].copy(),
    )  # fmt: skip


def filter_trace(run: TraceRun, *, word_bytes: int = 8) -> TraceRun:
    """Keep only the records that :func:`parse_trace` needs for the same matrices.

    Scheduler and clone records, accesses to the objects that two or more threads touch
    and to the logger's mailbox, and before each of them the last instruction record of
    the same thread inside the program when it changed: a few thousand lines instead of
    ~10^5. The communication matrices and the objects stay the same; the access counts
    of private objects are dropped.
    """
    prof = parse_trace(run, word_bytes=word_bytes)
    tr = prof.profile.trace
    owner = prof.object_of_element()
    shared = []
    for k, o in enumerate(prof.objects):
        rows = tr[owner[tr[:, 2]] == k] if tr is not None and len(tr) else np.zeros((0, 6))
        if len(np.unique(rows[:, 0])) >= 2:
            shared.append(o)
    spans = sorted((o.address, o.address + o.size) for o in shared)
    head, _ = _parse_allocs(run.allocations)
    mailbox = head.get("MAILBOX", -1)
    base = head.get("BASE", _PIE_BASE if run.binary.pie else 0)
    lo, hi = run.binary.text_range
    keep: list[str] = []
    last_i: dict[int, str] = {}
    written: dict[int, str] = {}
    cur = 1
    starts = [s for s, _ in spans]
    import bisect

    for line in io.StringIO(run.log):
        c = line[:1]
        if c == "I":
            a = int(line[3 : line.index(",")], 16)
            if lo + base <= a < hi + base:
                last_i[cur] = line
            continue
        if c == " ":
            if line[1:2] not in ("L", "S", "M") or "," not in line:
                continue
            a = int(line[3 : line.index(",")], 16)
            k = bisect.bisect_right(starts, a) - 1
            hit = a == mailbox or (k >= 0 and a < spans[k][1])
            if hit or cur not in written:
                if cur in last_i and written.get(cur) != last_i[cur]:
                    keep.append(last_i[cur].rstrip("\n"))
                    written[cur] = last_i[cur]
                if cur not in written:
                    written[cur] = ""
                keep.append(line.rstrip("\n"))
            continue
        if "SCHED[" in line and ("acquired lock" in line or "exit_thread" in line):
            m = re.search(r"SCHED\[(\d+)\]", line)
            cur = int(m.group(1)) if m else cur
            keep.append(line.rstrip("\n"))
        elif c == "S" and _CLONE.match(line):
            keep.append(line.rstrip("\n"))
    return replace(run, log="\n".join(keep) + "\n")


def save_run(run: TraceRun, folder: Path, name: str) -> list[Path]:
    """Write a run as ``name.lackey.log``, ``name.alloc.log`` and ``name.binary.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"{name}.lackey.log", folder / f"{name}.alloc.log",
             folder / f"{name}.binary.json"]  # fmt: skip
    files[0].write_text(run.log)
    files[1].write_text(run.allocations)
    meta = {"command": [Path(run.command[0]).name, *run.command[1:]], **run.binary.to_dict()}
    meta["path"] = Path(run.binary.path).name
    files[2].write_text(json.dumps(meta))
    return files


def recorded_run() -> TraceRun:
    """The recorded, filtered run shipped with the package (``csrc/ring.c``, 4 threads).

    For machines without valgrind: it parses to the same profile as a fresh run.

    Raises:
        FileNotFoundError: The package data is missing (a broken installation).
    """
    folder = resources.files("hpcnb.commprof").joinpath("data")
    names = [f"{RECORDED}.lackey.log", f"{RECORDED}.alloc.log", f"{RECORDED}.binary.json"]
    for n in names:
        if not folder.joinpath(n).is_file():
            raise FileNotFoundError(f"recorded valgrind run file {n} missing from {folder}")
    meta = json.loads(folder.joinpath(names[2]).read_text(encoding="utf-8"))
    command = meta.pop("command")
    return TraceRun(
        folder.joinpath(names[0]).read_text(encoding="utf-8"),
        folder.joinpath(names[1]).read_text(encoding="utf-8"),
        BinaryInfo.from_dict(meta),
        command,
    )


def profile_program(
    command: Sequence[str],
    *,
    threads_hint: int | None = None,
    word_bytes: int = 8,
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
    max_log_bytes: int = MAX_LOG_BYTES,
) -> ProgramProfile:
    """Run ``command`` under valgrind and return its :class:`ProgramProfile`.

    The arguments are those of :func:`run_program` and :func:`parse_trace`.
    """
    run = run_program(command, timeout=timeout, env=env, max_log_bytes=max_log_bytes)
    return parse_trace(run, word_bytes=word_bytes, threads_hint=threads_hint)
