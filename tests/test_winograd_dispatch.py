"""Tests of the per-layer fallback to torch, the micro-kernel, packing, torch in the wisdom."""

from __future__ import annotations

import json
import time
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcnb.winograd import WinogradConfig, autotune, conv2d_winograd
from hpcnb.winograd.bench import (
    LoadWarning,
    assembly_summary,
    blas_kernels,
    load_check,
    sgemm_rate,
)
from hpcnb.winograd.codegen import cpu_kernels
from hpcnb.winograd.conv import cached_filters, filter_transform, winograd_numpy
from hpcnb.winograd.dispatch import (
    PathChoice,
    choose_path,
    clear_choices,
    known_choice,
    measure_choice,
    remember_choice,
    wisdom_choice,
)
from hpcnb.winograd.fused import PANEL_ROWS, pack_panels
from hpcnb.winograd.numerics import direct_fp64, relative_error


@pytest.fixture(autouse=True)
def _fresh_choices(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp().parent / "hpcnb_winograd_cache"
    monkeypatch.setenv("HPCNB_CACHE", str(cache))
    clear_choices()
    yield
    clear_choices()


def test_choose_path_rule_and_bad_costs():
    assert choose_path(1.0, 2.0) == "winograd"
    assert choose_path(2.0, 1.0) == "torch"
    assert choose_path(1.0, 1.0) == "torch"  # a tie runs torch
    assert choose_path(1.0, 1.05, margin=1.1) == "torch"
    for bad in (0.0, -1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="winograd_s"):
            choose_path(bad, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="margin"):
        choose_path(1.0, 2.0, margin=0.5)
    with pytest.raises(ValueError, match="path"):
        PathChoice("cuda", WinogradConfig(), 1.0, 1.0, "given")


def test_dispatch_picks_torch_when_told_winograd_costs_more():
    x, w = torch.randn(2, 5, 9, 9), torch.randn(7, 5, 3, 3)
    cfg = WinogradConfig(m=4, points="accurate", threads=1)
    remember_choice(x.shape, w.shape, 1, 1, config=cfg, winograd_s=2e-3, torch_s=1e-3)
    y = conv2d_winograd(x, w, padding=1, config=cfg, fallback=True)
    assert torch.equal(y, F.conv2d(x, w, padding=1))  # torch's own result, bit for bit
    assert known_choice(x.shape, w.shape, 1, 1).path == "torch"
    # told the other way round, the same call runs the Winograd kernel (not bitwise torch's)
    remember_choice(x.shape, w.shape, 1, 1, config=cfg, winograd_s=1e-3, torch_s=2e-3)
    y = conv2d_winograd(x, w, padding=1, config=cfg, fallback=True)
    assert not torch.equal(y, F.conv2d(x, w, padding=1))
    ref = direct_fp64(x.numpy(), w.numpy(), 1)
    assert relative_error(y.numpy(), ref) <= 1e-5


def test_fallback_measures_once_and_is_cpu_only():
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32)
    cfg = WinogradConfig(m=2, threads=1)
    y = conv2d_winograd(x, w, padding=1, config=cfg, fallback=True)
    first = known_choice(x.shape, w.shape, 1, 1)
    assert first is not None and first.source == "measured" and first.config == cfg
    assert first.winograd_s > 0 and first.torch_s > 0
    assert relative_error(y, direct_fp64(x, w, 1)) <= 1e-5
    conv2d_winograd(x, w, padding=1, config=cfg, fallback=True)
    assert known_choice(x.shape, w.shape, 1, 1) is first  # kept, not measured again
    with pytest.raises(ValueError, match="target='cpu'"):
        conv2d_winograd(x, w, padding=1, fallback=True, target="opencl")
    slow = measure_choice(
        x.shape, w.shape, 1, cfg, 1, winograd=lambda: time.sleep(0.003), torch=lambda: None, reps=2
    )
    assert slow.path == "torch" and slow.gain == slow.torch_s / slow.winograd_s < 1
    assert known_choice(x.shape, w.shape, 1, 1) is slow  # the newest measurement is kept


