"""Timing Winograd convolution against PyTorch, a direct Numba kernel and im2col + GEMM.

All four run in one process with the same fixed thread count (torch, Numba and BLAS),
on the same random float32 data; each time is the median of ``reps`` calls after one
warm-up call. Layers are the 3×3 convolutions of ResNet/VGG stages (``C = K``, padding 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hpcnb.winograd.autotune import time_call, time_interleaved
from hpcnb.winograd.conv import (
    WinogradConfig,
    conv2d_direct,
    conv2d_im2col,
    default_config,
    filter_transform,
    thread_limit,
    winograd_numpy,
)

__all__ = [
    "RESNET_LAYERS",
    "Layer",
    "benchmark_layer",
    "geometric_mean",
    "layer_set",
    "time_configs",
    "tuned_gain",
]

# (channels, image side) of the ResNet/VGG 3x3 stages
RESNET_LAYERS: tuple[tuple[int, int], ...] = ((64, 56), (128, 28), (256, 14), (512, 7))


@dataclass(frozen=True)
class Layer:
    """A 3×3 stride-1 padding-1 convolution layer with ``C = K`` channels.

    Attributes:
        N: Batch size.
        C: Input (= output) channels.
        H: Image side.
        r: Filter size.
    """

    N: int
    C: int
    H: int
    r: int = 3

    @property
    def name(self) -> str:
        """Readable name, e.g. ``C64_H56_N1``."""
        return f"C{self.C}_H{self.H}_N{self.N}"

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        """Input shape."""
        return (self.N, self.C, self.H, self.H)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        """Filter shape."""
        return (self.C, self.C, self.r, self.r)

    @property
    def flops(self) -> float:
        """Direct-convolution flops (2 per multiply-add)."""
        return 2.0 * self.N * self.C * self.C * self.r * self.r * self.H * self.H


def layer_set(batches: tuple[int, ...] = (1, 8), scale: int = 1) -> list[Layer]:
    """The ResNet/VGG layer set, optionally with channels and sides divided by ``scale``."""
    return [
        Layer(N=b, C=max(c // scale, 1), H=max(h // scale, 4))
        for c, h in RESNET_LAYERS
        for b in batches
    ]


def geometric_mean(values) -> float:
    """Geometric mean of positive numbers."""
    v = np.asarray(list(values), dtype=np.float64)
    return float(np.exp(np.log(v).mean()))


def benchmark_layer(
    layer: Layer,
    *,
    threads: int,
    config: WinogradConfig | None = None,
    reps: int = 3,
    seed: int = 0,
    direct: bool = True,
    im2col: bool = True,
) -> dict:
    """Median times of the four convolutions of one layer, with equal thread counts.

    All methods are timed in interleaved rounds (one call each per round) after a
    warm-up, so that changes of machine load affect them alike.

    Args:
        layer: The layer.
        threads: Largest thread count. The Winograd configuration's own count (the tuner
            may have chosen fewer) is then given to torch, Numba and BLAS alike, so every
            method runs with the same number of threads.
        config: Winograd configuration (default: :func:`default_config`).
        reps: Timed repetitions (median).
        seed: Seed of the data.
        direct: Also time the direct Numba kernel.
        im2col: Also time im2col + GEMM.

    Returns:
        Dict with ``layer``, ``<method>_s`` medians (``winograd_s`` with the filters
        transformed once beforehand, as for inference with fixed weights, and
        ``winograd_with_filter_transform_s`` including it), ``winograd_rel_error`` vs torch and the
        ratios ``speedup_vs_torch``, ``speedup_vs_direct``, ``speedup_vs_im2col``.
    """
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(layer.x_shape, dtype=np.float32)
    w = rng.standard_normal(layer.w_shape, dtype=np.float32)
    pad = (layer.r - 1) // 2
    cfg = config or default_config(layer.r)
    if cfg.threads == 0 or cfg.threads > threads:
        cfg = replace(cfg, threads=threads)
    threads = cfg.threads  # every method runs with the same count as the Winograd configuration
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    U = filter_transform(w, cfg.m, cfg.points, dtype=np.float32)

    def run_torch() -> None:
        with torch.no_grad():
            F.conv2d(xt, wt, padding=pad)

    methods = {
        "torch": run_torch,
        "winograd": lambda: winograd_numpy(x, w, pad, cfg, U=U),
        "winograd_with_filter_transform": lambda: winograd_numpy(x, w, pad, cfg),
    }
    if im2col:
        methods["im2col"] = lambda: conv2d_im2col(x, w, pad)
    if direct:
        methods["direct"] = lambda: conv2d_direct(x, w, pad)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    times: dict[str, list[float]] = {k: [] for k in methods}
    try:
        with torch.no_grad():
            ref = F.conv2d(xt, wt, padding=pad).numpy()
        y = winograd_numpy(x, w, pad, cfg, U=U)
        with thread_limit(threads):
            for fn in methods.values():  # warm-up (and compile)
                fn()
            # interleaved rounds: a change of machine load hits every method alike
            for rnd in range(reps):
                for name, fn in methods.items():
                    if name == "direct" and rnd >= max(1, reps // 2):
                        continue  # the slow baseline gets fewer rounds
                    times[name].append(time_call(fn, reps=1, warmup=0))
    finally:
        torch.set_num_threads(old)
    med = {k: float(np.median(v)) for k, v in times.items()}
    t_wino = med["winograd"]
    out = {
        "layer": layer.name,
        "N": layer.N,
        "C": layer.C,
        "H": layer.H,
        "m": cfg.m,
        "threads": cfg.threads,
        "winograd_rel_error": float(np.abs(y - ref).max() / np.abs(ref).max()),
        "winograd_gflops_equiv": layer.flops / t_wino / 1e9,
    }
    out.update({f"{k}_s": v for k, v in med.items()})
    out["speedup_vs_torch"] = med["torch"] / t_wino
    for k in ("direct", "im2col"):
        if k in med:
            out[f"speedup_vs_{k}"] = med[k] / t_wino
    return out


def time_configs(
    layer: Layer, configs: list[WinogradConfig], *, threads: int, reps: int = 3, seed: int = 0
) -> list[float]:
    """Median times of several Winograd configurations on one layer, measured together.

    Used to compare a tuned configuration with the default one in a fresh measurement
    (the tuner's sweep times are single noisy measurements, biased towards the winner).
    Configurations are timed in interleaved rounds so that load changes hit all alike.

    Args:
        layer: The layer.
        configs: Configurations (``threads == 0`` means ``threads``).
        threads: Maximum thread count.
        reps: Rounds (median).
        seed: Seed of the data.

    Returns:
        Median seconds per configuration, in order.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(layer.x_shape, dtype=np.float32)
    w = rng.standard_normal(layer.w_shape, dtype=np.float32)
    pad = (layer.r - 1) // 2
    cfgs = [_effective(c, threads) for c in configs]
    filters = [filter_transform(w, c.m, c.points, dtype=np.float32) for c in cfgs]
    fns = [
        lambda c=c, U=U: winograd_numpy(x, w, pad, c, U=U)
        for c, U in zip(cfgs, filters, strict=True)
    ]
    return time_interleaved(fns, reps=reps, warmup=1)  # one warm-up round (and compile)


def _effective(config: WinogradConfig, threads: int) -> WinogradConfig:
    """The configuration as run with at most ``threads`` threads (0 means ``threads``)."""
    return config if 0 < config.threads <= threads else replace(config, threads=threads)


def tuned_gain(
    layer: Layer,
    default: WinogradConfig,
    tuned: WinogradConfig,
    *,
    threads: int,
    reps: int = 5,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Measure tuned against default configuration on one layer, after tuning.

    Both are timed in interleaved rounds after a warm-up round (:func:`time_configs`),
    independently of the tuner's own measurements. When the tuner kept the default
    (the same configuration once thread counts are resolved) nothing is timed and the
    gain is exactly 1.0: timing one configuration twice would only measure noise.

    Args:
        layer: The layer.
        default: The untuned configuration.
        tuned: The tuner's choice.
        threads: Maximum thread count.
        reps: Interleaved rounds (median).
        seed: Seed of the data.

    Returns:
        ``(default seconds, tuned seconds, default / tuned)``; the times are NaN when the
        configurations are the same.
    """
    if _effective(default, threads) == _effective(tuned, threads):
        return float("nan"), float("nan"), 1.0
    t_def, t_tuned = time_configs(layer, [default, tuned], threads=threads, reps=reps, seed=seed)
    return t_def, t_tuned, t_def / t_tuned
