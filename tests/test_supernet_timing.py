"""Tests of the fork-join phase timing, the MPI runs, the interleaved benchmark, progress.

No test asserts a duration: only that phases are measured, that they add up to the
step, and that the sequential and MPI runs train the same weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpcnb import models
from hpcnb.errors import HpcnbError
from hpcnb.progress import show_progress
from hpcnb.supernet import SandwichSampler, Supernet
from hpcnb.supernet.benchmark import compare_models
from hpcnb.supernet.forkjoin import PHASES, StepPhases, fork_join_step
from hpcnb.supernet.mpi import (
    ForkJoinBenchmark,
    ForkJoinJob,
    arm_threads,
    benchmark_fork_join,
    run_forkjoin_mpi,
    run_local,
    variant_name,
    write_job,
)


def _vit_supernet(seed: int = 0) -> tuple[Supernet, dict[str, int]]:
    kwargs = {"dim": 16, "depth": 2, "heads": 2, "mlp_dim": 32}
    torch.manual_seed(seed)
    return Supernet.from_model(models.vit(**kwargs), torch.zeros(1, 1, 8, 8)), kwargs


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 8, 8, generator=gen), torch.randint(10, (n,), generator=gen)


def _sandwich_job(
    sn: Supernet, kwargs: dict[str, int]
) -> tuple[tuple[tuple[tuple[int, ...], ...], ...], ForkJoinJob]:
    """Three sandwich-rule steps of four subnets of the ViT supernet, as an SGD job."""
    rng = np.random.default_rng(0)
    schedule = tuple(
        tuple(tuple(c.values) for c in SandwichSampler(sn.space).draw(rng, 4)) for _ in range(3)
    )
    job = ForkJoinJob(
        factory="hpcnb.models:vit",
        factory_kwargs=kwargs,
        example_shape=(1, 1, 8, 8),
        schedule=schedule,
        batch_size=16,
        lr=0.05,
        optimizer="sgd",
        seed=0,
    )
    return schedule, job


def test_step_phases_add_totals_and_json_round_trip() -> None:
    phases = StepPhases()
    phases.add(0.3, 0.1, 0.05, 0.02)
    phases.add(0.5, 0.0, 0.05, 0.04)
    assert phases.steps == 2
    assert phases.totals() == pytest.approx(
        {"compute": 0.8, "wait": 0.1, "allreduce": 0.1, "update": 0.06}
    )
    assert phases.mean_per_step()["compute"] == pytest.approx(0.4)
    assert StepPhases.from_json(phases.to_json()) == phases
    assert StepPhases().mean_per_step() == dict.fromkeys(PHASES, 0.0)


def test_fork_join_step_phases_do_not_change_the_update() -> None:
    x, y = _data(32)
    results = []
    for timed in (False, True):
        sn, _ = _vit_supernet()
        configs = SandwichSampler(sn.space).draw(np.random.default_rng(0), 3)
        opt = torch.optim.SGD(sn.model.parameters(), lr=0.05)
        phases = StepPhases() if timed else None
        fork_join_step(sn, configs, x, y, opt, phases=phases)
        results.append(sn.flat.params.clone())
        if phases is not None:
            assert phases.steps == 1
            assert phases.compute[0] > 0 and phases.update[0] > 0
            assert phases.wait == [0.0] and phases.allreduce == [0.0]  # no communicator
    assert torch.equal(results[0], results[1])


def test_show_progress_decision() -> None:
    assert show_progress(True, environ={"HPCNB_PROGRESS": "0"}) is True
    assert show_progress(False) is False
    assert show_progress(environ={"HPCNB_PROGRESS": "1"}, parent_cmdline="papermill") is True
    assert show_progress(environ={"HPCNB_PROGRESS": "off"}, parent_cmdline="bash") is False
    for parent in ("python -m papermill a.ipynb b.ipynb", "jupyter-nbconvert --execute", "pytest"):
        assert show_progress(environ={}, parent_cmdline=parent) is False
    # Not a kernel, stderr captured by pytest: no bar.
    assert show_progress(environ={}, parent_cmdline="bash") is False
    with pytest.raises(ValueError, match="HPCNB_PROGRESS"):
        show_progress(environ={"HPCNB_PROGRESS": "maybe"})


def _bench_json() -> dict:
    one = {"compute": 0.010, "wait": 0.0, "allreduce": 0.0, "update": 0.001}
    r0 = {"compute": 0.006, "wait": 0.001, "allreduce": 0.0005, "update": 0.001}
    r1 = {"compute": 0.005, "wait": 0.002, "allreduce": 0.0005, "update": 0.001}
    return {
        "ranks": 2,
        "steps": 10,
        "rounds": 3,
        "mpi": "2 proc x 1 thr",
        "seconds": {
            "1 proc x 1 thr": [0.11, 0.12, 0.10],
            "1 proc x 2 thr": [0.09, 0.08, 0.10],
            "2 proc x 1 thr": [0.08, 0.08, 0.05],
        },
        "phases": {
            "1 proc x 1 thr": [[one]] * 3,
            "1 proc x 2 thr": [[one]] * 3,
            "2 proc x 1 thr": [[r0, r1]] * 3,
        },
        "max_weight_diff": 1e-7,
        "threads": {"1 proc x 1 thr": 1, "1 proc x 2 thr": 2, "2 proc x 1 thr": 2},
    }


def test_fork_join_benchmark_ratios_and_phase_table() -> None:
    bench = ForkJoinBenchmark.from_json(_bench_json())
    assert bench.baselines == ("1 proc x 1 thr", "1 proc x 2 thr")
    assert bench.speedups("1 proc x 1 thr") == pytest.approx((0.11 / 0.08, 0.12 / 0.08, 2.0))
    with pytest.raises(KeyError):
        bench.speedups("4 proc x 1 thr")
    assert bench.phase_samples("2 proc x 1 thr", "wait") == pytest.approx((0.0015,) * 3)
    rows = bench.phase_table()
    assert [(r["configuration"], r["rank"]) for r in rows] == [
        ("1 proc x 1 thr", 0),
        ("1 proc x 2 thr", 0),
        ("2 proc x 1 thr", 0),
        ("2 proc x 1 thr", 1),
    ]
    assert rows[2]["total_ms"] == pytest.approx(8.5)
    assert rows[2]["step_ms"] == pytest.approx(8.0)
    summary = bench.summary()
    assert summary["speedup vs 1 proc x 2 thr"] == pytest.approx(0.09 / 0.08)
    assert summary["rounds"] == 3
    assert variant_name(2, 1) == "2 proc x 1 thr"


def test_same_cores_baseline_has_the_mpi_arms_thread_total() -> None:
    bench = ForkJoinBenchmark.from_json(_bench_json())
    base = bench.same_cores_baseline()
    assert base == "1 proc x 2 thr"
    assert bench.threads[bench.mpi] == bench.workers * 1 == bench.threads[base]
    assert bench.speedups_same_cores() == bench.speedups("1 proc x 2 thr")
    assert arm_threads(2, 1, (1, 2)) == {
        "1 proc x 1 thr": 1,
        "1 proc x 2 thr": 2,
        "2 proc x 1 thr": 2,
    }
    assert arm_threads(4, 2, (8,))["4 proc x 2 thr"] == 8
    with pytest.raises(HpcnbError, match="every count"):
        arm_threads(2, 0, (1,))
    unmatched = _bench_json()
    unmatched["threads"]["1 proc x 2 thr"] = 1  # a baseline that did not get its 2 threads
    with pytest.raises(HpcnbError, match="2 threads in total"):
        ForkJoinBenchmark.from_json(unmatched).same_cores_baseline()
    unrecorded = _bench_json()
    del unrecorded["threads"]
    with pytest.raises(HpcnbError, match="no thread totals"):
        ForkJoinBenchmark.from_json(unrecorded).speedups_same_cores()


def test_compare_models_gives_per_round_samples_and_counts() -> None:
    torch.manual_seed(0)
    full = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    small = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    x, y = _data(40)
    cmp = compare_models(full, small, x, y, (2.0, 1.0), batch_size=16, repeats=3, rounds=4)
    assert len(cmp.throughput_gain_samples) == 4 and len(cmp.latency_reduction_samples) == 4
    assert cmp.full.total == 40 and cmp.full.accuracy == cmp.full.correct / 40
    drop = cmp.accuracy_drop_interval()
    assert drop.value == pytest.approx(cmp.accuracy_drop)
    assert drop.low is not None and drop.high is not None
    assert drop.low <= drop.value <= drop.high
    assert drop.n == 80
    assert cmp.flops_reduction == pytest.approx(0.5)


@pytest.mark.mpi
def test_interleaved_benchmark_on_two_ranks(tmp_path: Path) -> None:
    sn, kwargs = _vit_supernet()
    _, job = _sandwich_job(sn, kwargs)
    x, y = _data(64)
    bench = benchmark_fork_join(
        tmp_path / "job", job, sn.model.state_dict(), x.numpy(), y.numpy(), rounds=2, timeout=300
    )
    assert bench.workers == 2 and bench.steps == 3 and bench.mpi == "2 proc x 1 thr"
    assert set(bench.seconds) == {"1 proc x 1 thr", "1 proc x 2 thr", "2 proc x 1 thr"}
    assert all(len(v) == 2 and min(v) > 0 for v in bench.seconds.values())
    assert bench.max_weight_diff <= 1e-5  # the join gives the sequential result
    mpi_rounds = bench.phases[bench.mpi]
    assert len(mpi_rounds) == 2 and all(len(r) == 2 for r in mpi_rounds)  # two ranks
    assert all(rank["allreduce"] > 0 and rank["compute"] > 0 for r in mpi_rounds for rank in r)
    seq = bench.phases["1 proc x 2 thr"][0][0]
    assert seq["allreduce"] == 0.0 and seq["wait"] == 0.0
    assert len(bench.speedups("1 proc x 1 thr")) == 2
    # The thread totals were read from torch while each configuration trained.
    assert bench.threads == arm_threads(2, job.threads, (1, 2))
    base = bench.same_cores_baseline()
    assert bench.threads[bench.mpi] == bench.workers * job.threads == bench.threads[base]
    assert len(bench.speedups_same_cores()) == 2


@pytest.mark.mpi
def test_mpi_two_ranks_match_sequential(tmp_path: Path) -> None:
    sn, kwargs = _vit_supernet()
    schedule, job = _sandwich_job(sn, kwargs)
    x, y = _data(64)
    folder = write_job(tmp_path / "job", job, sn.model.state_dict(), x.numpy(), y.numpy())
    seq = run_local(folder, threads=1, timeout=120)
    par = run_forkjoin_mpi(folder, 2, timeout=120)
    assert par["ranks"] == 2 and seq["ranks"] == 1
    assert (seq["final"] - par["final"]).abs().max().item() <= 1e-5
    assert not torch.equal(seq["final"], sn.flat.params)  # it trained
    # The in-process fork-join step gives the same weights as the sequential subprocess.
    opt = torch.optim.SGD(sn.model.parameters(), lr=0.05, momentum=0.9)
    from hpcnb.supernet.space import SubnetConfig
    from hpcnb.supernet.training import batches

    idx = list(batches(64, 16, np.random.default_rng(0), 3))
    for step, ix in zip(schedule, idx, strict=True):
        fork_join_step(sn, [SubnetConfig(c) for c in step], x[ix], y[ix], opt)
    assert (sn.flat.params - seq["final"]).abs().max().item() <= 1e-5
