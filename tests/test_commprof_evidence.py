"""Tests of the commprof pieces behind the claims of notebooks 07 and 08.

Held-out choice of the signature configuration, interleaved timing samples, the count of
improved case studies and the producing write of a communication event.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcnb import commprof
from hpcnb.commprof import cases as C
from hpcnb.commprof.locality import communication_distances, interleave, producing_write
from hpcnb.commprof.runtime import time_variant_samples, time_variants
from hpcnb.commprof.shadow import (
    choose_signature,
    held_out_f1,
    signature_slots,
    signature_sweep,
    split_kernels,
)
from hpcnb.commprof.suite import suite_case
from hpcnb.timing import Timing, ratios

NAMES = ["a", "b", "c", "d", "e", "f", "g"]


def test_split_is_disjoint_complete_seeded_and_keeps_order() -> None:
    tune, score = split_kernels(NAMES, 0.5, seed=3)
    assert set(tune) | set(score) == set(NAMES)
    assert not set(tune) & set(score)
    assert len(tune) == 4 and len(score) == 3
    assert list(tune) == [n for n in NAMES if n in tune]
    assert (tune, score) == split_kernels(NAMES, 0.5, seed=3)
    assert {split_kernels(NAMES, 0.5, seed=s) for s in range(6)} != {(tune, score)}
    assert split_kernels(["x", "y"], 0.9) in {(("x",), ("y",)), (("y",), ("x",))}


@pytest.mark.parametrize(
    ("names", "fraction"), [(["a"], 0.5), (["a", "a"], 0.5), (["a", "b"], 0.0), (["a", "b"], 1.0)]
)
def test_split_rejects_bad_input(names: list[str], fraction: float) -> None:
    with pytest.raises(ValueError):
        split_kernels(names, fraction)


def _rows() -> list[dict[str, float | str]]:
    """Tuning kernels a, b prefer (word, 0.25); scoring kernels c, d prefer (discopop, 0.5)."""
    f1 = {
        ("a", "word", 0.25): 1.0,
        ("b", "word", 0.25): 0.9,
        ("a", "discopop", 0.5): 0.5,
        ("b", "discopop", 0.5): 0.6,
        ("c", "word", 0.25): 0.7,
        ("d", "word", 0.25): 0.8,
        ("c", "discopop", 0.5): 1.0,
        ("d", "discopop", 0.5): 1.0,
    }
    rows = []
    for (k, h, s), v in f1.items():
        for frac, scale in ((0.125, 1.0), (1 / 64, 0.5)):
            rows.append(
                {"kernel": k, "hash": h, "read_share": s, "fraction": frac, "f1": v * scale}
            )
    return rows


def test_choice_uses_only_the_tuning_kernels_and_scores_the_rest() -> None:
    rows = _rows()
    choice = choose_signature(rows, ["a", "b"], 0.125)
    assert (choice.hash, choice.read_share) == ("word", 0.25)
    assert choice.tuned_on == ("a", "b")
    assert choice.tune_f1 == pytest.approx(0.95)
    score = held_out_f1(rows, choice, ["c", "d"])
    assert score.per_kernel == {"c": 0.7, "d": 0.8}
    assert score.mean == pytest.approx(0.75)
    assert score.low <= score.mean <= score.high
    assert score.low >= 0.7 and score.high <= 0.8
    assert score.n == 2
    assert score.estimate.interval == (score.low, score.high) and score.estimate.n == 2
    small = held_out_f1(rows, choice, ["c", "d"], 1 / 64)
    assert small.mean == pytest.approx(0.375)
    assert held_out_f1(rows, choice, ["c", "d"], seed=1).mean == score.mean
    # choosing on the scoring kernels would have picked the other configuration
    assert choose_signature(rows, ["c", "d"], 0.125).hash == "discopop"


def test_scoring_a_tuning_kernel_or_a_missing_row_is_an_error() -> None:
    rows = _rows()
    choice = choose_signature(rows, ["a", "b"], 0.125)
    with pytest.raises(ValueError, match="used to choose"):
        held_out_f1(rows, choice, ["a", "c"])
    with pytest.raises(ValueError, match="no sweep row"):
        held_out_f1(rows, choice, ["c"], 0.5)
    with pytest.raises(ValueError, match="no sweep rows"):
        choose_signature(rows, ["a", "zz"], 0.125)


def test_ties_prefer_smaller_memories_then_first_row() -> None:
    rows = [
        {"kernel": "a", "hash": "x", "read_share": 0.1, "fraction": 0.5, "f1": 1.0},
        {"kernel": "a", "hash": "y", "read_share": 0.1, "fraction": 0.5, "f1": 1.0},
        {"kernel": "a", "hash": "x", "read_share": 0.1, "fraction": 0.25, "f1": 0.5},
        {"kernel": "a", "hash": "y", "read_share": 0.1, "fraction": 0.25, "f1": 0.9},
        {"kernel": "a", "hash": "x", "read_share": 0.1, "fraction": 1.0, "f1": 1.0},
        {"kernel": "a", "hash": "y", "read_share": 0.1, "fraction": 1.0, "f1": 0.0},
    ]
    assert choose_signature(rows, ["a"], 0.5).hash == "y"
    assert choose_signature(rows[:2], ["a"], 0.5).hash == "x"


def test_choice_on_real_sweeps_is_scored_on_held_out_kernels() -> None:
    rows = []
    for name in ("jacobi", "transpose", "tree_reduction"):
        p, ok = commprof.profile_case(name, 12, 4)
        assert ok
        for r in signature_sweep(p, (1.0, 0.125), (0.25, 0.5), ("discopop", "word")):
            rows.append({"kernel": name, **r})
    tune, score = split_kernels(["jacobi", "transpose", "tree_reduction"], 0.5, seed=0)
    choice = choose_signature(rows, tune, 0.125)
    result = held_out_f1(rows, choice, score)
    assert set(result.per_kernel) == set(score)
    assert 0.0 <= result.low <= result.mean <= result.high <= 1.0
    assert held_out_f1(rows, choice, score, 1.0).mean > 0.99  # a full-size signature is exact


def test_signature_slots_are_odd_and_within_budget() -> None:
    for frac in (1.0, 0.125, 1 / 64):
        for share in (0.1, 0.5):
            sw, sr = signature_slots(10_000, frac, share)
            assert sw % 2 == 1 and sr % 2 == 1
            assert sw + sr <= max(3, int(frac * 10_000) + 1)
    with pytest.raises(ValueError):
        signature_slots(100, 0.5, 1.0)


def test_interleaved_variant_samples() -> None:
    c = suite_case("jacobi")
    make = lambda: c.make(12, 4, 0)[0]  # noqa: E731
    variants = ("native", "instrumented", "exact")
    t = time_variant_samples(c.kernel, make, nthreads=4, nphases=4, repeats=3, variants=variants)
    assert set(t) == {"native", "instrumented", "exact"}
    assert all(isinstance(v, Timing) and len(v.samples) == 3 for v in t.values())
    assert len(ratios(t["instrumented"], t["native"])) == 3
    medians = time_variants(c.kernel, make, nthreads=4, nphases=4, repeats=1, variants=("native",))
    assert set(medians) == {"native"} and medians["native"] > 0
    with pytest.raises(ValueError, match="unknown variants"):
        time_variant_samples(c.kernel, make, nthreads=4, nphases=4, variants=("gpu",))
    with pytest.raises(ValueError):
        time_variant_samples(c.kernel, make, nthreads=4, nphases=4, repeats=0)
    serial = ("native", "instrumented")
    cpu = time_variant_samples(
        c.kernel, make, nthreads=4, nphases=4, repeats=2, variants=serial, clock="cpu"
    )
    assert all(min(v.samples) >= 0 for v in cpu.values())
    with pytest.raises(ValueError, match="cpu clock"):
        time_variant_samples(c.kernel, make, nthreads=4, nphases=4, clock="cpu")
    with pytest.raises(ValueError, match="clock"):
        time_variant_samples(c.kernel, make, nthreads=4, nphases=4, clock="gpu")


def test_measure_case_returns_paired_timings() -> None:
    before, after, speedup = C.measure_case(C.CASE_STUDIES["sum"], 4, 2, repeats=2)
    assert len(before.samples) == len(after.samples) == 2
    assert speedup == pytest.approx(before.median / after.median)
    with pytest.raises(ValueError):
        C.measure_case(C.CASE_STUDIES["sum"], 4, 2, repeats=0)


def test_count_improved_needs_the_whole_interval_above_the_threshold() -> None:
    speedups = {
        "clear": [1.5, 1.6, 1.4, 1.55, 1.5],
        "none": [1.0, 0.98, 1.02, 1.0, 1.01],
        "straddles": [1.0, 1.3, 1.05, 1.25, 1.15],
        "untimed": [],
    }
    assert C.count_improved(speedups, 1.1) == 1
    assert C.count_improved(speedups, 0.9) == 3
    assert C.count_improved({"one": [1.2]}, 1.1) == 1


def test_producing_write_is_the_write_the_distance_starts_from() -> None:
    p, ok = commprof.profile_case("jacobi", 5, 2)
    assert ok
    tr = interleave(p.trace, 1)
    p.trace = tr
    for j, *_rest, d_all, _dp, _dc in communication_distances(p).tolist():
        i = producing_write(tr, j)
        assert i >= 0 and tr[i, 4] == 1 and tr[i, 0] != tr[j, 0]
        assert len(set(tr[i + 1 : j, 2].tolist()) - {int(tr[j, 2])}) == d_all
    first_read = int(np.flatnonzero(tr[:, 4] == 0)[0])
    assert producing_write(tr, first_read) == -1
    with pytest.raises(IndexError):
        producing_write(tr, len(tr))
