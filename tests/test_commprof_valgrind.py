"""Tests of profiling unmodified C programs: binary tables, loops, valgrind traces, CLI."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

from hpcnb.commprof.binary import (
    BINUTILS,
    BinaryInfo,
    DataSymbol,
    Function,
    Loop,
    NoDebugInfoError,
    read_binary,
)
from hpcnb.commprof.report import loop_table, object_table
from hpcnb.commprof.valgrind import (
    TraceError,
    TraceRun,
    filter_trace,
    missing_tools,
    parse_trace,
    recorded_run,
    run_program,
)
from hpcnb.launch import run_bounded

CSRC = Path(__file__).resolve().parents[1] / "hpcnb" / "commprof" / "csrc"

#: Threads created in a known order; each writes its own slot; a heap block at a known line.
ORDER_C = r"""
#include <pthread.h>
#include <stdlib.h>
#define T 3
long slot[T * 8];
double *block;
static void *work(void *arg) {
  long t = (long)arg;
  slot[t * 8] = t + 1;
  block[t] = slot[t * 8];
  return 0;
}
int main(void) {
  pthread_t th[T];
  block = malloc(T * sizeof(double));  /* ALLOC */
  for (long t = 0; t < T; t++) {
    pthread_create(&th[t], 0, work, (void *)t);
    pthread_join(th[t], 0);
  }
  double s = 0;
  for (int t = 0; t < T; t++) s += block[t];
  free(block);
  return s == 6 ? 0 : 1;
}
"""

#: Nested and sequential loops (no threads; for the loop recovery at -O1).
LOOPS_C = r"""
double a[64], b[64], c[8];
__attribute__((noinline)) void kernel(int n) {
  for (int i = 0; i < n; i++) {         /* OUTER */
    for (int j = 0; j < n; j++)         /* INNER */
      a[i * 8 + j] += b[j] * i;
    c[i] = a[i * 8];
  }
  for (int k = 0; k < n; k++)           /* SECOND */
    b[k] = c[k % 8] + 1;
}
int main(int argc, char **argv) { (void)argv; kernel(argc + 7); return (int)b[0]; }
"""


def _line(src: str, mark: str) -> int:
    return next(k for k, ln in enumerate(src.splitlines(), 1) if mark in ln)


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install valgrind gcc binutils)")


def _compile(tmp: Path, name: str, src: str, *flags: str) -> Path:
    c = tmp / f"{name}.c"
    c.write_text(src)
    exe = tmp / name
    run_bounded(["gcc", *flags, str(c), "-o", str(exe)], timeout=120, check=True)
    return exe


@pytest.fixture(scope="module")
def order_run(tmp_path_factory: pytest.TempPathFactory) -> TraceRun:
    if missing_tools():
        pytest.skip(f"{', '.join(missing_tools())} not installed (apt-get install valgrind gcc)")
    tmp = tmp_path_factory.mktemp("order")
    return run_program([str(_compile(tmp, "order", ORDER_C, "-g", "-O1", "-pthread"))])


def test_threads_are_numbered_in_creation_order(order_run: TraceRun) -> None:
    pp = parse_trace(order_run)
    assert pp.nthreads == 4 and pp.valgrind_threads[0] == 1
    slot = next(o for o in pp.objects if o.name == "slot")
    tr = pp.profile.trace
    for t in range(3):  # worker t (created t-th) writes slot[8 t]: logical thread t + 1
        e = slot.first + 8 * t
        writers = set(tr[(tr[:, 2] == e) & (tr[:, 4] == 1), 0].tolist())
        assert writers == {t + 1}


def test_heap_object_has_its_allocation_site(order_run: TraceRun) -> None:
    pp = parse_trace(order_run)
    heap = [o for o in pp.objects if o.kind == "heap"]
    assert len(heap) == 1 and heap[0].size == 24
    assert heap[0].site == f"order.c:{_line(ORDER_C, 'ALLOC')} (main)"
    rows = {r.name: r for r in object_table(pp)}
    assert rows["heap#1"].sharing == "single-writer"  # each worker writes, main reads
    assert rows["slot"].false_sharing_lines == 0  # one writer per line (8 longs apart)
    # main reads what every worker wrote into the heap block
    m = pp.matrix()
    assert all(m[t, 0] >= 1 for t in (1, 2, 3))


def test_loops_nested_and_sequential_recovered_at_o1(tmp_path: Path) -> None:
    _need("gcc", *BINUTILS)
    b = read_binary(_compile(tmp_path, "loops", LOOPS_C, "-g", "-O1"))
    got = {lp.line: lp for lp in b.loops if lp.function == "kernel"}
    outer, inner, second = (_line(LOOPS_C, m) for m in ("OUTER", "INNER", "SECOND"))
    assert set(got) == {outer, inner, second}
    assert got[inner].parent == got[outer].index
    assert got[outer].parent == -1 and got[second].parent == -1
    # every instruction of the inner body maps to the inner loop, not the outer one
    lo, hi = got[inner].ranges[0]
    assert b.loop_at(lo) == got[inner].index and b.loop_at(hi) == got[inner].index


def test_program_without_debug_info_gets_a_clear_message(tmp_path: Path, capsys) -> None:
    _need("gcc", *BINUTILS)
    exe = _compile(tmp_path, "nodebug", LOOPS_C, "-O1")
    with pytest.raises(NoDebugInfoError, match="-g"):
        read_binary(exe)
    from hpcnb.cli import main

    assert main(["commprof", "profile", "--out", str(tmp_path / "o"), "--", str(exe)]) == 2
    err = capsys.readouterr().err
    assert "nodebug" in err and "build the program with -g" in err


def test_ring_of_four_threads_through_the_command_line(tmp_path: Path, capsys) -> None:
    if missing_tools():
        pytest.skip(f"{', '.join(missing_tools())} not installed (apt-get install valgrind gcc)")
    exe = _compile(tmp_path, "ring", (CSRC / "ring.c").read_text(), "-g", "-O1", "-pthread")
    from hpcnb.cli import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "commprof",
                "profile",
                "--out",
                str(out),
                "--threads-hint",
                "5",
                "--",
                str(exe),
                "4",
                "8",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "communication.csv",
        "loops.csv",
        "objects.csv",
        "report.md",
    ]
    rows = list(csv.reader((out / "communication.csv").open()))
    assert rows[0] == ["writer\\reader", "0", "1", "2", "3", "4"]
    m = np.array([[int(x) for x in r[1:]] for r in rows[1:]])
    for t in range(4):  # worker t (thread t + 1) reads the 8 words worker t + 1 wrote
        assert m[1 + (t + 1) % 4, 1 + t] >= 8
    loops = {r["loop"]: r for r in csv.DictReader((out / "loops.csv").open())}
    read_loop = f"ring.c:{_line((CSRC / 'ring.c').read_text(), 's += buf[r * N + i]')}"
    assert loops[read_loop]["pattern"] == "ring" and int(loops[read_loop]["events"]) == 32
    objs = {r["object"]: r for r in csv.DictReader((out / "objects.csv").open())}
    assert objs["heap#1"]["site"].startswith("ring.c:") and objs["heap#1"]["bytes"] == "256"


def test_recorded_run_parses_to_a_ring_and_filtering_keeps_the_matrices() -> None:
    run = recorded_run()
    pp = parse_trace(run)
    assert pp.nthreads == 5
    line = _line((CSRC / "ring.c").read_text(), "s += buf[r * N + i]")
    row = next(r for r in loop_table(pp) if r.location == f"ring.c:{line}")
    assert row.pattern == "ring" and row.events == 64
    rid = 1 + next(lp.index for lp in pp.binary.loops if lp.line == line)
    expected = np.zeros((5, 5), np.int64)
    for t in range(4):
        expected[1 + (t + 1) % 4, 1 + t] = 16
    assert np.array_equal(pp.profile.exact[rid], expected)
    again = parse_trace(filter_trace(run))
    assert np.array_equal(again.profile.exact, pp.profile.exact)


def _fake_binary() -> BinaryInfo:
    return BinaryInfo(
        path="fake",
        pie=False,
        functions=[Function("main", 0x1000, 0x1100)],
        symbols=[DataSymbol("x", 0x2000, 16, "p.c:3")],
        line_addresses=[0x1000, 0x1010, 0x1020],
        line_rows=[("p.c", 5), ("p.c", 7), ("p.c", 9)],
        loops=[Loop(0, "main", "p.c", 7, ((0x1010, 0x101F),), -1)],
    )


def test_parser_joins_clone_scheduler_mailbox_and_line_records() -> None:
    log = "\n".join(
        [
            "--9--   SCHED[1]:  acquired lock (thread_wrapper(starting new thread))",
            "I  00001000,4",
            " S 00002000,8",  # main writes x[0] outside loops
            " S 00009000,8",  # mailbox: heap event 1 happens
            "I  00001012,4",
            " S 00005000,16",  # main writes the heap block in the loop
            "SYSCALL[9,1](56) sys_clone ( 3d0f00, 0x7000, 0x0, 0x0, 0x0 ) --> Success(0x2)",
            "--9--   SCHED[2]:  acquired lock (thread_wrapper(starting new thread))",
            " S 00007000,8",  # child's first access: its stack
            "I  00001014,4",
            " L 00005008,8",
            " L 00002000,8",
            " L 00002000,8",
            "--9--   SCHED[2]: release lock in VG_(exit_thread)",
            "--9--   SCHED[1]:  acquired lock (VG_(client_syscall)[async])",
            "I  00001020,4",
            " L 00005000,8",
        ]
    )
    alloc = "BASE 0x0\nMAILBOX 0x9000\nA 1 0x5000 16 0x1011\n"
    pp = parse_trace(TraceRun(log, alloc, _fake_binary(), ["fake"]))
    assert pp.nthreads == 2 and pp.valgrind_threads == [1, 2]
    names = [o.name for o in pp.objects]
    assert names == ["x", "heap#1"]
    assert pp.objects[1].site == "p.c:7 (main)"
    # the child (thread 1) reads heap word 1 and x[0], both written by main, in the loop
    assert pp.profile.exact[1].tolist() == [[0, 2], [0, 0]]
    assert pp.profile.exact[0].sum() == 0


def test_missing_tools_are_named(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert set(missing_tools()) == {"valgrind", "gcc", *BINUTILS}


def test_false_sharing_lines_and_compact_addresses() -> None:
    log = "\n".join(
        [
            "--9--   SCHED[1]:  acquired lock (thread_wrapper(starting new thread))",
            "I  00001000,4",
            " S 00002000,8",  # main writes x[0]
            "SYSCALL[9,1](56) sys_clone ( 3d0f00, 0x7ffff000, 0x0, 0x0, 0x0 ) --> Success(0x2)",
            "--9--   SCHED[2]:  acquired lock (thread_wrapper(starting new thread))",
            " S 7fffeff8,8",
            " S 00002008,8",
            " L 00002008,8",  # child: its stack, then x[1]
        ]
    )
    pp = parse_trace(TraceRun(log, "BASE 0x0\n", _fake_binary(), ["fake"]))
    (x,) = [r for r in object_table(pp) if r.name == "x"]
    assert x.false_sharing_lines == 1 and x.sharing == "partitioned" and x.events == 0
    compact = pp.compact_profile()
    assert compact.trace[:, 3].max() < 4096 and np.array_equal(
        compact.trace[:, 3] % 64, pp.profile.trace[:, 3] % 64
    )


def test_thread_started_before_its_clone_record_keeps_creation_order() -> None:
    log = "\n".join(
        [
            "--9--   SCHED[1]:  acquired lock (thread_wrapper(starting new thread))",
            "I  00001000,4",
            " S 00002000,8",
            "--9--   SCHED[2]:  acquired lock (thread_wrapper(starting new thread))",
            " S 00006ff8,8",
            " S 00002008,8",  # runs before its clone is logged
            "SYSCALL[9,1](56) sys_clone ( 3d0f00, 0x7000, 0x0, 0x0, 0x0 ) --> Success(0x2)",
            "SYSCALL[9,1](56) sys_clone ( 3d0f00, 0x9000, 0x0, 0x0, 0x0 ) --> Success(0x3)",
            "--9--   SCHED[3]:  acquired lock (thread_wrapper(starting new thread))",
            " S 00008ff8,8",
            " L 00002008,8",
        ]
    )
    pp = parse_trace(TraceRun(log, "BASE 0x0\n", _fake_binary(), ["fake"]))
    assert pp.valgrind_threads == [1, 2, 3]  # no thread counted twice, no hole
    assert pp.matrix()[1, 2] == 1


def test_trace_of_a_program_without_data_objects_parses() -> None:
    binary = BinaryInfo(
        path="fake",
        pie=False,
        functions=[Function("main", 0x1000, 0x1100)],
        symbols=[],
        line_addresses=[0x1000],
        line_rows=[("p.c", 5)],
        loops=[],
    )
    log = "\n".join(
        [
            "--9--   SCHED[1]:  acquired lock (thread_wrapper(starting new thread))",
            "I  00001000,4",
            " S 00002000,8",  # no object there: not a row
        ]
    )
    pp = parse_trace(TraceRun(log, "BASE 0x0\n", binary, ["fake"]))
    assert pp.objects == [] and pp.nthreads == 1
    assert len(pp.profile.trace) == 0 and pp.matrix().sum() == 0


def test_word_size_and_missing_trace_are_named() -> None:
    run = TraceRun("I  00001000,4\n", "BASE 0x0\n", _fake_binary(), ["fake"])
    with pytest.raises(ValueError, match="word_bytes=3: expected 1, 2, 4, 8 or 16"):
        parse_trace(run, word_bytes=3)
    empty = TraceRun("==9== no trace\n", "BASE 0x0\n", _fake_binary(), ["fake", "x"])
    with pytest.raises(TraceError, match="fake x: the valgrind log holds no memory trace"):
        parse_trace(empty)
    with pytest.raises(TraceError, match=r"allocation log line 'A 1 0x5000': unexpected format"):
        parse_trace(TraceRun(run.log, "A 1 0x5000\n", _fake_binary(), ["fake"]))


def test_marginal_overhead_cancels_start_up() -> None:
    import time

    from hpcnb.commprof.native import marginal_overhead

    def native(size: int) -> None:
        time.sleep(0.03 + 0.002 * size)  # 30 ms start-up, 2 ms per unit

    def tool(size: int) -> None:
        time.sleep(0.1 + 0.01 * size)  # 100 ms start-up, 10 ms per unit

    over = marginal_overhead(native, tool, (1, 11), (1, 5), repeats=3, warmup=0)
    assert len(over) == 3
    # per unit 10 ms against 2 ms: 5x; the whole-run ratio at the small sizes would be 3.5x
    assert 3.8 < float(np.median(over)) < 7.0
    with pytest.raises(ValueError, match="sizes"):
        marginal_overhead(native, tool, (5, 5), (1, 2))
