import json
import signal
import subprocess
import sys
import time

import pytest

from _nbutil import make_notebook
from hpcnb.cli import main
from hpcnb.parameters import ParameterError
from hpcnb.report import render_report
from hpcnb.runner import run_notebooks, summary_line

PARAMS = "SMOKE: bool = False  # tiny\nSEED: int = 0  # seed\nX: float = 1.0  # a value\n"


@pytest.fixture
def notebooks(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    good = make_notebook(
        src / "a_good.ipynb", PARAMS, "from hpcnb import record\nrecord('t.x', X * 2)"
    )
    bad = make_notebook(
        src / "b_bad.ipynb",
        PARAMS,
        "from hpcnb import record\nrecord('t.before', 1.0)",
        "raise RuntimeError('boom in cell two')",
        "record('t.after', 2.0)",
    )
    slow = make_notebook(src / "c_slow.ipynb", PARAMS, "import time\ntime.sleep(120)")
    return good, bad, slow


def test_failure_is_reported_and_others_still_run(notebooks, tmp_path):
    good, bad, _ = notebooks
    out = tmp_path / "run"
    results = run_notebooks([bad, good], {"X": "2.5"}, out=out, progress=False, timeout=120)
    by_name = {r.notebook: r for r in results}
    assert by_name["b_bad"].status == "failed"
    assert by_name["b_bad"].cell == 2  # parameters, record, raise (0-based, injected cell skipped)
    assert "RuntimeError: boom in cell two" in by_name["b_bad"].error
    assert by_name["b_bad"].records == {"t.before": 1.0}  # partial output kept
    assert by_name["a_good"].ok and by_name["a_good"].records == {"t.x": 5.0}
    records = json.loads((out / "records.json").read_text())
    assert records == {"a_good": {"t.x": 5.0}, "b_bad": {"t.before": 1.0}}
    run = json.loads((out / "run.json").read_text())
    assert run["b_bad"]["status"] == "failed" and (out / "b_bad.ipynb").exists()


def test_bad_parameter_rejected_before_anything_runs(notebooks, tmp_path):
    good, _, _ = notebooks
    out = tmp_path / "never"
    with pytest.raises(ParameterError, match="NO_SUCH"):
        run_notebooks([good], {"NO_SUCH": "1"}, out=out, progress=False)
    with pytest.raises(ParameterError, match="X"):
        run_notebooks([good], {"X": "fast"}, out=out, progress=False)
    assert not out.exists()


def test_timeout_stops_the_notebook(notebooks, tmp_path):
    _, _, slow = notebooks
    (result,) = run_notebooks([slow], {}, out=tmp_path / "t", progress=False, timeout=15)
    assert result.status == "timeout"
    assert result.seconds < 60


def test_cli_run_exit_status_and_report(notebooks, tmp_path, capsys):
    good, bad, _ = notebooks
    out = tmp_path / "cli"
    status = main(["run", str(good), str(bad), "--out", str(out), "--no-progress"])
    assert status == 1
    text = capsys.readouterr().out
    assert "[2/2] b_bad failed in" in text and "at cell 2" in text and "t.x = 2" in text
    report = (out / "report.md").read_text()
    assert "| a_good | ok |" in report and "| b_bad | failed |" in report
    assert main(["report", str(out)]) == 0
    assert main(["run", str(good), "-p", "NO_SUCH", "1"]) == 2
    assert "valid: SMOKE: bool" in capsys.readouterr().err


def test_run_folder_has_details_claims_and_report_columns(tmp_path):
    src = make_notebook(
        tmp_path / "d_claims.ipynb",
        PARAMS,
        "from hpcnb import claim, claims_table, record\n"
        "record('t.speed', samples=[1.1, 1.2, 1.3, 1.25, 1.15, 1.2, 1.22], target='>= 1.0',"
        " target_from='paper', paper=1.5)\n"
        "record('t.trace', 0.9, target='> 0.5', source='synthetic', target_from='paper')\n"
        "claim('faster than the peer', records=['t.speed'], paper='1.5x')\n"
        "claim('works on the real trace', records=['t.trace'], paper='0.9')\n"
        "claims_table()",
    )
    out = tmp_path / "run"
    (result,) = run_notebooks([src], {}, out=out, progress=False, timeout=120)
    assert result.ok, result.error
    detail = json.loads((out / "records_detail.json").read_text())["d_claims"]
    assert detail["t.speed"]["n"] == 7 and detail["t.speed"]["met"] == "met"
    assert detail["t.speed"]["low"] <= detail["t.speed"]["value"] <= detail["t.speed"]["high"]
    assert detail["t.trace"] == {**detail["t.trace"], "source": "synthetic", "met": "not tested"}
    claims = json.loads((out / "claims.json").read_text())["d_claims"]
    assert [(c["claim"], c["verdict"]) for c in claims] == [
        ("faster than the peer", "reproduced"),
        ("works on the real trace", "not tested (synthetic data)"),
    ]
    assert json.loads((out / "records.json").read_text())["d_claims"]["t.speed"] == 1.2
    assert main(["report", str(out)]) == 0
    from hpcnb.report import render_report

    report = render_report(out)
    assert "| t.speed | 1.2 | [" in report and "| synthetic |" in report
    assert "1 reproduced, 1 not tested (synthetic data)" in report
    assert "1/1 tested targets met" in report


def test_a_second_run_shows_values_that_moved_since_the_first(tmp_path):
    src = make_notebook(
        tmp_path / "h_noise.ipynb",
        PARAMS,
        "import random\n"
        "from hpcnb import claim, claims_table, record\n"
        "record('t.noise', samples=[random.random() for _ in range(7)], target='>= 0')\n"
        "claim('noise is non-negative', records=['t.noise'], kind='own design')\n"
        "claims_table()",
    )
    runs = tmp_path / "runs"
    run_notebooks([src], {}, out=runs / "first", progress=False, timeout=120)
    (result,) = run_notebooks(
        [src], {}, out=runs / "second", progress=False, timeout=120, force=True
    )
    assert result.ok, result.error
    first = json.loads((runs / "first" / "records.json").read_text())["h_noise"]["t.noise"]
    assert f"earlier runs: {first:.4g}" in result.claims[0]["measured"]
    assert "Run-to-run spread over 1 earlier run(s) of h_noise" in render_report(runs / "second")


# --- process control, run folders, record hygiene, cached re-runs (issue 17) ----------


def _pids_alive(pids):
    import psutil

    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_timeout_stops_kernel_children_and_a_kernel_blocked_in_c(tmp_path):
    pidfile = tmp_path / "pids.txt"
    nb = make_notebook(
        tmp_path / "e_orphans.ipynb",
        PARAMS,
        "import os, subprocess, ctypes\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        f"open({str(pidfile)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "ctypes.PyDLL(None).sleep(120)  # blocked in C: no Python signal handling",
    )
    start = time.monotonic()
    (result,) = run_notebooks([nb], {}, out=tmp_path / "t", progress=False, timeout=15)
    assert result.status == "timeout"
    assert time.monotonic() - start < 60
    pids = [int(p) for p in pidfile.read_text().split()]
    deadline = time.monotonic() + 10
    while _pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _pids_alive(pids) == [], "kernel or its child left running"


def test_sigint_stops_everything_and_marks_the_run_interrupted(tmp_path):
    pidfile = tmp_path / "pids.txt"
    nb = make_notebook(
        tmp_path / "f_long.ipynb",
        PARAMS,
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        f"open({str(pidfile)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(300)",
    )
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcnb", "run", str(nb), "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pidfile.exists(), "the notebook never started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    pids = [int(p) for p in pidfile.read_text().split()]
    deadline = time.monotonic() + 10
    while _pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _pids_alive(pids) == []
    run = json.loads((out / "run.json").read_text())
    assert run["f_long"]["status"] == "interrupted"
    assert (out / "report.md").is_file()


def test_run_folder_must_be_empty_and_single_writer(notebooks, tmp_path, capsys):
    from hpcnb.runfolder import RunFolderError, locked_run_folder

    good, _, _ = notebooks
    out = tmp_path / "busy"
    with locked_run_folder(out):
        assert main(["run", str(good), "--out", str(out), "--no-progress"]) == 2
        assert "in use by another hpcnb run" in capsys.readouterr().err
    assert main(["run", str(good), "--out", str(out), "--no-progress"]) == 0
    assert main(["run", str(good), "--out", str(out), "--no-progress"]) == 2
    assert "not empty" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert main(["run", str(good), "--out", str(tmp_path / "afile")]) == 2
    (out / "records.json").write_text("{broken")
    with pytest.raises(RunFolderError, match=r"records\.json"):
        run_notebooks([good], {}, out=out, resume=True, progress=False)


def test_resume_skips_finished_and_moved_folder_still_reports(notebooks, tmp_path):
    from hpcnb.report import render_report

    good, bad, _ = notebooks
    out = tmp_path / "r1"
    run_notebooks([good, bad], {}, out=out, progress=False, force=True)
    before = json.loads((out / "run.json").read_text())
    assert before["a_good"]["output"] == "a_good.ipynb"  # relative to the folder
    results = run_notebooks([good], {}, out=out, progress=False, resume=True)
    assert results[0].ok and results[0].seconds == before["a_good"]["seconds"]
    moved = tmp_path / "elsewhere" / "r1"
    moved.parent.mkdir()
    out.rename(moved)
    report = render_report(moved)
    assert "| t.x | 2 |" in report and "| a_good | ok |" in report


def test_malformed_record_outputs_fail_that_notebook_only(tmp_path):
    bodies = {
        "g_nokey": "{'value': 1.0}",
        "g_list": "[1, 2]",
        "g_nan": "{'key': 'a.b', 'value': float('nan')}",
        "g_badkey": "{'key': 'NOT A KEY', 'value': 1.0}",
    }
    paths = [
        make_notebook(
            tmp_path / f"{stem}.ipynb",
            PARAMS,
            "from IPython.display import display\n"
            f"display({{'application/vnd.hpcnb.record+json': {body}, 'text/plain': 'x'}}, "
            "raw=True)",
        )
        for stem, body in bodies.items()
    ]
    good = make_notebook(
        tmp_path / "h_good.ipynb", PARAMS, "from hpcnb import record\nrecord('t.y', 1.0)"
    )
    out = tmp_path / "run"
    results = run_notebooks([*paths, good], {}, out=out, progress=False, force=True)
    by = {r.notebook: r for r in results}
    for stem in bodies:
        assert by[stem].status == "failed" and "malformed" in by[stem].error, stem
    assert by["h_good"].ok
    json.loads((out / "records.json").read_text())  # strict JSON, still readable


def test_unchanged_notebook_is_reused_and_force_reexecutes(tmp_path):
    nb = make_notebook(
        tmp_path / "k_cached.ipynb",
        PARAMS,
        "import time\nfrom hpcnb import record\nrecord('t.stamp', time.time())",
    )
    runs = tmp_path / "papermill_runs"
    (first,) = run_notebooks([nb], {}, out=runs / "a", progress=False)
    (second,) = run_notebooks([nb], {}, out=runs / "b", progress=False)
    assert second.cached_from == "a" and second.records == first.records
    assert "cached (from a)" in summary_line(1, 1, second)
    (third,) = run_notebooks([nb], {"X": "3"}, out=runs / "c", progress=False)
    assert third.cached_from == "" and third.records != first.records  # parameters differ
    (fourth,) = run_notebooks([nb], {}, out=runs / "d", progress=False, force=True)
    assert fourth.cached_from == "" and fourth.records != first.records


@pytest.mark.parametrize(
    ("name", "first", "second"),
    [("OMP_NUM_THREADS", "1", "2"), ("OPENBLAS_CORETYPE", "Haswell", None)],
)
def test_a_changed_measurement_environment_is_never_answered_from_the_cache(
    tmp_path, monkeypatch, name, first, second
):
    nb = make_notebook(
        tmp_path / "k_env.ipynb",
        PARAMS,
        "import time\nfrom hpcnb import record\nrecord('t.stamp', time.time())",
    )
    runs = tmp_path / "papermill_runs"
    monkeypatch.setenv(name, first)
    (one,) = run_notebooks([nb], {}, out=runs / "a", progress=False)
    (same,) = run_notebooks([nb], {}, out=runs / "b", progress=False)
    assert same.cached_from == "a"  # nothing changed: re-used
    if second is None:
        monkeypatch.delenv(name)
    else:
        monkeypatch.setenv(name, second)
    (other,) = run_notebooks([nb], {}, out=runs / "c", progress=False)
    assert other.cached_from == "" and other.records != one.records  # executed again
    run_a = json.loads((runs / "a" / "run.json").read_text())["k_env"]
    run_c = json.loads((runs / "c" / "run.json").read_text())["k_env"]
    assert run_a["environment"][name] == first and run_c["environment"][name] == second
    assert run_a["inputs_key"] != run_c["inputs_key"]
    assert isinstance(run_c["environment"]["threadpools"], list)
    assert f"`{name}={first}`" in render_report(runs / "a")
    if name == "OPENBLAS_CORETYPE":  # the loaded BLAS kernel is recorded too
        pools = [
            p for p in run_a["environment"]["threadpools"] if p.get("internal_api") == "openblas"
        ]
        assert pools and pools[0]["architecture"].lower() == "haswell"


def test_neutral_settings_do_not_change_the_fingerprint(monkeypatch):
    from hpcnb.runfolder import measurement_environment

    base = measurement_environment()
    monkeypatch.setenv("HPCNB_PROGRESS", "0")
    monkeypatch.setenv("HPCNB_DATA_MIRROR", "http://127.0.0.1:1/")
    assert measurement_environment() == base
    monkeypatch.setenv("HPCNB_CACHE", "/nonexistent/cache")
    assert measurement_environment()["HPCNB_CACHE"] == "/nonexistent/cache"


def test_cli_edges(notebooks, tmp_path, capsys, monkeypatch):
    good, _, _ = notebooks
    for bad in ("nan", "inf", "-5", "0", "1e308", "soon"):
        assert main(["run", str(good), "--timeout", bad]) == 2
        assert "--timeout" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and "hpcnb" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hpcnb.runner.notebooks_dir", _no_notebooks)
    assert main(["list"]) == 2
    assert "no notebooks" in capsys.readouterr().err
    grid = tmp_path / "grid.yaml"
    grid.write_text("X: [1.0]\nX: [2.0]\n")
    assert main(["sweep", str(good), "--grid", str(grid)]) == 2
    assert "duplicate key" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", str(good), "--grid", str(grid), "--workers", "0"])


def _no_notebooks():
    raise FileNotFoundError("no notebooks/ folder in the current directory")


def test_report_of_a_corrupt_run_folder_is_a_clear_error(tmp_path, capsys):
    for text in ("{broken", "[1, 2]", '{"nb": [1]}'):
        (tmp_path / "run.json").write_text(text)
        assert main(["report", str(tmp_path)]) == 2
        assert "run.json" in capsys.readouterr().err


def test_status_names_what_changed_since_the_newest_run(tmp_path, monkeypatch, capsys):
    from hpcnb.runner import prepare
    from hpcnb.status import notebook_status

    nb = make_notebook(
        tmp_path / "s_status.ipynb", PARAMS, "from hpcnb import record\nrecord('t.one', 1.0)"
    )
    runs = tmp_path / "papermill_runs"
    ((path, params),) = prepare([nb], {})
    assert notebook_status(path, params, runs).state == "never run"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_notebooks([nb], {}, out=runs / "a", progress=False)
    st = notebook_status(path, params, runs)
    assert (st.state, st.run, st.reasons) == ("fresh", "a", ())
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    reasons = notebook_status(path, params, runs).reasons
    assert reasons[0] == "OMP_NUM_THREADS 1 -> 2" and "openmp threads 1 -> 2" in reasons
    ((_, other),) = prepare([nb], {"X": "7"})
    assert "parameters changed" in notebook_status(path, other, runs).reasons
    assert main(["status", str(nb), "--runs", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "| s_status | stale | a | OMP_NUM_THREADS 1 -> 2; " in out
    assert "openmp threads 1 -> 2" in out


def test_a_cached_rerun_shows_the_edited_prose(tmp_path):
    import nbformat

    nb_path = make_notebook(
        tmp_path / "m_prose.ipynb",
        PARAMS,
        "import time\nfrom hpcnb import record\nrecord('t.stamp', time.time())",
    )
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# First title"))
    nbformat.write(nb, nb_path)
    runs = tmp_path / "papermill_runs"
    (first,) = run_notebooks([nb_path], {"X": "4"}, out=runs / "a", progress=False)
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells[0].source = "# Edited title"
    nb.cells.append(nbformat.v4.new_markdown_cell("A new closing paragraph."))
    nbformat.write(nb, nb_path)
    (second,) = run_notebooks([nb_path], {"X": "4"}, out=runs / "b", progress=False)
    assert second.cached_from == "a" and second.records == first.records  # code unchanged
    reused = nbformat.read(runs / "b" / "m_prose.ipynb", as_version=4)
    texts = [c.source for c in reused.cells if c.cell_type == "markdown"]
    assert texts == ["# Edited title", "A new closing paragraph."]
    tags = [c.metadata.get("tags", []) for c in reused.cells]
    assert tags[1] == ["parameters"] and tags[2] == ["injected-parameters"]
    assert any(o.get("data") for c in reused.cells if c.cell_type == "code" for o in c.outputs)
    old = nbformat.read(runs / "a" / "m_prose.ipynb", as_version=4)
    assert old.cells[0].source == "# First title"  # the earlier run is left as it was


# --- smoke runs: the kernel's flag, the report, the kernel transport -------------------

_SMOKE_BODY = (
    "import os\n"
    "from hpcnb import claim, claims_table, record\n"
    "record('t.flag', float(os.environ.get('HPCNB_SMOKE_RUN') == '1'))\n"
    "record('t.speed', samples=[2.0, 2.1, 2.2, 1.9, 2.05, 2.0, 2.1], target='> 1',"
    " target_from='paper')\n"
    "record('t.ok', 1.0, target='>= 1')\n"
    "claim('faster than the peer', records=['t.speed'], paper='2x')\n"
    "claim('our check holds', records=['t.ok'], kind='own design')\n"
    "claims_table()"
)


def test_a_smoke_run_flags_the_kernel_its_claims_and_its_report(tmp_path):
    nb = make_notebook(tmp_path / "s_smoke.ipynb", PARAMS, _SMOKE_BODY)
    out = tmp_path / "smoke"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcnb",
            "run",
            str(nb),
            "--smoke",
            "-p",
            "X",
            "3",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "without encryption" not in proc.stderr  # the kernel talks over IPC sockets
    assert json.loads((out / "records.json").read_text())["s_smoke"]["t.flag"] == 1.0
    claims = json.loads((out / "claims.json").read_text())["s_smoke"]
    assert [(c["verdict"], c["smoke"]) for c in claims] == [
        ("not tested (smoke inputs)", True),
        ("met", True),
    ]
    report = (out / "report.md").read_text()
    assert report.splitlines()[2].startswith("**SMOKE run** (every notebook: `SMOKE=True`)")
    assert "| `SMOKE=True`, `X=3.0` |" in report and "Parameters: `SMOKE=True`, `X=3.0`." in report
    assert "1 met, 1 not tested (smoke inputs)" in report

    (full,) = run_notebooks([nb], {}, out=tmp_path / "full", progress=False, timeout=300)
    assert full.records["t.flag"] == 0.0
    assert [(c["verdict"], c["smoke"]) for c in full.claims] == [
        ("reproduced", False),
        ("met", False),
    ]
    report = render_report(tmp_path / "full")
    assert "SMOKE run" not in report and "| notebook defaults |" in report
