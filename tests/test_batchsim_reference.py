"""ElastiSim as the reference: comparison of job tables, staging and clear errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from hpcnb.batchsim.platform import simgrid_platform_xml
from hpcnb.batchsim.reference import (
    ElastiSimRunError,
    build_elastisim,
    compare_jobs,
    run_elastisim,
    self_agreement,
    simgrid_version,
)
from hpcnb.errors import InvalidInputError

HEADER = "ID,Type,Submit Time,Start Time,End Time,Wait Time,Makespan,Turnaround Time,Status\n"


def _reference(tmp_path):
    rows = [
        "0,rigid,0,0,100,0,100,100,completed",
        "1,rigid,5,100,300,95,200,295,completed",
        "2,malleable,6,10,60,4,50,54,completed",
        "3,malleable,7,300,400,293,100,393,completed",
    ]
    path = tmp_path / "job_statistics.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


def _ours():
    return pd.DataFrame(
        {
            "id": [3, 2, 1, 0],  # any order: matched by id
            "type": ["malleable", "malleable", "rigid", "rigid"],
            "start": [300.0, 10.5, 103.0, 0.0],
            "end": [420.0, 62.0, 306.0, 104.0],
        }
    )


def test_compare_jobs_shares_and_first_mismatch(tmp_path):
    result = compare_jobs(_ours(), _reference(tmp_path))
    jobs = result.jobs
    # makespans: ours 104, 203, 51.5, 120 against 100, 200, 50, 100
    assert jobs.loc[0, "makespan_error"] == pytest.approx(0.04)
    assert jobs.loc[3, "makespan_error"] == pytest.approx(0.2)
    assert list(jobs["within"]) == [True, True, True, False]
    assert result.shares["rigid"] == 1.0 and result.shares["malleable"] == 0.5
    assert result.shares["overall"] == 0.75
    # starts: job 1 is 3 s late (job 2's 0.5 s is within 1 s)
    assert jobs.loc[1, "start_diff"] == pytest.approx(3.0)
    assert result.first_start_mismatch == 1
    assert "overall 0.750" in result.summary() and "job 1" in result.summary()


def test_compare_jobs_tolerances_and_elastisim_layout(tmp_path):
    ref = _reference(tmp_path)
    strict = compare_jobs(ref, ref, tolerance=0.0, start_tolerance=0.0)
    assert strict.shares["overall"] == 1.0 and strict.first_start_mismatch is None
    loose = compare_jobs(_ours(), ref, tolerance=0.25, start_tolerance=0.4)
    assert loose.shares["overall"] == 1.0 and loose.first_start_mismatch == 2


def test_compare_jobs_rejects_mismatched_tables(tmp_path):
    ref = _reference(tmp_path)
    with pytest.raises(ElastiSimRunError, match="different jobs"):
        compare_jobs(_ours().iloc[:3], ref)
    with pytest.raises(ElastiSimRunError, match="needs columns"):
        compare_jobs(pd.DataFrame({"x": [1]}), ref)
    with pytest.raises(ElastiSimRunError, match="not a readable CSV"):
        compare_jobs(_ours(), tmp_path / "missing.csv")


def test_build_and_run_fail_with_clear_errors(tmp_path):
    with pytest.raises(ElastiSimRunError, match="not ElastiSim's sources"):
        build_elastisim(tmp_path, tmp_path / "build")
    with pytest.raises(ElastiSimRunError, match="no ElastiSim binary"):
        run_elastisim(tmp_path, tmp_path / "out", binary=tmp_path / "nope", interface_dir=tmp_path)


def test_run_stages_the_project_with_absolute_paths(tmp_path):
    project = tmp_path / "project"
    (project / "data" / "input").mkdir(parents=True)
    (project / "data" / "input" / "app.json").write_text("{}")
    (project / "platform.xml").write_text("<platform/>")
    jobs = {"jobs": [{"type": "rigid", "application_model": "data/input/app.json"}]}
    (project / "jobs.json").write_text(json.dumps(jobs))
    config = {"jobs_file": "data/input/jobs.json", "platform_file": "platform.xml"}
    config["job_statistics"] = "data/output/job_statistics.csv"
    (project / "configuration.json").write_text(json.dumps(config))
    fake = tmp_path / "elastisim"  # exits at once without writing job statistics
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    (tmp_path / "iface" / "elastisim_python").mkdir(parents=True)
    algorithm = tmp_path / "algorithm.py"
    algorithm.write_text("def schedule(jobs, nodes, system):\n    pass\n")
    with pytest.raises(ElastiSimRunError, match=r"failed|no job_statistics"):
        run_elastisim(
            project,
            tmp_path / "out",
            binary=fake,
            interface_dir=tmp_path / "iface",
            algorithm=algorithm,
            timeout=60,
        )
    staged = json.loads((tmp_path / "out" / "input" / "configuration.json").read_text())
    assert staged["platform_file"] == str((project / "platform.xml").resolve())
    assert staged["job_statistics"] == str(tmp_path / "out" / "output" / "job_statistics.csv")
    assert staged["zmq_url"].startswith("ipc://")
    staged_jobs = json.loads((tmp_path / "out" / "input" / "jobs.json").read_text())
    model = staged_jobs["jobs"][0]["application_model"]
    assert model == str((project / "data" / "input" / "app.json").resolve())


def test_simgrid_version_reads_the_header(tmp_path):
    header = tmp_path / "simgrid" / "version.h"
    header.parent.mkdir()
    header.write_text("#define SIMGRID_VERSION_MAJOR 3\n#define SIMGRID_VERSION_MINOR 32\n")
    assert simgrid_version([tmp_path]) == (3, 32)
    assert simgrid_version([tmp_path / "none"]) is None


def _pfs_project(tmp_path):
    """Two rigid 2-node jobs on a 2-node machine, each writing 4 GB to a 1 GB/s PFS."""
    xml = simgrid_platform_xml("0-1", "1Gf", "80Gbps", "0us", "1GBps", "1GBps", "0us")
    (tmp_path / "platform.xml").write_text(xml)
    model = {"phases": [{"iterations": 1, "tasks": [{"type": "pfs_write", "bytes": 4e9}]}]}
    (tmp_path / "app.json").write_text(json.dumps(model))
    job = {"type": "rigid", "num_nodes": 2, "application_model": "app.json"}
    jobs = [{**job, "submit_time": 0}, {**job, "submit_time": 1}]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    config = {"jobs_file": "jobs.json", "platform_file": "platform.xml"}
    (tmp_path / "configuration.json").write_text(json.dumps(config))
    return tmp_path


def test_self_agreement_of_a_project(tmp_path):
    project = _pfs_project(tmp_path)
    same = self_agreement(project, {"pfs_write_bandwidth": 1.0})
    assert same.shares["overall"] == 1.0 and same.first_start_mismatch is None
    # twice the PFS: job 0 writes 4 GB in 2 s instead of 4 s, job 1 starts at 2 instead
    # of 4 (it waits for the machine) and runs 2 s instead of 4
    fast = self_agreement(project, {"pfs_write_bandwidth": 2.0})
    assert fast.jobs["makespan"].tolist() == pytest.approx([2.0, 2.0])
    assert fast.jobs["makespan_ref"].tolist() == pytest.approx([4.0, 4.0])
    assert fast.shares["overall"] == 0.0 and fast.first_start_mismatch == 1
    with pytest.raises(InvalidInputError, match="no_such_field"):
        self_agreement(project, {"no_such_field": 2.0})
