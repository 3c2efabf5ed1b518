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

import bisect
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
from hpcnb.errors import HpcnbError, InvalidInputError, MissingFileError

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

#: Valgrind's scheduler lines name the thread slot as ``SCHED[slot]``.
_SCHED = r"SCHED\[(\d+)\]"
_SCHED_SLOT = re.compile(_SCHED)
_SCHED_ACQUIRED = re.compile(_SCHED + r":\s+acquired lock")
_SCHED_START = re.compile(_SCHED_ACQUIRED.pattern + r" \(thread_wrapper\(starting new")
_SCHED_EXIT = re.compile(_SCHED + r": release lock in VG_\(exit_thread\)")
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
        InvalidInputError: ``max_log_bytes`` is not positive.
        TraceError: valgrind is missing, fails, runs past ``timeout`` or its log grows
            past ``max_log_bytes``.
    """
    from hpcnb.launch import ProcessTree

    if not command:
        raise TraceError("no program given")
    if max_log_bytes <= 0:
        raise InvalidInputError(f"max_log_bytes={max_log_bytes}: expected a positive size")
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
            "valgrind",
            "--tool=lackey",
            "--trace-mem=yes",
            "--trace-sched=yes",
            "--trace-syscalls=yes",
            f"--log-file={log}",
            prog,
            *command[1:],
        ]
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
        return replace(p, trace=tr)

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
    """Live data objects sorted by address, with word-index allocation.

    Attributes:
        word_bytes: Bytes per shadow word.
        all: Every object ever added, in shadow order.
        live: Start address -> index in ``all`` of the objects alive now.
        next_element: First shadow word of the next object.
        starts: Start addresses of the live objects, ascending.
        ends: Their end addresses.
        ids: Their indices in ``all``.
    """

    def __init__(self, word_bytes: int) -> None:
        self.word_bytes = word_bytes
        self.all: list[DataObject] = []
        self.live: dict[int, int] = {}
        self.next_element = 0
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.ids: list[int] = []

    def add(self, name: str, kind: str, site: str, address: int, size: int) -> None:
        """Add a live object (arguments as the :class:`DataObject` attributes).

        Args:
            name: Its name.
            kind: ``global``, ``heap`` or ``stack``.
            site: Its definition or allocation site.
            address: Its run-time start address.
            size: Its size in bytes.
        """
        obj = DataObject(name, kind, site, address, size, self.next_element)
        self.next_element += -(-size // self.word_bytes)
        self.all.append(obj)
        self.live[address] = len(self.all) - 1
        self._index()

    def remove(self, address: int) -> None:
        """The live object starting at ``address`` (if any) is freed."""
        if self.live.pop(address, None) is not None:
            self._index()

    def _index(self) -> None:
        self.ids = sorted(self.live.values(), key=lambda k: self.all[k].address)
        self.starts = [self.all[k].address for k in self.ids]
        self.ends = [self.all[k].address + self.all[k].size for k in self.ids]


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


#: Word-access row of a trace: logical thread, region, element, address, 1 = write, function.
_Row = tuple[int, int, int, int, int, int]
_NO_LOCATION = (0, -1)  # (region, function) before a thread runs program code


class _LackeyReader:
    """Reads a lackey log, one method per kind of record, into word-access rows.

    The records (first characters of a line):

    - ``I  addr,size``: an instruction (:meth:`instruction`);
    - a space, then ``L addr,size``, ``S addr,size`` or ``M addr,size``: a load, store or
      modify (:meth:`load`, :meth:`store`, :meth:`modify`) by the thread that runs;
    - ``--pid-- SCHED[n]: ...``: valgrind's scheduler (:meth:`scheduler`): thread slot
      ``n`` starts a new thread, exits, or takes the lock and runs;
    - ``SYSCALL[pid,tid](nr) ...``: a system call (:meth:`syscall`): a ``clone`` of a
      thread, and possibly a scheduler record continuing the line.

    Other lines (valgrind's own ``==pid==`` messages) are skipped. A store to the
    allocation logger's mailbox is a marker: the next allocation event happens
    (:meth:`marker`).

    Attributes:
        binary: The program's tables.
        word_bytes: Bytes per shadow word.
        base: Load bias of the main executable.
        mailbox: Address of the allocation logger's mailbox (-1: none).
        text_lo: First run-time address of the program's code.
        text_hi: End of the program's code.
        events: The allocation logger's events, in order.
        next_event: Index of the event the next marker announces.
        objects: The data objects known so far.
        heap_blocks: Heap objects found so far.
        threads: Logical thread numbers handed out by clones and first accesses.
        logical: Valgrind thread slot -> logical thread, for slots that have one.
        main_started: Whether the main thread's start record was read.
        unmatched: Slots that started a thread whose first access is still to come.
        location: Slot -> (region, function) of the last program instruction it ran.
        slot: The valgrind slot that runs.
        thread: Its logical thread (-1 until its first access identifies it).
        records: Instruction and data-access records read.
        parallel_from: Row of the first access by a started thread (-1: none yet).
        rows: The word accesses, in trace order.
    """

    def __init__(self, run: TraceRun, word_bytes: int) -> None:
        """Set up the objects known before the trace: globals and the main stack window.

        Args:
            run: The traced run (its binary tables and allocation log are read here).
            word_bytes: Granularity of the shadow memory.

        Raises:
            TraceError: The allocation log is malformed.
        """
        self.binary = run.binary
        self.word_bytes = word_bytes
        head, self.events = _parse_allocs(run.allocations)
        self.base = head.get("BASE", _PIE_BASE if self.binary.pie else 0)
        self.mailbox = head.get("MAILBOX", -1)
        lo, hi = self.binary.text_range
        self.text_lo, self.text_hi = lo + self.base, hi + self.base
        self.next_event = 0
        self.objects = _Objects(word_bytes)
        for symbol in self.binary.symbols:
            self.objects.add(
                symbol.name, "global", symbol.site, symbol.address + self.base, symbol.size
            )
        if "STACK" in head:
            top = head["STACK"] + 4096
            self.objects.add(
                "stack of thread 0", "stack", "main thread", top - STACK_WINDOW, STACK_WINDOW
            )
        self.heap_blocks = 0
        self._code: dict[int, tuple[int, int]] = {}  # instruction address -> location
        self._function_index = {f.name: k for k, f in enumerate(self.binary.functions)}
        self.threads = _Threads()
        self.logical: dict[int, int] = {1: 0}
        self.main_started = False
        self.unmatched: set[int] = set()
        self.location: dict[int, tuple[int, int]] = {}
        self.slot, self.thread = 1, 0
        self.records = 0
        self.parallel_from = -1
        self.rows: list[_Row] = []
        self._accesses = {"L": self.load, "S": self.store, "M": self.modify}

    def read(self, log: str) -> None:
        """Read every record of ``log`` in order.

        Args:
            log: The lackey log text.
        """
        for line in io.StringIO(log):
            first = line[:1]
            if first == "I":
                self.instruction(line)
            elif first == " ":
                self.data_access(line)
            elif first == "-":
                self.scheduler(line)
            elif first == "S":
                self.syscall(line)

    def _code_location(self, address: int) -> tuple[int, int]:
        """(Region, function index) of the program instruction at run-time ``address``."""
        found = self._code.get(address)
        if found is None:
            file_address = address - self.base
            loop = self.binary.loop_at(file_address)
            function = self._function_index.get(self.binary.function_at(file_address), -1)
            found = self._code[address] = (loop + 1, function)
        return found

    def instruction(self, line: str) -> None:
        """``I  addr,size``: the running slot's location moves to a program instruction."""
        self.records += 1
        address = int(line[3 : line.index(",")], 16)
        if self.text_lo <= address < self.text_hi:
            self.location[self.slot] = self._code_location(address)

    def data_access(self, line: str) -> None:
        """A data access: identify the thread at its first access, then dispatch on its kind."""
        handler = self._accesses.get(line[1:2])
        comma = line.find(",")
        if handler is None or comma < 0:
            return
        self.records += 1
        address = int(line[3:comma], 16)
        if self.slot in self.unmatched:
            self.unmatched.discard(self.slot)
            self.thread = self.logical[self.slot] = self.threads.start(self.slot, address)
            if self.parallel_from < 0:
                self.parallel_from = len(self.rows)
        if self.thread >= 0:
            handler(address, line[comma + 1 :])

    def load(self, address: int, size: str) -> None:
        """A load of ``size`` bytes (decimal text) at ``address``: read rows."""
        self._words(address, size, read=True, write=False)

    def store(self, address: int, size: str) -> None:
        """A store: write rows, or a marker when it goes to the mailbox."""
        if address == self.mailbox:
            self.marker()
        else:
            self._words(address, size, read=False, write=True)

    def modify(self, address: int, size: str) -> None:
        """A read-modify-write: a read and a write row per word, or a marker."""
        if address == self.mailbox:
            self.marker()
        else:
            self._words(address, size, read=True, write=True)

    def _words(self, address: int, size: str, *, read: bool, write: bool) -> None:
        """Append the rows of an access to the words of the object holding ``address``."""
        objects = self.objects
        k = bisect.bisect_right(objects.starts, address) - 1
        if k < 0 or address >= objects.ends[k]:
            return
        obj = objects.all[objects.ids[k]]
        wb = self.word_bytes
        first = (address - obj.address) // wb
        last = min((address + int(size) - 1 - obj.address) // wb, (obj.size - 1) // wb)
        region, function = self.location.get(self.slot, _NO_LOCATION)
        for word in range(first, last + 1):
            element, word_address = obj.first + word, obj.address + word * wb
            if read:
                self.rows.append((self.thread, region, element, word_address, 0, function))
            if write:
                self.rows.append((self.thread, region, element, word_address, 1, function))

    def marker(self) -> None:
        """A mailbox store: the next allocation event (a heap block appears or goes)."""
        event = self.events[self.next_event] if self.next_event < len(self.events) else None
        self.next_event += 1
        if event is None:
            return
        kind, address, size, caller = event
        if kind == "A" and self.text_lo <= caller < self.text_hi:
            self.heap_blocks += 1
            site = self.binary.site(caller - self.base - 1)
            self.objects.add(f"heap#{self.heap_blocks}", "heap", site, address, size)
        elif kind == "F":
            self.objects.remove(address)

    def scheduler(self, line: str) -> None:
        """``--pid-- SCHED[n]: ...``: a thread starts, exits, or slot ``n`` runs."""
        start = _SCHED_START.search(line)
        if start:
            self.thread_start(int(start.group(1)))
            return
        exit_ = _SCHED_EXIT.search(line)
        if exit_:
            self.thread_exit(int(exit_.group(1)))
        elif "acquired lock" in line:
            switch = _SCHED_SLOT.search(line)
            if switch:
                self.thread_switch(int(switch.group(1)))

    def syscall(self, line: str) -> None:
        """``SYSCALL[...]``: a clone of a thread, and a scheduler record continuing it."""
        clone = _CLONE.match(line)
        if clone:
            flags = int(clone.group(3), 16)
            if flags & _CLONE_VM and flags & _CLONE_THREAD:
                self.clone(int(clone.group(4), 16))
        if "acquired lock" in line:
            switch = _SCHED_ACQUIRED.search(line)
            if switch:
                self.thread_switch(int(switch.group(1)))

    def clone(self, stack: int) -> None:
        """A thread is created with its stack at ``stack``."""
        self.threads.clone(stack)

    def thread_start(self, slot: int) -> None:
        """Slot ``slot`` starts a thread (the main one the first time slot 1 starts)."""
        self.slot = slot
        self.location[slot] = _NO_LOCATION
        if slot != 1 or self.main_started:
            self.unmatched.add(slot)
            self.logical.pop(slot, None)
            self.thread = -1
        else:
            self.thread, self.main_started = 0, True

    def thread_exit(self, slot: int) -> None:
        """The thread in ``slot`` ends (the slot may be reused by a new thread)."""
        self.logical.pop(slot, None)

    def thread_switch(self, slot: int) -> None:
        """Slot ``slot`` takes valgrind's lock and runs."""
        self.slot = slot
        self.thread = self.logical.get(slot, -1)

    def program_profile(self, run: TraceRun, threads_hint: int | None) -> ProgramProfile:
        """The profile of what was read, its communication replayed in trace order.

        Args:
            run: The traced run (its command names the profile).
            threads_hint: Expected threads; the matrices get at least this many rows.

        Raises:
            TraceError: Nothing was traced, or more than 64 threads.
        """
        from hpcnb.commprof.shadow import replay_exact

        if self.records == 0:
            raise TraceError(
                f"{' '.join(run.command)}: the valgrind log holds no memory trace "
                "(expected lackey --trace-mem=yes output)"
            )
        slots = self.threads.slots
        nthreads = max(len(slots), threads_hint or 0, 1)
        if nthreads > 64:
            raise TraceError(f"{nthreads} threads: the exact shadow memory holds at most 64")
        name = " ".join(Path(run.command[0]).name.split())
        regions = [Region(0, 0, -1, "program", name)]
        for lp in self.binary.loops:
            text = f"{lp.location} ({lp.function})"
            regions.append(Region(lp.index + 1, lp.line, lp.parent + 1, "loop", text))
        rows = np.array(self.rows, np.int64).reshape(-1, 6)
        trace = np.zeros((len(rows), 6), np.int64)
        trace[:, :5] = rows[:, :5]
        accesses = np.zeros((len(regions), 2), np.int64)
        if len(trace):
            np.add.at(accesses, (trace[:, 1], trace[:, 4]), 1)
        empty = np.zeros((len(regions), nthreads, nthreads), np.int64)
        profile = Profile(
            kernel=Path(run.command[0]).name,
            regions=regions,
            nthreads=nthreads,
            exact=empty,
            exact_bytes=empty.copy(),
            signature=None,
            accesses=accesses,
            trace=trace,
            n_elements=max(1, self.objects.next_element),
            itemsizes=[self.word_bytes] * len(self.objects.all),
            memory=MemoryConfig(),
        )
        profile.exact = replay_exact(profile)
        profile.exact_bytes = self.word_bytes * profile.exact
        parallel_from = self.parallel_from if self.parallel_from >= 0 else len(self.rows)
        return ProgramProfile(
            profile,
            self.objects.all,
            self.binary,
            slots,
            self.word_bytes,
            list(run.command),
            parallel_from,
            rows[:, 5].copy(),
        )


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
        InvalidInputError: ``word_bytes`` is not 1, 2, 4, 8 or 16.
        TraceError: The log holds no trace, more than 64 threads, or the allocation log
            is malformed.
    """
    if word_bytes not in (1, 2, 4, 8, 16):
        raise InvalidInputError(f"word_bytes={word_bytes}: expected 1, 2, 4, 8 or 16")
    reader = _LackeyReader(run, word_bytes)
    reader.read(run.log)
    return reader.program_profile(run, threads_hint)


def filter_trace(run: TraceRun, *, word_bytes: int = 8) -> TraceRun:
    """Keep only the records that :func:`parse_trace` needs for the same matrices.

    Scheduler and clone records, accesses to the objects that two or more threads touch
    and to the logger's mailbox, and before each of them the last instruction record of
    the same thread inside the program when it changed: a few thousand lines instead of
    ~10^5. The communication matrices and the objects stay the same; the access counts
    of private objects are dropped.

    Args:
        run: The traced run.
        word_bytes: Granularity of the shadow memory used to find the shared objects.

    Returns:
        The run with the reduced log.
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
            m = _SCHED_SLOT.search(line)
            cur = int(m.group(1)) if m else cur
            keep.append(line.rstrip("\n"))
        elif c == "S" and _CLONE.match(line):
            keep.append(line.rstrip("\n"))
    return replace(run, log="\n".join(keep) + "\n")


def save_run(run: TraceRun, folder: Path, name: str) -> list[Path]:
    """Write a run as ``name.lackey.log``, ``name.alloc.log`` and ``name.binary.json``.

    Args:
        run: The traced run.
        folder: Folder to write into (created).
        name: Stem of the three file names.

    Returns:
        The three paths.
    """
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"{name}.{suffix}" for suffix in ("lackey.log", "alloc.log", "binary.json")]
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
        MissingFileError: The package data is missing (a broken installation).
    """
    folder = resources.files("hpcnb.commprof").joinpath("data")
    names = [f"{RECORDED}.lackey.log", f"{RECORDED}.alloc.log", f"{RECORDED}.binary.json"]
    for n in names:
        if not folder.joinpath(n).is_file():
            raise MissingFileError(f"recorded valgrind run file {n} missing from {folder}")
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

    Args:
        command: The program (built with ``-g``) and its arguments.
        threads_hint: Expected threads, main included (see :func:`parse_trace`).
        word_bytes: Granularity of the shadow memory.
        timeout: Wall-clock limit of the valgrind run (s).
        env: Extra environment variables for the program.
        max_log_bytes: Largest lackey log allowed (bytes).

    Raises:
        BinaryError: The program is not an ELF executable; NoDebugInfoError: no ``-g``.
        InvalidInputError: A bad ``word_bytes`` or ``max_log_bytes``.
        TraceError: valgrind is missing or fails, or the trace cannot be read.
    """
    run = run_program(command, timeout=timeout, env=env, max_log_bytes=max_log_bytes)
    return parse_trace(run, word_bytes=word_bytes, threads_hint=threads_hint)
