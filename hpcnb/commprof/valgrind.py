"""Communication matrices of a real binary from a valgrind ``lackey`` memory trace.

Pipeline: compile a small C pthreads program (:data:`C_PROGRAM`) with gcc, run it under
``valgrind --tool=lackey --trace-mem=yes --trace-sched=yes``, parse the log and feed the
accesses to the shared arrays through the same exact shadow memory as the Python kernels.

Thread attribution. Valgrind runs one guest thread at a time; ``--trace-sched=yes``
writes ``SCHED[n]:  acquired lock`` to the same log whenever thread ``n`` starts running,
so every trace line belongs to the thread that last acquired the lock. Valgrind thread
ids are mapped to the program's logical ids by a marker scheme: each worker's first act is
a store to ``cp_whoami[t]``, so the thread that stores to that address is logical thread
``t``. Regions work the same way: a store to ``cp_region[r]`` means "this thread enters
region r" (the C program has no loop hooks, so regions are the program's phases: a
loop-free region report). The program prints the addresses of its arrays on stdout.

Only accesses to the program's shared arrays are analysed (stack, libc and the barrier's
internals are not), word by word (8 bytes); a ``M`` (modify) line is a load then a store.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from hpcnb.commprof.instrument import Region
from hpcnb.commprof.runtime import MemoryConfig, Profile

__all__ = [
    "C_PROGRAM",
    "REGION_NAMES",
    "ValgrindRun",
    "compile_program",
    "expected_matrices",
    "filter_log",
    "missing_tools",
    "parse_lackey",
    "recorded_run",
    "run_valgrind",
]

#: A recorded, filtered run (T=4, N=64) for machines without gcc or valgrind: package data
#: ``hpcnb/commprof/data/lackey_t4_n64.{log,stdout}``, read with importlib.resources.
RECORDED = "lackey_t4_n64"

#: Regions of the C program (index = region id).
REGION_NAMES = ("main", "init", "stencil", "gather", "broadcast")

#: The traced program: T threads, N doubles; phases separated by barriers.
C_PROGRAM = r"""
#include <pthread.h>
#include <stdio.h>
#ifndef T
#define T 4
#endif
#ifndef N
#define N 64
#endif
double a[N], b[N], total[1];
volatile long cp_whoami[T];
volatile char cp_region[8];
pthread_barrier_t bar;

static void *work(void *arg) {
  long t = (long)arg;
  int lo = t * N / T, hi = (t + 1) * N / T;
  cp_whoami[t] = t;
  cp_region[1] = 1;                       /* init: own block of a */
  for (int i = lo; i < hi; i++) a[i] = i;
  pthread_barrier_wait(&bar);
  cp_region[2] = 1;                       /* stencil: reads the neighbours' edge values */
  for (int i = lo; i < hi; i++) {
    double l = i > 0 ? a[i - 1] : 0.0;
    double r = i < N - 1 ? a[i + 1] : 0.0;
    b[i] = l + r;
  }
  pthread_barrier_wait(&bar);
  cp_region[3] = 1;                       /* gather: thread 0 sums b */
  if (t == 0) {
    double s = 0.0;
    for (int i = 0; i < N; i++) s += b[i];
    total[0] = s;
  }
  pthread_barrier_wait(&bar);
  cp_region[4] = 1;                       /* broadcast: everybody reads total */
  b[lo] = b[lo] / total[0];
  return 0;
}

