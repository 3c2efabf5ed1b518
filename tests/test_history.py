"""Run-to-run history: earlier runs in sibling folders, in the report and the claims table."""

import json
import os
import time

from hpcnb.claims import evaluate_claims
from hpcnb.history import (
    HISTORY_ENV,
    earlier_runs,
    history_text,
    record_history,
    session_history,
    write_history,
)
from hpcnb.records import Record
from hpcnb.report import render_report


def _row(verdict):
    return {
        "claim": "pruned error under 12 %",
        "kind": "paper",
        "paper": "< 12 %",
        "verdict": verdict,
        "records": ["perf.pruned_error"],
        "judged_on": "the paper's figure",
    }


def _fake_run(
    root,
    name,
    value,
    met,
    *,
    machine="m1",
    params=None,
    verdict="reproduced",
    cached_from="",
    when=None,
):
    folder = root / name
    folder.mkdir()
    info = {
        "status": "ok",
        "seconds": 1.0,
        "output": "03_x.ipynb",
        "machine": machine,
        "parameters": params or {},
        "cached_from": cached_from,
    }
    detail = {
        "value": value,
        "low": value - 0.02,
        "high": value + 0.02,
        "met": met,
        "target": "< 0.12",
        "target_from": "paper",
        "n": 9,
        "unit": "",
        "paper": None,
        "source": "real",
        "coverage": 0.96,
    }
    rows = [_row(verdict)]
    (folder / "run.json").write_text(json.dumps({"03_x": info}))
    (folder / "records_detail.json").write_text(json.dumps({"03_x": {"perf.pruned_error": detail}}))
    (folder / "claims.json").write_text(json.dumps({"03_x": rows}))
    if when is not None:
        os.utime(folder / "run.json", (when, when))
    return folder


def _executed_notebook(folder, value, verdict):
    payload = {
        "key": "perf.pruned_error",
        "value": value,
        "low": value - 0.02,
        "high": value + 0.02,
        "n": 9,
        "target": "< 0.12",
        "target_from": "paper",
        "coverage": 0.96,
        "source": "real",
    }
    row = _row(verdict)
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "source": "",
                "metadata": {},
                "outputs": [
                    {
                        "output_type": "display_data",
                        "metadata": {},
                        "data": {
                            "application/vnd.hpcnb.record+json": payload,
                            "application/vnd.hpcnb.claims+json": [row],
                        },
                    }
                ],
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (folder / "03_x.ipynb").write_text(json.dumps(nb))


def test_earlier_runs_keep_only_comparable_runs(tmp_path):
    now = time.time()
    _fake_run(tmp_path, "a", 0.143, "not met", when=now - 300)
    _fake_run(tmp_path, "b", 0.097, "met", when=now - 200)
    _fake_run(tmp_path, "other_machine", 0.5, "not met", machine="m2", when=now - 100)
    _fake_run(tmp_path, "smoke", 0.5, "not met", params={"SMOKE": True}, when=now - 100)
    _fake_run(tmp_path, "copy", 0.097, "met", cached_from="b", when=now - 50)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json")
    runs = earlier_runs(tmp_path, "03_x", machine="m1", parameters={})
    assert [r.run for r in runs] == ["a", "b"]  # oldest first
    history = record_history(runs)["perf.pruned_error"]
    assert [h["value"] for h in history] == [0.143, 0.097]
    rec = Record(
        "perf.pruned_error",
        0.11,
        target="< 0.12",
        target_from="paper",
        low=0.1,
        high=0.125,
        n=9,
        coverage=0.96,
    )
    text = history_text(rec, history)
    assert (
        text.startswith("earlier runs: 0.143 [0.123, 0.163] not met, 0.097") and "flipped" in text
    )
    assert history_text(Record("perf.pruned_error", 0.097), history[1:]) == ""  # nothing moved


def test_the_report_shows_the_history_of_a_record_across_two_run_folders(tmp_path):
    now = time.time()
    _fake_run(
        tmp_path, "20261201T100000Z", 0.143, "not met", verdict="not reproduced", when=now - 300
    )
    _fake_run(tmp_path, "20261201T101000Z", 0.097, "met", when=now - 200)
    current = _fake_run(
        tmp_path, "20261201T102000Z", 0.110, "inconclusive", verdict="inconclusive", when=now
    )
    _executed_notebook(current, 0.110, "inconclusive")
    report = render_report(current)
    assert "Run-to-run spread over 2 earlier run(s) of 03_x" in report
    assert "20261201T100000Z: 0.143 [0.123, 0.163] not met" in report
    assert "20261201T101000Z: 0.097" in report
    assert "Verdict changed: *pruned error under 12 %* is inconclusive here" in report
    assert "claims.paper_claims_judged_on_own_targets): 0." in report


def test_the_claims_table_reads_the_history_the_runner_passes(tmp_path, monkeypatch):
    _fake_run(tmp_path, "a", 0.143, "not met")
    path = write_history(
        tmp_path / "h.json", earlier_runs(tmp_path, "03_x", machine="m1", parameters={})
    )
    monkeypatch.setenv(HISTORY_ENV, str(path))
    history = session_history()
    rec = Record(
        "perf.pruned_error",
        0.09,
        target="< 0.12",
        target_from="paper",
        low=0.08,
        high=0.1,
        n=9,
        coverage=0.96,
    )
    from hpcnb.claims import Claim

    row = evaluate_claims(
        [Claim("c", ("perf.pruned_error",), paper="< 12 %")], {"perf.pruned_error": rec}, history
    )[0]
    assert "earlier runs: 0.143" in row.measured and "(verdict flipped)" in row.measured
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "missing.json"))
    assert session_history() == {}


def test_diff_lists_records_beyond_their_intervals_and_changed_verdicts(tmp_path, capsys):
    from hpcnb.cli import main
    from hpcnb.rundiff import diff_runs, moved_beyond, render_diff

    a = _fake_run(tmp_path, "a", 0.143, "not met", verdict="not reproduced")
    b = _fake_run(tmp_path, "b", 0.097, "met")
    (b / "run.json").write_text(
        json.dumps(
            {
                "03_x": json.loads((b / "run.json").read_text())["03_x"],
                "04_y": {"status": "failed", "seconds": 1.0, "output": "04_y.ipynb"},
            }
        )
    )
    diff = diff_runs(a, b)
    assert (diff.only_a, diff.only_b) == ([], ["04_y"])
    assert [(s, k) for s, k, _, _ in diff.moved] == [("03_x", "perf.pruned_error")]
    assert diff.verdicts == [("03_x", "pruned error under 12 %", "not reproduced", "reproduced")]
    text = render_diff(diff)
    assert "| 03_x | perf.pruned_error | 0.143 [0.123, 0.163] not met | 0.097" in text
    assert moved_beyond({"value": 1.0, "low": 0.9, "high": 1.1}, {"value": 1.05}) is False
    assert moved_beyond({"value": 1.0}, {"value": 1.0}) is None
    assert moved_beyond({"value": 1.0}, {"value": 2.0}) is True
    assert main(["diff", str(a), str(b)]) == 0 and "verdict changed (1)" in capsys.readouterr().out
    assert main(["diff", str(a), str(tmp_path / "nothing")]) == 2
