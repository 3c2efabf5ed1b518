"""Tests of hpcnb.winograd: exact transforms, op counts, generated kernels, tuning, CUDA sim."""

from __future__ import annotations

import json
from dataclasses import asdict
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcnb.winograd import (
    WinogradConfig,
    WisdomWarning,
    autotune,
    check_tensor_identity,
    conv2d_winograd,
    cook_toom,
    prove_equivalence,
    relative_error,
    transform_programs,
    winograd_reference,
)
from hpcnb.winograd.codegen import cpu_source, cuda_source, input_body
from hpcnb.winograd.config import default_config
from hpcnb.winograd.conv import conv2d_direct, conv2d_im2col
from hpcnb.winograd.cuda import validate_in_simulator
from hpcnb.winograd.numerics import direct_fp64
from hpcnb.winograd.opcount import op_count_row
from hpcnb.winograd.transforms import accurate_points, error_bound
from hpcnb.winograd.wisdom import lookup_wisdom

TABLE_CASES = [(m, 3) for m in range(2, 9)] + [(m, 5) for m in range(2, 7)]
TABLE_CASES += [(m, 7) for m in range(2, 5)]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # generated kernels are shared between tests (one folder), the wisdom file is per test
    cache = tmp_path_factory.getbasetemp().parent / "hpcnb_winograd_cache"
    monkeypatch.setenv("HPCNB_CACHE", str(cache))
    monkeypatch.delenv("HPCNB_WISDOM", raising=False)


def _ref(x, w, pad):
    return F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad).numpy()


@pytest.mark.parametrize(("m", "r"), TABLE_CASES)
def test_every_table_transform_is_exact(m, r):
    for pts in ("default", "accurate"):
        tr = cook_toom(m, r, pts)
        assert check_tensor_identity(tr)
        assert prove_equivalence(tr, dims=1)
        for level in ("naive", "paired", "searched"):
            progs = transform_programs(m, r, pts, level, 20)
            st = progs.transform  # the searched level rescales rows of BT and G
            assert check_tensor_identity(st)
            assert st.AT == tr.AT and (level == "searched" or st == tr)
            assert progs.input.matrix() == [list(row) for row in st.BT]
            assert progs.kernel.matrix() == [list(row) for row in st.G]
            assert progs.output.matrix() == [list(row) for row in st.AT]


def test_nested_2d_symbolic_proof_and_broken_transform_fails():
    assert prove_equivalence(cook_toom(2, 3), dims=2)
    assert prove_equivalence(cook_toom(3, 2), dims=2)
    tr = cook_toom(2, 3)
    bad_g = (tr.G[0], tr.G[1], tuple(v * 2 for v in tr.G[2]), tr.G[3])
    broken = type(tr)(tr.m, tr.r, tr.points, tr.AT, bad_g, tr.BT)
    assert not check_tensor_identity(broken)
    assert not prove_equivalence(broken, dims=1)


def test_point_sets_default_accurate_and_user():
    assert cook_toom(4, 3).points == (0, 1, -1, 2, -2)
    acc = accurate_points(4, 3)
    # Barabasz et al.'s {0, -1, 1, 1/2, -2} or its mirror image (same error)
    assert set(acc) in ({0, -1, 1, Fraction(1, 2), -2}, {0, -1, 1, 2, Fraction(-1, 2)})
    assert error_bound(cook_toom(4, 3, "accurate")) < error_bound(cook_toom(4, 3))
    user = cook_toom(2, 3, [0, Fraction(1, 3), -3])
    assert check_tensor_identity(user)
    assert prove_equivalence(user)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: cook_toom(0, 3), "parameter m"),
        (lambda: cook_toom(2, -1), "parameter r"),
        (lambda: cook_toom(30, 3), "finite points"),
        (lambda: cook_toom(2, 3, [0, 1, 1]), "distinct"),
        (lambda: cook_toom(2, 3, [0, 1]), "expected 3 finite points"),
        (lambda: cook_toom(2, 3, "fastest"), "points='fastest'"),
        (lambda: WinogradConfig(gemm="cublas"), "gemm"),
    ],
)
def test_invalid_parameters_give_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_invalid_shapes_give_clear_errors():
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(ValueError, match="4-D"):
        conv2d_winograd(x[0], np.zeros((2, 3, 3, 3), np.float32))
    with pytest.raises(ValueError, match="channels"):
        conv2d_winograd(x, np.zeros((2, 4, 3, 3), np.float32))
    with pytest.raises(ValueError, match="square"):
        conv2d_winograd(x, np.zeros((2, 3, 3, 2), np.float32))
    with pytest.raises(ValueError, match="smaller than"):
        conv2d_winograd(x, np.zeros((2, 3, 9, 9), np.float32))
    with pytest.raises(ValueError, match="padding"):
        conv2d_winograd(x, np.zeros((2, 3, 3, 3), np.float32), padding=-1)
    with pytest.raises(ValueError, match="parameter m"):
        conv2d_winograd(x, np.zeros((2, 3, 3, 3), np.float32), m=0)


