"""Search of interpolation points for ``F(m, r)``: fp32 error against operation count.

Which finite points a Cook–Toom transform uses decides its constants and so both its
floating-point error and how many operations its straight-line programs need. This module
enumerates *symmetric* point sets (0 and pairs ``±a`` with ``a`` from small rationals
such as 1, 1/2, 2, 1/4, 4, 1/3, 3, 3/2, 2/3, ...), builds each transform exactly with the
symbolic engine (:func:`~hpcnb.winograd.transforms.cook_toom`), checks it exactly
(:func:`~hpcnb.winograd.transforms.check_tensor_identity`), ranks all of them by the
first-order error bound, and measures the fp32 error of the best-ranked ones (and of the
commonly used points) on one fixed random benchmark with the same programs the kernels
run (:func:`~hpcnb.winograd.numerics.winograd_reference`, float64 direct convolution as
reference). Operation counts are those of the paired programs (even/odd pairing, constant
factoring, shared pairs; no random order search, so that hundreds of sets stay cheap).

Example:
    >>> from fractions import Fraction as Fr
    >>> sets = symmetric_sets(4, 3, magnitudes=(Fr(1), Fr(2), Fr(1, 2)))
    >>> len(sets), sets[0]
    (3, (Fraction(0, 1), Fraction(1, 1), Fraction(-1, 1), Fraction(2, 1), Fraction(-2, 1)))
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np

from hpcnb.winograd.config import WinogradError
from hpcnb.winograd.numerics import direct_fp64, relative_error, winograd_reference
from hpcnb.winograd.opcount import transform_programs
from hpcnb.winograd.transforms import check_tensor_identity, cook_toom, error_bound

__all__ = [
    "MAGNITUDES",
    "STANDARD_POINTS",
    "pareto_points",
    "point_search",
    "symmetric_sets",
]

MAGNITUDES: tuple[Fraction, ...] = tuple(
    Fraction(v)
    for v in ("1", "1/2", "2", "1/4", "4", "1/3", "3", "3/2", "2/3", "3/4", "4/3", "5/2", "2/5")
)
"""Candidate magnitudes ``a`` of the point pairs ``±a``."""

STANDARD_POINTS: dict[tuple[int, int], tuple[Fraction, ...]] = {
    (4, 3): tuple(Fraction(v) for v in (0, 1, -1, 2, -2)),
    (6, 3): tuple(Fraction(v) for v in (0, 1, -1, 2, -2, "1/2", "-1/2")),
    (8, 3): tuple(Fraction(v) for v in (0, 1, -1, 2, -2, "1/2", "-1/2", 4, -4)),
}
"""Commonly used points: Lavin & Gray's F(4,3) and F(6,3) (also NNPACK's F(6,3)); for
F(8,3) the same sequence extended by ±4 (a frequent choice in wincnn-style tables; which
points Paddle-Lite's F(8,3) uses is not checked here)."""


def symmetric_sets(
    m: int, r: int, magnitudes: tuple[Fraction, ...] = MAGNITUDES
) -> list[tuple[Fraction, ...]]:
    """Every point set ``{0, ±a_1, ..., ±a_k}`` with ``m + r - 2`` finite points.

    Args:
        m: Outputs per tile.
        r: Filter size.
        magnitudes: Candidate ``a`` (positive, distinct).

    Returns:
        Point sets (0 first, then ``a, -a`` per pair in the order of ``magnitudes``).

    Raises:
        WinogradError: ``m + r - 2`` is even (a symmetric set with 0 has an odd size).
    """
    k = m + r - 2
    if k % 2 == 0:
        raise WinogradError(f"symmetric_sets: F({m},{r}) needs {k} points, an even number")
    out = []
    for combo in itertools.combinations(magnitudes, k // 2):
        pts: list[Fraction] = [Fraction(0)]
        for a in combo:
            pts += [a, -a]
        out.append(tuple(pts))
    return out


def _ops(m: int, r: int, pts: tuple[Fraction, ...]) -> float:
    """Whole-algorithm operations per output of the paired programs (filter excluded)."""
    progs = transform_programs(m, r, pts, "paired")
    n = m + r - 1
    return (2 * n * progs.input.ops + n * n + (n + m) * progs.output.ops) / (m * m)


def point_search(
    m: int,
    r: int = 3,
    *,
    magnitudes: tuple[Fraction, ...] = MAGNITUDES,
    measure: int = 12,
    neighbours: int = 8,
    shape: tuple[int, int, int, int] = (2, 32, 32, 16),
    seed: int = 0,
) -> list[dict]:
    """Rank symmetric point sets of ``F(m, r)`` and measure the best ones' fp32 error.

    Every set is built exactly and checked by the tensor identity; all are ranked by the
    error bound; the ``measure`` best-ranked sets and the standard points (when known)
    are run in fp32 on one fixed random benchmark (uniform(-1, 1) data of ``shape =
    (N, C, K, H)``, padding ``r // 2``) and compared with a float64 direct convolution.

    Args:
        m: Outputs per tile.
        r: Filter size.
        magnitudes: Candidate magnitudes of the pairs.
        measure: How many of the best-ranked sets are measured.
        neighbours: Also measure this many of the best-ranked sets one swap away from the
            best-ranked symmetric set (any candidate point, so not symmetric).
        shape: ``(N, C, K, H)`` of the benchmark.
        seed: Seed of the benchmark data.

    Returns:
        One dict per measured set: ``points`` (str), ``exact`` (identity holds),
        ``bound``, ``ops`` (per output), ``fp32_error``, ``standard`` (the common set).
    """
    sets = symmetric_sets(m, r, magnitudes)
    bounds = [(error_bound(cook_toom(m, r, p)), p) for p in sets]
    bounds.sort(key=lambda bp: bp[0])
    chosen = [p for _, p in bounds[:measure]]
    std = STANDARD_POINTS.get((m, r))
    if std is not None:
        chosen = [p for p in chosen if frozenset(p) != frozenset(std)] + [std]
    if neighbours:  # one point of the best-ranked set swapped for any candidate (asymmetric)
        cands = [Fraction(0), *magnitudes, *(-a for a in magnitudes)]
        best = bounds[0][1]
        near = {
            tuple(sorted((*best[:i], c, *best[i + 1 :]), key=lambda v: (abs(v), v)))
            for i in range(len(best))
            for c in cands
            if c not in best
        }
        ranked = sorted(near, key=lambda p: error_bound(cook_toom(m, r, p)))
        seen = {frozenset(p) for p in chosen}
        chosen += [p for p in ranked[:neighbours] if frozenset(p) not in seen]
    N, C, K, H = shape
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (N, C, H, H)).astype(np.float32)
    w = rng.uniform(-1, 1, (K, C, r, r)).astype(np.float32)
    pad = r // 2
    ref = direct_fp64(x, w, pad)
    rows = []
    for pts in chosen:
        tr = cook_toom(m, r, pts)
        y = winograd_reference(x, w, m, pad, pts, np.float32, level="paired")
        rows.append(
            {
                "F": f"F({m},{r})",
                "points": ", ".join(map(str, pts)),
                "exact": check_tensor_identity(tr),
                "bound": error_bound(tr),
                "ops": _ops(m, r, pts),
                "fp32_error": relative_error(y, ref),
                "standard": pts == std,
            }
        )
    return rows


def pareto_points(rows: list[dict], x: str = "ops", y: str = "fp32_error") -> list[dict]:
    """The point-set rows not dominated in ``(x, y)`` (both smaller is better), sorted by ``x``.

    Args:
        rows: Rows of :func:`point_search` (any dicts holding ``x`` and ``y``).
        x: Key of the first criterion (operations per output by default).
        y: Key of the second criterion (fp32 error by default).

    Example:
        >>> rows = [
        ...     {"ops": 1, "fp32_error": 3},
        ...     {"ops": 2, "fp32_error": 1},
        ...     {"ops": 2, "fp32_error": 2},
        ... ]
        >>> [(r["ops"], r["fp32_error"]) for r in pareto_points(rows)]
        [(1, 3), (2, 1)]
    """
    front: list[dict] = []
    for row in sorted(rows, key=lambda d: (d[x], d[y])):
        if not front or row[y] < front[-1][y]:
            front.append(row)
    return front
