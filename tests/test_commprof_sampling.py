"""Tests of the sampling mode of the Numba profiler (hpcnb.commprof.sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcnb.commprof import MemoryConfig, inclusive, profile
from hpcnb.commprof.hooks import _FIB
from hpcnb.commprof.sampling import correlation, error_bound, scaled, sweep
from hpcnb.commprof.shadow import replay_exact
from hpcnb.commprof.suite import suite_case


def _run(name: str, memory: MemoryConfig | None = None, trace: bool = False):
    c = suite_case(name)
    args, nph = c.make(24, 4, 0)
    return profile(c.kernel, args, nthreads=4, nphases=nph, memory=memory, trace=trace)


def test_word_sample_is_exact_on_the_sampled_words() -> None:
    k = 4
    full = _run("jacobi", trace=True)
    sampled = _run("jacobi", MemoryConfig(sample_every=k))
    tr = full.trace
    h = (tr[:, 2].astype(np.uint64) * _FIB) >> np.uint64(32)
    keep = h < np.uint64((1 << 32) // k)
    assert 0 < keep.mean() < 0.5
    full.trace = tr[keep]
    assert np.array_equal(sampled.exact, replay_exact(full))  # same events, same cells
    assert sampled.accesses.sum() == keep.sum()


def test_scaled_estimate_is_close_and_keeps_the_pattern() -> None:
    (row,) = sweep(["transpose"], [4], size=32, nthreads=4)
    assert row.correlation > 0.9 and row.total_error < 0.2 and row.same_pattern
    assert row.coverage > 0.8 and row.overhead == ()


def test_period_one_is_the_full_profile_and_reads_mode_samples_reads() -> None:
    full = _run("lu")
    one = _run("lu", MemoryConfig(sample_every=1))
    assert np.array_equal(full.exact, one.exact)
    reads = _run("lu", MemoryConfig(sample_every=8, sample_mode="reads"))
    assert 0 < reads.accesses[:, 0].sum() < full.accesses[:, 0].sum()
    assert reads.accesses[:, 1].sum() == full.accesses[:, 1].sum()  # every write applied
    m = inclusive(reads.regions, reads.exact)[0]
    assert 0 < m.sum() < inclusive(full.regions, full.exact)[0].sum()


def test_helpers_and_bad_settings() -> None:
    assert scaled(np.array([1, 2]), 3).tolist() == [3, 6]
    assert error_bound(np.array([0.0]), 8)[0] == 0 and error_bound(np.array([9.0]), 1)[0] == 0
    assert correlation(np.eye(3), 2 * np.eye(3)) == pytest.approx(1.0)
    assert correlation(np.zeros(4), np.zeros(4)) == 1.0
    with pytest.raises(ValueError, match="sample_every"):
        MemoryConfig(sample_every=0)
    with pytest.raises(ValueError, match="sample_mode"):
        MemoryConfig(sample_every=2, sample_mode="time")
