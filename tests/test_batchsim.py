"""Tests of the batch simulator: engine, schedulers (hand-computed), invariants, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from hpcnb.batchsim import (
    SCHEDULERS,
    FixedWork,
    Job,
    JobType,
    MalleablePolicy,
    Platform,
    ScaledWork,
    Scheduler,
    WorkModel,
    check_invariants,
    jobs_from_swf,
    lublin_feitelson,
    make_scheduler,
    simulate,
)
from hpcnb.batchsim.engine import InvocationReason, SchedulerError, SchedulerView, SimulationError
from hpcnb.batchsim.policies import DRF, SRTF, MalleableEasy
from hpcnb.batchsim.rigid import simulate_rigid_arrays
from hpcnb.batchsim.scheduler import FCFS, SJF, ConservativeBackfilling, EasyBackfilling


def rigid(jid: int, submit: float, nodes: int, runtime: float, user: int = 0) -> Job:
    return Job(jid, submit, JobType.RIGID, nodes, FixedWork(runtime), user=user)


def starts(result) -> dict[int, float]:
    return dict(zip(result.jobs["id"], result.jobs["start"], strict=True))


def run(jobs, scheduler, nodes=4, compiled=False):
    result = simulate(jobs, Platform(nodes), scheduler, compiled=compiled)
    check_invariants(result, jobs)
    return result


# Four nodes; J2 needs the whole machine and blocks J3, J4 under strict FCFS.
SMALL = [rigid(1, 0, 2, 10), rigid(2, 0, 4, 5), rigid(3, 1, 1, 3), rigid(4, 1, 2, 20)]


@pytest.mark.parametrize("compiled", [False, True])
def test_fcfs_hand_computed(compiled):
    assert starts(run(SMALL, FCFS(), compiled=compiled)) == {1: 0, 2: 10, 3: 15, 4: 15}


@pytest.mark.parametrize("compiled", [False, True])
def test_easy_hand_computed(compiled):
    # J3 ends (t=4) before the shadow time 10 -> backfilled at 1; J4 would delay J2.
    assert starts(run(SMALL, EasyBackfilling(), compiled=compiled)) == {1: 0, 2: 10, 3: 1, 4: 15}


def test_sjf_hand_computed():
    # t=0: J2 (5 s) before J1 (10 s); t=5: J3 and J1; t=8: J4.
    assert starts(run(SMALL, SJF())) == {1: 5, 2: 0, 3: 5, 4: 8}


def test_conservative_hand_computed():
    assert starts(run(SMALL, ConservativeBackfilling())) == {1: 0, 2: 10, 3: 1, 4: 15}


def test_conservative_protects_every_reservation_easy_only_the_head():
    # J4 (1 node, 30 s) fits the extra node at EASY's shadow time, so EASY starts it at 2
    # and J3 (whole machine) waits until 32; conservative keeps J3's slot at 20.
    jobs = [rigid(1, 0, 3, 10), rigid(2, 1, 2, 10), rigid(3, 1, 4, 10), rigid(4, 2, 1, 30)]
    assert starts(run(jobs, EasyBackfilling())) == {1: 0, 2: 10, 3: 32, 4: 2}
    assert starts(run(jobs, EasyBackfilling(), compiled=True)) == {1: 0, 2: 10, 3: 32, 4: 2}
    assert starts(run(jobs, ConservativeBackfilling())) == {1: 0, 2: 10, 3: 20, 4: 30}


def test_drf_serves_smallest_dominant_share():
    jobs = [rigid(1, 0, 2, 10, user=1), rigid(2, 0, 2, 10, user=1), rigid(3, 0, 2, 10, user=2)]
    assert starts(run(jobs, DRF())) == {1: 0, 3: 0, 2: 10}
    assert starts(run(jobs, FCFS())) == {1: 0, 2: 0, 3: 10}


def malleable_case():
    work = ScaledWork(100.0, 4, serial_fraction=0.0, units=10, reconfiguration_cost=0.0)
    return [Job(1, 0, JobType.MALLEABLE, 4, work, 1, 4), rigid(2, 25, 2, 10)]


@pytest.mark.parametrize("scheduler", [SRTF(), MalleableEasy()])
def test_malleable_shrink_then_expand_hand_computed(scheduler):
    # J1 (4 nodes, 10 s units) is shrunk to 2 at t=25, effective at its point t=30 where
    # J2 starts; J2 ends at 40, J1 is expanded back (effective at 50): 6 units x 10 s.
    result = run(malleable_case(), scheduler)
    assert starts(result) == {1: 0, 2: 30}
    row = result.jobs.set_index("id").loc[1]
    assert row["end"] == pytest.approx(110.0)
    assert row["resizes"] == 2 and row["min_nodes"] == 2 and row["max_nodes"] == 4
    log = result.resize_log
    assert log[["id", "time", "old", "new"]].values.tolist() == [[1, 30, 4, 2], [1, 50, 2, 4]]


def test_reconfiguration_cost_is_paid():
    work = ScaledWork(100.0, 4, serial_fraction=0.0, units=10, reconfiguration_cost=7.0)
    jobs = [Job(1, 0, JobType.MALLEABLE, 4, work, 1, 4), rigid(2, 25, 2, 10)]
    result = run(jobs, MalleableEasy(gain=0.0))
    # 30 + 7 (shrink) + units at 2 nodes: 40-> expand ordered, effective at 57, +7
    end = result.jobs.set_index("id").loc[1, "end"]
    assert end == pytest.approx(30 + 7 + 20 + 7 + 6 * 10)


def test_rigid_kernel_matches_engine_on_generated_workload():
    trace = lublin_feitelson(400, 64, seed=3)
    loaded = jobs_from_swf(trace)
    for name in ("fcfs", "easy"):
        a = run(loaded.jobs, make_scheduler(name), nodes=64, compiled=True)
        b = run(loaded.jobs, make_scheduler(name), nodes=64, compiled=False)
        assert a.compiled and not b.compiled
        np.testing.assert_array_equal(a.jobs["start"].to_numpy(), b.jobs["start"].to_numpy())


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_invariants_and_determinism(name):
    trace = lublin_feitelson(150, 32, seed=1)
    loaded = jobs_from_swf(trace, policy=MalleablePolicy(0.5, seed=2, reconfiguration_cost=5))
    first = run(loaded.jobs, make_scheduler(name), nodes=32)
    second = run(loaded.jobs, make_scheduler(name), nodes=32)
    assert first.jobs.equals(second.jobs)
    assert first.metrics()["completed"] == len(loaded.jobs)


def test_fcfs_is_strict():
    trace = lublin_feitelson(200, 32, seed=5)
    result = run(jobs_from_swf(trace).jobs, FCFS(), nodes=32, compiled=True)
    order = result.jobs.sort_values(["submit", "id"], kind="stable")["start"].to_numpy()
    assert np.all(np.diff(order) >= 0)


def test_easy_beats_fcfs_on_loaded_machine():
    trace = lublin_feitelson(500, 64, seed=0)
    jobs = jobs_from_swf(trace).jobs
    fcfs = run(jobs, FCFS(), nodes=64, compiled=True).metrics()
    easy = run(jobs, EasyBackfilling(), nodes=64, compiled=True).metrics()
    assert easy["mean_wait"] <= fcfs["mean_wait"]


def test_metrics_hand_computed():
    m = run(SMALL, FCFS()).metrics()
    # waits 0, 10, 14, 14; runs 10, 5, 3, 20; makespan 35
    assert m["makespan"] == 35
    assert m["mean_wait"] == pytest.approx(38 / 4)
    assert m["median_wait"] == pytest.approx(12)
    assert m["mean_turnaround"] == pytest.approx((10 + 15 + 17 + 34) / 4)
    bsld = [1.0, max(1, 15 / 10), max(1, 17 / 10), max(1, 34 / 20)]
    assert m["mean_bounded_slowdown"] == pytest.approx(np.mean(bsld))
    busy = 2 * 10 + 4 * 5 + 1 * 3 + 2 * 20
    assert m["utilization"] == pytest.approx(busy / (4 * 35))


class StartAll(Scheduler):
    """Start every waiting job at its size without checking, then act on running jobs."""

    name = "start-all"

    def schedule(self, view: SchedulerView, reasons) -> None:
        for rec in list(view.queue):
            view.start(rec)
        self.then(view)

    def then(self, view: SchedulerView) -> None:
        """Act on the running jobs after the starts (nothing here)."""


class LargestFirst(Scheduler):
    """Start the largest waiting jobs that fit first (a user policy)."""

    name = "largest-first"

    def schedule(self, view, reasons):
        for rec in sorted(view.queue, key=lambda r: -r.job.num_nodes):
            if rec.job.num_nodes <= view.free_nodes:
                view.start(rec)


class Idle(Scheduler):
    name = "idle"

    def schedule(self, view: SchedulerView, reasons) -> None:
        self.seen = getattr(self, "seen", set()) | set(reasons)


def test_scheduler_errors_are_caught():
    with pytest.raises(SchedulerError, match="nodes free"):
        simulate(SMALL, Platform(4), StartAll(), compiled=False)
    with pytest.raises(SimulationError, match="still waiting"):
        simulate(SMALL, Platform(4), Idle())
    with pytest.raises(ValueError, match="machine has 2"):
        simulate(SMALL, Platform(2), FCFS())
    gpu_job = Job(9, 0, JobType.RIGID, 1, FixedWork(1), gpus_per_node=2)
    with pytest.raises(ValueError, match="needs 2 GPUs per node"):
        simulate([gpu_job], Platform(2, gpus_per_node=1), DRF())
    with pytest.raises(ValueError, match="needs 2 GPUs per node"):
        simulate([gpu_job], Platform(2, gpus_per_node=1), FCFS(), compiled=True)


def test_periodic_invocations_and_reasons():
    sched = Idle()
    with pytest.raises(SimulationError):
        simulate([rigid(1, 0, 1, 1)], Platform(2), sched, scheduling_interval=5)
    assert InvocationReason.PERIODIC in sched.seen and InvocationReason.JOB_SUBMIT in sched.seen


def test_user_scheduler_subclass():
    jobs = [rigid(1, 0, 1, 5), rigid(2, 0, 3, 5), rigid(3, 0, 2, 5)]
    assert starts(run(jobs, LargestFirst(), nodes=4)) == {2: 0, 1: 0, 3: 5}


class LargestFirstAct(Scheduler):
    """The same policy written as ``act``: the base ``schedule`` calls it."""

    name = "largest-first-act"

    def act(self, view: SchedulerView) -> None:
        """Start the largest waiting jobs that fit first."""
        for rec in sorted(view.queue, key=lambda r: -r.job.num_nodes):
            if rec.job.num_nodes <= view.free_nodes:
                view.start(rec)


def test_user_scheduler_act_hook():
    jobs = [rigid(1, 0, 1, 5), rigid(2, 0, 3, 5), rigid(3, 0, 2, 5)]
    assert starts(run(jobs, LargestFirstAct(), nodes=4)) == {2: 0, 1: 0, 3: 5}
    with pytest.raises(NotImplementedError):
        Scheduler().schedule(None, frozenset())


def test_rigid_resize_rejected():
    class Resizer(StartAll):
        def then(self, view):
            for rec in view.running:
                view.resize(rec, 1)

    with pytest.raises(SchedulerError, match="rigid"):
        simulate([rigid(1, 0, 2, 5)], Platform(4), Resizer(), compiled=False)


def test_kernel_input_checks():
    with pytest.raises(ValueError, match="policy"):
        simulate_rigid_arrays(np.zeros(1), np.ones(1), np.ones(1), np.ones(1), 2, "sjf")
    with pytest.raises(ValueError, match="non-decreasing"):
        simulate_rigid_arrays(np.array([1.0, 0.0]), np.ones(2), np.ones(2), np.ones(2), 2, "easy")


def test_kill_action_ends_job_once():
    class KillLong(Scheduler):
        name = "kill-long"

        def schedule(self, view, reasons):
            for rec in list(view.queue):
                if view.requested_time(rec) > 100:
                    view.kill(rec)
                elif rec.job.num_nodes <= view.free_nodes:
                    view.start(rec)

    jobs = [rigid(1, 0, 2, 10), rigid(2, 0, 2, 500), rigid(3, 5, 2, 10)]
    result = simulate(jobs, Platform(4), KillLong(), compiled=False)
    check_invariants(result, jobs)
    rows = result.jobs.set_index("id")
    assert rows.loc[2, "status"] == "killed" and rows.loc[2, "end"] == 0
    assert list(rows["status"]) == ["completed", "killed", "completed"]


def test_moldable_job_takes_what_is_free():
    work = ScaledWork(40.0, 4, serial_fraction=0.0, units=1)
    jobs = [rigid(1, 0, 3, 10), Job(2, 1, JobType.MOLDABLE, 4, work, 1, 4)]
    result = run(jobs, FCFS())
    rows = result.jobs.set_index("id")
    # one node free at t=1: the moldable job starts there on 1 node (4x its 4-node time)
    assert rows.loc[2, "start"] == 1 and rows.loc[2, "nodes"] == 1
    assert rows.loc[2, "runtime"] == pytest.approx(160.0) and rows.loc[2, "resizes"] == 0


def test_without_scheduling_point_invocations_freed_nodes_wait_for_next_event():
    # same case as above, but the scheduler is not invoked at scheduling points: J1's
    # shrink still takes effect at t=30, yet J2 only starts at the next invocation, J1's end
    jobs = malleable_case()
    result = simulate(jobs, Platform(4), SRTF(), on_scheduling_point=False)
    check_invariants(result, jobs)
    assert starts(result) == {1: 0, 2: 170}
    assert result.jobs.set_index("id").loc[1, "end"] == pytest.approx(30 + 7 * 20)


class Transfer(WorkModel):
    """One unit that writes ``nbytes`` through the PFS (after ``compute`` seconds)."""

    def __init__(self, nbytes: float, compute: float = 0.0) -> None:
        self.nbytes, self.compute = nbytes, compute

    def unit_time(self, unit, nodes, ctx):
        return self.compute + ctx.platform.pfs_time(self.nbytes, True, ctx.pfs_sharers)

    def unit_segments(self, unit, nodes, ctx):
        return [("time", self.compute), ("pfs_write", self.nbytes)]


def test_pfs_bandwidth_is_shared_between_concurrent_transfers():
    # 10 GB/s write link: A writes 10 GB from t=0; B writes 5 GB from t=0.5. A gets 5 GB
    # alone by 0.5, then both get 5 GB/s: both finish at 1.5. C computes 2 s then writes
    # 5 GB alone: 2.5.
    platform = Platform(4, pfs_write_bandwidth=10e9, pfs_latency=0.0)
    jobs = [
        Job(1, 0.0, JobType.RIGID, 1, Transfer(10e9)),
        Job(2, 0.5, JobType.RIGID, 1, Transfer(5e9)),
        Job(3, 0.0, JobType.RIGID, 1, Transfer(5e9, compute=2.0)),
    ]
    result = simulate(jobs, platform, FCFS())
    check_invariants(result, jobs)
    ends = dict(zip(result.jobs["id"], result.jobs["end"], strict=True))
    assert ends[1] == pytest.approx(1.5) and ends[2] == pytest.approx(1.5)
    assert ends[3] == pytest.approx(2.5)


def test_killed_transfer_frees_its_bandwidth_share():
    class KillFirstAtHalf(StartAll):
        def then(self, view):
            if view.time == 0.5:
                view.kill(next(r for r in view.running if r.id == 1))

    platform = Platform(4, pfs_write_bandwidth=10e9, pfs_latency=0.0)
    jobs = [
        Job(1, 0.0, JobType.RIGID, 1, Transfer(10e9)),
        Job(2, 0.5, JobType.RIGID, 1, Transfer(5e9)),
    ]
    result = simulate(jobs, platform, KillFirstAtHalf())
    check_invariants(result, jobs)
    rows = result.jobs.set_index("id")
    assert rows.loc[1, "status"] == "killed" and rows.loc[1, "end"] == 0.5
    assert rows.loc[2, "end"] == pytest.approx(1.0)  # alone on the link: 5 GB at 10 GB/s


def test_event_kinds_are_ordered_ranks():
    from hpcnb.batchsim.engine import Event

    # at one time stamp: unit ends (free nodes) first, then PFS links, submissions, ticks
    assert [e.name for e in sorted(Event)] == ["UNIT_END", "LINK", "SUBMIT", "PERIODIC"]
    assert [int(e) for e in Event] == [0, 1, 2, 3]


class ShortestFirstFCFS(FCFS):
    """FCFS that orders its queue by requested time: a different policy, same base."""

    name = "fcfs-shortest-first"

    def schedule(self, view, reasons):
        for rec in sorted(view.queue, key=view.requested_time):
            if rec.job.num_nodes > view.free_nodes:
                return
            view.start(rec)


def test_subclass_of_a_compiled_policy_runs_its_own_schedule():
    # all jobs rigid: FCFS itself takes the compiled kernel, its subclass never does
    fcfs = run(SMALL, FCFS(), compiled=True)
    mine = run(SMALL, ShortestFirstFCFS(), compiled=True)
    assert fcfs.compiled and not mine.compiled
    assert starts(fcfs) == {1: 0, 2: 10, 3: 15, 4: 15}
    assert starts(mine) == {1: 5, 2: 0, 3: 5, 4: 8}  # J2 (5 s) first, then J3, J1, J4

    class SameEasy(EasyBackfilling):
        pass

    same = run(SMALL, SameEasy(), compiled=True)
    assert not same.compiled
    assert starts(same) == starts(run(SMALL, EasyBackfilling(), compiled=True))


def test_package_face_is_narrow_and_light():
    import subprocess
    import sys

    import hpcnb.batchsim as face

    assert len(face.__all__) < 20 and set(face.__all__) == set(face._EXPORTS)
    assert all(getattr(face, name) is not None for name in face.__all__)
    code = (
        "import sys, hpcnb.batchsim\n"
        "print(sorted(m for m in ('matplotlib', 'numba', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_user_scheduler_registered_by_name_runs_like_a_builtin(tmp_path, capsys):
    import functools
    import json

    from hpcnb.batchsim.experiments import policy_sweep
    from hpcnb.batchsim.policies import SCHEDULERS, register_scheduler, unregister_scheduler
    from hpcnb.batchsim.swf import write_swf
    from hpcnb.cli import main
    from hpcnb.plugins import PluginError

    register_scheduler("largest-first", LargestFirst)
    try:
        assert isinstance(make_scheduler("Largest-First"), LargestFirst)
        register_scheduler("largest-first", LargestFirst)  # the same class again: no change
        # the CLI and the experiment drivers look it up exactly as they do the built-ins
        assert main(["batchsim", "schedulers"]) == 0
        assert "largest-first  Start the largest" in capsys.readouterr().out
        trace = write_swf(lublin_feitelson(60, 16, seed=2), tmp_path / "w.swf")
        out = tmp_path / "out"
        argv = ["batchsim", "simulate", str(trace), "--scheduler", "largest-first"]
        assert main([*argv, "--out", str(out)]) == 0
        assert json.loads((out / "metrics.json").read_text())["scheduler"] == "largest-first"
        table, _ = policy_sweep(
            lublin_feitelson(60, 16, seed=2), 16, ("largest-first", "fcfs"), (0.0,)
        )
        assert list(table["scheduler"]) == ["largest-first", "fcfs"]
        assert table["mean_wait"].iloc[0] != table["mean_wait"].iloc[1]
        with pytest.raises(PluginError, match=r"registered already.*replace=True"):
            register_scheduler("largest-first", ShortestFirstFCFS)
        register_scheduler("largest-first", MalleableEasy, replace=True)
        assert make_scheduler("largest-first", gain=0.5).gain == 0.5
    finally:
        unregister_scheduler("largest-first")
    assert "largest-first" not in SCHEDULERS
    with pytest.raises(PluginError, match="registered already"):
        register_scheduler("fcfs", LargestFirst)
    with pytest.raises(PluginError, match="not a subclass"):
        register_scheduler("int", int)
    with pytest.raises(PluginError, match="an instance"):
        register_scheduler("one", FCFS())
    with pytest.raises(PluginError, match="not a subclass"):  # a factory: give the class
        register_scheduler("half", functools.partial(MalleableEasy, 0.5))
    with pytest.raises(PluginError, match="lower-case"):
        register_scheduler("My Policy", FCFS)
    with pytest.raises(PluginError, match="unknown scheduler 'nope'"):
        make_scheduler("nope")
    assert "half" not in SCHEDULERS and "one" not in SCHEDULERS
    with pytest.raises(PluginError, match="no such scheduler"):
        unregister_scheduler("broken")
    with pytest.raises(TypeError):
        SCHEDULERS["x"] = FCFS  # not a mapping: register_scheduler is the way in


def stepped_case() -> list[Job]:
    work = ScaledWork(100.0, 4, serial_fraction=0.0, units=10, reconfiguration_cost=1.0)
    return [Job(1, 0, JobType.MALLEABLE, 4, work, 1, 4), rigid(2, 25, 2, 10), rigid(3, 26, 1, 5)]


def test_engine_steps_one_event_at_a_time_like_run():
    from hpcnb.batchsim.engine import Simulator
    from hpcnb.errors import InvalidStateError

    whole = Simulator(Platform(4), SRTF()).run(stepped_case())
    sim = Simulator(Platform(4), SRTF())
    assert sim.peek() == np.inf and sim.run().records == []  # nothing set up yet
    sim.reset(stepped_case())
    assert sim.peek() == 0.0 and sim.events == 0
    sim.step()  # the first submission; the scheduler starts job 1 (last event at t=0)
    assert sim.events == 1 and sim.invocations == 1 and sim.records[0].status.value == "running"
    partial = sim.run(until=25.0)  # up to and including the events at t=25
    assert sim.now == 25.0 and sim.peek() > 25.0
    assert [r.status.value for r in partial.records] == ["running", "waiting", "pending"]
    while sim.peek() < np.inf:
        sim.step()
    with pytest.raises(InvalidStateError, match="no event left"):
        sim.step()
    stepped = sim.trace()
    assert [(r.start_time, r.end_time, r.resizes) for r in stepped.records] == [
        (r.start_time, r.end_time, r.resizes) for r in whole.records
    ]
    assert (stepped.events, stepped.invocations) == (whole.events, whole.invocations)
    np.testing.assert_array_equal(stepped.usage_nodes, whole.usage_nodes)
    again = sim.run(stepped_case())  # run(jobs) starts over
    assert [r.end_time for r in again.records] == [r.end_time for r in whole.records]
