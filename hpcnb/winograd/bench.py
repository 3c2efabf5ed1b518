"""Timing Winograd convolution against PyTorch, a direct Numba kernel and im2col + GEMM.

All run in one process with the same fixed thread count (torch, Numba and BLAS),
on the same random float32 data, in interleaved rounds after one warm-up round; each
time is the median of the rounds, and every round is kept so that speed-ups can be
recorded as per-round ratios with an interval (:func:`round_geometric_means` combines
them over layers). Each sample is the mean of two calls after an untimed one, so that a
method does not pay for the previous method's threads still spinning on the cores
(:func:`hpcnb.timing.interleaved`). Two Winograd timings are kept apart: the kernel alone
(``winograd``) and the dispatching convolution (``dispatch``:
``conv2d_winograd(..., fallback=True)``, which runs torch where that is faster, see
:mod:`~hpcnb.winograd.dispatch`); ``winograd_gemm`` times the kernel's ``n²`` GEMMs
alone. :func:`sgemm_rate` measures the reference rate of a large sgemm,
:func:`blas_kernels` names the BLAS kernels that ran and :func:`load_check` records the
load average (warning when it exceeds the core count). Layers are the 3×3 stride-1
convolutions of ResNet-18/34 (``C = K``, padding 1; :data:`RESNET_LAYERS`, with how
often each shape occurs in :data:`RESNET_COUNTS`). Thread counts are pinned for the whole
measurement and checked inside it (:func:`thread_counts`): a benchmark whose pools do not
hold the asked count raises instead of reporting.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hpcnb.timing import Timing, interleaved, pinned_threads, ratios
from hpcnb.winograd.config import WinogradConfig, WinogradError, default_config
from hpcnb.winograd.conv import (
    conv2d_direct,
    conv2d_im2col,
    filter_transform,
    winograd_numpy,
)
from hpcnb.winograd.dispatch import PathChoice, known_choice, remember_choice
from hpcnb.winograd.fused import fused_plan, pack_panels

__all__ = [
    "RESNET_COUNTS",
    "RESNET_LAYERS",
    "GainMeasurement",
    "Layer",
    "LoadWarning",
    "assembly_summary",
    "benchmark_layer",
    "blas_kernels",
    "check_threads",
    "geometric_mean",
    "layer_set",
    "load_check",
    "measure_gain",
    "round_geometric_means",
    "sgemm_rate",
    "smoke_layers",
    "thread_counts",
    "time_configs",
]

# (channels, image side) of the ResNet-18/34 3x3 stride-1 convolutions (every stage's
# first block opens with a stride-2 convolution, which is not among them)
RESNET_LAYERS: tuple[tuple[int, int], ...] = ((64, 56), (128, 28), (256, 14), (512, 7))
RESNET_COUNTS: dict[str, tuple[int, ...]] = {"resnet18": (4, 3, 3, 3), "resnet34": (6, 7, 11, 5)}
"""How many 3x3 stride-1 convolutions of each shape of :data:`RESNET_LAYERS` each net has."""


def thread_counts() -> dict[str, int]:
    """Thread counts in force now: torch's intra-op pool, Numba's and each BLAS pool."""
    import numba
    import torch
    from threadpoolctl import threadpool_info

    out = {"torch": torch.get_num_threads(), "numba": numba.get_num_threads()}
    for i, info in enumerate(threadpool_info()):
        if info.get("user_api") == "blas":
            out[f"blas{i}"] = int(info["num_threads"])
    return out


class LoadWarning(UserWarning):
    """The machine was busier than its core count while timings were taken."""


def load_check(when: str) -> float:
    """The 1-minute load average now; a :class:`LoadWarning` when it exceeds the core count.

    Args:
        when: Named in the warning (``"before the benchmark"``).

    Returns:
        The load average (``nan`` where the OS does not report it).
    """
    from hpcnb.perfmodel.protocol import load_average

    load = load_average()[0]
    cores = os.cpu_count() or 1
    if load > cores:
        warnings.warn(
            f"load average {load:.2f} {when} exceeds the {cores} cores: other work competes "
            "for the cores, so the timings are not evidence of speed",
            LoadWarning,
            stacklevel=2,
        )
    return load


def blas_kernels() -> list[dict[str, object]]:
    """The BLAS libraries loaded now: library, version, kernel type and thread count.

    The kernel type (threadpoolctl's ``architecture``, e.g. ``SkylakeX`` or ``Haswell``
    for OpenBLAS) says which instruction set the GEMMs ran with; ``OPENBLAS_CORETYPE``
    forces it.
    """
    import scipy.linalg.cython_blas  # noqa: F401  (the BLAS behind Numba's np.dot)
    from threadpoolctl import threadpool_info

    return [
        {
            "library": i.get("internal_api"),
            "version": i.get("version"),
            "kernel": i.get("architecture"),
            "threads": i.get("num_threads"),
            "prefix": i.get("prefix"),
        }
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]


def sgemm_rate(threads: int, size: int = 2048, reps: int = 5, seed: int = 0) -> Timing:
    """GFLOP/s of a large float32 matrix product (NumPy's BLAS, ``threads`` threads).

    The reference "peak" the Winograd GEMMs are compared with. Each sample is one
    ``size x size`` product after a warm-up call.

    Args:
        threads: BLAS threads.
        size: Matrix side.
        reps: Timed products.
        seed: Seed of the data.

    Returns:
        A :class:`~hpcnb.timing.Timing` whose samples are GFLOP/s (median: the rate).
    """
    a = np.random.default_rng(seed).standard_normal((size, size), dtype=np.float32)
    with pinned_threads(threads):
        t = interleaved([lambda: a @ a], repeats=reps, warmup=1)[0]
    return Timing.of([2.0 * size**3 / s / 1e9 for s in t.samples])


def check_threads(threads: int) -> dict[str, int]:
    """Return :func:`thread_counts`, raising when torch or Numba does not run ``threads``.

    Raises:
        WinogradError: A pool holds another count (the timing would not be equal).
    """
    counts = thread_counts()
    bad = {k: v for k, v in counts.items() if k in ("torch", "numba") and v != threads}
    if bad:
        raise WinogradError(f"benchmark: thread pools {bad} differ from the pinned {threads}")
    return counts


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
    """The ResNet/VGG layer set, optionally with channels and sides divided by ``scale``.

    Args:
        batches: Batch sizes; every shape of :data:`RESNET_LAYERS` at each of them.
        scale: Divisor of the channels (at least 1 left) and image sides (at least 4).
    """
    return [
        Layer(N=b, C=max(c // scale, 1), H=max(h // scale, 4))
        for c, h in RESNET_LAYERS
        for b in batches
    ]


def smoke_layers() -> list[Layer]:
    """Two small layers for SMOKE runs (seconds, not minutes)."""
    return [Layer(N=1, C=16, H=14), Layer(N=2, C=32, H=7)]


def geometric_mean(values: Iterable[float]) -> float:
    """Geometric mean of positive numbers."""
    v = np.asarray(list(values), dtype=np.float64)
    return float(np.exp(np.log(v).mean()))


def round_geometric_means(per_layer: Sequence[Sequence[float]]) -> list[float]:
    """Per-round geometric means over layers of per-round ratios.

    Layer ``l`` was measured in its own interleaved rounds and gives ratios
    ``per_layer[l][i]`` (round ``i``). Sample ``i`` of the result is the geometric mean
    over layers of their round-``i`` ratios: one estimate of the layer-set speed-up per
    round, so the median of the samples estimates the geo-mean speed-up and their spread
    gives its interval (``record(..., samples=...)``).

    Args:
        per_layer: One sequence of positive per-round ratios per layer, all of one length.

    Returns:
        One geometric mean per round.

    Raises:
        WinogradError: No layers, an empty or non-positive sequence, or unequal lengths
            (a ``ValueError``).
    """
    if not per_layer:
        raise WinogradError("round_geometric_means: no layers")
    lengths = {len(r) for r in per_layer}
    if len(lengths) != 1 or 0 in lengths:
        raise WinogradError(
            f"round_geometric_means: every layer needs the same number (>= 1) of rounds, "
            f"got lengths {sorted(lengths)}"
        )
    a = np.asarray([list(r) for r in per_layer], dtype=np.float64)
    if not np.all(a > 0) or not np.all(np.isfinite(a)):
        raise WinogradError("round_geometric_means: ratios must be finite and positive")
    return [float(v) for v in np.exp(np.log(a).mean(axis=0))]


def benchmark_layer(
    layer: Layer,
    *,
    threads: int,
    config: WinogradConfig | None = None,
    reps: int = 3,
    seed: int = 0,
    direct: bool = True,
    im2col: bool = True,
    choice: PathChoice | None = None,
) -> dict:
    """Median times of every convolution of one layer, with equal thread counts.

    All methods are timed in interleaved rounds after a warm-up round; each sample is
    the mean of two calls after an untimed one, so that a change of machine load, or the
    threads of the method before still spinning, affect none of them alone.

    Args:
        layer: The layer.
        threads: Largest thread count. The Winograd configuration's own count (the tuner
            may have chosen fewer) is then given to torch, Numba and BLAS alike, so every
            method runs with the same number of threads.
        config: Winograd configuration (default: :func:`default_config`).
        reps: Timed interleaved rounds (median; every method runs in every round).
        seed: Seed of the data.
        direct: Also time the direct Numba kernel.
        im2col: Also time im2col + GEMM.
        choice: The dispatcher's choice for this layer (e.g. from the tuner's wisdom);
            None: the dispatcher measures on its first call (in the warm-up round).

    Returns:
        Dict with ``layer``, ``<method>_s`` medians (``winograd_s``: the kernel alone with
        the filters transformed once beforehand, as for inference with fixed weights;
        ``winograd_with_filter_transform_s`` including it; ``dispatch_s``:
        ``conv2d_winograd(..., fallback=True)`` on torch tensors; ``winograd_gemm_s``:
        the kernel's GEMMs alone), ``path`` (the dispatcher's choice), ``block`` and
        ``schedule`` (:func:`~hpcnb.winograd.fused.fused_plan`), ``gemm_gflops`` (the
        GEMMs' rate), ``winograd_rel_error`` vs a float64 direct convolution,
        ``threads_checked`` (:func:`thread_counts` inside the pinned block), the ratios of
        medians ``speedup_vs_torch`` (kernel), ``dispatch_speedup_vs_torch``,
        ``speedup_vs_direct``, ``speedup_vs_im2col``, ``round_speedups``:
        ``{"torch": (...), "direct": (...), "im2col": (...), "dispatch": (...)}`` (per
        round, that method's time / the kernel's time, except ``"dispatch"``: torch's
        time / the dispatcher's), and ``round_times``: ``{method: (seconds per round)}``.
    """
    cfg = config or default_config(layer.r)
    if cfg.threads == 0 or cfg.threads > threads:
        cfg = replace(cfg, threads=threads)
    x, w = _layer_data(layer, seed)
    pad = (layer.r - 1) // 2
    if choice is not None:
        remember_choice(
            layer.x_shape,
            layer.w_shape,
            pad,
            cfg.threads,
            config=cfg,
            winograd_s=choice.winograd_s,
            torch_s=choice.torch_s,
            source=choice.source,
        )
    methods, U = _methods(layer, x, w, cfg, direct=direct, im2col=im2col)
    from hpcnb.winograd.numerics import direct_fp64, relative_error

    ref = direct_fp64(x, w, pad)
    # every method runs with the same count as the Winograd configuration
    y, counts, timings = _measure_methods(layer, x, w, cfg, U, methods, reps)
    out = _layer_summary(layer, cfg, timings, relative_error(y, ref), counts)
    kept = known_choice(layer.x_shape, layer.w_shape, pad, cfg.threads)
    out["path"] = kept.path if kept is not None else "winograd"
    return out


def _layer_data(layer: Layer, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The random float32 input and filters of ``layer``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(layer.x_shape, dtype=np.float32)
    w = rng.standard_normal(layer.w_shape, dtype=np.float32)
    return x, w


def _methods(
    layer: Layer,
    x: np.ndarray,
    w: np.ndarray,
    cfg: WinogradConfig,
    *,
    direct: bool,
    im2col: bool,
) -> tuple[dict[str, Callable[[], object]], np.ndarray]:
    """The timed calls by method name, and the filters transformed once for Winograd."""
    import torch
    import torch.nn.functional as F

    from hpcnb.winograd.backend import conv2d_winograd

    pad = (layer.r - 1) // 2
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    U = filter_transform(w, cfg.m, cfg.points, dtype=np.float32)
    if cfg.gemm == "numba":
        U = pack_panels(U)  # pre-packed once, as the filter cache does

    def run_torch() -> None:
        with torch.no_grad():
            F.conv2d(xt, wt, padding=pad)

    methods: dict[str, Callable[[], object]] = {
        "torch": run_torch,
        "winograd": lambda: winograd_numpy(x, w, pad, cfg, U=U),
        "dispatch": lambda: conv2d_winograd(xt, wt, pad, config=cfg, fallback=True),
        "winograd_gemm": lambda: winograd_numpy(x, w, pad, cfg, U=U, parts=2),
        "winograd_with_filter_transform": lambda: winograd_numpy(x, w, pad, cfg),
    }
    if im2col:
        methods["im2col"] = lambda: conv2d_im2col(x, w, pad)
    if direct:
        methods["direct"] = lambda: conv2d_direct(x, w, pad)
    return methods, U


def _measure_methods(
    layer: Layer,
    x: np.ndarray,
    w: np.ndarray,
    cfg: WinogradConfig,
    U: np.ndarray,
    methods: dict[str, Callable[[], object]],
    reps: int,
) -> tuple[np.ndarray, dict[str, int], dict[str, Timing]]:
    """Winograd's output and every method's interleaved timing, the pools pinned and checked."""
    with pinned_threads(cfg.threads):
        counts = check_threads(cfg.threads)
        y = winograd_numpy(x, w, (layer.r - 1) // 2, cfg, U=U)
        # one warm-up round (compile; the dispatcher's first call decides), then
        # interleaved rounds: a change of machine load hits every method alike
        timings = interleaved(methods, repeats=reps, warmup=1, calls=2, lead=1)
        check_threads(cfg.threads)  # nothing changed the pools while timing
    return y, counts, timings


def _layer_summary(
    layer: Layer,
    cfg: WinogradConfig,
    timings: dict[str, Timing],
    rel_error: float,
    counts: dict[str, int],
) -> dict:
    """Medians, speed-ups, rates and per-round times and ratios of one layer's timings."""
    med = {k: t.median for k, t in timings.items()}
    t_wino = med["winograd"]
    n = cfg.m + layer.r - 1
    tiles = layer.N * math.ceil(layer.H / cfg.m) ** 2
    block, schedule = fused_plan(tiles, layer.C, layer.C, n, cfg.threads, cfg)
    out = {
        "layer": layer.name,
        "N": layer.N,
        "C": layer.C,
        "H": layer.H,
        "m": cfg.m,
        "gemm": cfg.gemm,
        "block": block,
        "schedule": schedule,
        "threads": cfg.threads,
        "points": cfg.points,
        "winograd_rel_error": rel_error,
        "threads_checked": counts,
        "winograd_gflops_equiv": layer.flops / t_wino / 1e9,
        "gemm_gflops": 2.0 * n * n * layer.C * layer.C * tiles / med["winograd_gemm"] / 1e9,
    }
    out.update({f"{k}_s": v for k, v in med.items()})
    out["speedup_vs_torch"] = med["torch"] / t_wino
    out["dispatch_speedup_vs_torch"] = med["torch"] / med["dispatch"]
    for k in ("direct", "im2col"):
        if k in med:
            out[f"speedup_vs_{k}"] = med[k] / t_wino
    out["round_times"] = {k: t.samples for k, t in timings.items()}
    per_round: dict[str, tuple[float, ...]] = {
        k: ratios(timings[k], timings["winograd"])
        for k in ("torch", "direct", "im2col")
        if k in timings
    }
    per_round["dispatch"] = ratios(timings["torch"], timings["dispatch"])
    out["round_speedups"] = per_round
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
    timings = _config_timings(layer, configs, threads=threads, reps=reps, seed=seed)
    return [t.median for t in timings]


def _config_timings(
    layer: Layer, configs: list[WinogradConfig], *, threads: int, reps: int, seed: int
) -> list[Timing]:
    """Interleaved timing (every round kept) of several configurations on one layer."""
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
    return interleaved(fns, repeats=reps, warmup=1)  # one warm-up round (and compile)


def _effective(config: WinogradConfig, threads: int) -> WinogradConfig:
    """The configuration as run with at most ``threads`` threads (0 means ``threads``)."""
    return config if 0 < config.threads <= threads else replace(config, threads=threads)


@dataclass(frozen=True)
class GainMeasurement:
    """Tuned against default configuration on one layer, measured after tuning.

    Attributes:
        default_s: Median seconds of the default configuration (NaN when not timed).
        tuned_s: Median seconds of the tuned configuration (NaN when not timed).
        gain: ``default_s / tuned_s``; exactly 1.0 when the configurations are the same.
        ratios: Per-round ratios default / tuned (round ``i`` of both ran back to back);
            ``reps`` times 1.0 when the configurations are the same.
        same: True when the tuner kept the default (nothing was timed).
    """

    default_s: float
    tuned_s: float
    gain: float
    ratios: tuple[float, ...]
    same: bool


def measure_gain(
    layer: Layer,
    default: WinogradConfig,
    tuned: WinogradConfig,
    *,
    threads: int,
    reps: int = 5,
    seed: int = 0,
) -> GainMeasurement:
    """Measure tuned against default configuration on one layer, keeping every round.

    Both are timed in ``reps`` interleaved rounds after a warm-up round, independently of
    the tuner's own measurements. When the tuner kept the default (the same
    configuration once thread counts are resolved) nothing is timed and the gain is
    exactly 1.0 in every round: timing one configuration twice would only measure noise.

    Args:
        layer: The layer.
        default: The untuned configuration.
        tuned: The tuner's choice.
        threads: Maximum thread count.
        reps: Interleaved rounds.
        seed: Seed of the data.

    Returns:
        The measurement, with per-round ratios for ``record(..., samples=...)``.
    """
    if _effective(default, threads) == _effective(tuned, threads):
        nan = float("nan")
        return GainMeasurement(nan, nan, 1.0, (1.0,) * reps, True)
    t_def, t_tuned = _config_timings(layer, [default, tuned], threads=threads, reps=reps, seed=seed)
    d, t = t_def.median, t_tuned.median
    return GainMeasurement(d, t, d / t, ratios(t_def, t_tuned), False)


def assembly_summary(m: int = 4, r: int = 3, points: str = "accurate") -> dict[str, dict[str, int]]:
    """Vector registers and FMAs in the machine code of the micro-kernel and the tile loop.

    Numba does not show the machine code of functions loaded from its cache, so the two
    kernels are compiled here once more from the generated source, without the cache, for
    this CPU (as Numba compiles them: LLVM targeting the host), the input transform under
    the same raised alias-check limit as in :mod:`~hpcnb.winograd.codegen`.

    Args:
        m: Outputs per tile side of the generated module.
        r: Filter size.
        points: Point set.

    Returns:
        ``{"gemm_panels": counts, "in_vec": counts}`` where ``counts`` holds the number of
        mentions of ``zmm`` (512-bit), ``ymm`` (256-bit) registers and of packed FMA
        instructions on ``zmm`` registers (``fma_zmm``).
    """
    import re

    import numba

    from hpcnb.winograd.codegen import cpu_source, wide_vectoriser
    from hpcnb.winograd.opcount import transform_programs

    source = cpu_source(transform_programs(m, r, points)).replace("cache=True", "cache=False")
    namespace: dict = {}
    exec(compile(source, f"<assembly of F({m},{r})>", "exec"), namespace)
    f32 = numba.float32
    with wide_vectoriser():
        namespace["in_vec"].compile((f32[:, ::1], f32[:, :, ::1], numba.int64, numba.int64))
    namespace["gemm_panels"].compile((f32[:, :, ::1], f32[:, ::1], f32[:, ::1], f32[:, ::1]))
    out = {}
    for name in ("gemm_panels", "in_vec"):
        asm = "\n".join(namespace[name].inspect_asm().values())
        out[name] = {
            "zmm": len(re.findall(r"%zmm", asm)),
            "ymm": len(re.findall(r"%ymm", asm)),
            "fma_zmm": len(re.findall(r"vfmadd\w*ps[^\n]*%zmm", asm)),
        }
    return out