def test_op_counts_reduce_and_f23_is_known():
    f23 = op_count_row(2, 3, search=10)
    # F(2,3) (Lavin): BT 4 adds, AT 4 adds, G 6 ops once constants are factored
    assert (f23["naive_input"], f23["naive_output"]) == (4, 4)
    assert f23["searched_kernel"] <= f23["naive_kernel"]
    f63 = op_count_row(6, 3, search=20)
    for part in ("input", "kernel", "output"):
        assert f63[f"searched_{part}"] < f63[f"naive_{part}"] < f63[f"dense_{part}"]
    assert f63["transform_reduction_vs_naive"] > 0.3
    assert f63["algorithm_reduction_vs_dense"] > 0.5


def test_generated_source_is_straight_line_and_shared_between_targets():
    progs = transform_programs(4, 3)
    cpu, gpu = cpu_source(progs), cuda_source(progs)
    body = input_body(progs, lambda c: f"K{c.numerator}_{c.denominator}")
    for line in body:  # the same expression lines appear in both targets
        assert line in cpu and line in gpu
    tile = cpu.split("def in_tile")[1].split("@numba")[0]
    assert "for " not in tile and "while " not in tile
    assert "@cuda.jit" in gpu and "@numba.njit" in cpu


CONV_CASES = [
    # (N, C, K, H, W, r, padding, config)
    (1, 1, 1, 5, 5, 3, 0, WinogradConfig(m=2)),
    (2, 3, 5, 9, 11, 3, 1, WinogradConfig(m=4)),
    (3, 67, 4, 7, 6, 3, 1, WinogradConfig(m=4, block_tiles=5, channel_major=False)),
    (1, 17, 66, 13, 9, 3, 0, WinogradConfig(m=2, gemm="numba", block_tiles=4)),
    (2, 5, 3, 12, 10, 5, 2, WinogradConfig(m=2)),
    (1, 4, 6, 11, 15, 3, 1, WinogradConfig(m=4, storage="fp32", threads=1)),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_generated_cpu_kernels_match_torch(case):
    N, C, K, H, W, r, pad, cfg = case
    rng = np.random.default_rng(C * 31 + K)
    x = rng.standard_normal((N, C, H, W), dtype=np.float32)
    w = rng.standard_normal((K, C, r, r), dtype=np.float32)
    y = conv2d_winograd(x, w, padding=pad, config=cfg)
    ref = _ref(x, w, pad)
    assert y.shape == ref.shape
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()


def test_random_shapes_and_torch_tensors():
    rng = np.random.default_rng(7)
    for _ in range(4):
        N, C, K = int(rng.integers(1, 4)), int(rng.integers(1, 68)), int(rng.integers(1, 9))
        H, W = int(rng.integers(3, 14)), int(rng.integers(3, 14))
        pad = int(rng.integers(0, 2))
        m = int(rng.choice([2, 4]))
        x = torch.randn(N, C, H, W)
        w = torch.randn(K, C, 3, 3)
        y = conv2d_winograd(x, w, m=m, padding=pad)
        ref = F.conv2d(x, w, padding=pad)
        assert isinstance(y, torch.Tensor) and y.shape == ref.shape
        torch.testing.assert_close(y, ref, rtol=0, atol=2e-5 * float(ref.abs().max()))


def test_baselines_match_torch():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 7), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    ref = _ref(x, w, 1)
    np.testing.assert_allclose(conv2d_direct(x, w, 1), ref, atol=1e-4)
    np.testing.assert_allclose(conv2d_im2col(x, w, 1), ref, atol=1e-4)


