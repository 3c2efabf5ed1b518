"""Exact Cook–Toom construction of Winograd minimal-filtering transforms.

For ``F(m, r)`` (``m`` outputs of an ``r``-tap correlation) the tile size is
``n = m + r - 1``. The construction evaluates polynomials at ``n - 1`` finite points and
at infinity, in exact rational arithmetic:

* ``G`` (``n x r``) evaluates the filter polynomial at every point (∞ picks the leading
  coefficient);
* ``AT`` (``m x n``) is the transpose of the data-polynomial evaluation matrix;
* ``BT`` (``n x n``) is the transposed inverse evaluation (Lagrange interpolation) matrix.

Then ``y = AT [(G g) ⊙ (BT d)]`` equals the correlation ``y_i = Σ_k d_{i+k} g_k``
(Winograd's transposition principle applied to the Toom–Cook linear convolution). The
Lagrange denominators are moved from ``BT`` into ``G`` (``G`` is applied once per
filter), and every ``BT`` row is scaled to a primitive integer row, as wincnn does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
import sympy as sp

from hpcnb.errors import HpcnbError

__all__ = [
    "POINT_SETS",
    "Matrix",
    "WinogradError",
    "WinogradTransform",
    "accurate_points",
    "check_tensor_identity",
    "cook_toom",
    "default_points",
    "error_bound",
    "nested_2d",
    "prove_equivalence",
    "validate_mr",
]

Matrix = tuple[tuple[Fraction, ...], ...]


class WinogradError(HpcnbError, ValueError):
    """Bad arguments of a Winograd convolution (configuration, shapes, target, transform)."""


def _rationals(text: str) -> tuple[Fraction, ...]:
    """The rationals written in ``text``, separated by spaces (``"0 1 -1/2"``)."""
    return tuple(Fraction(v) for v in text.split())


# Candidate points, in the order the default construction uses them (Lavin & Gray style).
_DEFAULT_ORDER = _rationals("0 1 -1 2 -2 1/2 -1/2 3 -3 1/3 -1/3 4 -4 1/4 -1/4 3/2 -3/2 2/3 -2/3")

POINT_SETS: tuple[str, ...] = ("default", "accurate")


def validate_mr(m: int, r: int) -> None:
    """Check the tile parameters of ``F(m, r)``.

    Args:
        m: Number of outputs per tile (>= 1).
        r: Filter size (>= 1).

    Raises:
        WinogradError: When ``m`` or ``r`` is not a positive integer, or the tile is too
            large for the available point sets (``m + r - 2 > 19`` finite points); a
            ``ValueError``.
    """
    for name, v in (("m", m), ("r", r)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise WinogradError(f"F(m, r): parameter {name} must be a positive integer, got {v!r}")
    if m + r - 2 > len(_DEFAULT_ORDER):
        raise WinogradError(
            f"F({m}, {r}): needs {m + r - 2} finite points, at most {len(_DEFAULT_ORDER)} "
            "are available (choose a smaller m or r)"
        )


def default_points(m: int, r: int) -> tuple[Fraction, ...]:
    """Return the default finite points for ``F(m, r)``: 0, ±1, ±2, ±1/2, ±3, ...

    Args:
        m: Outputs per tile.
        r: Filter size.

    Returns:
        ``m + r - 2`` distinct rational points (∞ is implicit).
    """
    validate_mr(m, r)
    return _DEFAULT_ORDER[: m + r - 2]


@dataclass(frozen=True)
class WinogradTransform:
    """The three exact transform matrices of ``F(m, r)``.

    Attributes:
        m: Outputs per tile.
        r: Filter size.
        points: The finite evaluation points (∞ is the last row).
        AT: Output transform, ``m x n`` rationals.
        G: Filter transform, ``n x r`` rationals.
        BT: Input transform, ``n x n`` rationals (primitive integer rows).
    """

    m: int
    r: int
    points: tuple[Fraction, ...]
    AT: Matrix
    G: Matrix
    BT: Matrix

    @property
    def n(self) -> int:
        """Tile size ``m + r - 1``."""
        return self.m + self.r - 1

    @property
    def name(self) -> str:
        """Readable name, e.g. ``F(2,3)``."""
        return f"F({self.m},{self.r})"

    def sympy(self) -> tuple[sp.Matrix, sp.Matrix, sp.Matrix]:
        """Return ``(AT, G, BT)`` as sympy matrices of exact rationals."""

        def exact(M: Matrix) -> sp.Matrix:
            return sp.Matrix([[sp.Rational(v.numerator, v.denominator) for v in row] for row in M])

        return exact(self.AT), exact(self.G), exact(self.BT)

    def numpy(self, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(AT, G, BT)`` as floating-point arrays of ``dtype``."""

        def floats(M: Matrix) -> np.ndarray:
            return np.array([[float(v) for v in row] for row in M], dtype=dtype)

        return floats(self.AT), floats(self.G), floats(self.BT)


