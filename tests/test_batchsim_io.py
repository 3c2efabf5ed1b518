"""Tests of batchsim inputs and outputs: SWF, expressions, ElastiSim input, DL tables, CLI."""

from __future__ import annotations

import argparse
import gzip
import json

import numpy as np
import pandas as pd
import pytest

from hpcnb.batchsim import (
    Platform,
    check_invariants,
    jobs_from_swf,
    lublin_feitelson,
    make_scheduler,
    read_elastisim,
    read_swf,
    simulate,
)
from hpcnb.batchsim.cli import register
from hpcnb.batchsim.dl import scaling_validation
from hpcnb.batchsim.expressions import ExpressionError, evaluate, parse_expression
from hpcnb.batchsim.platform import read_platform_xml, simgrid_platform_xml
from hpcnb.batchsim.policies import MalleableEasy
from hpcnb.batchsim.scheduler import FCFS, EasyBackfilling
from hpcnb.batchsim.simulation import JOB_STATISTICS_COLUMNS
from hpcnb.batchsim.swf import SWF_FIELDS, SWFError, write_swf

SWF_TEXT = """; Version: 2.2
; MaxNodes: 8
; MaxProcs: 16
1 0 5 100 4 -1 -1 4 200 -1 1 3 1 -1 1 1 -1 -1
2 10 0 50 16 -1 -1 16 -1 -1 1 4 1 -1 1 1 -1 -1
3 20 0 -1 2 -1 -1 2 60 -1 0 4 1 -1 1 1 -1 -1
4 30 0 40 32 -1 -1 32 60 -1 1 4 1 -1 1 1 -1 -1
"""


def test_swf_reader_fields_and_header(tmp_path):
    path = tmp_path / "t.swf"
    path.write_text(SWF_TEXT)
    trace = read_swf(path)
    assert len(trace) == 4 and set(trace.fields) == set(SWF_FIELDS)
    assert trace.header["MaxNodes"] == "8" and trace.machine_size() == 16
    assert trace["requested_time"][0] == 200 and trace["user_id"][1] == 4
    loaded = jobs_from_swf(trace)
    assert loaded.num_nodes == 16 and [j.id for j in loaded.jobs] == [1, 2]
    assert loaded.jobs[0].walltime == 200 and loaded.jobs[1].walltime is None
    assert any("job 3: unknown run time" in s for s in loaded.skipped)
    assert any("job 4: 32 nodes > machine of 16" in s for s in loaded.skipped)


def test_swf_roundtrip_plain_and_gzip(tmp_path):
    trace = lublin_feitelson(50, 32, seed=4)
    for name in ("a.swf", "a.swf.gz"):
        path = write_swf(trace, tmp_path / name)
        back = read_swf(path)
        for field in SWF_FIELDS:
            np.testing.assert_allclose(back[field], trace[field], atol=0.01)
        assert back.header["MaxNodes"] == "32"
    with gzip.open(tmp_path / "a.swf.gz", "rt") as handle:
        assert handle.readline().startswith(";")