int main(void) {
  pthread_t th[T];
  pthread_barrier_init(&bar, 0, T);
  printf("ADDR a %p %d\nADDR b %p %d\nADDR total %p 1\n", (void *)a, N, (void *)b, N,
         (void *)total);
  printf("ADDR cp_whoami %p %d\nADDR cp_region %p 8\n", (void *)cp_whoami, T,
         (void *)cp_region);
  fflush(stdout);
  for (long t = 0; t < T; t++) pthread_create(&th[t], 0, work, (void *)t);
  for (long t = 0; t < T; t++) pthread_join(th[t], 0);
  return 0;
}
"""

_SCHED = re.compile(r"SCHED\[(\d+)\]:\s+acquired lock")
_ACCESS = re.compile(r"^ ?([ILSM])\s+([0-9a-fA-F]+),(\d+)")
_ADDR = re.compile(r"^ADDR (\w+) (0x[0-9a-fA-F]+) (\d+)$", re.M)


def missing_tools() -> list[str]:
    """Return the names of the tools (gcc, valgrind) that are not installed."""
    return [t for t in ("gcc", "valgrind") if shutil.which(t) is None]


def compile_program(workdir: Path, nthreads: int = 4, n: int = 64) -> Path:
    """Write :data:`C_PROGRAM` to ``workdir`` and compile it (``-O0`` keeps every access).

    Raises:
        RuntimeError: When gcc is missing or fails (its message is included).
    """
    if shutil.which("gcc") is None:
        raise RuntimeError("gcc not found: install it (apt-get install gcc)")
    if not (2 <= nthreads <= 64 and n >= 2 * nthreads):
        raise ValueError(f"nthreads={nthreads}, n={n}: expected 2..64 threads and n >= 2T")
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / "commprof_prog.c"
    src.write_text(C_PROGRAM)
    exe = workdir / "commprof_prog"
    cmd = ["gcc", "-O0", "-pthread", f"-DT={nthreads}", f"-DN={n}", str(src), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode:
        raise RuntimeError(f"gcc failed ({' '.join(cmd)}):\n{res.stderr}")
    return exe


@dataclass(frozen=True)
class ValgrindRun:
    """Output of one traced run.

    Attributes:
        log: The valgrind log (lackey trace plus scheduler lines).
        stdout: The program's standard output (array addresses).
        nthreads: Logical threads of the program.
    """

    log: str
    stdout: str
    nthreads: int


def run_valgrind(exe: Path, nthreads: int, timeout: float = 120.0) -> ValgrindRun:
    """Run ``exe`` under lackey with memory and scheduler tracing."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind not found: install it (apt-get install valgrind)")
    log = exe.with_suffix(".lackey.log")
    cmd = [
        "valgrind", "--tool=lackey", "--trace-mem=yes", "--trace-sched=yes",
        f"--log-file={log}", str(exe),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode:
        raise RuntimeError(f"valgrind failed ({' '.join(cmd)}):\n{res.stderr[-2000:]}")
    return ValgrindRun(log.read_text(), res.stdout, nthreads)


def _ranges(stdout: str) -> dict[str, tuple[int, int]]:
    return {m.group(1): (int(m.group(2), 16), int(m.group(3))) for m in _ADDR.finditer(stdout)}


def filter_log(run: ValgrindRun) -> ValgrindRun:
    """Keep only the scheduler lines and the accesses to the program's own arrays.

    The result parses to the same profile and is a few hundred lines instead of ~10^5.
    """
    spans = [(lo, lo + 8 * n) for lo, n in _ranges(run.stdout).values()]
    keep = []
    for line in run.log.splitlines():
        if _SCHED.search(line):
            keep.append(line)
            continue
        m = _ACCESS.match(line)
        if m and m.group(1) != "I":
            addr = int(m.group(2), 16)
            if any(lo <= addr < hi for lo, hi in spans):
                keep.append(line)
    return ValgrindRun("\n".join(keep) + "\n", run.stdout, run.nthreads)


def recorded_run() -> ValgrindRun:
    """Load the recorded filtered run shipped with the package (T=4, N=64).

    Raises:
        FileNotFoundError: The package data is missing (a broken installation).
    """
    folder = resources.files("hpcnb.commprof").joinpath("data")
    log, out = folder.joinpath(f"{RECORDED}.log"), folder.joinpath(f"{RECORDED}.stdout")
    if not log.is_file() or not out.is_file():
        raise FileNotFoundError(f"recorded valgrind run {RECORDED}.* missing from {folder}")
    return ValgrindRun(log.read_text(encoding="utf-8"), out.read_text(encoding="utf-8"), 4)


def parse_lackey(run: ValgrindRun) -> Profile:
    """Attribute the traced accesses to threads and regions and build a :class:`Profile`.

    The profile's ``trace`` has the columns of :data:`hpcnb.commprof.hooks.TRACE_COLUMNS`,
    its ``exact`` matrices come from replaying it through the exact shadow memory.

    Raises:
        ValueError: When the program's address lines or thread markers are missing.
    """
    from hpcnb.commprof.shadow import replay_exact

    arrays = _ranges(run.stdout)
    need = {"a", "b", "total", "cp_whoami", "cp_region"}
    if not need <= set(arrays):
        raise ValueError(f"program output lacks ADDR lines for {sorted(need - set(arrays))}")
    shared = [(name, *arrays[name]) for name in ("a", "b", "total")]
    elem_base, e = {}, 0
    for name, _, count in shared:
        elem_base[name] = e
        e += count
    who_lo, _ = arrays["cp_whoami"]
    reg_lo, _ = arrays["cp_region"]
    T = run.nthreads
    logical: dict[int, int] = {}
    region_of: dict[int, int] = {}
    rows: list[tuple[int, int, int, int, int, int]] = []
    cur = -1
    for line in run.log.splitlines():
        m = _SCHED.search(line)
        if m:
            cur = int(m.group(1))
            continue
        m = _ACCESS.match(line)
        if not m or m.group(1) == "I":
            continue
        kind, addr, size = m.group(1), int(m.group(2), 16), int(m.group(3))
        if kind in "SM" and who_lo <= addr < who_lo + 8 * T:
            logical[cur] = (addr - who_lo) // 8
            continue
        if kind in "SM" and reg_lo <= addr < reg_lo + 8:
            region_of[cur] = addr - reg_lo
            continue
        for name, lo, count in shared:
            if lo <= addr < lo + 8 * count:
                if cur not in logical:
                    break  # main thread's accesses (none to shared arrays in this program)
                for w in range((addr - lo) // 8, min(count, (addr - lo + size + 7) // 8)):
                    el = elem_base[name] + w
                    ad = lo + 8 * w
                    tid, reg = logical[cur], region_of.get(cur, 0)
                    if kind in "LM":
                        rows.append((tid, reg, el, ad, 0, 0))
                    if kind in "SM":
                        rows.append((tid, reg, el, ad, 1, 0))
                break
    if len(logical) != T:
        raise ValueError(f"found thread markers for {len(logical)} of {T} threads in the log")
    regions = [Region(0, 0, -1, "kernel", "main")] + [
        Region(r, 0, 0, "phase", REGION_NAMES[r]) for r in range(1, len(REGION_NAMES))
    ]
    trace = np.array(rows, dtype=np.int64).reshape(-1, 6)
    acc = np.zeros((len(regions), 2), np.int64)
    np.add.at(acc, (trace[:, 1], trace[:, 4]), 1)
    p = Profile(
        kernel="commprof_prog", regions=regions, nthreads=T,
        exact=np.zeros((len(regions), T, T), np.int64),
        exact_bytes=np.zeros((len(regions), T, T), np.int64), signature=None,
        accesses=acc, trace=trace, n_elements=e, itemsizes=[8, 8, 8], memory=MemoryConfig(),
    )  # fmt: skip
    p.exact = replay_exact(p)
    p.exact_bytes = 8 * p.exact
    return p


def expected_matrices(nthreads: int, n: int) -> np.ndarray:
    """Per-region matrices the C program must produce, derived from its source.

    stencil: each thread reads the last element of its left and the first element of its
    right neighbour's block once; gather: thread 0 reads every other thread's block of
    ``b``; broadcast: every other thread reads ``total`` written by thread 0.
    """
    T = nthreads
    m = np.zeros((len(REGION_NAMES), T, T), np.int64)
    for t in range(T):
        if t > 0:
            m[2, t - 1, t] = 1
        if t < T - 1:
            m[2, t + 1, t] = 1
        lo, hi = t * n // T, (t + 1) * n // T
        if t > 0:
            m[3, t, 0] = hi - lo
            m[4, 0, t] = 1
    return m