def test_numerics_fp32_f43_and_fp16_storage_is_worse():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 8, 12, 12)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 8, 3, 3)).astype(np.float32)
    ref = direct_fp64(x, w, 1)
    e32 = relative_error(winograd_reference(x, w, 4, 1), ref)
    e16 = relative_error(winograd_reference(x, w, 4, 1, storage="fp16"), ref)
    e64 = relative_error(winograd_reference(x, w, 4, 1, dtype=np.float64), ref)
    assert e64 < 1e-12 < e32 <= 1e-5 < e16
    # the NumPy reference and the generated kernel run the same programs
    y = conv2d_winograd(x, w, m=4, padding=1)
    assert relative_error(y, ref) <= 1e-5


def test_wisdom_round_trip(tmp_path):
    path = tmp_path / "wisdom.json"
    xs, ws = (1, 3, 10, 10), (2, 3, 3, 3)
    space = [WinogradConfig(m=2), WinogradConfig(m=4, block_tiles=8, channel_major=False)]
    assert lookup_wisdom(xs, ws, 1, path=path) is None
    res = autotune(xs, ws, 1, space=space, reps=1, path=path)
    assert not res.from_wisdom and res.best in [*space, default_config(3)]
    assert len(res.trials) == 3 and res.gain >= 1.0
    # final measurement: default first, then the sweep's fastest; best is its fastest median
    finals = [WinogradConfig(**c) for c, _ in res.final]
    assert finals[0] == default_config(3) and len(finals) == 3
    assert res.best_s == min(t for _, t in res.final) <= res.default_s == res.final[0][1]
    assert res.best == finals[min(range(3), key=lambda i: res.final[i][1])]
    data = json.loads(path.read_text())
    (entries,) = data["machines"].values()
    assert "N1_C3_H10_W10_K2_r3_p1" in entries
    assert lookup_wisdom(xs, ws, 1, path=path) == res.best
    again = autotune(xs, ws, 1, space=space, reps=1, path=path)
    assert again.from_wisdom and again.best == res.best
    x = np.random.default_rng(0).standard_normal(xs, dtype=np.float32)
    w = np.random.default_rng(1).standard_normal(ws, dtype=np.float32)
    np.testing.assert_allclose(
        conv2d_winograd(x, w, padding=1, config="wisdom", wisdom=str(path)),
        _ref(x, w, 1),
        atol=1e-4,
    )
    path.write_text("{not json")  # a broken wisdom file is ignored with a warning
    with pytest.warns(WisdomWarning, match="not valid JSON"):
        assert lookup_wisdom(xs, ws, 1, path=path) is None


