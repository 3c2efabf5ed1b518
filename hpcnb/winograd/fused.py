"""The fused CPU path: one generated Numba kernel per layer, block by block of tiles.

A block of ``L`` consecutive tiles (tile ``p`` = image ``b``, tile row, tile column) goes
through three stages while it is resident in the core's cache:

1. **gather + input transform**, per input channel ``c``: the ``n x n`` patches of the
   block's tiles are copied into ``D[i*n + j, q]`` (straight-line copies for whole tiles,
   zeros outside the image for border tiles), then ``in_vec`` transforms them with the
   tile loop innermost, so every load and store is unit-stride in ``q`` and LLVM
   vectorises it across tiles (16 tiles per AVX-512 register);
2. **the n² GEMMs** ``Mt[t] = U[t] @ V[t]`` (``K x C`` times ``C x L``), either by BLAS
   (``np.dot`` into a preallocated output, one BLAS thread per Numba thread) or by the
   generated register-blocked **micro-kernel** ``gemm_panels`` that reads the filters
   pre-packed in panels of :data:`PANEL_ROWS` output channels
   (``Up[t, panel, c, row]``, :func:`pack_panels`): one pass over ``V[t]`` updates
   eight output rows, the ``C`` loop outside, the tile loop inside and vectorised;
3. **output transform + scatter**, per output channel ``k``: ``out_vec`` (vectorised across
   tiles like ``in_vec``) into ``Y[i*m + j, q]``, then straight-line stores into the image
   (clipped for border tiles).

Two schedules: ``tiles`` (each thread owns whole blocks and its scratch, one fork and join
per layer) and ``stages`` (one block at a time, each stage parallel: over channels, over
the ``n²`` GEMMs, over filters), for layers with few tiles per thread, where reading
each ``U[t]`` once for all tiles matters more. :func:`fused_plan` chooses the schedule
and the block size (from the core's L2 size). The ``n²`` slabs of ``V`` and ``Mt`` are
allocated with one spare row each: with ``C`` a multiple of 64 and ``L`` of 16, a slab
is a multiple of 4 KiB, and the ``n²`` streams a transform reads or writes would all
map to the same cache sets. Every driver
takes ``parts``, a bit mask of the stages to run (1 input, 2 GEMMs, 4 output), so that
one stage can be timed alone, ``threads``, the number of Numba threads in force, and
``work``, a float buffer of at least :func:`workspace_size` elements from which it carves
its scratch: allocating several MB per call would cost a page fault per 4 KiB page
whenever the allocator returns them to the system in between.
The generated text comes from :func:`fused_functions`, which
:mod:`~hpcnb.winograd.codegen` writes into the CPU module.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from hpcnb.winograd.config import WinogradConfig, WinogradError

__all__ = [
    "ALL_PARTS",
    "PANEL_ROWS",
    "TILES_PER_THREAD",
    "driver_name",
    "fused_functions",
    "fused_plan",
    "l2_bytes",
    "pack_panels",
    "workspace_size",
]

PANEL_ROWS = 8
"""Output channels per panel of the packed filters read by the micro-kernel."""

ALL_PARTS = 7
"""``parts`` of a whole convolution: input transform (1), GEMMs (2), output transform (4)."""

TILES_PER_THREAD = 128
"""Below this many tiles per thread the automatic plan runs the ``stages`` schedule."""


@lru_cache(maxsize=1)
def l2_bytes() -> int:
    """This machine's L2 cache per core in bytes (from sysfs; 1 MiB when it cannot be read)."""
    from hpcnb.perfmodel.features import cache_bytes_per_core

    return cache_bytes_per_core()


