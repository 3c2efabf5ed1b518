"""Tests of the fused CPU path of hpcnb.winograd: every path against float64, fused == unfused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcnb.winograd import WinogradConfig, conv2d_winograd
from hpcnb.winograd.conv import cached_filters, winograd_numpy
from hpcnb.winograd.fused import fused_plan, l2_bytes
from hpcnb.winograd.numerics import direct_fp64, relative_error

# (N, C, K, H, W, r, padding): padding, tiles that do not divide the image, r = 5, 1 channel
ODD_SHAPES = [
    (2, 3, 5, 9, 11, 3, 1),
    (1, 7, 4, 13, 6, 5, 2),
    (3, 16, 8, 7, 7, 3, 0),
    (1, 1, 3, 5, 9, 3, 2),
]
PATHS = [
    WinogradConfig(m=2),
    WinogradConfig(m=4, points="accurate"),
    WinogradConfig(m=4, points="accurate", schedule="stages"),
    WinogradConfig(m=4, points="accurate", schedule="tiles", block_tiles=3),
    WinogradConfig(m=4, points="accurate", gemm="numba"),
    WinogradConfig(m=4, points="accurate", fused=False),
    WinogradConfig(m=2, gemm="numba", fused=False),
]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp().parent / "hpcnb_winograd_cache"
    monkeypatch.setenv("HPCNB_CACHE", str(cache))


def _data(shape, seed=0):
    N, C, K, H, W, r, pad = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((K, C, r, r)).astype(np.float32)
    return x, w, pad


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_path_within_1e5_of_float64_and_fused_equals_unfused(shape):
    x, w, pad = _data(shape)
    ref = direct_fp64(x, w, pad)
    r = w.shape[2]
    outs = {}
    for cfg in PATHS:
        if r == 5 and cfg.m == 4 and cfg.points == "accurate":
            cfg = WinogradConfig(**{**cfg.__dict__, "m": 2})  # F(2,5): n = 6 as F(4,3)
        y = winograd_numpy(x, w, pad, cfg)
        assert y.shape == ref.shape and y.dtype == np.float32
        assert relative_error(y, ref) <= 1e-5, (cfg, relative_error(y, ref))
        outs[cfg] = y
    # the fused and the unfused path compute the same thing (up to the GEMMs' summation
    # order): far closer to each other than to the float64 result's error budget
    for m, pts in ((2, "default"), (4 if r == 3 else 2, "accurate")):
        fused = winograd_numpy(x, w, pad, WinogradConfig(m=m, points=pts))
        unfused = winograd_numpy(x, w, pad, WinogradConfig(m=m, points=pts, fused=False))
        assert relative_error(fused, unfused.astype(np.float64)) <= 2e-6


def test_fused_plan_blocks_and_schedule():
    cfg = WinogradConfig()
    block, sched = fused_plan(P=1568, C=64, K=64, n=6, threads=2, config=cfg)
    assert 32 <= block <= 784 and block % 16 == 0 and sched == "tiles"
    # one block's V and M fill at most half the L2 (or the 32-tile floor)
    assert 36 * 128 * block * 4 <= max(l2_bytes() // 2, 36 * 128 * 32 * 4)
    big = fused_plan(P=4096, C=512, K=512, n=6, threads=2, config=cfg)
    assert big == (32, "tiles")  # wide layers: the floor, not a block that fits L2
    # few tiles per thread: one block of all tiles (at most 256), each stage parallel
    assert fused_plan(P=4, C=512, K=512, n=6, threads=2, config=cfg) == (4, "stages")
    assert fused_plan(P=1, C=512, K=512, n=6, threads=2, config=cfg) == (1, "stages")
    assert fused_plan(P=254, C=8, K=8, n=6, threads=2, config=cfg) == (254, "stages")
    assert fused_plan(P=256, C=8, K=8, n=6, threads=2, config=cfg)[1] == "tiles"
    assert fused_plan(P=300, C=8, K=8, n=6, threads=1, config=cfg)[1] == "tiles"
    assert fused_plan(40, 8, 8, 6, 2, WinogradConfig(schedule="stages")) == (40, "stages")
    assert fused_plan(100, 8, 8, 6, 2, WinogradConfig(block_tiles=7)) == (7, "stages")
    assert fused_plan(400, 8, 8, 6, 2, WinogradConfig(block_tiles=7)) == (7, "tiles")
    assert fused_plan(100, 8, 8, 6, 2, WinogradConfig(schedule="tiles"))[1] == "tiles"
    with pytest.raises(ValueError, match="schedule"):
        WinogradConfig(schedule="fast")


def test_filter_transform_cached_per_weight_and_invalidated_by_changes():
    x = torch.randn(1, 4, 9, 9)
    w = torch.randn(6, 4, 3, 3)
    U1 = cached_filters(w, 4, "accurate")
    assert cached_filters(w, 4, "accurate") is U1  # same tensor, unchanged: reused
    y1 = conv2d_winograd(x, w, padding=1)
    w.mul_(2.0)  # in place: the version counter moves, the cache must not be used
    assert cached_filters(w, 4, "accurate") is not U1
    y2 = conv2d_winograd(x, w, padding=1)
    torch.testing.assert_close(y2, 2 * y1, rtol=1e-5, atol=1e-5)
    wn = w.numpy().copy()
    assert cached_filters(wn, 4) is None  # a writable array may change: never cached
    wn.flags.writeable = False
    assert cached_filters(wn, 4) is cached_filters(wn, 4)
