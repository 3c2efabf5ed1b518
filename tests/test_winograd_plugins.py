"""A Winograd target from outside the package: one module, named by reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcnb.plugins import PluginError
from hpcnb.winograd import WinogradConfig, conv2d_winograd
from hpcnb.winograd.backend import TARGETS, backend_names, get_backend

MODULE = "_toy_winograd_target"
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def toy(monkeypatch):
    """A fresh import of the toy target (tests/ on sys.path), unregistered afterwards."""
    monkeypatch.syspath_prepend(str(TESTS))
    sys.modules.pop(MODULE, None)
    TARGETS.unregister("toy_numpy")
    yield
    TARGETS.unregister("toy_numpy")
    sys.modules.pop(MODULE, None)


def test_the_toy_target_runs_by_reference_against_torch(toy):
    assert "toy_numpy" not in backend_names()
    rng = np.random.default_rng(3)
    for N, C, K, H, W, pad, m in [(1, 3, 4, 7, 9, 1, 2), (2, 5, 3, 10, 8, 0, 4)]:
        x = torch.from_numpy(rng.standard_normal((N, C, H, W), dtype=np.float32))
        w = torch.from_numpy(rng.standard_normal((K, C, 3, 3), dtype=np.float32))
        y = conv2d_winograd(x, w, pad, target=f"{MODULE}:BACKEND", m=m)
        assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
        torch.testing.assert_close(y, F.conv2d(x, w, padding=pad), rtol=0, atol=1e-4)
    assert "toy_numpy" in backend_names()  # the module registered it when imported
    y = conv2d_winograd(x.numpy(), w.numpy(), 1, WinogradConfig(m=3), target="toy_numpy")
    torch.testing.assert_close(torch.from_numpy(y), F.conv2d(x, w, padding=1), rtol=0, atol=1e-4)


def test_a_module_that_registers_one_target_is_named_without_its_attribute(toy):
    backend = get_backend(f"{MODULE}:")
    assert backend.name == "toy_numpy" and backend is sys.modules[MODULE].BACKEND
    with pytest.raises(PluginError, match="expected a named"):
        get_backend(f"{MODULE}:NAME")  # a text, not a Backend
    with pytest.raises(PluginError, match="no attribute"):
        get_backend(f"{MODULE}:MISSING")


def test_the_portability_loop_includes_the_toy_target(toy):
    from hpcnb.winograd.portability import portability_table, source_excerpts

    get_backend(f"{MODULE}:BACKEND")
    table = portability_table(
        2, 3, (1, 2, 3, 6), threads=1, reps=2, options={"cuda": {"archs": ()}}
    )
    (row,) = table[table["name"] == "toy_numpy"].to_dict("records")
    assert row["target"] == "NumPy reference" and row["time_kind"] == "measured"
    assert row["compiled"] and row["max_rel_error"] <= 1e-5
    assert (
        "toy_numpy" in table.attrs["measured"]
        and len(table.attrs["round_ratios"]["toy_numpy"]) == 2
    )
    ex = source_excerpts(2, 3, k=2, options={"cuda": {"archs": ()}})
    assert ex["NumPy reference"].splitlines() == ex["Numba CPU"].splitlines()
    (choice,) = get_backend("toy_numpy").tile_choices((1, 2, 2, 6), ms=(2, 4), reps=1)
    assert choice.measured and choice.target == "NumPy reference" and choice.best_m in (2, 4)
