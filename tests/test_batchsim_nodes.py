"""Nodes with identity: allocation policies, per-node state, topologies from SimGrid XML."""

from __future__ import annotations

import csv

import pytest

from hpcnb.batchsim.jobs import FixedWork, Job, JobType, ScaledWork
from hpcnb.batchsim.nodes import NODE_UTILIZATION_COLUMNS, NodePool, Topology
from hpcnb.batchsim.platform import Platform, read_platform_xml
from hpcnb.batchsim.policies import ElastiSimFCFS, make_scheduler
from hpcnb.batchsim.simulation import check_invariants, simulate
from hpcnb.batchsim.workloads import jobs_from_swf, lublin_feitelson


def test_first_fit_takes_the_lowest_free_ids():
    pool = NodePool(6, policy="first-fit", log=False)
    a = pool.take(2, 1, 0.0)
    b = pool.take(2, 2, 0.0)
    pool.release(a, 1.0)
    assert (a, b) == ([0, 1], [2, 3])
    assert pool.take(3, 3, 1.0) == [0, 1, 4]  # splits around job 2


def test_contiguous_takes_a_run_else_falls_back_to_first_fit():
    pool = NodePool(6, policy="contiguous", log=False)
    pool.take(1, 1, 0.0)  # node 0
    mid = pool.take(1, 2, 0.0)  # node 1
    pool.take(1, 3, 0.0)  # node 2
    pool.release(mid, 1.0)  # free: 1, 3, 4, 5
    assert pool.take(3, 4, 1.0) == [3, 4, 5]
    assert pool.take(1, 5, 1.0) == [1]


def test_topology_aware_uses_the_fewest_groups():
    topo = Topology.fat_tree(num_nodes=12, leaf_size=4, uplinks=1, link_bandwidth=1.0)
    pool = NodePool(12, topo, "topology", log=False)
    assert pool.take(3, 1, 0.0) == [0, 1, 2]
    # first-fit would give [3, 4]: two leaves; best fit puts it on a leaf of its own
    two = pool.take(2, 2, 0.0)
    assert pool.groups_of(two) == 1 and two == [4, 5]
    # 7 nodes: no leaf holds them; whole leaves by free count (leaf 2: 4, leaf 1: 2, ...)
    seven = pool.take(7, 3, 0.0)
    assert sorted(seven) == [3, 6, 7, 8, 9, 10, 11] and pool.groups_of(seven) == 3


def test_pool_refuses_more_than_free():
    pool = NodePool(2, log=False)
    pool.take(2, 1, 0.0)
    with pytest.raises(ValueError, match="2 nodes asked, 0 free"):
        pool.take(2, 2, 0.0)


def _owners_never_overlap(rows) -> None:
    """A node runs one job at a time: every take starts from free (or reserved, same job)."""
    held: dict[str, str] = {}
    for _, node, state, running, expected in rows:
        job = running or expected
        if state == "free":
            assert node in held, f"{node} freed while free"
            del held[node]
        else:
            assert held.get(node, job) == job, (
                f"{node} given to job {job} while job {held.get(node)} holds it"
            )
            held[node] = job
    assert not held, f"nodes still held at the end: {sorted(held)[:5]}"


@pytest.mark.parametrize("policy", ["first-fit", "contiguous", "topology"])
def test_a_node_runs_one_job_at_a_time_with_malleable_and_evolving_jobs(policy):
    topo = Topology.fat_tree(num_nodes=16, leaf_size=4, uplinks=2, link_bandwidth=1e9)
    platform = Platform(16, topology=topo)
    jobs = []
    for i in range(40):
        kind = [JobType.RIGID, JobType.MALLEABLE, JobType.MOLDABLE, JobType.RIGID][i % 4]
        size = 1 + (i * 7) % 6
        work = ScaledWork(100.0 + 13 * i, size, 0.1, 4, reconfiguration_cost=1.0)
        lo, hi = (size, size) if kind is JobType.RIGID else (1, 8)
        jobs.append(Job(i, 5.0 * i, kind, max(size, lo) if hi >= size else hi, work, lo, hi))
    result = simulate(jobs, platform, ElastiSimFCFS(), allocation=policy)
    check_invariants(result, jobs)
    assert result.node_log is not None and result.resizes  # malleable jobs did grow
    _owners_never_overlap(result.node_log)


def test_rigid_results_unchanged_by_node_identity_first_fit_on_a_crossbar():
    jobs = jobs_from_swf(lublin_feitelson(1500, 64, 3), 64).jobs
    counted = simulate(jobs, Platform(64), make_scheduler("easy"), compiled=False)
    placed = simulate(jobs, Platform(64), make_scheduler("easy"), allocation="first-fit")
    assert not placed.compiled
    assert placed.jobs["start"].tolist() == counted.jobs["start"].tolist()
    assert placed.jobs["end"].tolist() == counted.jobs["end"].tolist()
    _owners_never_overlap(placed.node_log)


