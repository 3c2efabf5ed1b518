"""Sphinx configuration of the hpcnb API reference (``make docs``).

The pages are built from the package's Google-style docstrings by autodoc and napoleon.
Nothing is fetched while building: no intersphinx inventories, the bundled theme.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "hpcnb"
author = "the hpcnb authors"
copyright = "2026, the hpcnb authors"

import hpcnb  # noqa: E402  (after the path is set)

release = hpcnb.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []


def _skip_generated_request_setters(
    app: object, what: str, name: str, obj: object, skip: bool, options: object
) -> bool | None:
    """Leave out scikit-learn's generated ``set_*_request`` methods (not this package's API).

    Returns:
        True for those methods; None lets autodoc decide for everything else.
    """
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app: Sphinx) -> None:
    """Register the member filter with Sphinx."""
    app.connect("autodoc-skip-member", _skip_generated_request_setters)
