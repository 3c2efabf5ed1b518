"""A scheduler of the user's own, named ``package.module:Class``, on the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpcnb.batchsim.policies import SCHEDULERS, make_scheduler
from hpcnb.batchsim.scheduler import EasyBackfilling, Scheduler
from hpcnb.batchsim.swf import write_swf
from hpcnb.batchsim.workloads import lublin_feitelson
from hpcnb.plugins import PluginError

# A module outside the package: the largest waiting jobs that fit start first, and every
# invocation appends a line to the marker file named by MYSCHED_MARKER.
USER_MODULE = '''
import os

from hpcnb.batchsim.scheduler import Scheduler


class MySched(Scheduler):
    """Largest waiting job first (a user policy)."""

    name = "mysched"

    def schedule(self, view, reasons):
        with open(os.environ["MYSCHED_MARKER"], "a", encoding="utf-8") as marker:
            marker.write(f"{view.time}\\n")
        for rec in sorted(view.queue, key=lambda r: -r.job.num_nodes):
            if rec.job.num_nodes <= view.free_nodes:
                view.start(rec)


NOT_A_SCHEDULER = 42
'''


@pytest.fixture
def user_module(tmp_path: Path) -> Path:
    """A folder outside the package holding ``mymod.py``."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "mymod.py").write_text(textwrap.dedent(USER_MODULE), encoding="utf-8")
    return folder


def hpcnb_cli(args: list[str], pythonpath: Path, marker: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pythonpath), MYSCHED_MARKER=str(marker))
    return subprocess.run(
        [sys.executable, "-m", "hpcnb", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_simulate_runs_a_scheduler_named_by_reference(tmp_path, user_module):
    trace = write_swf(lublin_feitelson(60, 16, seed=2), tmp_path / "w.swf")
    marker = tmp_path / "marker.txt"
    runs = {}
    for scheduler in ("mymod:MySched", "fcfs"):
        out = tmp_path / scheduler.replace(":", "_")
        argv = ["batchsim", "simulate", str(trace), "--scheduler", scheduler, "--out", str(out)]
        done = hpcnb_cli(argv, user_module, marker)
        assert done.returncode == 0, done.stderr
        runs[scheduler] = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert runs["mymod:MySched"]["scheduler"] == "mysched"
    assert len(marker.read_text(encoding="utf-8").splitlines()) > 10  # its schedule() ran
    assert runs["mymod:MySched"]["mean_wait"] != runs["fcfs"]["mean_wait"]


@pytest.mark.parametrize(
    ("scheduler", "message"),
    [
        ("nope", "unknown scheduler 'nope'; registered: conservative, drf, easy"),
        ("mymod:Missing", "'mymod' has no attribute 'Missing'"),
        ("mymod:NOT_A_SCHEDULER", "42 is not a subclass of hpcnb.batchsim.scheduler.Scheduler"),
        ("nomodule:Sched", "cannot import 'nomodule'"),
    ],
)
def test_a_bad_scheduler_is_one_line_and_exit_2(tmp_path, user_module, scheduler, message):
    trace = write_swf(lublin_feitelson(10, 8, seed=1), tmp_path / "w.swf")
    argv = ["batchsim", "simulate", str(trace), "--scheduler", scheduler, "--out", "x"]
    done = hpcnb_cli(argv, user_module, tmp_path / "marker.txt")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcnb batchsim simulate: "), done.stderr
    assert message in lines[0]
    assert not (tmp_path / "x").exists() and not (tmp_path / "marker.txt").exists()


def test_schedulers_lists_the_built_ins_one_line_each(tmp_path):
    done = hpcnb_cli(["batchsim", "schedulers"], tmp_path, tmp_path / "marker.txt")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == SCHEDULERS.names()
    assert len(lines) == 8 and all(len(line.split()) > 2 for line in lines)
    assert any(line.startswith("easy ") and "EASY backfilling" in line for line in lines)


def test_make_scheduler_resolves_references(user_module, monkeypatch):
    monkeypatch.syspath_prepend(str(user_module))
    monkeypatch.delitem(sys.modules, "mymod", raising=False)
    mine = make_scheduler("mymod:MySched")
    assert isinstance(mine, Scheduler) and type(mine).__name__ == "MySched"
    assert "mymod:MySched" not in SCHEDULERS  # a reference is used, not registered
    assert type(make_scheduler("hpcnb.batchsim.scheduler:EasyBackfilling")) is EasyBackfilling
    assert make_scheduler("malleable", gain=0.25).gain == 0.25
    with pytest.raises(PluginError, match="42 is not a subclass"):
        make_scheduler("mymod:NOT_A_SCHEDULER")
    with pytest.raises(PluginError, match="is not a subclass"):
        make_scheduler("mymod:os")
    with pytest.raises(PluginError, match="no attribute 'Missing'"):
        make_scheduler("mymod:Missing")
    with pytest.raises(PluginError, match="unknown scheduler 'greedy'; registered: "):
        make_scheduler("greedy")


def test_a_module_that_registers_its_scheduler_is_named_by_module(user_module, monkeypatch):
    from hpcnb.batchsim.policies import unregister_scheduler

    (user_module / "regmod.py").write_text(
        "from hpcnb.batchsim.policies import register_scheduler\n"
        "from mymod import MySched\n"
        "register_scheduler('my-sched', MySched)\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(user_module))
    for name in ("mymod", "regmod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        assert type(make_scheduler("regmod:")).__name__ == "MySched"
        assert type(make_scheduler("My-Sched")).__name__ == "MySched"  # now registered
    finally:
        unregister_scheduler("my-sched")