def test_swf_malformed_line_error_and_skip(tmp_path):
    path = tmp_path / "bad.swf"
    path.write_text(SWF_TEXT + "5 40 0 10 2 -1\n6 50 0 x 2 -1 -1 2 60 -1 1 4 1 -1 1 1 -1 -1\n")
    with pytest.raises(SWFError, match=r"bad\.swf:8: expected 18 fields, found 6"):
        read_swf(path)
    trace = read_swf(path, on_error="skip")
    assert len(trace) == 4
    assert trace.skipped[0].endswith("bad.swf:8: expected 18 fields, found 6")
    assert "bad.swf:9: field 4 (run_time) is 'x'" in trace.skipped[1]
    with pytest.raises(ValueError, match="on_error"):
        read_swf(path, on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        read_swf(tmp_path / "missing.swf")


def test_expressions_evaluate():
    env = {"flops": 1e12, "num_nodes": 4, "alpha": 0.5, "phase_iteration": 3}
    assert evaluate("flops/num_nodes^alpha", env) == pytest.approx(5e11)
    assert evaluate("phase_iteration % 2 == 0 ? num_nodes - 4 : num_nodes + 4", env) == 8
    assert evaluate("2^3^2") == 512 and evaluate("-2^2") == -4
    assert evaluate("min(3, 1, 2) + max(1, 5) + ceil(1.2) + floor(1.8)") == 9
    assert evaluate("sqrt(16) + log(1)") == 4
    assert evaluate("1 < 2 && 2 >= 3 || 1 != 1") == 0
    assert parse_expression("a*b+c").names == frozenset("abc")


@pytest.mark.parametrize(
    ("text", "position", "message"),
    [
        # positions are 1-based (issue 18)
        ("__import__('os').system('echo')", 12, "unexpected character"),
        ("open(1)", 1, "function 'open' is not allowed"),
        ("a.b", 2, "unexpected character '.'"),
        ("x[0]", 2, "unexpected character '['"),
        ("1 +", 4, "expected a number"),
        ("(1 + 2", 7, "expected ')'"),
        ("", 1, "empty expression"),
        ("min(1)", 1, "min() takes 2"),
        ("1 2", 3, "unexpected '2'"),
        ("lambda: 1", 7, "unexpected ':'"),
    ],
)
def test_expressions_reject(text, position, message):
    with pytest.raises(ExpressionError) as info:
        evaluate(text, {"x": 1, "a": 1, "lambda": 1})
    assert info.value.position == position
    assert message in str(info.value) and repr(text) in str(info.value)


def test_expression_runtime_errors_name_position():
    with pytest.raises(ExpressionError, match="unknown name 'y'") as info:
        evaluate("1 + y", {"x": 1})
    assert info.value.position == 5
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate("1 / (x - 1)", {"x": 1})


PLATFORM_XML = simgrid_platform_xml("0-3,8", "2Gf", "8Gbps", "10us", "4GBps", "2GBps", "1ms")

APP_MODEL = {
    "on_init": {"tasks": [{"type": "idle", "delay": "init"}]},
    "on_reconfiguration": {"tasks": [{"type": "idle", "delay": 3}]},
    "phases": [
        {
            "iterations": "iterations",
            "evolving_request": "phase_iteration == 1 ? num_nodes * 2 : num_nodes",
            "tasks": [
                {"type": "cpu", "flops": "work/num_nodes", "computation_pattern": "uniform"},
                {"type": "pfs_write", "bytes": "out", "pattern": "all_ranks"},
            ],
        }
    ],
}


def write_project(tmp_path, jobs):
    (tmp_path / "platform.xml").write_text(PLATFORM_XML)
    (tmp_path / "app.json").write_text(json.dumps(APP_MODEL))
    (tmp_path / "configuration.json").write_text(json.dumps({"platform_file": "platform.xml"}))
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    return tmp_path / "jobs.json"


def test_platform_xml_units(tmp_path):
    (tmp_path / "p.xml").write_text(PLATFORM_XML)
    p = read_platform_xml(tmp_path / "p.xml")
    assert p.num_nodes == 5 and p.node_flops == 2e9 and p.link_bandwidth == 1e9
    assert p.link_latency == pytest.approx(1e-5) and p.pfs_read_bandwidth == 4e9
    assert p.pfs_write_bandwidth == 2e9 and p.pfs_latency == pytest.approx(1e-3)
    (tmp_path / "q.xml").write_text(PLATFORM_XML.replace("2Gf", "2Gx"))
    with pytest.raises(ValueError, match=r"q\.xml.*speed '2Gx'"):
        read_platform_xml(tmp_path / "q.xml")


def test_elastisim_model_timing_and_evolving(tmp_path):
    args = {"iterations": 3, "work": 8e9, "init": 5, "out": 2e9}
    jobs = [
        {
            "type": "rigid",
            "submit_time": 0,
            "num_nodes": 2,
            "application_model": "app.json",
            "arguments": args,
        },
        {
            "type": "evolving",
            "submit_time": 0,
            "num_nodes_min": 1,
            "num_nodes_max": 2,
            "application_model": "app.json",
            "arguments": args,
        },
    ]
    data = read_elastisim(write_project(tmp_path, jobs))
    assert data.platform.num_nodes == 5 and len(data.jobs) == 2
    result = simulate(data.jobs, data.platform, FCFS())
    check_invariants(result, data.jobs)
    rows = result.jobs.set_index("id")
    # rigid on 2 nodes: init 5 + 3 x (8e9/2/2e9 = 2 s compute + 2e9/2e9 + 1 ms PFS), PFS
    # shared by two I/O jobs doubles the write time while both run.
    assert rows.loc[0, "start"] == 0 and rows.loc[0, "runtime"] > 5 + 3 * 3
    # evolving job asks for 4 nodes after iteration 0, clipped to its max 2 (already 2)
    assert rows.loc[1, "resizes"] == 0
    bad = [dict(jobs[0], arguments={"iterations": 2})]
    with pytest.raises(ValueError, match=r"jobs\[0\].*unknown name 'init'"):
        read_elastisim(write_project(tmp_path, bad))


def test_evolving_request_granted(tmp_path):
    args = {"iterations": 3, "work": 8e9, "init": 0, "out": 0}
    jobs = [
        {
            "type": "evolving",
            "submit_time": 0,
            "num_nodes": 2,
            "num_nodes_min": 1,
            "num_nodes_max": 4,
            "application_model": "app.json",
            "arguments": args,
        }
    ]
    data = read_elastisim(write_project(tmp_path, jobs))
    result = simulate(data.jobs, data.platform, FCFS())
    check_invariants(result, data.jobs)
    row = result.jobs.iloc[0]
    # before iteration 1 it asks for num_nodes * 2 = 4 nodes; FCFS grants it (nodes are free)
    assert row["nodes"] == 2 and row["max_nodes"] == 4 and row["resizes"] == 1
    # iteration on n nodes: 8e9 / n / 2e9 s compute; reconfiguration costs 3 s; a PFS write
    # of 0 bytes costs nothing (ptask_L07 has no route, so no latency)
    expected = 2.0 + 3 + 2 * 1.0
    assert row["runtime"] == pytest.approx(expected, rel=1e-3)


def test_elastisim_rejects_unsafe_expression(tmp_path):
    model = json.loads(json.dumps(APP_MODEL))
    model["phases"][0]["iterations"] = "__import__('os')"
    write_project(tmp_path, [])
    (tmp_path / "app.json").write_text(json.dumps(model))
    (tmp_path / "jobs.json").write_text(
        json.dumps(
            {
                "jobs": [
                    {
                        "type": "rigid",
                        "submit_time": 0,
                        "num_nodes": 1,
                        "application_model": "app.json",
                        "arguments": {},
                    }
                ]
            }
        )
    )
    with pytest.raises(
        ValueError, match=r"jobs\[0\].*app\.json: phases\[0\]\.iterations.*position 12"
    ):
        read_elastisim(tmp_path / "jobs.json")


def test_elastisim_example_end_to_end(shared_data):
    data = read_elastisim(shared_data / "elastisim-example" / "jobs.json")
    assert len(data.jobs) == 500 and data.platform.num_nodes == 128
    assert data.platform.node_flops == 100e9 and data.platform.pfs_write_bandwidth == 50e9
    for scheduler in (FCFS(), MalleableEasy()):
        result = simulate(data.jobs, data.platform, scheduler)
        check_invariants(result, data.jobs)
        assert result.metrics()["completed"] == 500
        types = set(result.jobs["type"])
        assert types == {"rigid", "moldable", "malleable", "evolving", "adaptive"}


def test_hpc2n_trace_replay(shared_data):
    trace = read_swf(shared_data / "swf" / "hpc2n-seth-first3170.swf")
    assert len(trace) == 3170 and trace.machine_size() == 240
    loaded = jobs_from_swf(trace)
    assert len(loaded.jobs) + len(loaded.skipped) == 3170
    fcfs = simulate(loaded.jobs, Platform(240), FCFS())
    easy = simulate(loaded.jobs, Platform(240), EasyBackfilling())
    check_invariants(easy, loaded.jobs)
    assert easy.metrics()["mean_wait"] < fcfs.metrics()["mean_wait"]


def test_dl_scaling_mape(shared_data):
    mapes = []
    for model_dir in sorted((shared_data / "dl").iterdir()):
        if (model_dir / "scalability.csv").exists():
            model, test, mape = scaling_validation(model_dir)
            assert len(test) > 50 and model.params["g"] >= 1
            mapes.append(mape)
    assert len(mapes) >= 2
    assert float(np.mean(mapes)) <= 0.15


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="hpcnb")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_simulate_swf(tmp_path, capsys):
    trace = write_swf(lublin_feitelson(120, 16, seed=2), tmp_path / "w.swf.gz")
    out = tmp_path / "out"
    assert (
        run_cli(["batchsim", "simulate", str(trace), "--scheduler", "easy", "--out", str(out)]) == 0
    )
    stats = pd.read_csv(out / "job_statistics.csv")
    assert tuple(stats.columns) == JOB_STATISTICS_COLUMNS and len(stats) == 120
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nodes"] == 16 and metrics["jobs"] == 120
    assert (
        run_cli(
            [
                "batchsim",
                "simulate",
                str(trace),
                "--scheduler",
                "malleable",
                "--nodes",
                "32",
                "--malleable-fraction",
                "0.5",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads((out / "metrics.json").read_text())["nodes"] == 32


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "bad.swf"
    bad.write_text(SWF_TEXT + "oops\n")
    code = run_cli(
        ["batchsim", "simulate", str(bad), "--scheduler", "fcfs", "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "bad.swf:8" in capsys.readouterr().err
    code = run_cli(
        [
            "batchsim",
            "simulate",
            str(bad),
            "--scheduler",
            "fcfs",
            "--on-error",
            "skip",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 0 and "bad.swf:8" in err and "job 4" in err
    code = run_cli(["batchsim", "simulate", str(bad), "--scheduler", "nope", "--out", "x"])
    assert code == 2 and "unknown scheduler 'nope'" in capsys.readouterr().err
    assert run_cli(["batchsim", "generate", str(tmp_path / "g.swf"), "--jobs", "10"]) == 0
    assert len(read_swf(tmp_path / "g.swf")) == 10


def test_cli_schedulers_and_validate_dl(tmp_path, capsys):
    assert run_cli(["batchsim", "schedulers"]) == 0
    listed = capsys.readouterr().out
    assert "easy" in listed and "malleable" in listed and "drf" in listed
    from hpcnb.batchsim.experiments import synthetic_dl_table

    folder = tmp_path / "model"
    folder.mkdir()
    synthetic_dl_table(seed=1, noise=0.02).to_csv(folder / "scalability.csv", index=False)
    assert run_cli(["batchsim", "validate-dl", str(folder)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("MAPE ") and float(last.split()[1]) < 0.05
    assert run_cli(["batchsim", "validate-dl", str(tmp_path / "nope")]) == 2


def test_cli_elastisim_json(tmp_path):
    args = {"iterations": 2, "work": 4e9, "init": 1, "out": 1e9}
    jobs = [
        {
            "type": "malleable",
            "submit_time": 0,
            "num_nodes_min": 1,
            "num_nodes_max": 4,
            "application_model": "app.json",
            "arguments": args,
        }
    ]
    path = write_project(tmp_path, jobs)
    assert (
        run_cli(
            ["batchsim", "simulate", str(path), "--scheduler", "srtf", "--out", str(tmp_path / "o")]
        )
        == 0
    )
    stats = pd.read_csv(tmp_path / "o" / "job_statistics.csv")
    assert list(stats["Type"]) == ["malleable"] and stats["Status"][0] == "completed"


def test_platform_validation():
    with pytest.raises(ValueError, match="num_nodes"):
        Platform(0)
    p = Platform(4)
    assert p.communication_time("allreduce", 1e9, 1) == 0
    assert p.communication_time("ring", 1e9, 4) < p.communication_time("allreduce", 1e9, 4)
    with pytest.raises(ValueError, match="pattern"):
        p.communication_time("butterfly", 1, 2)


def test_experiment_helpers_without_data(tmp_path, monkeypatch):
    from hpcnb.batchsim.dl import StepTimeModel, dl_jobs
    from hpcnb.batchsim.experiments import (
        load_trace,
        policy_sweep,
        speed_vs_jobs,
        synthetic_dl_table,
        write_synthetic_elastisim_project,
    )

    monkeypatch.delenv("HPCNB_DATA", raising=False)
    loaded = load_trace("swf/hpc2n-seth-first3170.swf", 32, 120, seed=0)
    assert not loaded.real and "Lublin-Feitelson" in loaded.message and len(loaded.value) == 120
    table, results = policy_sweep(loaded.value, 32, ("fcfs", "malleable"), (0.0, 1.0), 0, 5.0)
    assert len(table) == 4 and len(results) == 4
    assert table.loc[table["malleable_fraction"] == 1.0, "jobs"].eq(120).all()
    speed = speed_vs_jobs(loaded.value, (50, 120), 32, repeats=1, engine_max_jobs=50)
    assert speed["compiled_jobs_per_s"].gt(0).all() and speed["engine_jobs_per_s"].isna().sum() == 1
    project = write_synthetic_elastisim_project(tmp_path / "p", num_jobs=30, seed=1)
    data = read_elastisim(project)
    result = simulate(data.jobs, data.platform, MalleableEasy())
    check_invariants(result, data.jobs)
    model = StepTimeModel.fit(synthetic_dl_table(seed=0))
    workload = pd.DataFrame(
        {
            "name": ["a", "b"],
            "time": [0, 10],
            "application": ["m", "m"],
            "num_replicas": [8, 2],
            "batch_size": [512, 256],
        }
    )
    jobs = dl_jobs(workload, {"m": model}, np.array([600.0]), max_nodes=4)
    assert [j.num_nodes for j in jobs] == [2, 1]
    platform = Platform(4, gpus_per_node=4)
    assert jobs[0].work.estimate(2, None) == pytest.approx(600.0)
    steps = jobs[0].work.steps  # 600 s at 2 nodes; at 4 nodes: 16 replicas of 32 samples
    assert jobs[0].work.estimate(4, None) == pytest.approx(steps * model.step_time(4, 16, 32))
    result = simulate(jobs, platform, make_scheduler("srtf"))
    check_invariants(result, jobs)
    with pytest.raises(ValueError, match="no measured model"):
        dl_jobs(workload.assign(application="zzz"), {"m": model}, np.array([600.0]))


def test_predictor_adapter_for_convmeter_style_models():
    from hpcnb.batchsim.dl import DLWork, PredictorStepTime
    from hpcnb.batchsim.jobs import RunContext

    class Linear:
        def predict(self, num_nodes, num_replicas, local_bsz):
            return 0.01 * np.asarray(local_bsz) + 0.002 * np.asarray(num_replicas)

    work = DLWork(
        PredictorStepTime(Linear()), steps=1000, global_batch=256, gpus_per_node=4, units=4
    )
    ctx = RunContext(Platform(8, gpus_per_node=4))
    assert work.unit_time(0, 2, ctx) == pytest.approx(250 * (0.01 * 32 + 0.002 * 8))


def test_loaders_label_synthetic_stand_ins(tmp_path, monkeypatch):
    from hpcnb.batchsim.experiments import (
        load_dl_tables,
        load_dl_workload,
        load_elastisim_example,
        load_trace,
    )

    monkeypatch.delenv("HPCNB_DATA", raising=False)
    trace = load_trace("swf/hpc2n-seth-first3170.swf", 32, 50, seed=0, name="HPC2N")
    assert trace.source == "synthetic" and not trace.real
    assert trace.label == "synthetic (Lublin model, stand-in for HPC2N)"
    assert trace.label in trace.message
    assert load_trace("swf/x.swf", 8, 10, seed=0).label.endswith("stand-in for x)")
    tables = load_dl_tables(seed=0)
    assert tables.source == "synthetic" and list(tables.value) == ["synthetic"]
    assert "stand-in for Pollux" in tables.label
    workload = load_dl_workload(1, seed=0, synthetic_jobs=12)
    frame, durations = workload.value
    assert workload.source == "synthetic" and len(frame) == 12 and len(durations) > 0
    assert set(frame["application"]) == {"synthetic"}
    example = load_elastisim_example(tmp_path / "p", num_jobs=20, seed=0)
    assert example.source == "synthetic" and example.value.exists()
    assert len(read_elastisim(example.value).jobs) == 20


def test_loaders_read_real_data(shared_data):
    from hpcnb.batchsim.experiments import (
        load_dl_tables,
        load_dl_workload,
        load_elastisim_example,
        load_trace,
    )

    trace = load_trace("swf/hpc2n-seth-first3170.swf", 32, 50, seed=0, name="HPC2N")
    assert trace.source == "real" and trace.label == "HPC2N" and len(trace.value) == 3170
    tables = load_dl_tables()
    assert tables.source == "real" and "cifar10" in tables.value
    workload = load_dl_workload(1)
    assert workload.source == "real" and len(workload.value[0]) > 0
    example = load_elastisim_example("unused")
    assert example.source == "real" and example.value.name == "jobs.json"


def test_malleability_gains_per_scheduler_and_seed():
    from hpcnb.batchsim.experiments import malleability_gains

    trace = lublin_feitelson(80, 32, seed=3)
    gains = malleability_gains(trace, 32, ("fcfs", "malleable"), 0.5, (0, 1), 5.0, "t")
    assert len(gains) == 4 and list(gains["scheduler"].unique()) == ["fcfs", "malleable"]
    assert gains.groupby("scheduler")["rigid_turnaround"].nunique().eq(1).all()
    np.testing.assert_allclose(
        gains["gain"], gains["rigid_turnaround"] / gains["malleable_turnaround"]
    )
    assert (gains["gain"] > 0).all()
    again = malleability_gains(trace, 32, ("fcfs",), 0.5, (0,), 5.0)
    assert again["gain"].iloc[0] == gains["gain"].iloc[0]  # deterministic per seed


def test_step_time_mape_stratified_bootstrap():
    from hpcnb.batchsim.dl import step_time_mape
    from hpcnb.stats import Estimate, mape_interval

    a = pd.DataFrame({"step_time": [1.0, 1.0, 1.0, 1.0], "predicted": [1.1, 0.9, 1.2, 1.0]})
    b = pd.DataFrame({"step_time": [2.0, 2.0], "predicted": [2.0, 2.0]})
    e = step_time_mape({"a": a, "b": b}, seed=1)
    assert e.value == pytest.approx((0.1 + 0.1 + 0.2 + 0.0) / 4 / 2) and e.n == 6
    assert 0.0 <= e.low <= e.value <= e.high <= 0.1
    assert step_time_mape({"a": a, "b": b}, seed=1) == e
    both = pd.concat([a, b])
    same = mape_interval(both["predicted"], both["step_time"], groups=["a"] * 4 + ["b"] * 2, seed=1)
    assert same.n == e.n and same.bounds == pytest.approx(e.bounds)
    assert step_time_mape({"b": b}) == Estimate(0.0, 0.0, 0.0, 2)
    with pytest.raises(ValueError, match="no tested"):
        step_time_mape({})
    with pytest.raises(ValueError, match="no rows"):
        step_time_mape({"a": a, "empty": a.head(0)})
    with pytest.raises(ValueError, match="finite and positive"):
        step_time_mape({"a": a.assign(step_time=[1.0, 0.0, 1.0, 1.0])})


def test_a_model_trace_is_a_generated_input_and_a_stand_in_is_synthetic(monkeypatch, tmp_path):
    from hpcnb.batchsim.experiments import load_trace

    monkeypatch.setenv("HPCNB_DATA", str(tmp_path))  # an empty data folder: nothing found
    model = load_trace("lublin/lublin_256.swf", 16, 40, 0, name="Lublin-256", generated=True)
    stand_in = load_trace("hpc2n/HPC2N.swf", 16, 40, 0, name="HPC2N")
    assert (model.source, stand_in.source) == ("generated", "synthetic")
    assert model.label == "generated (Lublin model, in place of Lublin-256)"
    assert stand_in.label.startswith("synthetic (") and len(model.value) == 40