def fused_plan(
    P: int, C: int, K: int, n: int, threads: int, config: WinogradConfig
) -> tuple[int, str]:
    """Block size and schedule of the fused path for a layer of ``P`` tiles.

    With fewer than :data:`TILES_PER_THREAD` tiles per thread (small images, batch 1)
    the ``stages`` schedule runs one block of all tiles (at most 256), each stage
    parallel: every ``U[t]`` is then read once for the whole layer, and the GEMMs are as
    wide as the layer allows. Otherwise each thread runs whole blocks (``tiles``) whose
    transformed input and products (``4 n² (C + K)`` bytes per tile) fill about half the
    core's L2 (:func:`l2_bytes`), rounded down to a multiple of 16 tiles (one AVX-512
    register of tiles), at least 32 tiles (narrower GEMMs lose efficiency, and the
    filters are read once per block) and at most ``ceil(P / threads)``.

    Args:
        P: Tiles of the layer (``N · tiles_h · tiles_w``).
        C: Input channels.
        K: Output channels.
        n: Tile side ``m + r - 1``.
        threads: Threads that will run it.
        config: ``block_tiles`` and ``schedule`` (0 / ``"auto"``: chosen here).

    Returns:
        ``(block, schedule)``.
    """
    threads = max(threads, 1)
    per_thread = -(-P // threads)
    schedule = config.schedule
    if schedule == "auto":
        schedule = "stages" if per_thread < TILES_PER_THREAD else "tiles"
    if config.block_tiles > 0:
        return min(config.block_tiles, P), schedule
    if schedule == "stages":
        return min(P, 256), schedule
    fit = l2_bytes() // 2 // (4 * n * n * (C + K))
    return max(1, min(max(16 * (fit // 16), 32), per_thread)), schedule


def pack_panels(U: np.ndarray) -> np.ndarray:
    """Transformed filters ``(n², K, C)`` packed for the micro-kernel: ``(n², ceil(K/8), C, 8)``.

    ``Up[t, p, c, i] = U[t, 8p + i, c]``, zero for the rows past ``K``, so one panel's eight
    filter values of a channel are adjacent and the last panel needs no special case.

    Args:
        U: Transformed filters from :func:`~hpcnb.winograd.conv.filter_transform`.

    Returns:
        The packed array (C-contiguous, ``U``'s dtype).

    Raises:
        WinogradError: ``U`` is not 3-D.
    """
    if U.ndim != 3:
        raise WinogradError(f"pack_panels: U must be (n², K, C), got shape {U.shape}")
    T, K, C = U.shape
    panels = math.ceil(K / PANEL_ROWS)
    padded = np.zeros((T, panels * PANEL_ROWS, C), dtype=U.dtype)
    padded[:, :K] = U
    return np.ascontiguousarray(padded.reshape(T, panels, PANEL_ROWS, C).transpose(0, 1, 3, 2))


def driver_name(schedule: str, gemm: str) -> str:
    """Name of the generated driver for a schedule and GEMM (``fused_tiles_blas``, ...).

    Args:
        schedule: ``"tiles"`` or ``"stages"``.
        gemm: ``"blas"`` or ``"numba"`` (the micro-kernel, named ``panels``).
    """
    return f"fused_{schedule}_{'blas' if gemm == 'blas' else 'panels'}"


def _lines(text: str) -> list[str]:
    """The lines of a block of generated code written as one text (outer blank lines cut)."""
    return text.strip("\n").split("\n")


_ADVANCE = """
        tw += 1
        if tw == tiles_w:
            tw = 0
            th += 1
            if th == tiles_h:
                th = 0
                b += 1"""

_FIRST_TILE = """
    tpi = tiles_h * tiles_w
    b = p0 // tpi
    rem = p0 - b * tpi
    th = rem // tiles_w
    tw = rem - th * tiles_w"""


def _gather(n: int, m: int) -> list[str]:
    """``gather``: the ``n x n`` patches of ``L`` tiles of one channel into ``D``."""
    copies = "\n".join(
        f"            D[{i * n + j}, q] = x[b, c, h0 + {i}, w0 + {j}]"
        for i in range(n)
        for j in range(n)
    )
    return _lines(f"""
@numba.njit(cache=True)
def gather(x, c, p0, L, D, pad, tiles_h, tiles_w):
    H = x.shape[2]
    W = x.shape[3]{_FIRST_TILE}
    for q in range(L):
        h0 = th * {m} - pad
        w0 = tw * {m} - pad
        if h0 >= 0 and w0 >= 0 and h0 + {n} <= H and w0 + {n} <= W:
{copies}
        else:
            for i in range({n}):
                hh = h0 + i
                for j in range({n}):
                    ww = w0 + j
                    if 0 <= hh < H and 0 <= ww < W:
                        D[i * {n} + j, q] = x[b, c, hh, ww]
                    else:
                        D[i * {n} + j, q] = ZERO{_ADVANCE}
""")


def _scatter(m: int) -> list[str]:
    """``scatter``: one filter's ``m x m`` outputs of ``L`` tiles into the image."""
    stores = "\n".join(
        f"            out[b, k, oh + {i}, ow + {j}] = Y[{i * m + j}, q]"
        for i in range(m)
        for j in range(m)
    )
    return _lines(f"""
@numba.njit(cache=True)
def scatter(Y, out, k, p0, L, tiles_h, tiles_w):
    Ho = out.shape[2]
    Wo = out.shape[3]{_FIRST_TILE}
    for q in range(L):
        oh = th * {m}
        ow = tw * {m}
        if oh + {m} <= Ho and ow + {m} <= Wo:
{stores}
        else:
            for i in range(min({m}, Ho - oh)):
                for j in range(min({m}, Wo - ow)):
                    out[b, k, oh + i, ow + j] = Y[i * {m} + j, q]{_ADVANCE}
""")


def _gemm_panels() -> list[str]:
    """``gemm_panels``: the register-blocked micro-kernel on packed filters."""
    rows = range(PANEL_ROWS)
    loads = "\n".join(f"            a{i} = Ap[p, c, {i}]" for i in rows)
    fmas = "\n".join(f"                acc[{i}, q] += a{i} * bv" for i in rows)
    return _lines(f"""
@numba.njit(cache=True, fastmath={{"contract"}})
def gemm_panels(Ap, B, Cm, acc):
    # Cm = A @ B for A packed as Ap[panel, c, row] ({PANEL_ROWS} rows per panel, zero past K),
    # B (C, L); acc ({PANEL_ROWS}, >= L) is scratch: one panel's rows, kept in L1 while the
    # C loop runs, the tile loop innermost (vectorised across tiles, one FMA per row)
    K = Cm.shape[0]
    C = B.shape[0]
    L = B.shape[1]
    for p in range(Ap.shape[0]):
        for i in range({PANEL_ROWS}):
            for q in range(L):
                acc[i, q] = ZERO
        for c in range(C):
{loads}
            for q in range(L):
                bv = B[c, q]
{fmas}
        for i in range(min({PANEL_ROWS}, K - p * {PANEL_ROWS})):
            for q in range(L):
                Cm[p * {PANEL_ROWS} + i, q] = acc[i, q]
""")


def _products() -> list[str]:
    """GEMM number ``t`` of a block by BLAS and by the micro-kernel."""
    return _lines("""
@numba.njit(cache=True)
def products_blas(U, V, Mt, t, acc):
    np.dot(U[t], V[t, : U.shape[2]], Mt[t, : U.shape[1]])


@numba.njit(cache=True)
def products_panels(U, V, Mt, t, acc):
    gemm_panels(U[t], V[t, : U.shape[2]], Mt[t, : Mt.shape[1] - 1], acc)
""")


def _slabs(base: str, n2: int, indent: int) -> str:
    """Lines carving ``V`` and ``Mt`` of ``L`` tiles from ``work`` at ``base`` ("": 0).

    Each is zeroed when the stage that writes it is not run, so a stage timed alone reads
    no garbage.
    """
    start, plus = (f"{base} : {base} + ", f"{base} + ") if base else (": ", "")
    lines = [
        f"V = work[{start}{n2} * (C + 1) * L].reshape(({n2}, C + 1, L))",
        f"o_m = {plus}{n2} * (C + 1) * L",
        f"Mt = work[o_m : o_m + {n2} * (K + 1) * L].reshape(({n2}, K + 1, L))",
        "if not parts & 1:",
        "    V[:] = ZERO",
        "if not parts & 2:",
        "    Mt[:] = ZERO",
    ]
    return "\n".join(" " * indent + line for line in lines)


def _tiles_driver(n: int, m: int, gemm: str) -> list[str]:
    """``fused_tiles_<gemm>``: each thread runs whole blocks on its own part of ``work``."""
    n2 = n * n
    return _lines(f"""
@numba.njit(parallel=True, cache=True)
def fused_tiles_{gemm}(x, U, out, pad, tiles_h, tiles_w, block, parts, threads, work):
    # each thread owns every nth-th block and one part of the workspace: gather + input
    # transform, the n² GEMMs and output transform + scatter of a block run on one core
    C = x.shape[1]
    K = out.shape[1]
    P = x.shape[0] * tiles_h * tiles_w
    nblk = (P + block - 1) // block
    nth = max(1, min(threads, nblk))
    part = block * ({n2} * (C + K + 3) + {m * m + PANEL_ROWS})
    for ti in numba.prange(nth):
        o = ti * part
        D = work[o : o + {n2} * block].reshape(({n2}, block))
        Y = work[o + {n2} * block : o + {n2 + m * m} * block].reshape(({m * m}, block))
        o_acc = o + {n2 + m * m} * block
        acc = work[o_acc : o_acc + {PANEL_ROWS} * block].reshape(({PANEL_ROWS}, block))
        o_v = o_acc + {PANEL_ROWS} * block
        L = 0
        for bi in range(ti, nblk, nth):
            p0 = bi * block
            if min(block, P - p0) != L:  # exact sizes keep each V[t] contiguous
                L = min(block, P - p0)
{_slabs("o_v", n2, 16)}
            if parts & 1:
                for c in range(C):
                    gather(x, c, p0, L, D, pad, tiles_h, tiles_w)
                    in_vec(D, V, c, L)
            if parts & 2:
                for t in range({n2}):
                    products_{gemm}(U, V, Mt, t, acc)
            if parts & 4:
                for k in range(K):
                    out_vec(Mt, k, Y, L)
                    scatter(Y, out, k, p0, L, tiles_h, tiles_w)
""")


def _stages_driver(n: int, m: int, gemm: str) -> list[str]:
    """``fused_stages_<gemm>``: blocks in sequence, each stage parallel (for few tiles)."""
    n2 = n * n
    return _lines(f"""
@numba.njit(parallel=True, cache=True)
def fused_stages_{gemm}(x, U, out, pad, tiles_h, tiles_w, block, parts, threads, work):
    # blocks in sequence, each stage parallel: over channels (gather + input transform),
    # over the n² GEMMs, over filters (output transform + scatter); for few tiles
    C = x.shape[1]
    K = out.shape[1]
    P = x.shape[0] * tiles_h * tiles_w
    B = min(block, P)
    for p0 in range(0, P, B):
        L = min(B, P - p0)
{_slabs("", n2, 8)}
        if parts & 1:
            for c in numba.prange(C):
                D = np.empty(({n2}, L), dtype=x.dtype)
                gather(x, c, p0, L, D, pad, tiles_h, tiles_w)
                in_vec(D, V, c, L)
        if parts & 2:
            for t in numba.prange({n2}):
                acc = np.empty(({PANEL_ROWS}, L), dtype=x.dtype)
                products_{gemm}(U, V, Mt, t, acc)
        if parts & 4:
            for k in numba.prange(K):
                Y = np.empty(({m * m}, L), dtype=x.dtype)
                out_vec(Mt, k, Y, L)
                scatter(Y, out, k, p0, L, tiles_h, tiles_w)
""")


def workspace_size(
    P: int, C: int, K: int, n: int, m: int, block: int, schedule: str, threads: int
) -> int:
    """Elements of the workspace a fused driver carves its scratch from.

    ``tiles``: one part per thread (at most one per block) holding ``D``, ``Y``, the
    micro-kernel's accumulator and one block's ``V`` and ``Mt``; ``stages``: one block's
    ``V`` and ``Mt``.

    Args:
        P: Tiles of the layer.
        C: Input channels.
        K: Output channels.
        n: Tile side.
        m: Outputs per tile side.
        block: Tiles per block (from :func:`fused_plan`).
        schedule: ``"tiles"`` or ``"stages"``.
        threads: Numba threads in force.
    """
    if schedule == "stages":
        return n * n * (C + K + 2) * min(block, P)
    parts = max(1, min(threads, -(-P // block)))
    return parts * block * (n * n * (C + K + 3) + m * m + PANEL_ROWS)


def fused_functions(n: int, m: int) -> list[str]:
    """Source lines of the fused path for tiles of side ``n`` with ``m x m`` outputs.

    ``in_vec`` and ``out_vec`` (the transforms across a vector of tiles) are written by
    :mod:`~hpcnb.winograd.codegen` before these lines; here come ``gather``, ``scatter``,
    the micro-kernel, the per-``t`` products and the four drivers
    (:func:`driver_name`: ``tiles`` / ``stages`` x BLAS / micro-kernel).

    Args:
        n: Tile side ``m + r - 1``.
        m: Outputs per tile side.
    """
    blocks = [_gather(n, m), _scatter(m), _gemm_panels(), _products()]
    for gemm in ("blas", "panels"):
        blocks += [_tiles_driver(n, m, gemm), _stages_driver(n, m, gemm)]
    lines: list[str] = []
    for i, block in enumerate(blocks):
        lines += ["", "", *block] if i else block
    return lines
