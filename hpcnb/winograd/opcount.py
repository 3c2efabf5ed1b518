"""Operation counts of Winograd transforms: naive matrix products vs optimised programs.

Levels, each counted as additions + multiplications by constants other than ±1:

* ``dense``: the literal matrix-vector product (every entry multiplied and summed);
* ``naive``: the matrix product skipping zeros and unit multiplications;
* ``sympy_cse``: ``sympy.cse`` on the expanded rows;
* ``paired``: even/odd pairing of ±a points, constant factoring and greedy common
  scaled-pair extraction, in one fixed order;
* ``searched``: the best of ``paired`` and many randomised evaluation orders.

The whole 2-D algorithm ``F(m x m, r x r)`` per output (one input/output channel pair)
applies the 1-D input transform ``2n`` times, the output transform ``n + m`` times and
does ``n²`` element-wise products; the filter transform (``r + n`` applications) is done
once per filter and reported separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import sympy as sp

from hpcnb.winograd.config import WinogradError
from hpcnb.winograd.slp import LinearProgram, dense_cost, naive_program, optimise
from hpcnb.winograd.transforms import Matrix, WinogradTransform, cook_toom

__all__ = [
    "LEVELS",
    "TransformPrograms",
    "op_count_row",
    "op_count_table",
    "point_pairs",
    "search_row_scaling",
    "sympy_cse_cost",
    "transform_programs",
]

LEVELS: tuple[str, ...] = ("dense", "naive", "sympy_cse", "paired", "searched")


def point_pairs(tr: WinogradTransform) -> tuple[tuple[int, int], ...]:
    """Index pairs ``(i, j)`` with ``points[i] == -points[j] != 0``."""
    pts = tr.points
    out = []
    for i, p in enumerate(pts):
        if p > 0 and -p in pts:
            out.append((i, pts.index(-p)))
    return tuple(out)


def _sympy_count(expr: sp.Expr) -> tuple[int, int]:
    """(adds, mults) of a linear sympy expression; ±1 coefficients are free."""
    if expr.is_Symbol or expr.is_Number:
        return 0, 0
    if expr.is_Add:
        a, m = len(expr.args) - 1, 0
        for arg in expr.args:
            da, dm = _sympy_count(arg)
            a, m = a + da, m + dm
        return a, m
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        a, m = _sympy_count(rest)
        if abs(coeff) != 1:
            m += 1
        return a, m
    raise WinogradError(f"unexpected non-linear expression {expr}")


def sympy_cse_cost(M) -> tuple[int, int]:
    """Cost of the rows of ``M`` after ``sympy.cse`` (exact-coefficient subexpressions).

    Args:
        M: Rational matrix.

    Returns:
        ``(additions, multiplications)``.
    """
    x = sp.symbols(f"x0:{len(M[0])}")
    rows = [
        sum(
            (sp.Rational(c.numerator, c.denominator) * xi for c, xi in zip(row, x, strict=True)),
            start=sp.Integer(0),
        )
        for row in M
    ]
    subs, reduced = sp.cse(rows)
    a = m = 0
    for expr in [e for _, e in subs] + list(reduced):
        da, dm = _sympy_count(expr)
        a, m = a + da, m + dm
    return a, m


@dataclass(frozen=True)
class TransformPrograms:
    """Optimised straight-line programs of the three 1-D transforms of one ``F(m, r)``.

    Attributes:
        transform: The exact transform.
        input: Program for ``BT`` (n inputs ``x*`` -> n outputs ``y*``).
        kernel: Program for ``G`` (r -> n).
        output: Program for ``AT`` (n -> m).
    """

    transform: WinogradTransform
    input: LinearProgram
    kernel: LinearProgram
    output: LinearProgram


def _names(prefix: str, k: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(k))


@lru_cache(maxsize=256)
def transform_programs(
    m: int, r: int, points: str | tuple = "default", level: str = "searched", search: int = 200
) -> TransformPrograms:
    """Build the straight-line programs of ``F(m, r)`` at one optimisation level.

    Args:
        m: Outputs per tile.
        r: Filter size.
        points: Point set (see :func:`~hpcnb.winograd.transforms.cook_toom`).
        level: ``"naive"``, ``"paired"`` or ``"searched"``.
        search: Randomised evaluation orders tried at level ``"searched"``.

    Returns:
        The three programs; each computes its matrix exactly.

    Raises:
        WinogradError: For an unknown level (a ``ValueError``).
    """
    tr = cook_toom(m, r, points)
    n = tr.n
    pairs = point_pairs(tr)
    if level == "searched":
        tr = search_row_scaling(tr)
    # matrix, inputs, outputs, row pairs, column pairs
    mats: dict[str, tuple[Matrix, int, int, tuple, tuple]] = {
        "input": (tr.BT, n, n, pairs, ()),
        "kernel": (tr.G, r, n, pairs, ()),
    }
    mats["output"] = (tr.AT, n, m, (), pairs)
    progs = {}
    for key, (M, k, rows, rp, cp) in mats.items():
        ins, outs = _names("x", k), _names("y", rows)
        if level == "naive":
            progs[key] = naive_program(M, ins, outs)
        elif level in ("paired", "searched"):
            progs[key] = optimise(
                M,
                ins,
                outs,
                row_pairs=rp,
                col_pairs=cp,
                search=search if level == "searched" else 0,
                seed=m * 100 + r,
            )
        else:
            raise WinogradError(
                f"transform_programs: level must be naive/paired/searched, got {level!r}"
            )
    return TransformPrograms(tr, progs["input"], progs["kernel"], progs["output"])


def _scaled(tr: WinogradTransform, scales: list[Fraction]) -> WinogradTransform:
    """Scale row l of ``BT`` by ``s_l`` and row l of ``G`` by ``1/s_l`` (same algorithm)."""
    BT = tuple(tuple(v * s for v in row) for row, s in zip(tr.BT, scales, strict=True))
    G = tuple(tuple(v / s for v in row) for row, s in zip(tr.G, scales, strict=True))
    return WinogradTransform(tr.m, tr.r, tr.points, tr.AT, G, BT)


@lru_cache(maxsize=256)
def search_row_scaling(tr: WinogradTransform) -> WinogradTransform:
    """Choose the scale of every ``BT`` row (compensated in ``G``) that minimises input ops.

    Scaling row ``l`` of ``BT`` by ``s`` and row ``l`` of ``G`` by ``1/s`` leaves the
    algorithm unchanged, but decides which coefficients are ±1 and so how many
    multiplications the input transform needs (Lavin's ``F(6,3)`` divides rows by 4 to get
    ``5.25`` and ``4.25``). Rows of a ±a pair share one scale so that the even/odd split
    still applies. Candidates are ``1/|c|`` for the coefficients ``c`` of the group's rows;
    a coordinate search keeps the cheapest program.

    Args:
        tr: A transform.

    Returns:
        The rescaled transform (exactly equivalent).
    """
    n = tr.n
    pairs = point_pairs(tr)
    paired = {i for p in pairs for i in p}
    groups = [list(p) for p in pairs] + [[i] for i in range(n) if i not in paired]
    scales = [Fraction(1)] * n
    names = _names("x", n), _names("y", n)

    def cost(sc: list[Fraction]) -> int:
        return optimise(_scaled(tr, sc).BT, *names, row_pairs=pairs).ops

    best = cost(scales)
    for group in groups:
        cands = {Fraction(1)} | {1 / abs(c) for i in group for c in tr.BT[i] if c != 0}
        for cand in sorted(cands):
            trial = list(scales)
            for i in group:
                trial[i] = cand
            c = cost(trial)
            if c < best:
                best, scales = c, trial
    return _scaled(tr, scales)


def _per_output(m: int, n: int, r: int, cin: int, cout: int, ck: int) -> tuple[float, float]:
    """Whole-algorithm ops per output (without / with the filter transform)."""
    algo = 2 * n * cin + (n + m) * cout + n * n
    return algo / (m * m), (algo + (r + n) * ck) / (m * m)


def op_count_row(m: int, r: int, points: str = "default", search: int = 200) -> dict:
    """Operation counts of ``F(m, r)`` at every level.

    Args:
        m: Outputs per tile.
        r: Filter size.
        points: Point set.
        search: Evaluation orders tried at the ``searched`` level.

    Returns:
        A flat dict: per level, ``<level>_<input|kernel|output>`` ops (adds + mults) of
        the 1-D transforms, ``<level>_adds``/``<level>_mults`` of the three together,
        ``<level>_per_output`` (2-D algorithm per output, filter transform excluded) and
        ``<level>_per_output_with_kernel``; plus ``direct_per_output`` (``2r² - 1``) and
        the reductions of ``searched`` vs ``dense`` and vs ``naive``.
    """
    tr = cook_toom(m, r, points)
    n = tr.n
    row: dict = {"F": f"F({m},{r})", "m": m, "r": r, "n": n}
    mats = {"input": tr.BT, "kernel": tr.G, "output": tr.AT}
    for level in LEVELS:
        costs: dict[str, tuple[int, int]] = {}
        if level == "dense":
            costs = {k: dense_cost(M) for k, M in mats.items()}
        elif level == "sympy_cse":
            costs = {k: sympy_cse_cost(M) for k, M in mats.items()}
        else:
            progs = transform_programs(m, r, points, level, search)
            costs = {k: getattr(progs, k).cost for k in mats}
        for k, (a, mu) in costs.items():
            row[f"{level}_{k}"] = a + mu
        row[f"{level}_adds"] = sum(a for a, _ in costs.values())
        row[f"{level}_mults"] = sum(mu for _, mu in costs.values())
        c = {k: sum(v) for k, v in costs.items()}
        po, pk = _per_output(m, n, r, c["input"], c["output"], c["kernel"])
        row[f"{level}_per_output"] = po
        row[f"{level}_per_output_with_kernel"] = pk
    row["direct_per_output"] = 2 * r * r - 1
    tot = {lv: sum(row[f"{lv}_{k}"] for k in mats) for lv in ("dense", "naive", "searched")}
    row["transform_reduction_vs_dense"] = 1 - tot["searched"] / tot["dense"]
    row["transform_reduction_vs_naive"] = 1 - tot["searched"] / tot["naive"]
    row["algorithm_reduction_vs_dense"] = 1 - row["searched_per_output"] / row["dense_per_output"]
    row["algorithm_reduction_vs_naive"] = 1 - row["searched_per_output"] / row["naive_per_output"]
    return row


def op_count_table(cases: tuple[tuple[int, int], ...], points: str = "default", search: int = 200):
    """Operation-count table over several ``F(m, r)`` (a pandas DataFrame, one row each).

    Args:
        cases: ``(m, r)`` pairs.
        points: Point set.
        search: Evaluation orders tried at the ``searched`` level.

    Returns:
        ``pandas.DataFrame`` with the columns of :func:`op_count_row`.
    """
    import pandas as pd

    return pd.DataFrame([op_count_row(m, r, points, search) for m, r in cases])
