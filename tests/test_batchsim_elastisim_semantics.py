"""ElastiSim semantics: the example policy per job type, max-min sharing, the example input."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from hpcnb.batchsim.jobs import FixedWork, Job, JobType, RunContext, ScaledWork, WorkModel
from hpcnb.batchsim.network import FlowNetwork, max_min_rates
from hpcnb.batchsim.platform import Platform
from hpcnb.batchsim.policies import ElastiSimFCFS, make_scheduler
from hpcnb.batchsim.simulation import check_invariants, simulate

INF = math.inf


def rows(result):
    return result.jobs.set_index("id")


# -- max-min fair sharing, by hand ------------------------------------------------------
def test_two_flows_share_one_link_equally_and_a_bound_gives_back_the_rest():
    assert max_min_rates([({"l": 1.0}, 1, INF), ({"l": 1.0}, 1, INF)], {"l": 10.0}) == [5, 5]
    # B is held to 2 by its own (private) node link: A takes the remaining 8
    assert max_min_rates([({"l": 1.0}, 1, INF), ({"l": 1.0}, 1, 2.0)], {"l": 10.0}) == [8, 2]
    # a flow standing for 3 ranks gets 3 shares
    assert max_min_rates([({"l": 1.0}, 3, INF), ({"l": 1.0}, 1, INF)], {"l": 8.0}) == [2, 2]


def test_three_flows_two_links_progressive_filling():
    # A: link 1 (10); B: links 1 and 2; C: link 2 (4). Link 2 saturates at 2 for B and C;
    # A then gets 10 - 2 = 8. With link 2 at 12, link 1 saturates first at 5 for A and B,
    # and C takes 12 - 5 = 7.
    flows = [({"l1": 1.0}, 1, INF), ({"l1": 1.0, "l2": 1.0}, 1, INF), ({"l2": 1.0}, 1, INF)]
    assert max_min_rates(flows, {"l1": 10.0, "l2": 4.0}) == pytest.approx([8, 2, 2])
    assert max_min_rates(flows, {"l1": 10.0, "l2": 12.0}) == pytest.approx([5, 5, 7])


def test_flow_network_completion_times_follow_the_rates():
    # 10 B/s link: A (10 B) alone from 0, B (5 B) joins at 0.5: both at 5 B/s; A has 5 B
    # left at 0.5, B 5 B: both finish at 1.5.
    net = FlowNetwork({"l": 10.0})
    net.add("A", 10.0, {"l": 1.0}, 0.0)
    net.add("B", 5.0, {"l": 1.0}, 0.5)
    assert net.rate("A") == net.rate("B") == 5.0
    when = net.next_completion(0.5)
    assert when == pytest.approx(1.5)
    assert sorted(net.pop_finished(when)) == ["A", "B"]
    assert net.next_completion(when) is None


def test_ptask_fairness_shares_by_equal_progress():
    # SimGrid's ptask_L07: two transfers of 1 and 3 bytes on a 4 B/s link progress at
    # the same fraction per second, so both end at t=1 (1 B/s and 3 B/s).
    net = FlowNetwork({"l": 4.0})
    net.add("small", 1.0, {"l": 1.0}, 0.0)
    net.add("big", 1.0, {"l": 3.0}, 0.0)
    assert net.next_completion(0.0) == pytest.approx(1.0)


def test_pfs_contention_switch_and_node_link_bound():
    class Write(WorkModel):
        def unit_time(self, unit, nodes, ctx):
            return 1.0

        def unit_segments(self, unit, nodes, ctx):
            return [("pfs_write", 10e9)]

    platform = Platform(4, pfs_write_bandwidth=10e9, pfs_latency=0.0, link_bandwidth=100e9)
    jobs = [Job(i, 0.0, JobType.RIGID, 1, Write()) for i in (1, 2)]
    shared = rows(simulate(jobs, platform, make_scheduler("fcfs")))
    alone = rows(simulate(jobs, platform, make_scheduler("fcfs"), network="isolated"))
    assert shared["end"].tolist() == pytest.approx([2.0, 2.0])  # 5 GB/s each
    assert alone["end"].tolist() == pytest.approx([1.0, 1.0])  # each sees 10 GB/s
    # a node link of 2 GB/s bounds a one-node job's flow below its fair share
    slow = Platform(4, pfs_write_bandwidth=10e9, pfs_latency=0.0, link_bandwidth=2e9)
    assert rows(simulate(jobs[:1], slow, make_scheduler("fcfs")))["end"].iloc[0] == 5.0


# -- the ElastiSim example policy, one job type at a time ----------------------------------
def scaled(total: float, units: int = 1, cost: float = 0.0) -> ScaledWork:
    """``total`` seconds on one node, perfectly parallel, in ``units`` iterations."""
    return ScaledWork(total, 1, 0.0, units, reconfiguration_cost=cost)


def test_rigid_jobs_start_in_order_and_the_walk_stops():
    jobs = [
        Job(1, 0, JobType.RIGID, 3, FixedWork(10)),
        Job(2, 0, JobType.RIGID, 2, FixedWork(5)),
        Job(3, 0, JobType.RIGID, 1, FixedWork(1)),
    ]
    result = simulate(jobs, Platform(4), ElastiSimFCFS())
    check_invariants(result, jobs)
    # job 3 would fit at 0, but job 2 stops the walk: no backfilling
    assert rows(result)["start"].to_dict() == {1: 0, 2: 10, 3: 10}


def test_moldable_jobs_take_min_of_free_and_maximum_else_stop():
    jobs = [
        Job(1, 0, JobType.RIGID, 5, FixedWork(10)),
        Job(2, 0, JobType.MOLDABLE, 6, scaled(60), num_nodes_min=2, num_nodes_max=6),
        Job(3, 0, JobType.MOLDABLE, 4, scaled(40), num_nodes_min=4, num_nodes_max=4),
        Job(4, 1, JobType.RIGID, 1, FixedWork(1)),
    ]
    result = simulate(jobs, Platform(8), ElastiSimFCFS())
    check_invariants(result, jobs)
    r = rows(result)
    assert (r.loc[2, "start"], r.loc[2, "nodes"], r.loc[2, "end"]) == (0, 3, 20)  # 60 s / 3
    # job 3 needs 4 (0 free): the walk stops and job 4 waits behind it until t=10
    assert (r.loc[3, "start"], r.loc[3, "nodes"], r.loc[3, "end"]) == (10, 4, 20)
    assert r.loc[4, "start"] == 10 and r.loc[2, "resizes"] == 0


def test_malleable_job_expands_at_its_scheduling_point_and_pays_reconfiguration():
    # job 2 starts on min(2 free, 4) = 2 nodes: 4 units of 10/2 = 5 s. At t=10 job 1 ends
    # and job 2 sits at a point: it grows to 4, pays 1 s, runs 2 units of 2.5 s: 16.
    jobs = [
        Job(1, 0, JobType.RIGID, 2, FixedWork(10)),
        Job(2, 0, JobType.MALLEABLE, 4, scaled(40, 4, cost=1.0), num_nodes_min=1, num_nodes_max=4),
    ]
    result = simulate(jobs, Platform(4), ElastiSimFCFS())
    check_invariants(result, jobs)
    assert rows(result).loc[2, "end"] == pytest.approx(16.0)
    assert result.resize_log[["time", "old", "new"]].values.tolist() == [[10, 2, 4]]


def test_malleable_expansion_any_invocation_reserves_nodes_point_does_not():
    # job 1 ends at 7, in the middle of job 2's unit (5..10). "any" grows job 2 at once
    # (nodes reserved until its point at 10), so job 3 (t=8) waits for job 2's end;
    # "point" leaves the nodes free at 8 and job 3 starts at once.
    jobs = [
        Job(1, 0, JobType.RIGID, 2, FixedWork(7)),
        Job(2, 0, JobType.MALLEABLE, 4, scaled(40, 4), num_nodes_min=1, num_nodes_max=4),
        Job(3, 8, JobType.RIGID, 1, FixedWork(5)),
    ]
    anytime = rows(simulate(jobs, Platform(4), ElastiSimFCFS("any")))
    point_result = simulate(jobs, Platform(4), ElastiSimFCFS("point"))
    at_point = rows(point_result)
    assert anytime.loc[2, "end"] == pytest.approx(15.0)  # 2 units of 2.5 s after t=10
    assert anytime.loc[3, "start"] == pytest.approx(15.0)
    assert at_point.loc[3, "start"] == 8
    # at t=10 job 3 holds one node: job 2 grows by min(1 free, 2) to 3 nodes; its next
    # point is at 10 + 10/3, after job 3's end (13): it grows to 4 there
    log = point_result.resize_log[["time", "old", "new"]].values.tolist()
    assert [x for row in log for x in row] == pytest.approx([10, 2, 3, 10 + 10 / 3, 3, 4])


class Stepping(WorkModel):
    """``units`` iterations of ``work / nodes`` s; asks for ``requests[k]`` after unit k."""

    def __init__(self, work: float, requests: list[int | None]) -> None:
        self.work, self.requests = work, requests
        self.num_units = len(requests) + 1

    def unit_time(self, unit: int, nodes: int, ctx: RunContext) -> float:
        return self.work / nodes

    def evolving_request(self, unit_done: int, nodes: int) -> int | None:
        return self.requests[unit_done - 1]


def test_evolving_requests_shrink_granted_growth_only_when_nodes_are_free():
    # alone: 4 nodes, 1.5 s units; shrink to 2 at 1.5 (granted), grow to 4 at 4.5
    # (granted: 2 free): 1.5 + 3 + 1.5 = 6
    evolving = Job(1, 0, JobType.EVOLVING, 4, Stepping(6, [2, 4]), num_nodes_min=1, num_nodes_max=4)
    alone = rows(simulate([evolving], Platform(4), ElastiSimFCFS()))
    assert alone.loc[1, "end"] == pytest.approx(6.0) and alone.loc[1, "resizes"] == 2
    # a rigid job takes the 2 freed nodes at t=2: the growth at 4.5 is refused, the last
    # unit runs on 2 nodes: 1.5 + 3 + 3 = 7.5
    jobs = [evolving, Job(2, 2, JobType.RIGID, 2, FixedWork(10))]
    busy = rows(simulate(jobs, Platform(4), ElastiSimFCFS()))
    assert busy.loc[1, "end"] == pytest.approx(7.5) and busy.loc[2, "start"] == 2


def test_adaptive_jobs_grow_at_points_without_a_request_and_evolve_with_one():
    # ElastiSim (Application.cpp): an adaptive job whose phase has no evolving model sends
    # a scheduling point, as a malleable job does, and the example algorithm grows it
    def case(kind: JobType):
        return [
            Job(1, 0, JobType.RIGID, 2, FixedWork(3)),
            Job(2, 0, kind, 4, Stepping(12, [None, None]), num_nodes_min=1, num_nodes_max=4),
        ]

    adaptive = rows(simulate(case(JobType.ADAPTIVE), Platform(4), ElastiSimFCFS()))
    malleable = rows(simulate(case(JobType.MALLEABLE), Platform(4), ElastiSimFCFS()))
    assert malleable.loc[2, "resizes"] == 1 and malleable.loc[2, "end"] < 18.0  # not 3 x 6 s
    assert adaptive.loc[2, "resizes"] == 1
    assert adaptive.loc[2, "end"] == pytest.approx(malleable.loc[2, "end"])
    # the looser merged pass never grows adaptive jobs
    merged = rows(simulate(case(JobType.ADAPTIVE), Platform(4), ElastiSimFCFS("any")))
    assert merged.loc[2, "resizes"] == 0 and merged.loc[2, "end"] == pytest.approx(18.0)
    # an adaptive job's own evolving request is granted like an evolving job's
    # (on 2 nodes a 4 s unit; the rigid job ends at 4; the request for 4 is granted)
    grown = [
        Job(1, 0, JobType.RIGID, 2, FixedWork(4)),
        Job(2, 0, JobType.ADAPTIVE, 4, Stepping(8, [4, None]), num_nodes_min=1, num_nodes_max=4),
    ]
    r = rows(simulate(grown, Platform(4), ElastiSimFCFS()))
    assert r.loc[2, "max_nodes"] == 4 and r.loc[2, "end"] == pytest.approx(4 + 2 + 2)


# -- the example input ---------------------------------------------------------------------
ELASTISIM_TURNAROUND = {
    "adaptive": 28908,
    "rigid": 28152,
    "malleable": 26609,
    "moldable": 28307,
    "evolving": 34521,
}


def example_jobs() -> Path:
    root = Path(os.environ.get("HPCNB_DATA", Path(__file__).parents[2] / "shared" / "data"))
    path = root / "elastisim-example" / "jobs.json"
    if not path.is_file():
        pytest.skip(f"ElastiSim example input not found at {path} (set HPCNB_DATA)")
    return path


def test_example_per_type_turnaround_within_five_percent_of_elastisim():
    from hpcnb.batchsim.elastisim import read_elastisim

    data = read_elastisim(example_jobs())
    result = simulate(
        data.jobs, data.platform, make_scheduler("elastisim-fcfs"), **data.simulation_options()
    )
    check_invariants(result, data.jobs)
    means = result.jobs.groupby("type")["turnaround"].mean()
    errors = {k: abs(means[k] / v - 1) for k, v in ELASTISIM_TURNAROUND.items()}
    assert max(errors.values()) <= 0.05, errors
