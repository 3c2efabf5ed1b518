"""Tests of hpcnb.commprof: hooks, virtual threads, shadow memories, matrices, patterns."""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest

from hpcnb import commprof
from hpcnb.commprof import MemoryConfig, Schedule, prange
from hpcnb.commprof.analysis import PATTERNS, classify_pattern, inclusive, loop_tree
from hpcnb.commprof.hooks import sched_iters
from hpcnb.commprof.shadow import (
    detection_accuracy,
    replay_exact,
    replay_exact_table,
    replay_signature,
    signature_sweep,
)
from hpcnb.commprof.suite import SUITE, check_result, suite_case


@commprof.kernel
def pass_right(tid, nthreads, phase, a, b):
    if phase == 0:
        a[tid] = tid + 1.0
    else:
        for _r in range(2):
            b[tid] += a[(tid + 1) % nthreads]


@commprof.kernel
def neighbours(tid, nthreads, phase, a, b):
    n = a.shape[0]
    for i in prange(1, n - 1):
        if phase % 2 == 0:
            b[i] = a[i - 1] + a[i + 1]
        else:
            a[i] = b[i - 1] + b[i + 1]


def _lines(fn_name: str) -> dict[str, int]:
    src, start = inspect.getsourcelines(globals()[fn_name].py_func)
    return {ln.strip(): start + k for k, ln in enumerate(src)}


def test_hooks_emit_exact_event_sequence() -> None:
    a, b = np.zeros(3), np.zeros(3)
    p = commprof.profile(pass_right, [a, b], nthreads=3, nphases=2, trace=True)
    assert np.allclose(b, [4.0, 6.0, 2.0])
    tr = p.trace
    assert tr is not None
    r_loop = pass_right.region_id(_lines("pass_right")["for _r in range(2):"])
    expected = [(t, 0, t, 1, 0) for t in range(3)]  # phase 0: a[t] = ... (write, region 0)
    for t in range(3):  # phase 1: two iterations of  b[t] += a[t+1]
        for _ in range(2):
            expected += [(t, r_loop, 3 + t, 0, 1), (t, r_loop, (t + 1) % 3, 0, 1)]
            expected += [(t, r_loop, 3 + t, 1, 1)]
    got = [(int(r[0]), int(r[1]), int(r[2]), int(r[4]), int(r[5])) for r in tr]
    assert got == expected
    # each thread reads its right neighbour's value once (repeat read is no new event)
    m = p.exact[r_loop]
    assert m.sum() == 3 and m[1, 0] == m[2, 1] == m[0, 2] == 1
    assert classify_pattern(inclusive(p.regions, p.exact)[0]) == "ring"
    assert p.accesses[r_loop].tolist() == [12, 6]


def test_regions_follow_loop_lines_and_nesting() -> None:
    lines = _lines("neighbours")
    regions = neighbours.regions
    assert regions[0].kind == "kernel" and regions[0].parent == -1
    loop = [r for r in regions if r.kind == "prange"]
    assert len(loop) == 1 and loop[0].line == lines["for i in prange(1, n - 1):"]
    assert loop[0].parent == 0
    src = neighbours.instrumented_source
    assert src.count("enter(_cp_S") == src.count("leave(_cp_S") == 1
    assert "ld1(_cp_S, 0, a" in src and "st1(_cp_S, 1, b" in src
    assert "ld1" not in neighbours.native_source and "sched_iters" in neighbours.native_source


def test_ring_and_nearest_neighbour_matrices() -> None:
    a, b = np.zeros(8), np.zeros(8)
    p = commprof.profile(pass_right, [a, b], nthreads=8, nphases=2)
    assert classify_pattern(inclusive(p.regions, p.exact)[0]) == "ring"
    a = np.arange(34.0)
    p = commprof.profile(neighbours, [a, np.zeros(34)], nthreads=4, nphases=3)
    m = inclusive(p.regions, p.exact)[0]
    assert classify_pattern(m) == "nearest-neighbour"
    assert np.array_equal(m, m.T) and m[0, 1] > 0 and m[0, 2] == 0 and m[0, 3] == 0


