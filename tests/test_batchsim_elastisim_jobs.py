"""ElastiSim's timing of single jobs, computed by hand from the application model.

The example's adaptive job 0 alone on the example platform (SimGrid ``ptask_L07`` as
ElastiSim runs it), the evolving-request semantics of ElastiSim's ``Application`` and
the collective payloads of ``Utility::createMatrix``, and job arguments as the text
``Utility::readStringMap`` makes of them.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from hpcnb.batchsim import read_elastisim
from hpcnb.batchsim.elastisim import as_argument_text
from hpcnb.batchsim.engine import Simulator
from hpcnb.batchsim.platform import Platform
from hpcnb.batchsim.policies import ElastiSimFCFS
from hpcnb.data import DataNotFoundError, data_path


def _example():
    try:
        return read_elastisim(data_path("elastisim-example/jobs.json"))
    except DataNotFoundError as exc:
        pytest.skip(f"ElastiSim example not available: {exc}")


def _alone(example, job_id, platform):
    job = next(j for j in example.jobs if j.id == job_id)
    options = example.simulation_options()
    sim = Simulator(platform, ElastiSimFCFS(), **options)
    rec = sim.run([job]).records[0]
    return rec.end_time - rec.start_time, rec


def _job0_by_hand(platform: Platform) -> float:
    """Job 0 of the example alone: arguments from jobs.json, the arithmetic written out."""
    # jobs.json gives alpha = 0.8527412240709863; ElastiSim substitutes it as the text
    # std::to_string writes, six decimals (Utility::readStringMap)
    flops, alpha = 28010281208643, 0.852741
    model, ckpt, comm = 303564911249, 399004473015, 23879643869
    speed, bw, gamma = platform.node_flops, platform.link_bandwidth, platform.tcp_gamma
    node_route = 2 * platform.link_latency  # sender's link + receiver's link
    pfs_route = platform.link_latency + platform.pfs_latency  # node link + PFS link
    window = (lambda b, lat: 2 * lat * b / gamma) if gamma > 0 else (lambda b, lat: 0.0)
    cap = min(bw, gamma / (2 * pfs_route)) if gamma > 0 else bw  # one PFS flow's rate

    def iteration(n: int) -> float:
        # coupled cpu task: latency, then max(flops / n^alpha / speed, all-to-all link
        # bytes comm/n over bw, TCP window of one pair's comm/(n(n-1)) bytes)
        task = node_route + max(
            flops / n**alpha / speed, comm / n / bw, window(comm / (n * (n - 1)), node_route)
        )
        # checkpoint: every rank writes ckpt/n through its link and the 50 GB/s PFS link
        rate = min(cap, platform.pfs_write_bandwidth / n)
        return task + pfs_route + ckpt / n / rate

    def reconfiguration(n: int) -> float:
        # on_init / on_reconfiguration: rank 0 reads the model, then scatters it
        read = pfs_route + model / cap
        scatter = node_route + max((n - 1) / n * model / bw, window(model / n, node_route))
        return read + scatter

    # 24 iterations on 16 nodes; before iteration k >= 1 the request is
    # "k % 2 == 0 ? num_nodes - 4 : num_nodes + 4", clipped to [2, 16]: k = 1 asks for
    # 20 -> 16 (no change), then 12, 16, 12, ... from k = 2 on: 11 iterations on 12
    # nodes, 13 on 16, and 22 reconfigurations (11 to 12 nodes, 11 back to 16).
    return (
        reconfiguration(16)
        + 13 * iteration(16)
        + 11 * iteration(12)
        + 11 * reconfiguration(12)
        + 11 * reconfiguration(16)
    )


def _probe(platform: Platform) -> bool:
    from hpcnb.batchsim.jobs import FixedWork, Job, JobType

    class _Read(FixedWork):
        def unit_segments(self, unit, nodes, ctx):
            return [("pfs_read_root", 1e12)]

    job = Job(0, 0.0, JobType.RIGID, 1, _Read(1.0))
    rec = Simulator(platform, ElastiSimFCFS()).run([job]).records[0]
    return rec.end_time > 1e12 / platform.link_bandwidth * 1.01


def test_adaptive_job_alone_without_the_tcp_window():
    example = _example()
    platform = dataclasses.replace(example.platform, tcp_gamma=0.0)
    makespan, rec = _alone(example, 0, platform)
    assert len(rec.resizes) == 22
    assert [new for _, _, new in rec.resizes[:3]] == [12, 16, 12]
    assert makespan == pytest.approx(_job0_by_hand(platform), rel=1e-9)


def test_adaptive_job_alone_on_the_example_platform():
    example = _example()
    platform = example.platform
    # a PFS flow runs at the TCP-window bound of its route, below the node's link
    assert _probe(platform)
    makespan, rec = _alone(example, 0, platform)
    assert len(rec.resizes) == 22
    assert makespan == pytest.approx(_job0_by_hand(platform), rel=1e-9)


def test_window_bound_of_a_pfs_flow():
    p = Platform(4, link_bandwidth=100e9 / 8, link_latency=50e-6, pfs_latency=500e-6)
    assert p.pfs_route_latency == pytest.approx(550e-6)
    assert p.pfs_flow_bandwidth == pytest.approx(4194304 / (2 * 550e-6))
    assert dataclasses.replace(p, tcp_gamma=0.0).pfs_flow_bandwidth == p.link_bandwidth
    slow = dataclasses.replace(p, link_bandwidth=1e9)
    assert slow.pfs_flow_bandwidth == 1e9  # the link, when it is the tighter bound
    # no latency on the route: no window bound (L07Action::calculate_network_bound)
    instant = dataclasses.replace(p, link_latency=0.0, pfs_latency=0.0)
    assert instant.pfs_flow_bandwidth == p.link_bandwidth


def test_collective_payloads_follow_elastisim():
    p = Platform(8, link_bandwidth=1e9, link_latency=1e-6, tcp_gamma=0.0)
    route = 2e-6
    assert p.communication_time("all_to_all", 8e9, 8) == pytest.approx(route + 1.0)
    assert p.communication_time("ring", 8e9, 8) == pytest.approx(route + 1.0)
    assert p.communication_time("scatter", 8e9, 8) == pytest.approx(route + 7.0)
    assert p.communication_time("gather", 8e9, 8) == pytest.approx(route + 7.0)
    assert p.communication_time("master_worker", 8e9, 8) == pytest.approx(route + 16.0)
    # the TCP window binds a large pair payload over a long route
    far = dataclasses.replace(p, link_latency=1.0, tcp_gamma=1e9)
    assert far.communication_time("scatter", 8e9, 2) == pytest.approx(2.0 + 2 * 2.0 * 4e9 / 1e9)


def _project(tmp_path, request: str, iterations: int = 4) -> object:
    model = {
        "phases": [
            {
                "iterations": iterations,
                "evolving_request": request,
                "tasks": [{"type": "idle", "delay": 1}],
            }
        ]
    }
    (tmp_path / "app.json").write_text(json.dumps(model))
    job = {
        "type": "evolving",
        "submit_time": 0,
        "num_nodes_min": 1,
        "num_nodes_max": 8,
        "application_model": "app.json",
        "arguments": {},
    }
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": [job]}))
    return read_elastisim(tmp_path / "jobs.json", Platform(8))


def test_evolving_request_uses_the_next_iteration(tmp_path):
    work = _project(tmp_path, "phase_iteration == 1 ? 2 : num_nodes").jobs[0].work
    assert work.evolving_request(0, 4) is None  # the job's first iteration: no request
    assert work.evolving_request(1, 4) == 2  # before iteration 1 (phase_iteration = 1)
    assert work.evolving_request(2, 4) == 4
    assert work.evolving_request(4, 4) is None  # no iteration left


def test_evolving_request_is_cut_toward_zero(tmp_path):
    work = _project(tmp_path, "num_nodes * 0.99").jobs[0].work
    assert work.evolving_request(1, 4) == 3  # (int) 3.96, not round()
    assert math.trunc(4 * 0.99) == 3


def test_empty_pfs_transfer_costs_nothing(tmp_path):
    model = {"phases": [{"iterations": 1, "tasks": [{"type": "pfs_write", "bytes": 0}]}]}
    (tmp_path / "app.json").write_text(json.dumps(model))
    job = {"type": "rigid", "submit_time": 0, "num_nodes": 2, "application_model": "app.json"}
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": [job]}))
    data = read_elastisim(tmp_path / "jobs.json", Platform(8))
    assert data.jobs[0].work.unit_segments(0, 2, None) == []


def test_fractional_arguments_have_six_decimals():
    assert as_argument_text(0.7023175709607384) == 0.702318
    assert as_argument_text(0.8527412240709863) == 0.852741
    assert as_argument_text(2.5e-7) == 0.0  # "0.000000"
    assert as_argument_text(6e-7) == 0.000001
    assert as_argument_text(1.0) == 1.0


def _delay_job(tmp_path, arguments: dict) -> object:
    model = {"phases": [{"iterations": 1, "tasks": [{"type": "idle", "delay": "d * k"}]}]}
    (tmp_path / "app.json").write_text(json.dumps(model))
    job = {
        "type": "rigid",
        "submit_time": 0,
        "num_nodes": 1,
        "application_model": "app.json",
        "arguments": arguments,
    }
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": [job]}))
    return read_elastisim(tmp_path / "jobs.json", Platform(1)).jobs[0]


def test_job_arguments_enter_expressions_as_elastisim_writes_them(tmp_path):
    # d = 0.1234567 becomes "0.123457"; the integer k = 123456789012 is written in full
    job = _delay_job(tmp_path, {"d": 0.1234567, "k": 123456789012})
    assert job.work.arguments == {"d": 0.123457, "k": 123456789012.0}
    assert job.work.unit_segments(0, 1, None) == [("time", 0.123457 * 123456789012)]
    rec = Simulator(Platform(1), ElastiSimFCFS()).run([job]).records[0]
    assert rec.end_time - rec.start_time == pytest.approx(0.123457 * 123456789012, rel=1e-12)


def test_a_fraction_below_the_sixth_decimal_is_zero(tmp_path):
    job = _delay_job(tmp_path, {"d": 4e-7, "k": 1})
    assert job.work.unit_segments(0, 1, None) == []  # "0.000000 * 1": no delay
