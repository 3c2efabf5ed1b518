import json
import math

import nbformat
import pytest

from hpcnb.records import (
    MIME_TYPE,
    Record,
    format_record,
    read_record_details,
    read_records,
    record,
    session_records,
    target_met,
)


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
    [(1.0, ">= 1", True), (0.99, ">= 1", False), (0.5, "<= 1e-6", False),
     (1e-7, "≤ 1e-6", True), (500, 500, True), (499, 500, False), (2.0, "> 1.5", True),
     (1.0, "< 1", False), (3, None, None)],
)  # fmt: skip
def test_target_met(value, target, met):
    assert target_met(value, target) is met


def test_format_record_mentions_target_and_paper():
    line = format_record(Record("a.b", 0.5, "", ">= 1", 2.15))
    assert "NOT met" in line and "paper 2.15" in line


def test_read_records_round_trip(tmp_path):
    path = _notebook_with(
        [{"key": "a.x", "value": 1.0, "unit": "", "target": None, "paper": None},
         {"key": "a.y", "value": 2.5, "unit": "s", "target": ">= 2", "paper": 3.0}],
        tmp_path,
    )  # fmt: skip
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