def test_node_utilization_csv_has_elastisim_columns(tmp_path):
    jobs = [Job(1, 0, JobType.RIGID, 2, FixedWork(5)), Job(2, 1, JobType.RIGID, 1, FixedWork(1))]
    result = simulate(
        jobs, Platform(3, hosts=("a", "b", "c")), make_scheduler("fcfs"), allocation="first-fit"
    )
    path = result.write(tmp_path)["node_utilization"]
    rows = list(csv.reader(path.open()))
    assert tuple(rows[0]) == NODE_UTILIZATION_COLUMNS
    assert rows[1:] == [
        ["0.0", "a", "allocated", "1", ""],
        ["0.0", "b", "allocated", "1", ""],
        ["1.0", "c", "allocated", "2", ""],
        ["2.0", "c", "free", "", ""],
        ["5.0", "a", "free", "", ""],
        ["5.0", "b", "free", "", ""],
    ]


def test_simgrid_fat_tree_and_dragonfly_clusters_are_read(tmp_path):
    def platform(attrs: str) -> Platform:
        path = tmp_path / "p.xml"
        path.write_text(
            "<?xml version='1.0'?><platform version='4.1'><zone id='z' routing='Full'>"
            f"<cluster id='c' prefix='n' radical='0-31' suffix='.x' speed='1Gf' bw='8Gbps' "
            f"lat='1us' {attrs}/></zone></platform>"
        )
        return read_platform_xml(path)

    flat = platform("")
    assert flat.topology is None and flat.hosts[:2] == ("n0.x", "n1.x")
    tree = platform("topology='FAT_TREE' topo_parameters='2;8,4;1,2;1,2'")
    assert tree.topology == Topology("fat-tree", 8, 4 * 1e9)  # 2 spines x 2 links x 1 GB/s
    fly = platform("topology='DRAGONFLY' topo_parameters='2,2;2,1;2,1;2'")
    assert fly.topology == Topology("dragonfly", 8, 2 * 1e9)
    with pytest.raises(ValueError, match="topo_parameters"):
        platform("topology='FAT_TREE' topo_parameters='2;x'")


def _allreduce_case(allocation: str, network: str = "shared") -> dict[int, float]:
    # 6 nodes, leaves of 2 with one uplink of 1 GB/s; job 0 holds node 0. Jobs 1 and 2
    # all-reduce 1 GB on 2 nodes: 1 s alone (ring: 1 GB each way over the node links).
    from hpcnb.batchsim.experiments import TrainingWork

    topo = Topology.fat_tree(num_nodes=6, leaf_size=2, uplinks=1, link_bandwidth=1e9)
    platform = Platform(6, link_bandwidth=1e9, link_latency=0.0, topology=topo)
    jobs = [
        Job(0, 0, JobType.RIGID, 1, FixedWork(100)),
        Job(1, 0, JobType.RIGID, 2, TrainingWork(1, 0.0, 1e9)),
        Job(2, 0, JobType.RIGID, 2, TrainingWork(1, 0.0, 1e9)),
    ]
    result = simulate(
        jobs, platform, make_scheduler("fcfs"), allocation=allocation, network=network
    )
    check_invariants(result, jobs)
    return dict(zip(result.jobs["id"], result.jobs["end"], strict=True))


def test_collectives_share_group_links_and_topology_aware_placement_avoids_them():
    # first-fit: job 1 on nodes 1, 2 (leaves 0, 1), job 2 on 3, 4 (leaves 1, 2): both
    # cross leaf 1's up and down links, each at half of 1 GB/s: 2 s
    shared = _allreduce_case("first-fit")
    assert shared[1] == pytest.approx(2.0) and shared[2] == pytest.approx(2.0)
    # contention-free: each alone on the links: 1 s
    alone = _allreduce_case("first-fit", "isolated")
    assert alone[1] == pytest.approx(1.0) and alone[2] == pytest.approx(1.0)
    # topology-aware: each job on a leaf of its own (2, 3 and 4, 5): no uplink, 1 s
    placed = _allreduce_case("topology")
    assert placed[1] == pytest.approx(1.0) and placed[2] == pytest.approx(1.0)


def test_group_traffic_of_each_pattern_by_hand():
    from hpcnb.batchsim.nodes import group_traffic

    # ring on ranks in groups [0, 1]: each rank sends B/4 to both neighbours (the same
    # other rank): B/2 each way
    assert group_traffic("ring", 8.0, [0, 1]) == ({0: 4.0, 1: 4.0}, {1: 4.0, 0: 4.0})
    # scatter from a root in group 0 to 3 other ranks, 2 of them in group 1: 2 x B/4
    assert group_traffic("scatter", 8.0, [0, 0, 1, 1]) == ({0: 4.0}, {1: 4.0})
    assert group_traffic("all_to_all", 12.0, [5, 5, 5]) == ({}, {})
    with pytest.raises(ValueError, match="no traffic model"):
        group_traffic("butterfly", 1.0, [0, 1])


