"""Pareto ranking for subnet selection: non-dominated sorting and NSGA-II crowding distance.

Every objective is minimised (negate an accuracy). The prioritised sampler ranks its
pool with :func:`pareto_ranks`; the evolutionary search ranks and thins its population
with both functions.

Example:
    >>> import numpy as np
    >>> from hpcnb.supernet.pareto import crowding_distance, pareto_ranks
    >>> points = np.array([[1.0, 4.0], [2.0, 2.0], [3.0, 3.0], [4.0, 1.0]])
    >>> pareto_ranks(points).tolist()  # [3, 3] is dominated by [2, 2]
    [0, 0, 1, 0]
    >>> crowding_distance(points[[0, 1, 3]]).tolist()
    [inf, 2.0, inf]
"""

from __future__ import annotations

import numpy as np

from hpcnb.errors import InvalidInputError

__all__ = ["crowding_distance", "pareto_ranks"]


def pareto_ranks(points: np.ndarray) -> np.ndarray:
    """Return the non-dominated-sorting rank of each point (0 = Pareto front).

    Args:
        points: ``(n, m)`` array; every column is minimised.
    """
    pts = np.asarray(points, dtype=float)
    if pts.ndim != 2:
        raise InvalidInputError(f"points has shape {pts.shape}; expected (n, m)")
    n = len(pts)
    le = (pts[:, None, :] <= pts[None, :, :]).all(-1)
    lt = (pts[:, None, :] < pts[None, :, :]).any(-1)
    dominates = np.asarray(le & lt)  # dominates[i, j]: i dominates j
    dominated_by = dominates.sum(0)
    ranks = np.full(n, -1, dtype=int)
    rank = 0
    remaining = dominated_by.copy()
    current = np.where(remaining == 0)[0]
    while len(current):
        ranks[current] = rank
        remaining[current] = -1
        for i in current:
            remaining[dominates[i]] -= 1
        current = np.where(remaining == 0)[0]
        rank += 1
    return ranks


def crowding_distance(points: np.ndarray) -> np.ndarray:
    """Return NSGA-II crowding distances of points on one front (larger = more isolated)."""
    pts = np.asarray(points, dtype=float)
    n = len(pts)
    dist = np.zeros(n)
    if n <= 2:
        return np.full(n, np.inf)
    for j in range(pts.shape[1]):
        order = np.argsort(pts[:, j], kind="stable")
        span = pts[order[-1], j] - pts[order[0], j]
        dist[order[0]] = dist[order[-1]] = np.inf
        if span > 0:
            dist[order[1:-1]] += (pts[order[2:], j] - pts[order[:-2], j]) / span
    return dist
