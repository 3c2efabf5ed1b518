"""Straight-line programs for linear transforms and their optimisation.

A transform ``y = M x`` with exact rational ``M`` becomes a :class:`LinearProgram`: an
ordered list of definitions ``name = Σ_g c_g · (±v ± v ...)``, each a linear form over the
inputs and earlier definitions. Terms that share a constant magnitude are summed first and
multiplied once (*constant factoring*). The optimiser applies

* **even/odd pairing**: for a point pair ±a, rows ``y₊, y₋`` of ``G`` or ``BT`` become
  ``e ± o`` with ``e = (y₊ + y₋)/2``, ``o = (y₊ - y₋)/2`` (half the non-zeros each), and
  columns ``x₊, x₋`` of ``AT`` are replaced by ``x₊ ± x₋``;
* **common-subexpression extraction** of scaled pairs ``u + ρ v`` that occur in several
  rows (greedy, most frequent first);
* **evaluation-order search**: random tie-breaking and on/off choices of the steps above,
  keeping the cheapest program.

Costs count additions/subtractions and multiplications by constants other than ±1.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = [
    "Definition",
    "LinearProgram",
    "dense_cost",
    "naive_program",
    "optimise",
]

Form = dict[str, Fraction]


@dataclass(frozen=True)
class Definition:
    """One straight-line assignment ``target = Σ_g coef_g · (Σ sign · var)``.

    Attributes:
        target: Name being defined.
        groups: ``(coef, ((sign, var), ...))`` with ``coef > 0``; signs are ±1.
    """

    target: str
    groups: tuple[tuple[Fraction, tuple[tuple[int, str], ...]], ...]

    @property
    def cost(self) -> tuple[int, int]:
        """``(additions, multiplications)`` of this definition."""
        terms = sum(len(t) for _, t in self.groups)
        adds = max(terms - 1, 0)
        mults = sum(1 for c, _ in self.groups if c != 1)
        # an all-negative sum of unit-coefficient terms needs an explicit negation
        if mults == 0 and terms and all(s < 0 for _, t in self.groups for s, _ in t):
            adds += 1
        return adds, mults

    def form(self) -> Form:
        """Return the definition as a linear form over its variables."""
        out: Form = {}
        for c, terms in self.groups:
            for s, v in terms:
                out[v] = out.get(v, Fraction(0)) + s * c
        return out


def _group(form: Form, factor_constants: bool = True) -> tuple:
    """Group a linear form's terms by coefficient magnitude (or keep them separate)."""
    items = sorted((v, c) for v, c in form.items() if c != 0)
    if not factor_constants:
        return tuple((abs(c), ((1 if c > 0 else -1, v),)) for v, c in items)
    groups: dict[Fraction, list[tuple[int, str]]] = {}
    for v, c in items:
        groups.setdefault(abs(c), []).append((1 if c > 0 else -1, v))
    # flip a whole group's sign when that leaves it with more positive terms
    out = []
    for mag in sorted(groups):
        terms = groups[mag]
        out.append((mag, tuple(sorted(terms, key=lambda t: -t[0]))))
    return tuple(out)


@dataclass(frozen=True)
class LinearProgram:
    """A straight-line program computing ``outputs = M · inputs``.

    Attributes:
        inputs: Input variable names.
        definitions: Ordered assignments (each uses inputs and earlier targets).
        outputs: For each output, the name holding its value.
    """

    inputs: tuple[str, ...]
    definitions: tuple[Definition, ...]
    outputs: tuple[str, ...]

    @property
    def cost(self) -> tuple[int, int]:
        """Total ``(additions, multiplications)``."""
        a = m = 0
        for d in self.definitions:
            da, dm = d.cost
            a, m = a + da, m + dm
        return a, m

    @property
    def ops(self) -> int:
        """Additions plus multiplications."""
        return sum(self.cost)

    def matrix(self) -> list[list[Fraction]]:
        """Evaluate the program on unit vectors: the exact matrix it computes."""
        env: dict[str, Form] = {v: {v: Fraction(1)} for v in self.inputs}
        for d in self.definitions:
            acc: Form = {}
            for v, c in d.form().items():
                for u, cu in env[v].items():
                    acc[u] = acc.get(u, Fraction(0)) + c * cu
            env[d.target] = acc
        return [[env[o].get(v, Fraction(0)) for v in self.inputs] for o in self.outputs]

    def evaluate(self, values: dict[str, Any]) -> list[Any]:
        """Run the program on concrete or symbolic values (numbers, sympy symbols)."""
        env = dict(values)
        for d in self.definitions:
            total: Any = 0
            for c, terms in d.groups:
                part: Any = 0
                for s, v in terms:
                    part = part + s * env[v]
                total = total + (part if c == 1 else c * part)
            env[d.target] = total
        return [env[o] for o in self.outputs]


