"""Dominators and natural loops of hpcnb.commprof.binary, checked on random and small CFGs."""

from __future__ import annotations

import random

import pytest

from hpcnb.commprof.binary import _dominators, _natural_loops


def _random_cfg(seed: int) -> dict[int, list[int]]:
    """A random control-flow graph on blocks 0..n-1 with entry 0 (self-loops allowed)."""
    rng = random.Random(seed)
    n = rng.randint(1, 30)
    succ: dict[int, list[int]] = {v: [] for v in range(n)}
    for v in range(n):
        for _ in range(rng.choice([0, 1, 1, 2, 2, 2])):
            w = rng.randrange(n)
            if w not in succ[v]:
                succ[v].append(w)
    return succ


def _reverse_post_order(succ: dict[int, list[int]], entry: int) -> list[int]:
    order: list[int] = []
    seen = {entry}

    def visit(v: int) -> None:
        for w in succ[v]:
            if w not in seen:
                seen.add(w)
                visit(w)
        order.append(v)

    visit(entry)
    return order[::-1]


def _reachable(succ: dict[int, list[int]], entry: int, removed: int | None) -> set[int]:
    if entry == removed:
        return set()
    seen, work = {entry}, [entry]
    while work:
        for w in succ[work.pop()]:
            if w != removed and w not in seen:
                seen.add(w)
                work.append(w)
    return seen


def _by_definition(succ: dict[int, list[int]], order: list[int]) -> dict[int, set[int]]:
    """``d`` dominates ``v`` when ``v`` is ``d`` or unreachable once ``d`` is removed."""
    entry = order[0]
    dom: dict[int, set[int]] = {v: {v} for v in order}
    for d in order:
        cut = _reachable(succ, entry, d)
        for v in order:
            if v not in cut:
                dom[v].add(d)
    return dom


@pytest.mark.parametrize("seed", range(300))
def test_dominators_match_the_definition(seed):
    succ = _random_cfg(seed)
    order = _reverse_post_order(succ, 0)
    preds: dict[int, list[int]] = {v: [] for v in order}
    for v in order:
        for w in succ[v]:
            preds[w].append(v)
    assert _dominators(order, preds) == _by_definition(succ, order)


def test_random_cfgs_are_not_trivial():
    """Enough of the graphs have a block with a dominator other than the entry and itself."""
    deep = 0
    for seed in range(300):
        succ = _random_cfg(seed)
        order = _reverse_post_order(succ, 0)
        deep += any(len(d) > 2 for d in _by_definition(succ, order).values())
    assert deep > 100


def _insns(pattern: str) -> list[tuple[int, str, int]]:
    """Instructions at 0, 4, 8, ...; ``j<k>``/``b<k>`` jump (conditional/always) to insn k."""
    out: list[tuple[int, str, int]] = []
    for k, word in enumerate(pattern.split()):
        if word[0] in "jb":
            out.append((4 * k, "jne" if word[0] == "j" else "jmp", 4 * int(word[1:])))
        else:
            out.append((4 * k, word, -1))
    return out


def test_natural_loops_of_nested_loops():
    #        0    1   2   3   4   5   6   7
    code = _insns("mov mov mov j2 mov j1 mov ret")
    loops = _natural_loops(code, 0, 4 * len(code))
    assert sorted(loops) == [4, 8]
    assert loops[8] == ([(8, 12)], [12])  # inner: insns 2-3, latch at 3
    assert loops[4] == ([(4, 20)], [20])  # outer: insns 1-5, latch at 5


def test_backward_jump_that_is_not_a_back_edge_is_no_loop():
    # 0 jumps over the exit block (1-2) to 3, which jumps back to it: 1 does not
    # dominate 3, since 0 -> 3 misses it.
    code = _insns("j3 mov ret b1")
    assert _natural_loops(code, 0, 4 * len(code)) == {}
