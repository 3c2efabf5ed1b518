"""Tests of the point search, the tuner's regret study and the benchmark in SMOKE size."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from hpcnb.winograd import WinogradConfig, lookup_wisdom, prove_equivalence
from hpcnb.winograd.autotune import autotune, regret_study
from hpcnb.winograd.bench import benchmark_layer, check_threads, smoke_layers
from hpcnb.winograd.config import WinogradError
from hpcnb.winograd.points import STANDARD_POINTS, pareto_points, point_search, symmetric_sets
from hpcnb.winograd.transforms import cook_toom


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp().parent / "hpcnb_winograd_cache"
    monkeypatch.setenv("HPCNB_CACHE", str(cache))
    monkeypatch.delenv("HPCNB_WISDOM", raising=False)


def test_symmetric_sets_and_searched_points_give_exact_transforms():
    sets = symmetric_sets(4, 3)
    assert all(len(p) == 5 and len(set(p)) == 5 and p[0] == 0 for p in sets)
    assert len(sets) == 78  # 13 magnitudes, 2 pairs
    with pytest.raises(WinogradError, match="even"):
        symmetric_sets(3, 3)
    rows = point_search(4, 3, measure=3, neighbours=2, shape=(1, 4, 4, 10))
    assert len(rows) == 6 and sum(r["standard"] for r in rows) == 1
    assert all(r["exact"] for r in rows)  # the exact tensor identity holds for every set
    best = min(rows, key=lambda r: r["fp32_error"])
    pts = tuple(Fraction(v) for v in best["points"].split(", "))
    assert prove_equivalence(cook_toom(4, 3, pts), 1)  # and the sympy expansion agrees
    std = next(r for r in rows if r["standard"])
    assert std["points"] == ", ".join(map(str, STANDARD_POINTS[(4, 3)]))
    # searched points beat the common ones in fp32 error on this benchmark (F(4,3))
    assert best["fp32_error"] < std["fp32_error"]
    front = pareto_points(rows)
    assert front[0]["ops"] == min(r["ops"] for r in rows)
    assert all(a["fp32_error"] > b["fp32_error"] for a, b in itertools.pairwise(front))


def test_regret_study_and_wisdom_round_trip(tmp_path):
    path = tmp_path / "wisdom.json"
    xs, ws = (1, 4, 10, 10), (4, 4, 3, 3)
    space = [
        WinogradConfig(m=m, points="accurate", gemm=g) for m in (2, 4) for g in ("blas", "numba")
    ]
    res = regret_study(
        xs, ws, 1, space=space, knobs={"m": (2, 4), "gemm": ("blas", "numba")}, reps=2, path=path
    )
    assert res.regret >= 0 and len(res.round_regrets) == 2
    assert all(r >= 0 for r in res.round_regrets)  # against each round's fastest
    assert res.best in space and res.tune_s > 0 and res.configs >= len(space)
    assert lookup_wisdom(xs, ws, 1, path=path) == res.tuned
    again = autotune(xs, ws, 1, knobs={"m": (2, 4)}, path=path)
    assert again.from_wisdom and again.best == res.tuned


def test_benchmark_smoke_layers_threads_checked_and_accurate():
    for layer in smoke_layers():
        out = benchmark_layer(layer, threads=2, reps=1, direct=False)
        assert out["threads_checked"]["torch"] == out["threads_checked"]["numba"] == 2
        assert out["winograd_rel_error"] <= 1e-5
        assert len(out["round_speedups"]["torch"]) == 1 and out["speedup_vs_torch"] > 0
    with pytest.raises(WinogradError, match="differ"):
        check_threads(99)
