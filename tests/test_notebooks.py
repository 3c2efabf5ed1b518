"""Notebook hygiene and regression: every notebook runs in SMOKE mode through the runner."""

import json
import math
import os
import re

import pytest

from conftest import NOTEBOOKS
from hpcnb.claims import (
    BY_CONSTRUCTION,
    NOT_TESTED_SMOKE,
    NOT_TESTED_SYNTHETIC,
    REPRODUCED,
    SIMULATED_ONLY,
    SUCCESS,
    audit_claims,
    paper_claims_judged_on_own_targets,
    read_claims,
)
from hpcnb.parameters import notebook_parameters, parameters_cell
from hpcnb.records import read_record_details, target_met
from hpcnb.runner import execute_notebook
from notebook_expectations import EXPECTATIONS

PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
IDS = [p.stem for p in PATHS]
SMOKE_TIMEOUT = float(os.environ.get("HPCNB_SMOKE_TIMEOUT", "300"))
_ABSOLUTE = re.compile(r"(?<![\w.])(/(home|root|work|tmp|Users|usr|opt)/|[A-Z]:\\\\)")
ROOT = NOTEBOOKS.parent
#: Words of the project's own process that user-facing text must not use.
INTERNAL = re.compile(
    r"\b(issues?|closing notes?|earlier versions?|previous versions?|last session|"
    r"this session|the ticket)\b",
    re.IGNORECASE,
)


def test_there_are_notebooks():
    assert PATHS and PATHS[0].stem == "00_tour"


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_hygiene(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert re.fullmatch(r"\d\d_[a-z0-9_]+", path.stem), "name must be NN_short_name"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    parameters_cell(nb, path)  # exactly one parameters cell
    names = {p.name for p in notebook_parameters(path)}
    assert {"SMOKE", "SEED"} <= names
    for p in notebook_parameters(path):
        assert p.comment, f"parameter {p.name} has no comment"
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"cell {index} has stored outputs"
            assert cell.get("execution_count") is None, f"cell {index} has an execution count"
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        assert not _ABSOLUTE.search(text), f"cell {index} holds an absolute path"
    assert path.stem in EXPECTATIONS, f"add an entry for {path.stem} to notebook_expectations.py"
    _check_scope_and_summary(nb)


def _check_scope_and_summary(nb):
    """A scope statement right after the title, a reproducibility summary after the claims."""
    texts = [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"]
    ]
    assert "Scope of this reproduction" in texts[1], "cell 1 must state the scope"
    table = max(i for i, t in enumerate(texts) if "claims_table()" in t)
    assert any("reproducibility_summary(" in t for t in texts[table:]), (
        "a reproducibility_summary(...) must follow the claims table"
    )


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_papermill_sees_every_parameter(path):
    """papermill's own parser (``papermill --help-notebook``) finds what ``hpcnb list`` finds.

    Choice parameters (``Literal[...]``) are the exception: papermill's line pattern drops
    them, and only ``hpcnb list`` shows them.
    """
    import papermill

    from hpcnb.parameters import choices

    seen = set(papermill.inspect_notebook(str(path)))
    params = notebook_parameters(path)
    assert seen == {p.name for p in params if choices(p) is None}


@pytest.mark.notebook
@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_smoke_run(path, tmp_path):
    result = execute_notebook(
        path, tmp_path / path.name, {"SMOKE": True}, timeout=SMOKE_TIMEOUT, progress=False
    )
    assert result.ok, f"{path.stem}: {result.status} (cell {result.cell}): {result.error}"
    for key, value in result.records.items():
        assert math.isfinite(value), f"{key} = {value}"
    expectation = EXPECTATIONS[path.stem]
    missing = set(expectation.required) - set(result.records)
    assert not missing, f"records missing: {sorted(missing)}"
    for key, target in expectation.smoke.items():
        assert key in result.records, f"{key} not recorded"
        assert target_met(result.records[key], target), f"{key} = {result.records[key]} !{target}"
    _check_claims(result.output, smoke=True)


def _check_claims(output, *, readings=False, smoke=False):
    """Every claims row names records that exist and carries the verdict they imply.

    Paper claims rest on paper-figure targets only, no record with fewer than 3
    observations carries an interval, and (with ``readings``) every paper claim that is not
    a success carries its reading. A smoke run's rows say so and its paper claims are not
    tested (smoke inputs) unless set by construction, synthetic or simulated; a full run's
    paper claims are never "not tested (smoke inputs)".
    """
    records = {rec.key: rec for rec in read_record_details(output)}
    rows = read_claims(output)
    assert rows, "the notebook shows no claims table (claim(...) + claims_table())"
    assert audit_claims(rows, records) == []
    assert paper_claims_judged_on_own_targets(rows) == 0
    untested = {NOT_TESTED_SMOKE, BY_CONSTRUCTION, NOT_TESTED_SYNTHETIC, SIMULATED_ONLY}
    for row in rows:
        assert row.get("smoke") is smoke, f"{row['claim']!r}: smoke={row.get('smoke')!r}"
        if smoke and row["kind"] == "paper":
            assert row["verdict"] in untested, f"{row['claim']!r} is {row['verdict']} on smoke"
        if not smoke:
            assert row["verdict"] != NOT_TESTED_SMOKE, f"{row['claim']!r} in a full run"
        sources = {records[key].source for key in row["records"]}
        if row["verdict"] == REPRODUCED:
            assert sources <= {"real", "generated"}, f"{row['claim']!r} reproduced on {sources}"
        if readings and row["kind"] == "paper" and row["verdict"] not in SUCCESS:
            assert row.get("explanation"), f"{row['claim']!r} is {row['verdict']} with no reading"


def _user_texts():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for index, cell in enumerate(nb["cells"]):
            src = cell["source"]
            yield f"{path.name} cell {index}", "".join(src) if isinstance(src, list) else src
    for name in ("README.md", "ARCHITECTURE.md"):
        if (ROOT / name).is_file():
            yield name, (ROOT / name).read_text(encoding="utf-8")
    for path in sorted((ROOT / "hpcnb").rglob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")


def test_no_internal_wording_in_user_facing_text():
    """Notebooks, README and the package speak to users, not about the project's process."""
    found = [
        f"{where}: {m.group(0)!r}" for where, text in _user_texts() for m in INTERNAL.finditer(text)
    ]
    assert not found, "internal wording in user-facing text:\n" + "\n".join(found)


@pytest.mark.skipif(os.environ.get("HPCNB_FULL") != "1", reason="full runs only with HPCNB_FULL=1")
@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_full_run(path, tmp_path):
    result = execute_notebook(path, tmp_path / path.name, {}, timeout=900, progress=False)
    assert result.ok, f"{path.stem}: {result.status} (cell {result.cell}): {result.error}"
    for key, target in EXPECTATIONS[path.stem].full.items():
        assert target_met(result.records[key], target), f"{key} = {result.records[key]} !{target}"
    _check_claims(result.output, readings=True)
