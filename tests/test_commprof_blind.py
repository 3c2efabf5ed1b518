"""Tests of the blind advice: evidence thresholds, the schedule what-if, scoring, capacity."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hpcnb.commprof import cases as C
from hpcnb.commprof.advice import AdviceThresholds, advise
from hpcnb.commprof.blind import (
    BLIND_KERNELS,
    blind_advice,
    blind_kernel,
    fix_variant,
    score_advice,
    words_of,
)
from hpcnb.commprof.instrument import Region, kernel
from hpcnb.commprof.locality import (
    LocalityConfig,
    RegionLocality,
    analyse_locality,
    cache_bytes,
    scaled_capacity,
)

CACHE = 32 << 20


def _blind(name: str, **kw: object):
    return blind_advice(BLIND_KERNELS[name], 16, 2, cache=CACHE, timed_size=256, **kw)


def _region(**kw: object) -> RegionLocality:
    base = dict(
        rid=0,
        accesses=1000,
        volume=0,
        pair_volume=np.zeros((2, 2), np.int64),
        hist=np.zeros((3, 40), np.int64),
        pair_near=np.zeros((2, 2), np.int64),
        near_fraction=1.0,
        false_sharing=0,
        locality_score=1.0,
        sharing={},
        sharing_degree=0.0,
        write_repeat=1.0,
        written_words=100,
        line_utilisation=1.0,
        imbalance=1.0,
        occupancy=1.0,
        staggered=False,
        writer_words=50.0,
    )
    base.update(kw)
    return RegionLocality(**base)  # type: ignore[arg-type]


def _rules(m: RegionLocality, th: AdviceThresholds | None = None) -> set[str]:
    return {a.rule for a in advise([Region(0, 1, -1, "kernel", "")], [m], 2, th)}


def test_a_kernel_without_a_locality_problem_fires_no_rule() -> None:
    r = _blind("clean_scale")
    assert r.rules == () and r.withdrawn == {}


def test_rules_stay_silent_below_their_evidence_thresholds() -> None:
    th = AdviceThresholds()
    few = _region(private_false_sharing=th.min_false_sharing - 1, accesses=100)
    assert "padding" not in _rules(few)
    assert "padding" in _rules(replace(few, private_false_sharing=th.min_false_sharing))
    shared_array = _region(false_sharing=400, private_false_sharing=0)
    assert "padding" not in _rules(shared_array)  # several writers per word: padding cannot help
    wave = _region(staggered=True, occupancy=0.5, volume=th.min_events - 1)
    assert "blocking" not in _rules(wave)
    assert "blocking" in _rules(replace(wave, volume=th.min_events))
    far = _region(volume=th.min_events - 1, near_fraction=0.0)
    assert "tiling" not in _rules(far)
    assert "tiling" in _rules(replace(far, volume=th.min_events))
    assert "schedule" not in _rules(_region(volume=th.min_events - 1, written_words=1))
    assert "schedule" in _rules(_region(volume=th.min_events, written_words=1))


def test_a_fired_rule_gives_its_numbers_and_line() -> None:
    (a,) = advise(
        [Region(0, 7, -1, "kernel", "")], [_region(false_sharing=400, private_false_sharing=400)], 2
    )
    assert (a.rule, a.line) == ("padding", 7) and "400" in a.evidence


def test_the_wavefront_is_staggered_and_half_idle_and_blocking_fires() -> None:
    bk = BLIND_KERNELS["needleman_wunsch"]
    args, nph = bk.variant.make(16, 2, 0)
    p = bk.variant.profile(args, nthreads=2, nphases=nph, trace=True)
    mets, _ = analyse_locality(p)
    busy = max(mets, key=lambda m: m.accesses)
    assert busy.staggered and busy.occupancy == pytest.approx(2 / 3)
    assert "blocking" in _blind("needleman_wunsch").rules
    jac, _ = analyse_locality(
        BLIND_KERNELS["jacobi"].variant.profile(
            *BLIND_KERNELS["jacobi"].variant.make(16, 2, 0)[:1], nthreads=2, nphases=4, trace=True
        )
    )
    assert not any(m.staggered for m in jac) and all(m.occupancy == 1.0 for m in jac)


def test_the_schedule_rule_stands_only_where_a_schedule_halves_the_events() -> None:
    cyc = _blind("jacobi_cyclic")
    assert "schedule" in cyc.rules and cyc.schedule_fix is not None
    assert cyc.schedule_fix.kind == "static"
    variant, text = fix_variant(BLIND_KERNELS["jacobi_cyclic"], cyc, "schedule")
    assert variant.schedule.kind == "static" and "static" in text
    radix = _blind("radix_sort")
    assert "schedule" not in radix.rules and "schedule" in radix.withdrawn
    assert "halves" in radix.withdrawn["schedule"]


def test_known_fixes_are_found_blind_and_every_fired_rule_has_a_fix() -> None:
    for bk in BLIND_KERNELS.values():
        r = _blind(bk.name)
        if bk.known:
            assert bk.known in r.rules, (bk.name, r.rules)
        for rule in r.rules:
            assert fix_variant(bk, r, rule) is not None, (bk.name, rule)


def test_the_padded_kmeans_gives_the_same_centroids() -> None:
    bk = BLIND_KERNELS["kmeans"]
    out = []
    for v in (bk.variant, bk.fix("padding").variant):
        args, nph = v.make(16, 2, 0)
        v.run_native(args, nthreads=2, nphases=nph)
        out.append(np.asarray(args[1]).copy())
    assert np.allclose(out[0], out[1])


def test_scores_count_confirmed_rules_and_found_fixes() -> None:
    fired = [("a", "padding", 1.5), ("b", "layout", 1.05), ("c", "tiling", None)]
    precision, recall = score_advice(fired, [("a", "padding"), ("d", "schedule")])
    assert precision.value == pytest.approx(1 / 3) and precision.n == 3
    assert recall.value == pytest.approx(1 / 2) and recall.n == 2
    assert precision.low <= precision.value <= precision.high
    with pytest.raises(ValueError, match="fired rules"):
        score_advice([], [("a", "padding")])


def test_capacity_scales_with_the_footprint_and_rejects_bad_sizes() -> None:
    assert scaled_capacity(8 << 20, 1000, 1000) == 1 << 20
    assert scaled_capacity(8 << 20, 1000, 4000) == 1 << 18
    assert scaled_capacity(8, 1, 10**6) == 1
    with pytest.raises(ValueError, match="positive"):
        scaled_capacity(0, 1, 1)
    size = cache_bytes()
    assert size is None or size > 0
    assert words_of([np.zeros(3), 2.0, np.zeros((2, 2))]) == 7


def test_bad_blind_input_is_named() -> None:
    with pytest.raises(ValueError, match="nthreads"):
        blind_advice(BLIND_KERNELS["jacobi"], 16, 0, cache=CACHE, timed_size=16)
    with pytest.raises(KeyError, match="no_such"):
        blind_kernel("no_such")
    with pytest.raises(ValueError, match="min_events"):
        AdviceThresholds(min_events=-1)
    assert LocalityConfig().capacity > 0 and C.clean_inputs(2, 2, 0)[1] == 1


def _need_valgrind() -> None:
    from hpcnb.commprof.valgrind import missing_tools

    if missing_tools():
        pytest.skip(f"{', '.join(missing_tools())} not installed (apt-get install valgrind gcc)")


def test_the_c_kernel_profile_numbers_workers_from_zero_in_one_phase() -> None:
    _need_valgrind()
    from hpcnb.commprof.csuite import kernel_profile
    from hpcnb.commprof.suite import SUITE

    args, nph = SUITE["jacobi"].make(12, 2, 0)
    p = kernel_profile("jacobi", args, nph, 2)
    assert p.nthreads == 2 and set(np.unique(p.trace[:, 0])) == {0, 1}
    assert set(np.unique(p.trace[:, 5])) == {0}
    assert p.exact.sum() > 0


def test_blind_advice_on_the_c_suite_finds_the_padding_of_kmeans_only() -> None:
    _need_valgrind()
    from hpcnb.commprof.blind import blind_c_advice, c_fix

    km = blind_c_advice("kmeans", 16, 2, cache=CACHE, timed_size=256)
    assert km.kernel == "kmeans.c" and "padding" in km.rules
    assert blind_c_advice("jacobi", 16, 2, cache=CACHE, timed_size=256).rules == ()
    make, defines, _ = c_fix("kmeans", "padding")
    assert defines == () and np.shape(make(4, 2, 0)[0][2])[1] > 4  # padded rows per thread
    assert c_fix("lu", "padding")[1] == ("-DCS_ALIGN",)
    assert c_fix("radix_sort", "schedule") is None


@kernel
def cyclic_rows(tid, nthreads, phase, a):
    """Rows dealt cyclically; rows whose length is not a whole number of lines share lines.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase.
        a: The rows, each incremented by the thread that owns it.
    """
    for i in range(tid, a.shape[0], nthreads):
        for j in range(a.shape[1]):
            a[i, j] = a[i, j] + 1.0


def test_padding_on_block_boundaries_is_withdrawn_when_the_input_doubles() -> None:
    from hpcnb.commprof import profile
    from hpcnb.commprof.blind import FADE, _judge

    def profile_at(n: int):
        a = np.zeros((64, 2 * n + 1))  # odd row lengths: row ends share lines with the next row
        return profile(cyclic_rows, [a], nthreads=2, trace=True), a.size

    p, _ = profile_at(2)
    mets, _ = analyse_locality(p)
    assert "padding" in {a.rule for a in advise(p.regions, mets, 2)}  # at the profiled size
    advice, withdrawn, _ = _judge(profile_at, 2, 10**6, CACHE, 64, None)
    assert 0 < FADE < 1
    assert "padding" not in {a.rule for a in advice}
    assert "doubles" in withdrawn["padding"]
