"""Shared pytest configuration: the real-data folder and repository paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
_SHARED_DATA = REPO.parent / "shared" / "data"

# A plug-in module registers a Winograd target when imported; doctest collection
# (--doctest-modules) would import it for every test of the worker, so only its own
# tests import it, and put it back afterwards.
collect_ignore = ["_toy_winograd_target.py"]

# Tests find real traces through HPCNB_DATA; point it at ../shared/data when present.
if "HPCNB_DATA" not in os.environ and _SHARED_DATA.is_dir():
    os.environ["HPCNB_DATA"] = str(_SHARED_DATA)


@pytest.fixture
def shared_data() -> Path:
    """Return the real-data folder, skipping the test when it is absent."""
    value = os.environ.get("HPCNB_DATA")
    if not value or not Path(value).is_dir():
        pytest.skip("real data absent: set HPCNB_DATA to a folder like ../shared/data")
    return Path(value)
