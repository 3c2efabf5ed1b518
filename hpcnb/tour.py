"""The tour notebook's small measurement: a stencil in NumPy, in Numba, and threaded.

A three-point smoothing stencil applied ``steps`` times. NumPy evaluates each step
as whole-array expressions with temporaries; the Numba kernel fuses the arithmetic
into one loop per step and reuses two buffers; the threaded Numba kernel splits each
step's loop into contiguous chunks that numba's thread pool runs in parallel
(``numba.prange``; set the thread count with :func:`hpcnb.timing.set_threads`). All
three compute the same values.
"""

from __future__ import annotations

import numba
import numpy as np

from hpcnb.errors import InvalidInputError

__all__ = ["smooth_numba", "smooth_numba_parallel", "smooth_numpy"]


def smooth_numpy(x: np.ndarray, steps: int) -> np.ndarray:
    """Apply ``y[i] = (x[i-1] + 2 x[i] + x[i+1]) / 4`` to the interior ``steps`` times.

    Args:
        x: 1-D float64 array; its two end points stay fixed.
        steps: Number of smoothing steps (>= 0).

    Raises:
        ValueError: ``x`` is not 1-D with at least 3 elements, or ``steps`` < 0.
    """
    _check(x, steps)
    cur = x.copy()
    for _ in range(steps):
        nxt = cur.copy()
        nxt[1:-1] = (cur[:-2] + 2.0 * cur[1:-1] + cur[2:]) * 0.25
        cur = nxt
    return cur


@numba.njit(cache=True)
def _smooth_kernel(x: np.ndarray, steps: int) -> np.ndarray:  # pragma: no cover - compiled
    cur = x.copy()
    nxt = x.copy()
    n = x.shape[0]
    for _ in range(steps):
        for i in range(1, n - 1):
            nxt[i] = (cur[i - 1] + 2.0 * cur[i] + cur[i + 1]) * 0.25
        cur, nxt = nxt, cur
    return cur


def smooth_numba(x: np.ndarray, steps: int) -> np.ndarray:
    """Numba version of :func:`smooth_numpy` (same arguments, same result).

    Args:
        x: The 2-D grid (copied to a contiguous float64 array).
        steps: Number of smoothing sweeps (>= 0).
    """
    _check(x, steps)
    return _smooth_kernel(np.ascontiguousarray(x, dtype=np.float64), steps)


@numba.njit(cache=True)
def _smooth_chunk(
    cur: np.ndarray, nxt: np.ndarray, start: int, stop: int
) -> None:  # pragma: no cover - compiled
    # Views of the chunk (with its two neighbours) let the compiler vectorise the loop,
    # as it does for the one-thread kernel.
    src = cur[start - 1 : stop + 1]
    dst = nxt[start:stop]
    for j in range(dst.shape[0]):
        dst[j] = (src[j] + 2.0 * src[j + 1] + src[j + 2]) * 0.25


@numba.njit(parallel=True, cache=True)
def _smooth_parallel_kernel(
    x: np.ndarray, steps: int, chunks: int
) -> np.ndarray:  # pragma: no cover - compiled
    cur = x.copy()
    nxt = x.copy()
    inner = x.shape[0] - 2
    size = (inner + chunks - 1) // chunks
    for _ in range(steps):
        for c in numba.prange(chunks):  # one contiguous chunk of the interior per iteration
            start = 1 + c * size
            stop = min(start + size, inner + 1)
            if start < stop:
                _smooth_chunk(cur, nxt, start, stop)
        cur, nxt = nxt, cur
    return cur


def smooth_numba_parallel(x: np.ndarray, steps: int, chunks: int | None = None) -> np.ndarray:
    """Threaded Numba version of :func:`smooth_numpy` (bitwise the result of :func:`smooth_numba`).

    Each step's interior is cut into ``chunks`` contiguous pieces that ``numba.prange``
    hands to numba's thread pool; the pool's size is :func:`numba.get_num_threads`
    (pinned by :func:`hpcnb.timing.set_threads`). Every element is computed from the
    previous step's buffer alone, so the chunks need no synchronisation within a step.

    Args:
        x: 1-D float64 array; its two end points stay fixed.
        steps: Number of smoothing steps (>= 0).
        chunks: Pieces per step (default: 4 per thread of the pool, at most one per
            interior element).

    Raises:
        ValueError: As :func:`smooth_numpy`, or ``chunks`` < 1.
    """
    _check(x, steps)
    if chunks is None:
        chunks = 4 * numba.get_num_threads()
    if chunks < 1:
        raise InvalidInputError(f"chunks must be >= 1, got {chunks}")
    chunks = min(int(chunks), x.shape[0] - 2)
    return _smooth_parallel_kernel(np.ascontiguousarray(x, dtype=np.float64), steps, chunks)


def _check(x: np.ndarray, steps: int) -> None:
    if x.ndim != 1 or x.shape[0] < 3:
        raise InvalidInputError(f"x must be 1-D with at least 3 elements, got shape {x.shape}")
    if steps < 0:
        raise InvalidInputError(f"steps must be >= 0, got {steps}")