def _poly_from_roots(roots: list[Fraction]) -> list[Fraction]:
    """Coefficients (lowest degree first) of ``prod (x - a)``."""
    coeffs = [Fraction(1)]
    for a in roots:
        nxt = [Fraction(0)] * (len(coeffs) + 1)
        for i, c in enumerate(coeffs):
            nxt[i + 1] += c
            nxt[i] -= a * c
        coeffs = nxt
    return coeffs


def _primitive_scale(row: list[Fraction]) -> Fraction:
    """Return ``s`` such that ``row / s`` is a primitive integer row with a positive lead."""
    nz = [v for v in row if v != 0]
    num = 0
    den = 1
    for v in nz:
        num = math.gcd(num, v.numerator)
        den = den * v.denominator // math.gcd(den, v.denominator)
    s = Fraction(num, den)
    return -s if nz[0] < 0 else s


def _check_points(points: tuple[Fraction, ...] | list, m: int, r: int) -> tuple[Fraction, ...]:
    try:
        pts = tuple(Fraction(p) for p in points)
    except (TypeError, ValueError) as exc:
        raise WinogradError(f"F({m}, {r}): points must be rationals, got {points!r}") from exc
    if len(pts) != m + r - 2:
        raise WinogradError(
            f"F({m}, {r}): expected {m + r - 2} finite points (∞ is added), got {len(pts)}"
        )
    if len(set(pts)) != len(pts):
        raise WinogradError(f"F({m}, {r}): points must be distinct, got {points!r}")
    return pts


@lru_cache(maxsize=256)
def _cook_toom_cached(m: int, r: int, pts: tuple[Fraction, ...]) -> WinogradTransform:
    n = m + r - 1
    # G: evaluate the filter polynomial; AT: transposed data-polynomial evaluation.
    G = [[p**k for k in range(r)] for p in pts] + [[Fraction(int(k == r - 1)) for k in range(r)]]
    AT = [[p**j for p in pts] + [Fraction(int(j == m - 1))] for j in range(m)]
    # BT rows: Lagrange numerators prod_{j != i}(x - a_j) (finite points), then prod(x - a_j)
    # for ∞; the Lagrange denominators go to G.
    BT: list[list[Fraction]] = []
    for i, p in enumerate(pts):
        others = [q for j, q in enumerate(pts) if j != i]
        row = [*_poly_from_roots(others), Fraction(0)]
        denom = math.prod((p - q for q in others), start=Fraction(1))
        scale = _primitive_scale(row)
        BT.append([v / scale for v in row])
        G[i] = [v * scale / denom for v in G[i]]
    row = _poly_from_roots(list(pts))
    scale = _primitive_scale(row)
    BT.append([v / scale for v in row])
    G[n - 1] = [v * scale for v in G[n - 1]]
    return WinogradTransform(
        m=m,
        r=r,
        points=pts,
        AT=tuple(tuple(row) for row in AT),
        G=tuple(tuple(row) for row in G),
        BT=tuple(tuple(row) for row in BT),
    )


def cook_toom(
    m: int, r: int, points: str | tuple[Fraction, ...] | list = "default"
) -> WinogradTransform:
    """Build exact ``AT``, ``G``, ``BT`` for ``F(m, r)`` by the Cook–Toom construction.

    Args:
        m: Outputs per tile.
        r: Filter size.
        points: ``"default"`` (0, ±1, ±2, ±1/2, ...), ``"accurate"`` (greedy search for a
            small error bound, see :func:`accurate_points`) or ``m + r - 2`` distinct
            rationals given by the user.

    Returns:
        The transform with exact rational matrices.

    Raises:
        WinogradError: For invalid ``m``, ``r`` or points (a ``ValueError``).
    """
    validate_mr(m, r)
    if isinstance(points, str):
        if points == "default":
            pts = default_points(m, r)
        elif points == "accurate":
            pts = accurate_points(m, r)
        else:
            raise WinogradError(
                f"points={points!r}: expected one of {POINT_SETS} or a sequence of rationals"
            )
    else:
        pts = _check_points(points, m, r)
    return _cook_toom_cached(m, r, pts)


def error_bound(tr: WinogradTransform) -> float:
    """First-order floating-point error constant of a transform (smaller is better).

    The bound sums, over the ``n`` products of the element-wise stage, the absolute
    magnitudes that flow through them: ``max_j Σ_l |AT_jl| · ||G_l||_1 · ||BT_l||_1``.
    It follows the error analysis of Barabasz et al. (the product of the transform norms
    drives the error) and is used to rank point sets.

    Args:
        tr: A transform.

    Returns:
        The bound constant (nested 2-D error grows with its square).
    """
    AT, G, BT = tr.numpy()
    g1 = np.abs(G).sum(axis=1)
    b1 = np.abs(BT).sum(axis=1)
    return float((np.abs(AT) * (g1 * b1)[None, :]).sum(axis=1).max())


