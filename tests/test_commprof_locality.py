"""Tests of hpcnb.commprof locality metrics and advice (issue: notebook 07)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcnb import commprof
from hpcnb.commprof import cases as C
from hpcnb.commprof.advice import RULES, AdviceThresholds, advise, format_advice
from hpcnb.commprof.instrument import Region
from hpcnb.commprof.locality import (
    LocalityConfig,
    analyse_locality,
    brute_force_distances,
    communication_distances,
    interleave,
)
from hpcnb.commprof.runtime import MemoryConfig, Profile


def _random_profile(seed: int, n: int = 400, T: int = 4, words: int = 30) -> Profile:
    rng = np.random.default_rng(seed)
    tr = np.zeros((n, 6), np.int64)
    tr[:, 0] = rng.integers(0, T, n)
    tr[:, 2] = rng.integers(0, words, n)
    tr[:, 3] = 0x10000 + 8 * tr[:, 2]
    tr[:, 4] = rng.random(n) < 0.3
    regions = [Region(0, 1, -1, "kernel", "k")]
    z = np.zeros((1, T, T), np.int64)
    return Profile(
        "random", regions, T, z, z, None, np.zeros((1, 2), np.int64), tr, words, [8], MemoryConfig()
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reuse_distances_equal_brute_force_on_random_traces(seed: int) -> None:
    p = _random_profile(seed)
    fast = communication_distances(p)
    assert len(fast) > 10
    assert np.array_equal(fast, brute_force_distances(p))


def test_reuse_distances_on_a_kernel_trace() -> None:
    p, ok = commprof.profile_case("jacobi", 10, 3)
    assert ok
    assert np.array_equal(communication_distances(p), brute_force_distances(p))


def test_interleave_keeps_each_threads_order_and_phases() -> None:
    p = _random_profile(3)
    p.trace[:, 5] = np.arange(len(p.trace)) // 100  # four phases
    tr = interleave(p.trace, 2)
    assert sorted(map(tuple, tr.tolist())) == sorted(map(tuple, p.trace.tolist()))
    assert np.all(np.diff(tr[:, 5]) >= 0)
    for t in range(4):
        assert np.array_equal(tr[tr[:, 0] == t], p.trace[p.trace[:, 0] == t])


def _metrics(v: C.Variant, size: int = 24, T: int = 4, capacity: int = 32):
    args, nphases = v.make(size, T, 0)
    p = v.profile(args, nthreads=T, nphases=nphases, trace=True)
    mets, stats = analyse_locality(p, LocalityConfig(capacity=capacity))
    return p, mets, stats


def test_false_sharing_on_unpadded_kernel_and_not_on_padded_twin() -> None:
    cs = C.CASE_STUDIES["histogram"]
    _, before, stats = _metrics(cs.before)
    _, after, _ = _metrics(cs.after)
    assert sum(m.false_sharing for m in before) > 100
    assert sum(m.false_sharing for m in after) == 0
    assert stats["rate"] > 0 and stats["accesses"] > 0
    assert min(m.locality_score for m in before) < min(m.locality_score for m in after)


@pytest.mark.parametrize("name", [n for n in C.CASE_STUDIES if n != "sum"])
def test_each_rule_fires_on_its_designed_example(name: str) -> None:
    cs = C.CASE_STUDIES[name]
    p, mets, _ = _metrics(cs.before)
    fired = {a.rule for a in advise(p.regions, mets, p.nthreads)}
    assert cs.rule in fired, (name, fired)
    p2, mets2, _ = _metrics(cs.after)
    fired2 = {a.rule for a in advise(p2.regions, mets2, p2.nthreads)}
    assert cs.rule not in fired2, (name, fired2)


def test_a_running_sum_at_a_fixed_address_fires_neither_padding_nor_privatisation() -> None:
    p, mets, _ = _metrics(C.CASE_STUDIES["sum"].before)
    busy = max(mets, key=lambda m: m.accesses)
    assert busy.false_sharing > 100 and busy.writer_words == 1
    assert not {a.rule for a in advise(p.regions, mets, p.nthreads)} & {"padding", "privatisation"}
    _, hist, _ = _metrics(C.CASE_STUDIES["histogram"].before)
    assert max(m.writer_words for m in hist) == 4  # four bins per thread: no running value


def test_rules_stay_quiet_on_a_clean_kernel() -> None:
    x = np.random.default_rng(0).random(1024)
    p = commprof.profile(C.clean_scale, [x, np.zeros(1024)], nthreads=4, trace=True)
    mets, _ = analyse_locality(p, LocalityConfig(capacity=64))
    assert advise(p.regions, mets, 4) == []
    assert format_advice([]) == "no rule fired"
    assert {cs.rule for cs in C.CASE_STUDIES.values()} <= set(RULES)


def test_sharing_classes_and_imbalance() -> None:
    p, _ = commprof.profile_case("kmeans", 8, 4)
    mets, _ = analyse_locality(p)
    total = {k: sum(m.sharing[k] for m in mets) for k in mets[0].sharing}
    assert total["read-only"] > 0 and total["producer-consumer"] > 0
    root_like = max(mets, key=lambda m: m.volume)
    assert root_like.imbalance > 1.5  # the master takes part in every event
    assert all(m.hist.sum() == 3 * m.volume for m in mets)


def test_bad_line_size_is_rejected() -> None:
    p = _random_profile(0)
    with pytest.raises(ValueError, match="line_bytes"):
        analyse_locality(p, LocalityConfig(line_bytes=48))


def test_advice_thresholds_are_checked() -> None:
    with pytest.raises(ValueError, match="near"):
        AdviceThresholds(near=1.5)
    with pytest.raises(ValueError, match="repeat"):
        AdviceThresholds(repeat=0)