def test_native_serial_parallel_and_instrumented_agree() -> None:
    base = np.random.default_rng(0).random(50)
    outs = []
    for mode in ("instr", "native", "parallel"):
        a, b = base.copy(), np.zeros(50)
        sched = Schedule("dynamic", chunk=3, seed=1)
        if mode == "instr":
            commprof.profile(neighbours, [a, b], nthreads=5, nphases=3, schedule=sched)
        else:
            commprof.run_native(
                neighbours,
                [a, b],
                nthreads=5,
                nphases=3,
                schedule=sched,
                parallel=mode == "parallel",
            )
        outs.append((a, b))
    for a, b in outs[1:]:
        assert np.allclose(a, outs[0][0]) and np.allclose(b, outs[0][1])


def test_interleaving_does_not_change_race_free_matrices() -> None:
    mats = []
    for order in ("ascending", "descending", "seeded"):
        a = np.arange(40.0)
        p = commprof.profile(
            neighbours, [a, np.zeros(40)], nthreads=6, nphases=4, interleave=order, seed=3
        )
        mats.append(p.exact)
    assert all(np.array_equal(mats[0], m) for m in mats[1:])


@pytest.mark.parametrize("kind,chunk", [(0, 1), (1, 1), (1, 4), (2, 3)])
def test_schedules_partition_the_iteration_space(kind: int, chunk: int) -> None:
    sched = np.array([kind, chunk, 7], np.int64)
    parts = [sched_iters(sched, t, 5, 3, 40) for t in range(5)]
    allit = np.sort(np.concatenate(parts))
    assert np.array_equal(allit, np.arange(3, 40))
    again = [sched_iters(sched, t, 5, 3, 40) for t in range(5)]
    assert all(np.array_equal(x, y) for x, y in zip(parts, again, strict=True))
    if kind == 0:
        assert all(np.all(np.diff(p) == 1) for p in parts)
    if kind == 1 and chunk == 1:
        assert parts[1][:3].tolist() == [4, 9, 14]


def test_signature_with_enough_slots_equals_exact() -> None:
    a = np.arange(40.0)
    footprint_words = 2 * 40 + 16
    mem = MemoryConfig(
        exact=True, write_slots=footprint_words + 1, read_slots=footprint_words + 1, hash="word"
    )
    p = commprof.profile(
        neighbours, [a, np.zeros(40)], nthreads=6, nphases=4, memory=mem, trace=True
    )
    assert p.signature is not None and p.exact.sum() > 0
    assert np.array_equal(p.signature, p.exact)
    assert np.array_equal(replay_exact(p), p.exact)
    table, nbytes = replay_exact_table(p)
    assert np.array_equal(table, p.exact) and nbytes >= 17 * 80
    # the replay reproduces the online signature; a tiny signature is measurably worse
    assert np.array_equal(replay_signature(p, footprint_words + 1, hash="word"), p.signature)
    small = detection_accuracy(p.exact, replay_signature(p, 7, 3, hash="discopop"))
    assert small.f1 < 1.0
    rows = signature_sweep(p, fractions=(1.0, 0.01), read_shares=(0.5,), hashes=("word",))
    assert rows[0]["f1"] == 1.0 and rows[1]["f1"] < 1.0


def test_accuracy_definition() -> None:
    ex = np.array([[[0, 4], [2, 0]]])
    det = np.array([[[0, 3], [3, 0]]])
    acc = detection_accuracy(ex, det)
    assert acc.precision == pytest.approx(5 / 6) and acc.recall == pytest.approx(5 / 6)
    assert detection_accuracy(np.zeros((1, 2, 2)), np.zeros((1, 2, 2))).f1 == 1.0


def _star(T: int, hub: int, out: bool, inn: bool) -> np.ndarray:
    m = np.zeros((T, T))
    for t in range(T):
        if t != hub:
            m[hub, t] = 5 * out
            m[t, hub] = 5 * inn
    return m