def test_default_is_always_a_candidate_and_never_beaten_by_a_slower_choice(tmp_path):
    from hpcnb.winograd.autotune import search_space
    from hpcnb.winograd.bench import Layer, measure_gain
    from hpcnb.winograd.config import default_config

    for r in (3, 5):
        assert default_config(r) in search_space(r)
        assert default_config(r) in search_space(r, ms=(2,), blocks=(8,), threads=(1,))
    xs, ws = (1, 2, 9, 9), (2, 2, 3, 3)
    path = tmp_path / "w.json"
    res = autotune(xs, ws, 1, knobs={"m": (2, 4)}, reps=1, finalists=2, final_reps=3, path=path)
    assert default_config(3) in [WinogradConfig(**c) for c, _ in res.trials]
    assert res.final[0][0] == asdict(default_config(3))
    assert res.best_s <= res.default_s and res.gain >= 1.0
    assert asdict(res.best) in [c for c, _ in res.final]
    again = autotune(xs, ws, 1, knobs={"m": (2, 4)}, path=path)
    assert again.from_wisdom and again.final == res.final
    with pytest.raises(ValueError, match="finalists"):
        autotune(xs, ws, 1, finalists=0, path=path, reuse=False)
    # identical configurations: the gain is 1.0 by definition, nothing is timed
    layer = Layer(N=1, C=2, H=6)
    same = measure_gain(layer, WinogradConfig(m=4), WinogradConfig(m=4, threads=2), threads=2)
    assert same.gain == 1.0 and np.isnan(same.default_s) and np.isnan(same.tuned_s)


def test_cuda_kernels_in_simulator():
    results = validate_in_simulator(
        ((1, 2, 3, 6, 7, 3, 1, 2), (2, 2, 2, 5, 6, 3, 0, 4), (1, 1, 2, 6, 5, 5, 2, 2)),
        timeout=240,
    )
    assert len(results) == 3
    for res in results:
        assert res["max_rel_error"] <= 1e-5, res


def test_interleaved_rounds_are_kept_for_per_round_ratios():
    # the tuner and the benchmarks time through the shared layer hpcnb.timing
    from hpcnb.timing import interleaved

    calls: list[str] = []
    timings = interleaved([lambda: calls.append("a"), lambda: calls.append("b")], repeats=4)
    assert calls == ["a", "b"] * 5  # one warm-up round, then interleaved rounds
    rounds = [t.samples for t in timings]
    assert len(rounds) == 2 and all(len(r) == 4 and min(r) >= 0 for r in rounds)
    assert len(interleaved([lambda: None], repeats=3)) == 1
    with pytest.raises(ValueError, match="repeats"):
        interleaved([lambda: None], repeats=0)


def test_round_geometric_means():
    from hpcnb.winograd.bench import geometric_mean, round_geometric_means

    per_layer = [(1.0, 2.0, 4.0), (4.0, 2.0, 1.0)]
    assert round_geometric_means(per_layer) == pytest.approx([2.0, 2.0, 2.0])
    assert round_geometric_means([(3.0, 5.0)]) == pytest.approx([3.0, 5.0])
    assert geometric_mean(round_geometric_means(per_layer)) == pytest.approx(2.0)
    for bad in ([], [(1.0, 2.0), (1.0,)], [(1.0, 0.0)], [()]):
        with pytest.raises(ValueError, match="round_geometric_means"):
            round_geometric_means(bad)


def test_gain_and_benchmark_expose_per_round_samples():
    from hpcnb.winograd.bench import Layer, benchmark_layer, measure_gain

    layer = Layer(N=1, C=4, H=8)
    g = measure_gain(layer, WinogradConfig(m=4), WinogradConfig(m=2, threads=1), threads=2, reps=3)
    assert not g.same and len(g.ratios) == 3 and all(r > 0 for r in g.ratios)
    assert g.gain == pytest.approx(g.default_s / g.tuned_s)
    same = measure_gain(layer, WinogradConfig(m=4), WinogradConfig(m=4, threads=2), threads=2)
    assert same.same and same.ratios == (1.0,) * 5 and same.gain == 1.0
    out = benchmark_layer(layer, threads=1, reps=3)
    assert set(out["round_speedups"]) == {"torch", "direct", "im2col", "dispatch"}
    assert out["path"] in ("winograd", "torch") and out["gemm_gflops"] > 0
    assert out["dispatch_speedup_vs_torch"] == pytest.approx(out["torch_s"] / out["dispatch_s"])
    for key, ratios in out["round_speedups"].items():
        assert len(ratios) == 3 and all(r > 0 for r in ratios), key
    assert out["winograd_rel_error"] < 1e-4
    assert out["winograd_s"] == pytest.approx(float(np.median(out["round_times"]["winograd"])))