@lru_cache(maxsize=64)
def accurate_points(m: int, r: int) -> tuple[Fraction, ...]:
    """Return accuracy-oriented points: a greedy search minimising :func:`error_bound`.

    Starting from ``{0, -1, 1}`` (Barabasz et al. keep these for every size), each further
    point is the candidate (from 0, ±1, ±2, ±1/2, ±3, ±1/3, ±4, ±1/4, ±3/2, ±2/3) whose
    addition gives the smallest bound of the resulting ``F(m', r)``; for ``F(4, 3)`` this
    gives ``{0, -1, 1, 2, -1/2}``, the mirror image (x -> -x, same error) of Barabasz
    et al.'s ``{0, -1, 1, 1/2, -2}``.

    Args:
        m: Outputs per tile.
        r: Filter size.

    Returns:
        ``m + r - 2`` distinct rational points.
    """
    validate_mr(m, r)
    k = m + r - 2
    chosen: list[Fraction] = []
    for p in (Fraction(0), Fraction(-1), Fraction(1)):
        if len(chosen) < k:
            chosen.append(p)
    while len(chosen) < k:
        best: tuple[float, Fraction] | None = None
        mm = len(chosen) + 1 - r + 2  # outputs of the grown algorithm
        for cand in _DEFAULT_ORDER:
            if cand in chosen:
                continue
            pts = (*chosen, cand)
            if mm >= 1:
                bound = error_bound(_cook_toom_cached(mm, r, pts))
            else:  # too few points for r: rank by magnitude only
                bound = float(abs(cand) + 1 / abs(cand) if cand else 0.0)
            if best is None or bound < best[0] - 1e-12:
                best = (bound, cand)
        assert best is not None
        chosen.append(best[1])
    return tuple(chosen)


def nested_2d(tr: WinogradTransform) -> tuple[sp.Matrix, sp.Matrix, sp.Matrix]:
    """Return the 2-D algorithm's matrices as sympy objects.

    The nested 2-D algorithm is ``Y = AT [(G g Gᵀ) ⊙ (BT d B)] A``; this returns
    ``(AT, G, BT)`` so that callers can build it for symbolic ``d`` and ``g``.

    Args:
        tr: A 1-D transform.

    Returns:
        ``(AT, G, BT)`` sympy matrices.
    """
    return tr.sympy()


def check_tensor_identity(tr: WinogradTransform) -> bool:
    """Exact check of the bilinear identity ``Σ_l AT[j,l] G[l,k] BT[l,i] = [i == j + k]``.

    This is the coefficient-wise form of ``AT((Gg) ⊙ (BT d)) = correlation(d, g)`` for
    symbolic ``d`` and ``g``, evaluated with exact rationals.

    Args:
        tr: A transform.

    Returns:
        True when the identity holds for every ``i, j, k``.
    """
    for j in range(tr.m):
        for k in range(tr.r):
            for i in range(tr.n):
                s = sum(
                    (tr.AT[j][lv] * tr.G[lv][k] * tr.BT[lv][i] for lv in range(tr.n)),
                    start=Fraction(0),
                )
                if s != (1 if i == j + k else 0):
                    return False
    return True


def prove_equivalence(tr: WinogradTransform, dims: int = 1) -> bool:
    """Symbolically prove that the Winograd algorithm equals direct correlation.

    Builds the algorithm on sympy symbols ``d`` and ``g``, expands, and checks that the
    difference to the direct correlation is exactly zero.

    Args:
        tr: A transform.
        dims: 1 for ``F(m, r)``, 2 for the nested ``F(m x m, r x r)``.

    Returns:
        True when every output's difference expands to 0.

    Raises:
        WinogradError: When ``dims`` is not 1 or 2 (a ``ValueError``).
    """
    AT, G, BT = tr.sympy()
    n, m, r = tr.n, tr.m, tr.r
    if dims == 1:
        d = sp.Matrix(sp.symbols(f"d0:{n}"))
        g = sp.Matrix(sp.symbols(f"g0:{r}"))
        y = AT * (G * g).multiply_elementwise(BT * d)
        direct = [sum(d[i + k] * g[k] for k in range(r)) for i in range(m)]
        return all(sp.expand(y[i] - direct[i]) == 0 for i in range(m))
    if dims == 2:
        d = sp.Matrix(n, n, lambda i, j: sp.Symbol(f"d{i}_{j}"))
        g = sp.Matrix(r, r, lambda i, j: sp.Symbol(f"g{i}_{j}"))
        Y = AT * (G * g * G.T).multiply_elementwise(BT * d * BT.T) * AT.T
        for i in range(m):
            for j in range(m):
                direct = sum(d[i + a, j + b] * g[a, b] for a in range(r) for b in range(r))
                if sp.expand(Y[i, j] - direct) != 0:
                    return False
        return True
    raise WinogradError(f"prove_equivalence: dims must be 1 or 2, got {dims!r}")
