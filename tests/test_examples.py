"""The scripts in examples/ run in a fresh interpreter and print what their README says."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

EXAMPLES = REPO / "examples"


def _run(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _table(stdout: str, first: str) -> dict[str, list[float]]:
    """Rows of whitespace-separated numbers whose first cell is a name, keyed by the name."""
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if cells and cells[0] == first:
            rows[cells[0]] = [float(c) for c in cells[1:]]
    return rows


def test_every_example_is_listed_in_its_readme() -> None:
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts == ["batchsim_schedulers.py", "ir_trace.py", "perfmodel_fit.py"]
    for name in scripts:
        assert f"examples/{name}" in readme


def test_batchsim_example_compares_two_schedulers() -> None:
    out = _run("batchsim_schedulers.py", "--jobs", "300", "--nodes", "64").stdout
    assert "300 jobs on 64 nodes" in out
    fcfs = _table(out, "fcfs")["fcfs"]
    easy = _table(out, "easy")["easy"]
    for row in (fcfs, easy):
        jobs, completed, makespan, mean_wait, slowdown, utilization = row
        assert jobs == completed == 300
        assert makespan > 0 and mean_wait >= 0 and slowdown >= 1
        assert 0 < utilization <= 1
    # Backfilling on this seeded workload starts jobs earlier than strict FCFS.
    assert easy[3] < fcfs[3]
    change = re.search(r"mean wait by ([+-][0-9.]+) %", out)
    assert change is not None
    assert float(change.group(1)) == pytest.approx(100 * (easy[3] - fcfs[3]) / fcfs[3], abs=0.2)


def test_perfmodel_example_predicts_the_held_out_network() -> None:
    out = _run("perfmodel_fit.py", "--repeats", "3").stdout
    assert "fitted ConvMeter on 12 measurements" in out
    assert "held-out network: mobilenet_v2" in out
    rows = [
        line.split() for line in out.splitlines() if re.fullmatch(r"\s*\d+ +[0-9.]+ +[0-9.]+", line)
    ]
    assert [int(r[0]) for r in rows] == [1, 4, 16, 64]
    for _, measured, predicted in rows:
        assert float(measured) > 0
        assert math.isfinite(float(predicted)) and float(predicted) > 0
    error = re.search(r"MAPE on the held-out network: ([0-9.]+) %", out)
    assert error is not None and math.isfinite(float(error.group(1)))


def test_ir_example_prints_groups_and_flops() -> None:
    out = _run("ir_trace.py", "--model", "resnet").stdout
    total = int(re.search(r"total FLOPs: ([0-9,]+)", out).group(1).replace(",", ""))
    kinds = re.findall(r"^  ([a-z_]+) +([0-9,]+)$", out, flags=re.MULTILINE)
    assert dict(kinds)["conv"]
    assert sum(int(v.replace(",", "")) for _, v in kinds) == total > 0
    header = re.search(r"channel groups: (\d+) \((\d+) prunable\)", out)
    groups = re.findall(r"^  (g\d+) +(\w+) +size +(\d+)  (.*)$", out, flags=re.MULTILINE)
    assert len(groups) == int(header.group(1)) > 0
    assert sum(state == "prunable" for *_, state in groups) == int(header.group(2))
    assert groups[0][3] == "fixed: model input"


def test_ir_example_rejects_an_unknown_model() -> None:
    proc = _run("ir_trace.py", "--model", "no_such_net", check=False)
    assert proc.returncode == 2
    assert "no_such_net" in proc.stderr.strip().splitlines()[-1]
