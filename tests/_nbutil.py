"""Build small throw-away notebooks for runner tests."""

from __future__ import annotations

from pathlib import Path

import nbformat


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
