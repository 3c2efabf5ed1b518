import json
import math

import nbformat
import pytest

from hpcnb.errors import RecordError
from hpcnb.records import (
    INCONCLUSIVE,
    MET,
    MIME_TYPE,
    NOT_MET,
    NOT_TESTED,
    Record,
    clear_session,
    evaluate_target,
    format_record,
    format_record_html,
    read_record_details,
    read_records,
    record,
    record_accuracy,
    session_records,
    target_met,
)
from hpcnb.stats import Estimate, wilson_interval


@pytest.fixture(autouse=True)
def _fresh_session():
    clear_session()
    yield
    clear_session()


def _notebook_with(payloads, tmp_path):
    nb = nbformat.v4.new_notebook()
    for payload in payloads:
        cell = nbformat.v4.new_code_cell("record(...)")
        cell.outputs = [
            nbformat.v4.new_output(
                "display_data", data={MIME_TYPE: payload, "text/plain": payload["key"]}
            )
        ]
        nb.cells.append(cell)
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_record_keeps_validated_record_and_returns_nothing(capsys):
    assert record("area.metric_one", 1.5, unit="s", target=">= 1", paper=2.0) is None
    assert session_records()["area.metric_one"] == Record("area.metric_one", 1.5, "s", ">= 1", 2.0)
    assert "area.metric_one = 1.5 s" in capsys.readouterr().out


def test_record_accepts_numpy_scalars():
    np = pytest.importorskip("numpy")
    record("a.b", np.float32(0.25))
    record("a.c", np.int64(3))
    assert session_records()["a.b"].value == 0.25
    assert session_records()["a.c"].value == 3.0


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_record_rejects_non_finite(value):
    with pytest.raises(ValueError, match="not finite"):
        record("area.metric", value)


@pytest.mark.parametrize("key", ["metric", "Area.metric", "area.Metric", "area-x.y", "a..b", ""])
def test_record_rejects_bad_keys(key):
    with pytest.raises(ValueError, match="snake_case"):
        record(key, 1.0)


def test_record_rejects_non_numbers_and_bad_targets():
    with pytest.raises(TypeError):
        record("a.b", "fast")
    with pytest.raises(ValueError, match="target"):
        record("a.b", 1.0, target="about 2")


@pytest.mark.parametrize(
    ("value", "target", "met"),
    [
        (1.0, ">= 1", True),
        (0.99, ">= 1", False),
        (0.5, "<= 1e-6", False),
        (1e-7, "≤ 1e-6", True),
        (500, 500, True),
        (499, 500, False),
        (2.0, "> 1.5", True),
        (1.0, "< 1", False),
        (3, None, None),
    ],
)
def test_target_met(value, target, met):
    assert target_met(value, target) is met


def test_format_record_mentions_target_and_paper():
    line = format_record(Record("a.b", 0.5, "", ">= 1", 2.15))
    assert "NOT met" in line and "paper 2.15" in line


def test_read_records_round_trip(tmp_path):
    path = _notebook_with(
        [
            {"key": "a.x", "value": 1.0, "unit": "", "target": None, "paper": None},
            {"key": "a.y", "value": 2.5, "unit": "s", "target": ">= 2", "paper": 3.0},
        ],
        tmp_path,
    )
    assert read_records(path) == {"a.x": 1.0, "a.y": 2.5}
    details = read_record_details(path)
    assert details[1] == Record("a.y", 2.5, "s", ">= 2", 3.0)


def test_read_records_rejects_duplicate_keys(tmp_path):
    payload = {"key": "a.x", "value": 1.0, "unit": "", "target": None, "paper": None}
    path = _notebook_with([payload, payload], tmp_path)
    with pytest.raises(ValueError, match="emitted twice"):
        read_records(path)


def test_read_records_rejects_non_notebook(tmp_path):
    path = tmp_path / "bad.ipynb"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a notebook"):
        read_records(path)


