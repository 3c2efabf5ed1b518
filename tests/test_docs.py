"""The API reference builds from the docstrings (Sphinx, autodoc + napoleon) without a network."""

from __future__ import annotations

import importlib.util
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

DOCS = REPO / "docs"


def test_docs_configuration_fetches_nothing() -> None:
    conf = runpy.run_path(str(DOCS / "conf.py"))
    assert {"sphinx.ext.autodoc", "sphinx.ext.napoleon"} <= set(conf["extensions"])
    assert not any("intersphinx" in ext for ext in conf["extensions"])
    assert conf["napoleon_google_docstring"] is True
    for source in DOCS.glob("*"):
        if source.is_file():
            assert not re.search(r"https?://", source.read_text(encoding="utf-8")), source.name


@pytest.mark.slow
def test_docs_build_lists_the_public_api(tmp_path: Path) -> None:
    if importlib.util.find_spec("sphinx") is None:
        pytest.skip("sphinx is not installed: pip install -c requirements.lock -e '.[docs]'")
    out = tmp_path / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "autodoc: failed to import" not in proc.stderr, proc.stderr[-3000:]
    techniques = (out / "techniques.html").read_text(encoding="utf-8")
    for name in (
        "hpcnb.batchsim.simulate",
        "hpcnb.batchsim.make_scheduler",
        "hpcnb.perfmodel.ConvMeter",
        "hpcnb.perfmodel.predict_latency",
        "hpcnb.ir.trace",
        "hpcnb.models.ModelSpec",
    ):
        assert f'id="{name}"' in techniques, name
    # napoleon turned the Google sections into field lists.
    for section in ("Parameters", "Returns", "Raises"):
        assert re.search(rf'<dt class="field-(odd|even)">{section}', techniques), section
    assert "set_fit_request" not in techniques
    core = (out / "core.html").read_text(encoding="utf-8")
    for name in ("hpcnb.records.record", "hpcnb.claims.claim", "hpcnb.errors.HpcnbError"):
        assert f'id="{name}"' in core, name
