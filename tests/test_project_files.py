"""CITATION.cff, CHANGELOG.md and .pre-commit-config.yaml: they parse and say what is true."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml
from test_notebooks import INTERNAL

from conftest import NOTEBOOKS, REPO


def _citation() -> dict:
    return yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))


def _title_cell(stem: str) -> str:
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text(encoding="utf-8"))
    return " ".join("".join(nb["cells"][0]["source"]).split())


def test_citation_has_the_fields_cff_requires() -> None:
    cff = _citation()
    assert cff["cff-version"] == "1.2.0"
    assert cff["message"].strip() and cff["title"].strip() and cff["authors"]
    assert cff["type"] == "software"
    project = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    license_line = re.search(r'^license = "([^"]+)"', project, flags=re.MULTILINE)
    assert license_line is not None and cff["license"] == license_line.group(1)
    import hpcnb

    assert str(cff["version"]) == hpcnb.__version__
    for ref in cff["references"]:
        assert {"type", "title", "authors"} <= set(ref), ref.get("title")
        for author in ref["authors"]:
            assert "name" in author or {"given-names", "family-names"} <= set(author)


def test_citation_references_are_the_papers_the_notebooks_cite() -> None:
    refs = _citation()["references"]
    stems = sorted(p.stem for p in NOTEBOOKS.glob("0[1-9]_*.ipynb"))
    assert len(refs) == len(stems) == 8
    for stem in stems:
        (ref,) = [r for r in refs if f"notebooks/{stem}.ipynb" in r.get("notes", "")]
        cell = _title_cell(stem)
        title = " ".join(ref["title"].split())
        assert title in cell, f"{stem}: {title!r} is not in the notebook's title cell"
        for author in ref["authors"]:
            if "family-names" in author:
                assert f"{author['given-names']} {author['family-names']}" in cell, stem
        if "year" in ref:
            assert str(ref["year"]) in cell, stem
        if "doi" in ref:
            assert ref["doi"] in cell, stem


def test_changelog_has_an_unreleased_section() -> None:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings[0] == "[Unreleased]"
    assert "### Added" in text
    for path in sorted(NOTEBOOKS.glob("0*.ipynb")):
        assert f"`{path.stem}`" in text, path.stem


@pytest.mark.parametrize(
    "name",
    ["CHANGELOG.md", "CITATION.cff", ".pre-commit-config.yaml", "examples", "docs", "binder"],
)
def test_no_internal_wording_in_project_files(name: str) -> None:
    root = REPO / name
    paths = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    found = [
        f"{p.relative_to(REPO)}: {m.group(0)!r}"
        for p in paths
        for m in INTERNAL.finditer(p.read_text(encoding="utf-8"))
    ]
    assert not found, found


def _hooks() -> list[dict]:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    return config["repos"][0]["hooks"]


def test_pre_commit_hooks_are_local_system_commands() -> None:
    hooks = _hooks()
    assert all(hook["language"] == "system" for hook in hooks)
    entries = {hook["id"]: shlex.split(hook["entry"]) for hook in hooks}
    assert entries["ruff-check"][:2] == [".venv/bin/ruff", "check"]
    assert entries["ruff-format"][:2] == [".venv/bin/ruff", "format"]
    assert entries["hpcnb-strip"] == [".venv/bin/hpcnb", "strip"]
    strip = next(hook for hook in hooks if hook["id"] == "hpcnb-strip")
    assert re.search(strip["files"], "notebooks/00_tour.ipynb")
    assert not re.search(strip["files"], "papermill_runs/x/00_tour.ipynb")


def test_pre_commit_strip_hook_clears_outputs(tmp_path: Path) -> None:
    entry = shlex.split(next(h["entry"] for h in _hooks() if h["id"] == "hpcnb-strip"))
    if not (REPO / entry[0]).is_file():
        pytest.skip(f"{entry[0]} is missing: run make setup")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("1 + 1", metadata={"tags": ["parameters"]})
    cell.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"})]
    cell.execution_count = 3
    nb.cells.append(cell)
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    proc = subprocess.run(
        [str(REPO / entry[0]), *entry[1:], str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "stripped" in proc.stdout
    after = nbformat.read(path, as_version=4).cells[0]
    assert after.outputs == [] and after.execution_count is None
    assert after.metadata["tags"] == ["parameters"]
