import json

import pytest

from _nbutil import make_notebook
from hpcnb.cli import main
from hpcnb.parameters import ParameterError
from hpcnb.runner import run_notebooks

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
    assert "b_bad: failed" in text and "t.x = 2" in text
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
        "record('t.speed', samples=[1.1, 1.2, 1.3, 1.25, 1.15], target='>= 1.0', paper=1.5)\n"
        "record('t.trace', 0.9, target='> 0.5', source='synthetic')\n"
        "claim('faster than the peer', records=['t.speed'], paper='1.5x')\n"
        "claim('works on the real trace', records=['t.trace'], paper='0.9')\n"
        "claims_table()",
    )
    out = tmp_path / "run"
    (result,) = run_notebooks([src], {}, out=out, progress=False, timeout=120)
    assert result.ok, result.error
    detail = json.loads((out / "records_detail.json").read_text())["d_claims"]
    assert detail["t.speed"]["n"] == 5 and detail["t.speed"]["met"] == "met"
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
