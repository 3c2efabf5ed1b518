"""The tour notebook's small measurement: a stencil in NumPy and in Numba.

A three-point smoothing stencil applied ``steps`` times. NumPy evaluates each step
as whole-array expressions with temporaries; the Numba kernel fuses the arithmetic
into one loop per step and reuses two buffers. Both compute the same values.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["smooth_numba", "smooth_numpy"]


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
    """Numba version of :func:`smooth_numpy` (same arguments, same result)."""
    _check(x, steps)
    return _smooth_kernel(np.ascontiguousarray(x, dtype=np.float64), steps)


def _check(x: np.ndarray, steps: int) -> None:
    if x.ndim != 1 or x.shape[0] < 3:
        raise ValueError(f"x must be 1-D with at least 3 elements, got shape {x.shape}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
