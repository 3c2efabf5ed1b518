"""The rigid kernel's indexed queue, the columnar trace path and the fast CSV writer."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcnb.batchsim import FixedWork, Job, JobType, Platform, check_invariants, simulate
from hpcnb.batchsim.index import FitIndex, profile_shadow
from hpcnb.batchsim.scheduler import FCFS, SJF, EasyBackfilling, shadow_time
from hpcnb.batchsim.simulation import _write_csv, simulate_rigid
from hpcnb.batchsim.swf import trace_from_arrays
from hpcnb.batchsim.workloads import jobs_from_swf, rigid_arrays_from_swf
from hpcnb.errors import InvalidInputError


def long_queue(n: int = 200, nodes: int = 16, seed: int = 0) -> list[Job]:
    """A backlog: ``n`` jobs submitted in bursts far faster than the machine runs them."""
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(n):
        size = int(rng.choice([1, 1, 2, 3, 4, 8, nodes]))
        run = float(rng.integers(1, 400))
        walltime = run + float(rng.integers(0, 200)) if i % 3 else None
        jobs.append(Job(i, float(i // 20), JobType.RIGID, size, FixedWork(run), walltime=walltime))
    return jobs


@pytest.mark.parametrize("scheduler", [FCFS(), EasyBackfilling()], ids=["fcfs", "easy"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_long_queue_same_schedule_as_the_full_scan(scheduler, seed):
    # the general engine's pass scans the whole queue; the kernel indexes it
    jobs = long_queue(seed=seed)
    fast = simulate(jobs, Platform(16), scheduler)
    scan = simulate(jobs, Platform(16), scheduler, compiled=False)
    assert fast.compiled and not scan.compiled
    check_invariants(fast, jobs)
    np.testing.assert_array_equal(fast.jobs["start"].to_numpy(), scan.jobs["start"].to_numpy())
    # a backlog indeed: most jobs wait
    assert (fast.jobs["wait"] > 0).mean() > 0.5


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 9), st.floats(0, 50), st.booleans()), min_size=1, max_size=70
    ),
    st.integers(0, 70),
    st.integers(0, 10),
    st.integers(0, 10),
    st.floats(0, 20),
    st.floats(0, 80) | st.just(math.inf),
)
def test_first_fit_equals_a_linear_scan(jobs, lo, free, extra, now, shadow):
    """Jobs of sizes [fit, fit + grow]: they start with min(size, free) nodes."""
    index = FitIndex(len(jobs))
    sizes = []
    for j, (fit, est, waiting) in enumerate(jobs):
        size = fit + j % 3
        sizes.append((fit, size, est, waiting))
        if waiting:
            index.add(j, fit, size, est)
    if jobs and jobs[0][2]:
        index.remove(0)  # and out again
        sizes[0] = (*sizes[0][:3], False)
    got = index.first(lo, free, extra, now, shadow)
    expected = next(
        (
            j
            for j, (fit, size, est, waiting) in enumerate(sizes)
            if j >= lo
            and waiting
            and fit <= free
            and (now + est <= shadow or min(size, free) <= extra)
        ),
        -1,
    )
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100), st.integers(1, 8)), max_size=30),
    st.floats(0, 120),
    st.integers(0, 8),
    st.integers(1, 40),
)
def test_profile_gives_the_earliest_start_for_k_nodes(running, now, free, need):
    """The shadow time is the earliest time ``need`` nodes are free, by brute force."""
    if free >= need:
        need = free + 1  # the kernel asks only for a head that does not fit now
    start = np.array([r[0] for r in running] + [0.0])
    estimate = np.array([r[1] for r in running] + [0.0])
    size = np.array([r[2] for r in running] + [1], dtype=np.int64)
    idx = np.arange(len(running), dtype=np.int64)
    scratch_e, scratch_s = np.empty(len(running) + 1), np.empty(len(running) + 1, np.int64)
    shadow, extra = profile_shadow(
        now, free, need, start, estimate, size, idx, len(idx), scratch_e, scratch_s
    )
    ends = sorted({max(now, s + e) for s, e, _ in running})
    brute = (math.inf, 0)
    for t in ends:  # try every candidate time in order; the first with enough nodes wins
        avail = free + sum(n for s, e, n in running if max(now, s + e) <= t)
        if avail >= need:
            brute = (t, avail - need)
            break
    assert (shadow, extra) == brute
    releases = [(max(now, s + e), n) for s, e, n in running]
    assert (shadow, extra) == shadow_time(now, free, need, releases)


def _trace(n: int = 300, seed: int = 4):
    rng = np.random.default_rng(seed)
    run = rng.integers(1, 1000, n).astype(float)
    run[5] = -1  # unknown: skipped
    trace = trace_from_arrays(
        submit=np.sort(rng.integers(0, 5000, n)).astype(float),
        run_time=run,
        processors=rng.integers(1, 40, n).astype(float),
        requested_time=np.where(rng.random(n) < 0.5, run * 2, -1),
    )
    trace.fields["user_id"][:] = rng.integers(-1, 5, n)
    return trace


@pytest.mark.parametrize("scheduler", [FCFS(), EasyBackfilling()], ids=["fcfs", "easy"])
def test_columns_give_the_result_of_the_job_objects(scheduler, tmp_path):
    trace = _trace()
    rows = rigid_arrays_from_swf(trace, 32)
    jobs = jobs_from_swf(trace, 32)
    assert len(rows) == len(jobs.jobs) and rows.skipped == jobs.skipped
    assert len(rows) + len(rows.skipped) == 300 and len(rows) > 200
    fast = simulate_rigid(
        rows.ids,
        rows.submit,
        rows.size,
        rows.runtime,
        rows.walltime,
        rows.user,
        Platform(32),
        scheduler,
    )
    slow = simulate(jobs.jobs, Platform(32), scheduler)
    for column in ("id", "submit", "start", "end", "nodes", "user"):
        np.testing.assert_array_equal(fast.jobs[column].to_numpy(), slow.jobs[column].to_numpy())
    a, b = fast.write(tmp_path / "a"), slow.write(tmp_path / "b")
    for name in ("job_statistics", "node_utilization"):
        assert a[name].read_bytes() == b[name].read_bytes()


def test_columns_reject_bad_input():
    one = np.ones(2)
    ids = np.array([1, 2])
    with pytest.raises(InvalidInputError, match="no compiled kernel"):
        simulate_rigid(ids, one, one, one, one, one, Platform(2), SJF())
    with pytest.raises(InvalidInputError, match="not unique"):
        simulate_rigid(np.array([3, 3]), one, one, one, one, one, Platform(2), FCFS())
    with pytest.raises(InvalidInputError, match="job 2: needs 5 nodes"):
        simulate_rigid(ids, one, np.array([1, 5]), one, one, one, Platform(2), FCFS())
    with pytest.raises(InvalidInputError, match="one length"):
        simulate_rigid(ids, one, one, np.ones(3), one, one, Platform(2), FCFS())
    with pytest.raises(InvalidInputError, match="job 1: submit_time=-1"):
        simulate_rigid(ids, np.array([-1.0, 0]), one, one, one, one, Platform(2), FCFS())


def test_a_non_finite_requested_time_names_its_job_and_line():
    trace = trace_from_arrays(
        submit=np.zeros(2),
        run_time=np.ones(2),
        processors=np.ones(2),
        requested_time=np.array([5.0, np.inf]),
    )
    with pytest.raises(InvalidInputError, match=r"job 2: requested time inf is not finite"):
        rigid_arrays_from_swf(trace, 4)


def _csv_reference(columns: dict) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(zip(*(np.asarray(v).tolist() for v in columns.values()), strict=True))
    return buf.getvalue()


@pytest.mark.parametrize(
    "columns",
    [
        {"a": np.arange(5), "b": np.array([0.0, 1.0, -2.0, 3e15, 7.0])},
        {"a": np.array([0.5, np.nan, np.inf, -0.0, 1e300]), "t": ["x", "y", "x", "y", "x"]},
        {"s": ["p,q", "r", "s", "t", "u"], "v": np.zeros(5)},  # quoted: falls back
        {"s": ['a"b', "r", "s", "t", "u"], "k": np.full(5, "done", dtype=object)},
        {"c": np.full(5, "100%", dtype=object), "d": np.array([1, 2, 3, 4, 5]) * 2**40},
        {"e": np.array([], dtype=float), "f": np.array([], dtype=np.int64)},
    ],
)
def test_fast_csv_writes_the_bytes_of_csv_writer(columns, tmp_path):
    path = tmp_path / "t.csv"
    _write_csv(path, columns)
    assert path.read_text(encoding="utf-8") == _csv_reference(columns)


def test_fast_csv_on_many_rows_with_blocks(tmp_path):
    rng = np.random.default_rng(1)
    n = 150_000  # more than one block of rows
    columns = {
        "id": np.arange(n),
        "type": np.where(rng.random(n) < 0.5, "rigid", "malleable").astype(object),
        "t": np.floor(rng.random(n) * 1e6),
        "x": rng.random(n),
    }
    path = tmp_path / "t.csv"
    _write_csv(path, columns)
    assert path.read_text(encoding="utf-8") == _csv_reference(columns)


def test_waiting_queue_is_a_sequence_in_submit_order():
    from hpcnb.batchsim.engine import JobRecord, WaitingQueue

    records = []
    for k in range(100):
        rec = JobRecord(Job(k, 0.0, JobType.RIGID, 1, FixedWork(1.0)))
        rec.seq = k
        records.append(rec)
    queue = WaitingQueue()
    for rec in records:
        queue._add(rec, None)
    removed = {0, 1, 2, 5, 50, *range(60, 99)}  # the head, the middle, enough to compact
    for k in sorted(removed):
        queue._remove(records[k])
    alive = [r for r in records if r.seq not in removed]
    assert list(queue) == alive and len(queue) == len(alive) and queue
    assert queue[0] is alive[0] and queue[3] is alive[3] and queue[-1] is alive[-1]
    assert queue[1:3] == alive[1:3]
    assert records[4] in queue and records[5] not in queue and "x" not in queue
    with pytest.raises(IndexError, match="out of range"):
        queue[len(alive)]
    for rec in alive:
        queue._remove(rec)
    assert not queue and list(queue) == []


def test_lazy_queue_iteration_while_starting_visits_every_job_once():
    class StartAll(FCFS):
        def act(self, view):
            seen = []
            for rec in view.queue:  # no snapshot: starting removes the job as we go
                seen.append(rec.id)
                view.start(rec)
            assert len(seen) == len(set(seen))

    jobs = [Job(i, 0.0, JobType.RIGID, 1, FixedWork(5.0)) for i in range(6)]
    result = simulate(jobs, Platform(6), StartAll())
    assert (result.jobs["start"] == 0).all()


def test_long_queue_trace_copies_jobs_with_unique_ids():
    from hpcnb.batchsim.experiments import long_queue_trace

    trace = _trace(40)
    long = long_queue_trace(trace, 10, 3)
    assert len(long) == 30
    ids = long.fields["job_id"]
    assert len(set(ids.tolist())) == 30
    np.testing.assert_array_equal(long.fields["submit_time"][::3], trace.fields["submit_time"][:10])
    assert np.all(np.diff(long.fields["submit_time"]) >= 0)
    with pytest.raises(InvalidInputError, match="copies=0"):
        long_queue_trace(trace, 10, 0)


def test_loglog_slope_and_backlog_scaling():
    from hpcnb.batchsim.experiments import backlog_scaling, loglog_slope

    assert loglog_slope([1, 10, 100], [3, 30, 300]) == pytest.approx(1.0)
    assert loglog_slope([1, 10, 100], [1, 100, 10_000]) == pytest.approx(2.0)
    with pytest.raises(InvalidInputError, match="positive"):
        loglog_slope([1, 2], [0, 1])
    table = backlog_scaling(
        _trace(60), 32, 50, (1, 4), repeats=2, engine_max_jobs=1000, engine_repeats=1
    )
    counts = table.groupby(["scheduler", "path"]).size().to_dict()
    assert counts == {
        ("easy", "compiled"): 4,
        ("easy", "general"): 2,
        ("fcfs", "compiled"): 4,
        ("fcfs", "general"): 2,
    }
    # the same schedule on both paths gives the same longest queue; it grows with the copies
    peak = table.groupby(["scheduler", "path", "copies"])["max_queue"].first().unstack("path")
    assert (peak["compiled"] == peak["general"]).all()
    assert (peak.xs(4, level="copies")["compiled"] > peak.xs(1, level="copies")["compiled"]).all()
