"""Tests of the sampling mode of the Numba profiler (hpcnb.commprof.sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcnb.commprof import MemoryConfig, inclusive, profile
from hpcnb.commprof.hooks import _FIB
from hpcnb.commprof.instrument import kernel
from hpcnb.commprof.runtime import _word_sample
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


@kernel
def _touch(tid, nthreads, phase, a, idx):
    for _r in range(4):
        a[idx] = a[idx] + 1.0


def _sampled(e: int, k: int) -> bool:
    return int((np.uint64(e) * _FIB) >> np.uint64(32)) < (1 << 32) // k


def test_sampled_hooks_skip_unsampled_words_before_any_other_work() -> None:
    k = 16
    out = _touch.compiled().__name__  # the kernel module has a sampled variant
    assert out and "_cp_t = _cp_P[0]" in _touch._module_source
    unsampled = next(e for e in range(64) if not _sampled(e, k))
    sampled = next(e for e in range(64) if _sampled(e, k))
    for idx, rows in ((unsampled, 0), (sampled, 2 * 4 * 2)):
        a = np.zeros(64)
        p = profile(_touch, [a, idx], nthreads=2, memory=MemoryConfig(sample_every=k), trace=True)
        assert a[idx] == 8.0  # the kernel's own work is done either way
        assert p.trace is not None and len(p.trace) == rows
        assert p.accesses.sum() == rows
        assert (p.trace[:, 2] == idx).all()
        assert p.exact.sum() == (rows > 0)  # thread 1 reads thread 0's last write once


def test_compact_shadow_ids_are_injective_and_small() -> None:
    for n, k in ((1, 2), (7, 2), (1000, 3), (12345, 16), (200_003, 16), (1 << 20, 64)):
        P, size = _word_sample(k, np.zeros(1, np.int64), n, compact=True)
        h = np.arange(n, dtype=np.uint64) * _FIB
        keep = h < P[0]
        ids = ((h[keep] >> np.uint64(32)) * P[1]) >> np.uint64(32)
        if P[1] == 0:  # indexed by the element itself
            ids = np.flatnonzero(keep)
        assert np.unique(ids).size == keep.sum()  # one shadow entry per sampled word
        assert ids.size == 0 or int(ids.max()) < size
        assert (size <= 3 * n // k + 1 and size < n) or (P[1] == 0 and size == n)
        assert P[1] > 0 or k <= 3 or n < 8
    P, size = _word_sample(16, np.zeros(1, np.int64), 5000, compact=False)
    assert P[1] == 0 and size == 5000


@pytest.mark.parametrize("name", ["lu", "kmeans", "fft"])
def test_compact_and_full_shadow_give_the_same_sampled_profile(name: str) -> None:
    mem = MemoryConfig(sample_every=8)
    with_trace = _run(name, mem, trace=True)  # full-size shadow (the trace keeps elements)
    compact = _run(name, mem)
    assert np.array_equal(with_trace.exact, compact.exact)
    assert np.array_equal(with_trace.exact_bytes, compact.exact_bytes)
    assert np.array_equal(with_trace.accesses, compact.accesses)
    assert 0 < compact.accesses.sum() < _run(name).accesses.sum()