def dense_cost(M: list[list[Fraction]] | tuple) -> tuple[int, int]:
    """Cost of the literal dense matrix-vector product: ``rows·(k-1)`` adds, ``rows·k`` mults."""
    rows, k = len(M), len(M[0])
    return rows * (k - 1), rows * k


def _rows_to_forms(M, inputs: tuple[str, ...]) -> list[Form]:
    return [{v: Fraction(c) for v, c in zip(inputs, row, strict=True) if c != 0} for row in M]


def naive_program(M, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> LinearProgram:
    """Row-by-row program skipping zeros and multiplications by ±1 (no factoring).

    Args:
        M: Rational matrix (rows are outputs).
        inputs: Input names.
        outputs: Output names.

    Returns:
        The program.
    """
    defs = tuple(
        Definition(o, _group(f, factor_constants=False))
        for o, f in zip(outputs, _rows_to_forms(M, inputs), strict=True)
    )
    return LinearProgram(inputs, defs, outputs)


class _Builder:
    """Mutable state of one optimisation run."""

    def __init__(self, M, inputs: tuple[str, ...], outputs: tuple[str, ...], prefix: str):
        self.inputs = inputs
        self.outputs = outputs
        self.work: dict[str, Form] = dict(zip(outputs, _rows_to_forms(M, inputs), strict=True))
        self.pre: list[tuple[str, Form]] = []  # temporaries, in order
        self.post: list[tuple[str, Form]] = []  # definitions after the work rows
        self.prefix = prefix
        self.counter = 0

    def fresh(self) -> str:
        self.counter += 1
        return f"{self.prefix}{self.counter}"

    def pair_rows(self, a: str, b: str) -> None:
        """Even/odd split of two work rows if it reduces their non-zeros."""
        fa, fb = self.work[a], self.work[b]
        keys = set(fa) | set(fb)
        half = Fraction(1, 2)
        e = {k: half * (fa.get(k, 0) + fb.get(k, 0)) for k in keys}
        o = {k: half * (fa.get(k, 0) - fb.get(k, 0)) for k in keys}
        e = {k: v for k, v in e.items() if v != 0}
        o = {k: v for k, v in o.items() if v != 0}
        if not e or not o or len(e) + len(o) + 2 >= len(fa) + len(fb):
            return
        ne, no = self.fresh(), self.fresh()
        del self.work[a], self.work[b]
        self.work[ne], self.work[no] = e, o
        self.post.append((a, {ne: Fraction(1), no: Fraction(1)}))
        self.post.append((b, {ne: Fraction(1), no: Fraction(-1)}))

    def pair_columns(self, u: str, v: str) -> None:
        """Replace inputs ``u, v`` by ``u + v`` and ``u - v`` where that saves terms."""
        before = sum((u in f) + (v in f) for f in self.work.values())
        new_forms = {}
        s, d = self.fresh(), self.fresh()
        after = 0
        for name, f in self.work.items():
            cu, cv = f.get(u, Fraction(0)), f.get(v, Fraction(0))
            g = {k: c for k, c in f.items() if k not in (u, v)}
            cs, cd = (cu + cv) / 2, (cu - cv) / 2
            if cs:
                g[s] = cs
            if cd:
                g[d] = cd
            after += (cs != 0) + (cd != 0)
            new_forms[name] = g
        if after + 2 >= before:
            return
        self.pre.append((s, {u: Fraction(1), v: Fraction(1)}))
        self.pre.append((d, {u: Fraction(1), v: Fraction(-1)}))
        self.work = new_forms

    def extract_pairs(self, rng: random.Random | None) -> None:
        """Greedy extraction of scaled pairs ``u + ρ v`` shared by several rows."""
        while True:
            counts: Counter = Counter()
            for f in self.work.values():
                names = sorted(f)
                for i, u in enumerate(names):
                    for v in names[i + 1 :]:
                        counts[(u, v, f[v] / f[u])] += 1
            if not counts:
                return
            top = max(counts.values())
            if top < 2:
                return
            # a randomised order may also take a slightly less frequent pair
            floor = max(2, top - (rng.random() < 0.3)) if rng else top
            cands = [k for k, c in counts.items() if c >= floor]
            unit = [k for k in cands if abs(k[2]) == 1]
            if not rng or rng.random() < 0.7:
                cands = unit or cands
            key = rng.choice(sorted(cands)) if rng else min(cands)
            u, v, rho = key
            t = self.fresh()
            self.pre.append((t, {u: Fraction(1), v: rho}))
            for f in self.work.values():
                if u in f and v in f and f[v] / f[u] == rho:
                    cu = f.pop(u)
                    f.pop(v)
                    f[t] = cu

    def program(self, factor_constants: bool) -> LinearProgram:
        defs = [Definition(n, _group(f, factor_constants)) for n, f in self.pre]
        defs += [Definition(n, _group(f, factor_constants)) for n, f in self.work.items()]
        defs += [Definition(n, _group(f, factor_constants)) for n, f in self.post]
        # outputs that are plain copies of an input or another name need no definition
        alias: dict[str, str] = {}
        kept = []
        for d in defs:
            f = d.form()
            if len(f) == 1 and next(iter(f.values())) == 1 and d.target not in self.outputs:
                src = next(iter(f))
                alias[d.target] = alias.get(src, src)
                continue
            kept.append(d)
        final = []
        for d in kept:
            groups = tuple(
                (c, tuple((s, alias.get(v, v)) for s, v in terms)) for c, terms in d.groups
            )
            final.append(Definition(d.target, groups))
        return LinearProgram(self.inputs, tuple(final), self.outputs)


def optimise(
    M,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    *,
    row_pairs: tuple[tuple[int, int], ...] = (),
    col_pairs: tuple[tuple[int, int], ...] = (),
    pairing: bool = True,
    cse: bool = True,
    factor_constants: bool = True,
    search: int = 0,
    seed: int = 0,
    prefix: str = "t",
) -> LinearProgram:
    """Build an optimised straight-line program for ``outputs = M · inputs``.

    Args:
        M: Rational matrix (rows are outputs).
        inputs: Input names.
        outputs: Output names.
        row_pairs: Index pairs of rows belonging to points ±a (even/odd split of outputs).
        col_pairs: Index pairs of columns belonging to points ±a (input sums/differences).
        pairing: Apply the even/odd pairing.
        cse: Extract common scaled pairs.
        factor_constants: Multiply terms of equal magnitude once.
        search: Number of extra randomised evaluation orders to try (0: deterministic).
        seed: Seed of the search.
        prefix: Prefix of temporary names.

    Returns:
        The cheapest program found; its :meth:`LinearProgram.matrix` equals ``M``.
    """
    rng = random.Random(seed)
    best: LinearProgram | None = None
    trials: list[tuple[bool, random.Random | None]] = [(pairing, None)]
    for _ in range(search):
        trials.append((pairing and rng.random() < 0.8, random.Random(rng.random())))
    for use_pairs, trial_rng in trials:
        b = _Builder(M, inputs, outputs, prefix)
        if use_pairs:
            cp = list(col_pairs)
            rp = list(row_pairs)
            if trial_rng:
                trial_rng.shuffle(cp)
                trial_rng.shuffle(rp)
            for i, j in cp:
                b.pair_columns(inputs[i], inputs[j])
            for i, j in rp:
                b.pair_rows(outputs[i], outputs[j])
        if cse:
            b.extract_pairs(trial_rng)
        prog = b.program(factor_constants)
        if best is None or prog.ops < best.ops:
            best = prog
    assert best is not None
    return best