def test_record_emits_mime_bundle_in_a_kernel(tmp_path):
    """Execute a two-cell notebook in a real kernel and read the record back."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("from hpcnb import record\nrecord('k.v', 0.5)"))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    assert read_records(path) == {"k.v": 0.5}
    raw = json.loads(path.read_text())
    data = raw["cells"][0]["outputs"][0]["data"]
    assert data[MIME_TYPE]["key"] == "k.v" and "k.v = 0.5" in data["text/plain"]
    assert "<table" in "".join(data["text/html"]) and "<code>k.v</code>" in "".join(
        data["text/html"]
    )


# --- uncertainty and provenance -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "target", "low", "high", "source", "state"),
    [
        (1.29, ">= 1.3", 1.21, 1.37, "real", INCONCLUSIVE),
        (1.5, ">= 1.3", 1.35, 1.6, "real", MET),
        (1.1, ">= 1.3", 1.0, 1.2, "real", NOT_MET),
        (0.1, "< 0.2", 0.05, 0.2, "real", INCONCLUSIVE),
        (0.1, "<= 0.2", 0.05, 0.2, "real", MET),
        (1.5, ">= 1.3", None, None, "real", MET),
        (9.0, "> 1", 8.0, 10.0, "synthetic", NOT_TESTED),
        (9.0, "> 1", 8.0, 10.0, "simulated", MET),
        (500, 500, 499, 501, "real", INCONCLUSIVE),
        (1.0, 1.0, 0.74, 1.0, "real", INCONCLUSIVE),
        (1.0, ">= 0.909", 0.74, 1.0, "real", INCONCLUSIVE),
        (500, 500, 500, 500, "real", MET),
        (500, 500, 501, 503, "real", NOT_MET),
        (500, 500, None, None, "real", MET),
        (9.0, "> 1", 8.0, 10.0, "generated", MET),
        (3.0, None, None, None, "real", None),
    ],
)
def test_evaluate_target_is_three_valued(value, target, low, high, source, state):
    assert evaluate_target(value, target, low, high, source) == state


def test_an_interval_under_95_percent_or_too_few_observations_is_never_met():
    assert evaluate_target(2.0, "> 1", 1.5, 2.5, coverage=0.9375) == INCONCLUSIVE
    assert evaluate_target(0.5, "> 1", 0.4, 0.6, coverage=0.9375) == NOT_MET
    assert evaluate_target(2.0, "> 1", 1.5, 2.5, coverage=0.96875) == MET
    assert evaluate_target(2.0, "> 1", n=2) == INCONCLUSIVE
    assert evaluate_target(0.5, "> 1", n=2) == NOT_MET


def test_record_of_few_samples_says_its_coverage_or_has_no_interval(capsys):
    record("p.five", samples=[1.2, 1.3, 1.25, 1.4, 1.35], target="> 1")
    rec = session_records()["p.five"]
    assert (rec.low, rec.high, rec.coverage) == (1.2, 1.4, 0.9375) and rec.met == INCONCLUSIVE
    assert "covers only 94%" in capsys.readouterr().out
    record("p.seven", samples=[1.2, 1.3, 1.25, 1.4, 1.35, 1.22, 1.31], target="> 1")
    assert session_records()["p.seven"].met == MET
    record("p.two", samples=[1.2, 1.3], target="> 1")
    rec = session_records()["p.two"]
    assert rec.low is None and rec.coverage is None and rec.met == INCONCLUSIVE
    assert "no interval (n=2 < 3)" in capsys.readouterr().out
    record_accuracy("p.one", 1, 1, target=">= 0.5")
    rec = session_records()["p.one"]
    assert rec.low is None and rec.met == INCONCLUSIVE


def test_target_origin_and_own_target():
    record(
        "p.err",
        0.15,
        interval=(0.12, 0.17),
        n=40,
        target="< 0.2",
        target_from="paper",
        own_target="< 0.12",
    )
    rec = session_records()["p.err"]
    assert rec.met == MET and rec.own_met == NOT_MET
    assert rec.paper_target == "< 0.2" and rec.our_target == "< 0.12"
    with pytest.raises(RecordError, match="own_target"):
        record("p.bad", 0.1, target="< 0.2", own_target="< 0.1")
    with pytest.raises(RecordError, match="target_from"):
        record("p.bad", 0.1, target="< 0.2", target_from="theirs")
    with pytest.raises(RecordError, match="paper's figure"):
        record("p.bad", 0.1, target_from="paper")


def test_record_with_samples_carries_median_interval_and_line(capsys):
    record("p.latency_speedup", samples=[1.2, 1.3, 1.25, 1.4, 1.1], target=">= 1.3", paper=1.5)
    rec = session_records()["p.latency_speedup"]
    assert rec.value == 1.25 and rec.n == 5 and rec.low <= 1.25 <= rec.high
    assert rec.samples == (1.2, 1.3, 1.25, 1.4, 1.1)
    line = capsys.readouterr().out
    assert (
        line.startswith("p.latency_speedup = 1.25 [")
        and "(n=5), interval covers only 94%, target >= 1.3 (ours):" in line
    )


def test_record_accuracy_uses_wilson_and_synthetic_is_not_tested(capsys):
    record_accuracy("p.accuracy", 45, 50, target=">= 0.5", source="synthetic")
    rec = session_records()["p.accuracy"]
    assert rec.n == 50 and (rec.low, rec.high) == wilson_interval(45, 50).bounds
    assert rec.met == NOT_TESTED and "synthetic" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"value": 1.0, "samples": [1.0, 2.0]}, "not both"),
        ({}, "value or samples"),
        ({"value": 1.0, "interval": (1.5, 2.0)}, "does not hold"),
        ({"value": 1.0, "source": "measured"}, "source"),
        ({"value": 1.0, "n": 0}, "positive"),
        ({"samples": [1.0, math.inf]}, "not finite"),
    ],
)
def test_record_rejects_inconsistent_uncertainty(kwargs, match):
    with pytest.raises(RecordError, match=match):
        record("a.bad", **kwargs)


def test_detailed_payload_round_trips_through_strict_json(tmp_path):
    record(
        "r.x",
        samples=[0.2, 0.2, 0.3, 0.2, 0.2, 0.3, 0.2],
        unit="s",
        target="< 1",
        target_from="paper",
        own_target="< 0.15",
        source="simulated",
        note="hi",
    )
    rec = session_records()["r.x"]
    text = json.dumps(rec.to_json(), allow_nan=False)
    path = _notebook_with([json.loads(text)], tmp_path)
    back = read_record_details(path)[0]
    assert back == rec and back.met == MET and back.own_met == NOT_MET
    assert set(rec.detail()) == {
        "value",
        "unit",
        "target",
        "paper",
        "n",
        "low",
        "high",
        "source",
        "met",
        "target_from",
        "own_target",
        "own_met",
        "coverage",
    }


def test_malformed_payload_names_the_cell(tmp_path):
    path = _notebook_with([{"key": "a.x", "value": "fast"}], tmp_path)
    with pytest.raises(RecordError, match="cell 0"):
        read_record_details(path)


# --- HTML rendering --------------------------------------------------------------------


def test_record_html_escapes_texts_colours_the_state_and_aligns_numbers():
    rec = Record(
        "a.speed",
        1.25,
        unit="<jobs>/s",
        target=">= 1",
        low=1.1,
        high=1.4,
        n=7,
        note="fast & <i>loud</i>",
        coverage=0.95,
    )
    page = format_record_html(rec)
    assert "&lt;jobs&gt;/s" in page and "fast &amp; &lt;i&gt;loud&lt;/i&gt;" in page
    assert "<i>" not in page and "&gt;= 1 (ours)" in page
    assert '<span style="color:#1a7f37;font-weight:bold">met</span>' in page
    cells = page.split("<td ")[1:]
    assert "<code>a.speed</code> = <b>1.25</b> &lt;jobs&gt;/s" in cells[0]
    assert "text-align:left" in cells[0]
    for cell, text in zip(cells[1:4], ("1.1", "1.4", "7"), strict=True):
        assert "text-align:right" in cell and f">{text}</td>" in cell
    missed = format_record_html(Record("a.slow", 0.5, target=">= 1"))
    assert '<span style="color:#cf222e;font-weight:bold">not met</span>' in missed


def test_record_displays_html_beside_the_line(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.get_ipython", lambda: object())
    monkeypatch.setattr("IPython.display.display", lambda bundle, raw: shown.append(bundle))
    record("a.x", 2.0, target="> 1", note="<b>")
    (bundle,) = shown
    assert bundle["text/plain"].startswith("a.x = 2") and "&lt;b&gt;" in bundle["text/html"]
    assert bundle[MIME_TYPE]["key"] == "a.x"


def test_record_takes_an_estimate_with_its_interval_and_n(capsys):
    record("e.gap", Estimate(0.02, 0.01, 0.04, 120), target="> 0")
    rec = session_records()["e.gap"]
    assert (rec.value, rec.low, rec.high, rec.n, rec.met) == (0.02, 0.01, 0.04, 120, MET)
    assert "e.gap = 0.02 [0.01, 0.04] (n=120)" in capsys.readouterr().out
    with pytest.raises(RecordError, match="carries its interval"):
        record("e.gap", Estimate(0.02, 0.01, 0.04, 120), n=5)
    record("e.few", Estimate(0.5, 0.1, 0.9, 2))  # too few observations: no interval kept
    assert session_records()["e.few"].low is None