def test_classifier_on_synthetic_matrices() -> None:
    T = 8
    idx = np.arange(T)
    chain = np.zeros((T, T))
    chain[idx[:-1], idx[1:]] = 3
    ring = chain.copy()
    ring[T - 1, 0] = 3
    nn = chain + chain.T
    fly = np.zeros((T, T))
    for s in (1, 2, 4):
        fly[idx, idx ^ s] = 2
    tree = np.zeros((T, T))
    for s in (1, 2, 4):
        for t in range(0, T, 2 * s):
            tree[t + s, t] = 1
    dense = np.ones((T, T)) - np.eye(T)
    cases = {
        "none": np.zeros((T, T)),
        "pipeline": chain,
        "ring": ring,
        "nearest-neighbour": nn,
        "butterfly": fly,
        "reduction": tree,
        "all-to-all": dense,
        "broadcast": _star(T, 0, True, True),
    }
    for want, m in cases.items():
        assert classify_pattern(m) == want, want
    assert classify_pattern(_star(T, 3, False, True)) == "reduction"
    assert classify_pattern(_star(T, 3, True, False)) == "broadcast"
    noisy = nn + 0.01 * dense  # stray collision events below the edge threshold
    assert classify_pattern(noisy) == "nearest-neighbour"
    assert set(cases) <= set(PATTERNS)
    with pytest.raises(ValueError, match="square"):
        classify_pattern(np.zeros((2, 3)))


@pytest.mark.parametrize("name", ["jacobi", "needleman_wunsch", "tree_reduction", "fft"])
def test_suite_kernels_match_ground_truth(name: str) -> None:
    c = suite_case(name)
    args, nphases = c.make(16, 8, 0)
    original = copy.deepcopy(args)
    p = commprof.profile(c.kernel, args, nthreads=8, nphases=nphases, schedule=c.schedule)
    assert check_result(name, args, original)
    nodes = loop_tree(p.regions, p.exact, p.accesses)
    assert nodes[0].pattern == c.pattern
    assert nodes[0].inclusive == p.exact.sum() > 0


def test_suite_is_complete() -> None:
    want = {
        "jacobi",
        "hotspot",
        "kmeans",
        "needleman_wunsch",
        "lu",
        "bfs",
        "fft",
        "radix_sort",
        "tree_reduction",
        "transpose",
        "pipeline",
    }
    assert set(SUITE) == want
    assert {c.pattern for c in SUITE.values()} <= set(PATTERNS)
    with pytest.raises(KeyError, match="known"):
        suite_case("nope")


def _expect_error(src: str, what: str, line_in_src: int, tmp_path) -> None:
    path = tmp_path / "bad_kernel.py"
    path.write_text("from hpcnb import commprof\n\n" + src)
    ns: dict[str, object] = {}
    code = compile(path.read_text(), str(path), "exec")
    with pytest.raises(commprof.InstrumentationError) as err:
        exec(code, ns)
    msg = str(err.value)
    assert f"bad_kernel.py:{line_in_src + 2}:" in msg and what in msg


@pytest.mark.parametrize(
    "body,what,line",
    [
        ("    for i in range(3):\n        b[i] = a[1:3]\n", "slice of 'a'", 4),
        ("    for i in range(3):\n        return\n", "'return' inside a loop", 4),
        ("    t = a\n    b[0] = a[0]\n", "whole-array use of 'a'", 3),
        ("    b[0] = a.sum() + a[0]\n", "'a.sum'", 3),
        ("    x = [a[i] for i in range(3)]\n    b[0] = 1.0\n", "comprehensions", 3),
    ],
)
def test_uninstrumentable_constructs_name_file_and_line(body, what, line, tmp_path) -> None:
    src = "@commprof.kernel\ndef bad(tid, nthreads, phase, a, b):\n" + body
    _expect_error(src, what, line, tmp_path)


def test_bad_arguments_are_reported() -> None:
    with pytest.raises(TypeError, match="'a' must be"):
        commprof.profile(neighbours, [3, np.zeros(3)], nthreads=2)
    with pytest.raises(ValueError, match="nthreads"):
        commprof.profile(neighbours, [np.zeros(3), np.zeros(3)], nthreads=65)
    with pytest.raises(ValueError, match="schedule kind"):
        commprof.run_native(
            neighbours, [np.zeros(3), np.zeros(3)], nthreads=2, schedule=Schedule("guided")
        )