@pytest.mark.parametrize("K,C,L", [(8, 16, 16), (13, 7, 5), (1, 1, 1), (17, 33, 40), (24, 3, 17)])
def test_micro_kernel_equals_np_dot_including_edge_blocks(K, C, L):
    kern = cpu_kernels(2, 3)
    rng = np.random.default_rng(K * 1000 + C * 10 + L)
    A = rng.standard_normal((1, K, C)).astype(np.float32)
    B = rng.standard_normal((C, L)).astype(np.float32)
    Ap = pack_panels(A)
    assert Ap.shape == (1, -(-K // PANEL_ROWS), C, PANEL_ROWS)
    out = np.full((K, L), np.nan, dtype=np.float32)
    acc = np.empty((PANEL_ROWS, L), dtype=np.float32)
    kern.gemm_panels(Ap[0], B, out, acc)
    want = np.dot(A[0].astype(np.float64), B.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with pytest.raises(ValueError, match="pack_panels"):
        pack_panels(A[0])


def test_every_tile_size_and_gemm_within_1e5_on_an_odd_shape():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 11, 13, 10)).astype(np.float32)
    w = rng.standard_normal((9, 11, 3, 3)).astype(np.float32)
    ref = direct_fp64(x, w, 1)
    paths = [WinogradConfig(m=m, points="accurate") for m in (2, 3, 4, 6)]
    paths.append(WinogradConfig(m=4, points="accurate", gemm="numba"))  # the micro-kernel
    for cfg in paths:
        y = winograd_numpy(x, w, 1, cfg)
        assert relative_error(y, ref) <= 1e-5, (cfg, relative_error(y, ref))
    # the stages of the fused kernel can be run alone (timing); a bad mask is refused
    cfg = WinogradConfig(m=4, points="accurate")
    assert winograd_numpy(x, w, 1, cfg, parts=0).shape == ref.shape
    with pytest.raises(ValueError, match="parts"):
        winograd_numpy(x, w, 1, cfg, parts=8)
    U = filter_transform(w, 4, "accurate", dtype=np.float32)
    with pytest.raises(ValueError, match="packed"):
        winograd_numpy(x, w, 1, WinogradConfig(m=4, points="accurate", gemm="numba"), U=U[:, :2])


def test_packed_filters_are_invalidated_by_an_in_place_change():
    x, w = torch.randn(1, 5, 10, 10), torch.randn(11, 5, 3, 3)
    cfg = WinogradConfig(m=4, points="accurate", gemm="numba")
    Up = cached_filters(w, 4, "accurate", packed=True)
    assert Up.shape == (36, 2, 5, PANEL_ROWS)
    assert cached_filters(w, 4, "accurate", packed=True) is Up
    assert cached_filters(w, 4, "accurate") is not Up  # the BLAS layout is another entry
    y1 = conv2d_winograd(x, w, padding=1, config=cfg)
    w.mul_(-3.0)
    assert cached_filters(w, 4, "accurate", packed=True) is not Up
    y2 = conv2d_winograd(x, w, padding=1, config=cfg)
    torch.testing.assert_close(y2, -3 * y1, rtol=1e-5, atol=1e-4)


def test_tuner_times_torch_and_the_wisdom_decides_the_fallback(tmp_path):
    path = tmp_path / "wisdom.json"
    xs, ws = (1, 4, 8, 8), (4, 4, 3, 3)
    res = autotune(xs, ws, 1, knobs={"m": (2, 6)}, reps=1, final_reps=2, path=path, max_error=1e-5)
    assert res.torch_s is not None and res.torch_s > 0
    assert res.torch_gain == pytest.approx(res.torch_s / res.best_s)
    stored = json.loads(path.read_text())
    (entry,) = stored["machines"][next(iter(stored["machines"]))].values()
    assert entry["torch_s"] == res.torch_s
    again = autotune(xs, ws, 1, knobs={"m": (2, 6)}, path=path)
    assert again.from_wisdom and again.torch_s == res.torch_s
    choice = wisdom_choice(xs, ws, 1, 2, path)
    assert choice is not None and choice.source == "wisdom" and choice.config == res.best
    assert choice.path == choose_path(res.best_s, res.torch_s)
    # a budget no configuration but the default meets: every other one is left out
    strict = autotune(
        xs, ws, 1, knobs={"m": (2, 6)}, reps=1, final_reps=1, path=path, reuse=False, max_error=0
    )
    assert strict.best == WinogradConfig(m=4, points="accurate")
    assert {c["m"] for c, _ in strict.rejected} == {2, 6} and all(e > 0 for _, e in strict.rejected)


def test_benchmark_helpers_report_blas_load_and_rate(monkeypatch):
    libs = blas_kernels()
    assert libs and all({"library", "kernel", "threads"} <= set(lib) for lib in libs)
    rate = sgemm_rate(1, size=64, reps=2)
    assert rate.median > 0 and rate.repeats == 2
    monkeypatch.setattr("os.getloadavg", lambda: (99.0, 1.0, 1.0))
    with pytest.warns(LoadWarning, match="99.00"):
        assert load_check("before the test") == 99.0
    monkeypatch.setattr("os.getloadavg", lambda: (0.1, 0.1, 0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_check("now") == 0.1


def test_assembly_summary_counts_vector_registers():
    import llvmlite.binding as llvm

    summary = assembly_summary(2, 3, "default")
    assert set(summary) == {"gemm_panels", "in_vec"}
    assert all(set(v) == {"zmm", "ymm", "fma_zmm"} for v in summary.values())
    if "+avx512f" in llvm.get_host_cpu_features().flatten().split(","):
        assert summary["gemm_panels"]["fma_zmm"] > 0  # the micro-kernel's FMAs are 512-bit
        assert summary["in_vec"]["zmm"] > 0  # the tile loop is vectorised across tiles
