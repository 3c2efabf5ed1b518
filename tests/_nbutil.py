"""Build small throw-away notebooks for runner tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat


def chromium() -> str | None:
    """Return the Chromium executable: ``$HPCNB_CHROMIUM``, else ``chromium`` on PATH."""
    named = os.environ.get("HPCNB_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def make_notebook(path: Path, parameters: str, *bodies: str) -> Path:
    """Write a notebook with a parameters cell followed by code cells."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells.append(nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nb.cells.extend(nbformat.v4.new_code_cell(body) for body in bodies)
    nbformat.write(nb, path)
    return path