def _bb_platform(tmp_path, striping: bool) -> Platform:
    props = (
        "<prop id='node_local_bb' value='True'/><prop id='bb_read_bw' value='2GBps'/>"
        "<prop id='bb_write_bw' value='1GBps'/>"
    )
    if striping:
        props += "<prop id='wide_striping' value='True'/><prop id='flops_per_byte' value='0'/>"
    path = tmp_path / f"bb{striping}.xml"
    path.write_text(
        "<?xml version='1.0'?><platform version='4.1'><zone id='z' routing='Full'>"
        "<cluster id='c' prefix='n' radical='0-3' suffix='' speed='1Gf' bw='8Gbps' lat='0us'>"
        f"{props}</cluster></zone></platform>"
    )
    return read_platform_xml(path)


def test_burst_buffers_node_local_and_wide_striped_by_hand(tmp_path):
    local = _bb_platform(tmp_path, False)
    assert (local.bb_read_bandwidth, local.bb_write_bandwidth) == (2e9, 1e9)
    assert not local.bb_wide_striping
    # each rank writes its own 4 GB at 1 GB/s: 4 s, however many nodes
    assert local.burst_buffer_time(4e9, True, 4) == pytest.approx(4.0)
    assert local.burst_buffer_time(4e9, False, 4) == pytest.approx(2.0)
    striped = _bb_platform(tmp_path, True)
    # striped over 4 nodes: 1 GB locally (1 s) and an all-to-all of 3 GB per rank over
    # 1 GB/s links (3 s): the all-to-all sets the time
    assert striped.burst_buffer_time(4e9, True, 4) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="without burst buffers"):
        Platform(4).burst_buffer_time(1.0, True, 1)


def test_burst_buffer_tasks_run_in_a_simulation(tmp_path):
    import json

    from hpcnb.batchsim.elastisim import read_elastisim

    platform = _bb_platform(tmp_path, False)
    (tmp_path / "platform.xml").write_text((tmp_path / "bbFalse.xml").read_text())
    (tmp_path / "configuration.json").write_text(json.dumps({"platform_file": "platform.xml"}))
    model = {
        "phases": [
            {
                "iterations": 2,
                "tasks": [
                    {"type": "bb_write", "bytes": "size", "pattern": "all_ranks"},
                    {"type": "bb_read", "bytes": "size", "pattern": "root_only"},
                ],
            }
        ]
    }
    (tmp_path / "app.json").write_text(json.dumps(model))
    job = {
        "type": "rigid",
        "submit_time": 0,
        "num_nodes": 4,
        "application_model": "app.json",
        "arguments": {"size": 8e9},
    }
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": [job]}))
    data = read_elastisim(tmp_path / "jobs.json")
    assert data.platform == platform
    result = simulate(data.jobs, data.platform, make_scheduler("elastisim-fcfs"))
    # per iteration: 2 GB per rank at 1 GB/s (2 s) + 8 GB on the root at 2 GB/s (4 s)
    assert result.jobs["end"].iloc[0] == pytest.approx(2 * (2.0 + 4.0))


def test_cli_allocation_writes_per_node_utilization(tmp_path):
    from hpcnb.batchsim.swf import write_swf

    trace = write_swf(lublin_feitelson(50, 16, 1), tmp_path / "t.swf")
    from hpcnb.cli import main

    assert (
        main(
            [
                "batchsim",
                "simulate",
                str(trace),
                "--allocation",
                "contiguous",
                "--network",
                "isolated",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    header = (tmp_path / "out" / "node_utilization.csv").read_text().splitlines()[0]
    assert tuple(header.split(",")) == NODE_UTILIZATION_COLUMNS


def test_oversubscription_in_a_configuration_is_refused_by_name(tmp_path):
    import json

    from hpcnb.batchsim.elastisim import WorkloadError, read_elastisim

    (tmp_path / "p.xml").write_text(
        "<?xml version='1.0'?><platform version='4.1'><zone id='z' routing='Full'>"
        "<cluster id='c' prefix='n' radical='0-3' suffix='' speed='1Gf' bw='8Gbps' lat='0us'/>"
        "</zone></platform>"
    )
    config = {"platform_file": "p.xml", "allow_oversubscription": True}
    (tmp_path / "configuration.json").write_text(json.dumps(config))
    (tmp_path / "app.json").write_text(
        json.dumps({"phases": [{"tasks": [{"type": "idle", "delay": 1}]}]})
    )
    job = {"type": "rigid", "submit_time": 0, "num_nodes": 1, "application_model": "app.json"}
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": [job]}))
    with pytest.raises(WorkloadError, match="allow_oversubscription: several jobs per node"):
        read_elastisim(tmp_path / "jobs.json")
