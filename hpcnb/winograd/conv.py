"""2-D convolution with generated Winograd kernels, and the baselines it is compared with.

This module is the ``"cpu"`` target (:data:`CPU_BACKEND`) of
:func:`~hpcnb.winograd.backend.conv2d_winograd`, which matches
``torch.nn.functional.conv2d(x, w, padding=p)`` (stride 1, no bias, NCHW) for any batch,
channel counts and image size. The filter transform is done once in float64
(``U = G w Gᵀ``, cached per weight by :func:`cached_filters`), the input transform, the
``n²`` batched products and the output transform run as generated Numba kernels, in
blocks of tiles (:class:`~hpcnb.winograd.config.WinogradConfig`). The configuration is
explicit: the default one, a given one, or with ``config="wisdom"`` the one tuned for this
machine (:mod:`~hpcnb.winograd.wisdom`). Baselines: :func:`conv2d_direct` (a direct Numba loop
nest) and :func:`conv2d_im2col` (im2col in Numba + one BLAS GEMM per image). The Numba
on-disk caches of this module's kernels, like those of the generated ones, are guarded
(:func:`hpcnb.codecache.guard_numba_cache`): an entry that does not load is dropped with a
warning and compiled again, and one that cannot be written is skipped.

Example:
    >>> import numpy as np
    >>> from hpcnb.winograd.config import WinogradConfig
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((1, 3, 9, 9), dtype=np.float32)
    >>> w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    >>> y = conv2d_winograd(x, w, padding=1, config=WinogradConfig(m=2))
    >>> y.shape, bool(np.allclose(y, conv2d_direct(x, w, padding=1), atol=1e-4))
    ((1, 4, 9, 9), True)
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from hpcnb.codecache import guard_numba_cache
from hpcnb.timing import pinned_threads
from hpcnb.winograd.backend import Backend, check_conv_args, conv2d_winograd, register_backend
from hpcnb.winograd.codegen import (
    cpu_kernels,
    cpu_source,
    input_body,
    python_constant,
    source_excerpt,
)
from hpcnb.winograd.config import WinogradConfig, WinogradError, default_config
from hpcnb.winograd.fused import (
    ALL_PARTS,
    PANEL_ROWS,
    driver_name,
    fused_plan,
    pack_panels,
    workspace_size,
)
from hpcnb.winograd.opcount import transform_programs
from hpcnb.winograd.transforms import validate_mr

__all__ = [
    "CPU_BACKEND",
    "batched_gemm",
    "cached_filters",
    "conv2d_direct",
    "conv2d_im2col",
    "conv2d_winograd",  # the one call of every target, defined in hpcnb.winograd.backend
    "filter_transform",
    "precompile",
    "winograd_numpy",
]


def _pinned(threads: int, blas: bool = True) -> contextlib.AbstractContextManager:
    """Numba (and BLAS) pools pinned to ``threads`` in a block (torch untouched; 0: as they are)."""
    if threads <= 0:
        return contextlib.nullcontext()
    return pinned_threads(threads, torch=False, blas=blas)


def filter_transform(
    w: np.ndarray,
    m: int,
    points: str | tuple = "default",
    level: str = "searched",
    dtype: npt.DTypeLike = np.float64,
) -> np.ndarray:
    """Return ``U[ab, k, c] = (G w[k, c] Gᵀ)[a, b]`` computed in float64.

    Args:
        w: Filters ``(K, C, r, r)``.
        m: Outputs per tile side.
        points: Point set.
        level: Optimisation level of the kernels that will use ``U`` (the ``searched``
            level rescales rows of ``BT`` and ``G``, see
            :func:`~hpcnb.winograd.opcount.search_row_scaling`).
        dtype: Storage type of the result (arithmetic is float64 either way).

    Returns:
        ``(n², K, C)`` float64 array.
    """
    K, C, r, _ = w.shape
    _, G, _ = transform_programs(m, r, points, level).transform.numpy(np.float64)
    n = G.shape[0]
    U = np.empty((n * n, K, C), dtype=dtype)
    _filter_kernel(np.ascontiguousarray(w, dtype=np.float64), G, U)
    return U


@numba.njit(parallel=True, cache=True)
def _filter_kernel(w, G, U):  # pragma: no cover - compiled
    """``U[a*n+b, k, c] = Σ_ij G[a,i] w[k,c,i,j] G[b,j]`` in float64, parallel over (k, c)."""
    K, C, r, _ = w.shape
    n = G.shape[0]
    for idx in numba.prange(K * C):
        k = idx // C
        c = idx - k * C
        T = np.zeros((r, n))
        for i in range(r):
            for b in range(n):
                acc = 0.0
                for j in range(r):
                    acc += w[k, c, i, j] * G[b, j]
                T[i, b] = acc
        for a in range(n):
            for b in range(n):
                acc = 0.0
                for i in range(r):
                    acc += G[a, i] * T[i, b]
                U[a * n + b, k, c] = acc


_WORK = threading.local()


def _workspace(size: int, dtype: np.dtype) -> np.ndarray:
    """This thread's workspace of the fused path: at least ``size`` elements, kept between calls.

    One buffer per calling thread (two threads convolving at once never share scratch),
    grown when a layer needs more; keeping it avoids allocating and faulting in megabytes
    of scratch on every call.
    """
    key = np.dtype(dtype).str
    bufs = getattr(_WORK, "buffers", None)
    if bufs is None:
        bufs = _WORK.buffers = {}
    buf = bufs.get(key)
    if buf is None or buf.size < size:
        buf = bufs[key] = np.empty(max(size, 1), dtype=dtype)
    return buf


_BLAS: list = []


def _blas_one_thread() -> contextlib.AbstractContextManager:
    """BLAS pools at one thread (the fused kernels call BLAS from every Numba thread).

    Numba's ``np.dot`` calls SciPy's BLAS, so that library is loaded before the
    threadpoolctl controller (built once: inspecting the loaded libraries is slow).
    """
    if not _BLAS:
        import scipy.linalg.cython_blas  # noqa: F401  (the BLAS behind Numba's np.dot)
        from threadpoolctl import ThreadpoolController

        _BLAS.append(ThreadpoolController())
    return _BLAS[0].limit(limits=1, user_api="blas")


def winograd_numpy(
    x: np.ndarray,
    w: np.ndarray,
    padding: int,
    config: WinogradConfig,
    dtype: str = "float32",
    U: np.ndarray | None = None,
    parts: int = ALL_PARTS,
) -> np.ndarray:
    """Winograd convolution of NumPy arrays with the generated kernels.

    With ``config.fused`` (the default) one generated kernel does the whole layer block by
    block (see :func:`~hpcnb.winograd.fused.fused_plan` and the layout in
    :mod:`~hpcnb.winograd.fused`);
    otherwise, and always for fp16 storage, three passes over whole-layer buffers: the
    input transform into ``V (n², C, tiles)``, the batched products, the output transform.

    Args:
        x: Input ``(N, C, H, W)``.
        w: Filters ``(K, C, r, r)``.
        padding: Zero padding.
        config: Run configuration.
        dtype: Arithmetic precision, ``"float32"`` or ``"float64"``.
        U: Pre-transformed filters from :func:`filter_transform` for ``config.m`` and
            ``config.points`` (inference with fixed weights), or for ``gemm="numba"`` the
            same packed by :func:`~hpcnb.winograd.fused.pack_panels`; computed when None.
        parts: Fused path only: bit mask of the stages to run (1 input transform, 2 GEMMs,
            4 output transform), to time a stage alone; other values leave ``out``
            partly unwritten.

    Returns:
        Output ``(N, K, Ho, Wo)`` of ``dtype``.
    """
    Ho, Wo = check_conv_args(x.shape, w.shape, padding)
    N, C, _H, _W = x.shape
    K, _, r, _ = w.shape
    m = config.m
    validate_mr(m, r)
    n = m + r - 1
    kern = cpu_kernels(m, r, config.points, dtype)
    np_dtype = np.dtype(dtype)
    x = np.ascontiguousarray(x, dtype=np_dtype)
    if U is None:
        U = filter_transform(w, m, config.points, dtype=np_dtype)
    packed = (n * n, -(-K // PANEL_ROWS), C, PANEL_ROWS)
    if U.shape != (n * n, K, C) and not (U.shape == packed and config.gemm == "numba"):
        raise WinogradError(
            f"winograd_numpy: U must have shape {(n * n, K, C)}"
            + (f" or, packed, {packed}" if config.gemm == "numba" else "")
            + f", got {U.shape}"
        )
    if not isinstance(parts, int) or not 0 <= parts <= ALL_PARTS:
        raise WinogradError(f"winograd_numpy: parts must be an int in 0..7, got {parts!r}")
    U = np.ascontiguousarray(U, dtype=np_dtype)
    tiles_h, tiles_w = math.ceil(Ho / m), math.ceil(Wo / m)
    P = N * tiles_h * tiles_w
    out = np.empty((N, K, Ho, Wo), dtype=np_dtype)
    if config.fused and config.storage == "fp32":
        if config.gemm == "numba" and U.ndim == 3:
            U = pack_panels(U)
        with _pinned(config.threads, blas=False), _blas_one_thread():
            threads = numba.get_num_threads()
            block, schedule = fused_plan(P, C, K, n, threads, config)
            size = workspace_size(P, C, K, n, m, block, schedule, threads)
            run = getattr(kern, driver_name(schedule, config.gemm))
            run(
                x,
                U,
                out,
                padding,
                tiles_h,
                tiles_w,
                block,
                parts,
                threads,
                _workspace(size, np_dtype),
            )
        return out
    if U.ndim == 4:
        raise WinogradError("winograd_numpy: packed filters run only on the fused fp32 path")
    if config.storage == "fp16":
        U = U.astype(np.float16).astype(np_dtype)
    B = P if config.block_tiles <= 0 else min(config.block_tiles, P)
    V = np.empty((n * n, C, B), dtype=np_dtype)
    Mt = np.empty((n * n, K, B), dtype=np_dtype)
    with _pinned(config.threads):
        for p0 in range(0, P, B):
            p1 = min(p0 + B, P)
            Vb, Mb = (
                (V, Mt) if p1 - p0 == B else (V[:, :, : p1 - p0].copy(), Mt[:, :, : p1 - p0].copy())
            )
            kern.input_transform(x, Vb, padding, tiles_h, tiles_w, p0, p1, config.channel_major)
            if config.storage == "fp16":
                Vb[...] = Vb.astype(np.float16)
            if config.gemm == "blas":
                np.matmul(U, Vb, out=Mb)
            else:
                batched_gemm(U, Vb, Mb)
            kern.output_transform(Mb, out, tiles_h, tiles_w, p0, config.channel_major)
    return out


_FILTERS: OrderedDict = OrderedDict()
FILTER_CACHE_BYTES = 512 * 2**20
"""Largest total size of the transformed filters kept by :func:`cached_filters` (bytes)."""


def _weight_key(w) -> tuple | None:
    """Identity of a weight that changes whenever its values may have changed, or None.

    A ``torch.Tensor`` is known by its storage address and its version counter (bumped by
    every in-place change); a NumPy array only when it is read-only (then it cannot change
    through it), by its address. Writable arrays are not cached.
    """
    if type(w).__module__.startswith("torch"):
        return ("torch", w.data_ptr(), w._version, tuple(w.shape), tuple(w.stride()), str(w.dtype))
    if isinstance(w, np.ndarray) and not w.flags.writeable:
        ptr = w.__array_interface__["data"][0]
        return ("numpy", ptr, w.shape, w.strides, w.dtype.str)
    return None


def cached_filters(
    w: Any, m: int, points: str | tuple = "default", packed: bool = False
) -> np.ndarray | None:
    """Transformed filters ``U`` of ``w`` for ``F(m, r)``, computed once per weight.

    A change of the weight in place (a tensor's version counter) makes a new entry, so
    stale filters are never used.

    The cache (least recently used first out, at most :data:`FILTER_CACHE_BYTES`) holds a
    reference to each weight, so an address cannot be reused while its entry lives.

    Args:
        w: Filters ``(K, C, r, r)``: a ``torch.Tensor`` or a read-only NumPy array.
        m: Outputs per tile side.
        points: Point set.
        packed: Packed in panels for the micro-kernel (:func:`~hpcnb.winograd.fused.pack_panels`).

    Returns:
        ``(n², K, C)`` float32 (packed: ``(n², ceil(K/8), C, 8)``), or None for a writable
        NumPy array (not cacheable).
    """
    wk = _weight_key(w)
    if wk is None:
        return None
    key = (*wk, m, points, packed)
    hit = _FILTERS.get(key)
    if hit is not None:
        _FILTERS.move_to_end(key)
        return hit[1]
    wa = w.detach().cpu().numpy() if hasattr(w, "detach") else w
    U = filter_transform(np.asarray(wa), m, points, dtype=np.float32)
    if packed:
        U = pack_panels(U)
    _FILTERS[key] = (w, U)
    while sum(u.nbytes for _, u in _FILTERS.values()) > FILTER_CACHE_BYTES and len(_FILTERS) > 1:
        _FILTERS.popitem(last=False)
    return U


def _plan(
    x_shape: tuple[int, ...], w: np.ndarray, padding: int, config: WinogradConfig
) -> Callable[[np.ndarray], np.ndarray]:
    """The CPU target's plan: the filters transformed once, then :func:`winograd_numpy`."""
    U = filter_transform(w, config.m, config.points, dtype=np.float32)
    if _packed(config):
        U = pack_panels(U)
    return lambda x: winograd_numpy(x, w, padding, config, U=U)


def _packed(config: WinogradConfig) -> bool:
    """True when ``config`` runs the micro-kernel, which reads the filters packed in panels."""
    return config.fused and config.storage == "fp32" and config.gemm == "numba"


def _prepare(w: Any, config: WinogradConfig) -> dict[str, Any]:
    """The transformed filters of ``w`` from :func:`cached_filters` (None: not cacheable)."""
    return {"U": cached_filters(w, config.m, config.points, _packed(config))}


def _excerpt(m: int, r: int, lines: int) -> dict[str, str]:
    """The first input-transform lines of the generated Numba module."""
    progs = transform_programs(m, r)
    first = input_body(progs, python_constant)[0]
    return {"Numba CPU": source_excerpt(cpu_source(progs), first, lines)}


CPU_BACKEND = register_backend(
    Backend(
        "cpu",
        winograd_numpy,
        default_config,
        label="Numba CPU",
        excerpt=_excerpt,
        plan=_plan,
        prepare=_prepare,
        wisdom=True,
    )
)
"""The Numba CPU target: :func:`winograd_numpy`, filters cached per weight, tuned by
:func:`~hpcnb.winograd.autotune.autotune` (``config="wisdom"``)."""


@numba.njit(parallel=True, cache=True)
def batched_gemm(U, V, Mt):  # pragma: no cover - compiled
    """``Mt[t] = U[t] @ V[t]`` for every ``t`` (Numba, parallel over ``(t, k)``).

    Args:
        U: Transformed filters ``(T, K, C)``.
        V: Transformed input ``(T, C, P)``.
        Mt: Output ``(T, K, P)``, overwritten.
    """
    T, K, C = U.shape
    P = V.shape[2]
    for idx in numba.prange(T * K):
        t = idx // K
        k = idx - t * K
        for p in range(P):
            Mt[t, k, p] = 0
        for c in range(C):
            u = U[t, k, c]
            for p in range(P):
                Mt[t, k, p] += u * V[t, c, p]


@numba.njit(parallel=True, cache=True)
def _direct_kernel(x, w, out, pad):  # pragma: no cover - compiled
    N, C, H, W = x.shape
    K, _, r, _ = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    for idx in numba.prange(N * K):
        b = idx // K
        k = idx - b * K
        for oh in range(Ho):
            for ow in range(Wo):
                out[b, k, oh, ow] = 0
        for c in range(C):
            for i in range(r):
                for oh in range(Ho):
                    ih = oh + i - pad
                    if ih < 0 or ih >= H:
                        continue
                    for j in range(r):
                        wv = w[k, c, i, j]
                        lo = max(0, pad - j)
                        hi = min(Wo, W + pad - j)
                        for ow in range(lo, hi):
                            out[b, k, oh, ow] += wv * x[b, c, ih, ow + j - pad]


def _baseline(x: np.ndarray, w: np.ndarray, padding: int, threads: int, kernel) -> np.ndarray:
    """Check the arguments, run ``kernel(x, w, padding, Ho, Wo)`` in float32, threads pinned."""
    Ho, Wo = check_conv_args(x.shape, w.shape, padding)
    x32, w32 = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(w, np.float32)
    with _pinned(threads):
        return kernel(x32, w32, padding, Ho, Wo)


def _direct(x: np.ndarray, w: np.ndarray, padding: int, Ho: int, Wo: int) -> np.ndarray:
    out = np.empty((x.shape[0], w.shape[0], Ho, Wo), dtype=np.float32)
    _direct_kernel(x, w, out, padding)
    return out


def conv2d_direct(x: np.ndarray, w: np.ndarray, padding: int = 0, threads: int = 0) -> np.ndarray:
    """Direct convolution: a parallel Numba loop nest over (image, filter), float32.

    Args:
        x: Input ``(N, C, H, W)`` (converted to float32).
        w: Filters ``(K, C, r, r)`` (converted to float32).
        padding: Zero padding on every side; ``Ho = H + 2 padding - r + 1``, likewise ``Wo``.
        threads: Numba threads of the loop nest (0: current setting).

    Returns:
        ``(N, K, Ho, Wo)`` float32.
    """
    return _baseline(x, w, padding, threads, _direct)


@numba.njit(parallel=True, cache=True)
def _im2col_kernel(x, cols, b, r, pad, Ho, Wo):  # pragma: no cover - compiled
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    for row in numba.prange(C * r * r):
        c = row // (r * r)
        i = (row // r) % r
        j = row % r
        for oh in range(Ho):
            ih = oh + i - pad
            for ow in range(Wo):
                iw = ow + j - pad
                if 0 <= ih < H and 0 <= iw < W:
                    cols[row, oh * Wo + ow] = x[b, c, ih, iw]
                else:
                    cols[row, oh * Wo + ow] = 0


def _im2col(x: np.ndarray, w: np.ndarray, padding: int, Ho: int, Wo: int) -> np.ndarray:
    N, C = x.shape[:2]
    K, _, r, _ = w.shape
    wm = w.reshape(K, C * r * r)
    cols = np.empty((C * r * r, Ho * Wo), dtype=np.float32)
    out = np.empty((N, K, Ho * Wo), dtype=np.float32)
    for b in range(N):
        _im2col_kernel(x, cols, b, r, padding, Ho, Wo)
        np.matmul(wm, cols, out=out[b])
    return out.reshape(N, K, Ho, Wo)


def conv2d_im2col(x: np.ndarray, w: np.ndarray, padding: int = 0, threads: int = 0) -> np.ndarray:
    """im2col (Numba) followed by one BLAS GEMM per image, float32.

    Args:
        x, w, padding: As for :func:`conv2d_direct`; each image's ``(C r r, Ho Wo)`` column
            matrix holds the padding's zeros, and the filters are one ``(K, C r r)`` matrix.
        threads: Numba and BLAS threads (0: current setting).

    Returns:
        ``(N, K, Ho, Wo)`` float32: :func:`conv2d_direct`'s result up to rounding.
    """
    return _baseline(x, w, padding, threads, _im2col)


def precompile(m: int, r: int = 3, points: str = "accurate") -> None:
    """Compile (or load from Numba's cache) every fused driver of ``F(m, r)`` now.

    A driver compiles on its first call, for tens of seconds; timing code calls this first
    so that no measurement (a tuner's included) pays for compilation.

    Args:
        m: Outputs per tile side.
        r: Filter size.
        points: Point set.
    """
    x = np.zeros((1, 2, m + r, m + r), dtype=np.float32)
    w = np.zeros((3, 2, r, r), dtype=np.float32)
    for gemm in ("blas", "numba"):
        for schedule in ("tiles", "stages"):
            cfg = WinogradConfig(m=m, points=points, gemm=gemm, schedule=schedule, threads=0)
            winograd_numpy(x, w, 1, cfg)


guard_numba_cache(globals())  # this module's cache=True kernels, defined above
