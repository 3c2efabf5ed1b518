"""Tests of the signature memories: exactness at one slot per word, the false-positive
bound, budgets in slots per word and their bytes, held-out choice, and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hpcnb import commprof
from hpcnb.commprof import prange
from hpcnb.commprof.runtime import MemoryConfig, signature_bytes, slot_bytes
from hpcnb.commprof.shadow import (
    choose_signature,
    distinct_words,
    exact_table_bytes,
    false_positive_rate,
    held_out_f1,
    held_out_rows,
    replay_exact,
    replay_signature,
    replay_trace,
    signature_sweep_spw,
    split_kernels,
)
from hpcnb.commprof.signature import (
    SignatureSpec,
    default_specs,
    false_positive_bound,
    random_trace,
)
from hpcnb.commprof.suite import profile_case
from hpcnb.errors import InvalidInputError


@commprof.kernel
def shifted_blocks(tid, nthreads, phase, a, b):
    n = a.shape[0]
    for i in prange(0, n):
        if phase % 2 == 0:
            a[i] = b[(i + 3) % n] + 1.0
        else:
            b[i] = a[(i + 5) % n] * 0.5 + a[i] + a[0]


def _contiguous(nthreads: int = 8, n: int = 64) -> commprof.Profile:
    """Profile of a kernel whose words form one contiguous range (every word touched)."""
    a, b = np.arange(float(n)), np.zeros(n)
    p = commprof.profile(shifted_blocks, [a, b], nthreads=nthreads, nphases=4, trace=True)
    assert p.trace is not None and p.exact.sum() > 0
    words = np.unique(p.trace[:, 3]) >> 3
    assert words[-1] - words[0] + 1 == len(words) == 2 * n
    return p


@pytest.mark.parametrize("granule", [1, 2, 4])
@pytest.mark.parametrize("hash", ["modulo", "fibonacci"])
def test_one_slot_per_word_on_a_contiguous_range_is_exact(granule: int, hash: str) -> None:
    p = _contiguous()
    n = distinct_words(p)
    spec = SignatureSpec("granule", hash, 0.0, granule, pow2=False)
    sw, sr = spec.slots(n, 1.0)
    assert (sw, sr) == (n, 0)
    sig = replay_trace(p.trace, len(p.regions), p.nthreads, spec.memory(sw, sr))
    if hash == "modulo":  # consecutive granules in consecutive slots: no collision at all
        assert p.exact.sum() > 0 and np.array_equal(sig, p.exact)
    else:  # a hash collides, and a collision only loses events (full tags)
        assert np.all(sig <= p.exact)


def test_last_reader_mode_is_exact_at_one_slot_per_word() -> None:
    # 4 words x 32 threads do not fit 64 reader bits: the slot keeps the last reader, which
    # is exact when each thread's reads of a value come before the next thread's
    p = _contiguous(nthreads=32, n=128)
    n = distinct_words(p)
    m = replay_signature(p, n, design="granule", hash="modulo", granule=4)
    assert np.array_equal(m, replay_exact(p))


def test_power_of_two_table_equals_exact_when_the_words_fit() -> None:
    p = _contiguous()
    n = distinct_words(p)
    spec = SignatureSpec("granule", "modulo", 0.0, 4)  # power-of-two table (masks)
    sw, _ = spec.slots(n, 0.25)
    assert sw & (sw - 1) == 0 and sw <= 0.25 * n
    sig = replay_trace(p.trace, len(p.regions), p.nthreads, spec.memory(sw))
    if 4 * sw >= n:
        assert np.array_equal(sig, p.exact)
    assert np.all(sig <= p.exact)  # no false events with full tags


def test_online_run_matches_the_replay() -> None:
    for slots, hash in ((13, "modulo"), (16, "modulo"), (16, "fibonacci")):
        mem = MemoryConfig(write_slots=slots, hash=hash, design="granule", granule=4)
        a, b = np.arange(64.0), np.zeros(64)
        on = commprof.profile(shifted_blocks, [a, b], nthreads=8, nphases=4, memory=mem, trace=True)
        assert on.signature is not None and on.trace is not None
        assert np.array_equal(on.signature, replay_trace(on.trace, len(on.regions), 8, mem))
        assert 0 < on.signature.sum() < on.exact.sum()  # a quarter slot per word loses some


@pytest.mark.parametrize("nthreads", [4, 8])
def test_false_positive_rate_at_a_quarter_slot_matches_the_bound(nthreads: int) -> None:
    n = 1 << 16
    tr = random_trace(n, nthreads, seed=0)
    reads = int((tr[:, 4] == 0).sum())
    for tag_bits in (4, 6):
        spec = SignatureSpec("granule", "modulo", 0.0, 1, tag_bits)
        fp = false_positive_rate(tr, nthreads, spec.memory(*spec.slots(n, 0.25)))
        bound = false_positive_bound(0.25, tag_bits, nthreads, n)
        sigma = np.sqrt(bound / reads)
        assert fp <= bound + 3 * sigma  # an upper bound ...
        assert fp >= 0.9 * bound - 3 * sigma  # ... and a tight one
    full = SignatureSpec("granule", "modulo", 0.0, 1)  # 31-bit tags
    assert false_positive_bound(0.25, 31, nthreads, n) < 1e-9
    assert false_positive_rate(tr, nthreads, full.memory(*full.slots(n, 0.25))) == 0.0
    # DiscoPoP's untagged tables on the same trace: far more false events
    disco = SignatureSpec("discopop", "modulo", 0.25, 1)
    assert false_positive_rate(tr, nthreads, disco.memory(*disco.slots(n, 0.25))) > 0.1


def test_bound_grows_as_the_budget_shrinks() -> None:
    b = [false_positive_bound(s, 4, 8) for s in (1, 0.5, 0.25, 0.125, 0.0625)]
    assert all(x < y for x, y in itertools.pairwise(b))
    assert false_positive_bound(0.25, 0, 8) == pytest.approx(16 * false_positive_bound(0.25, 4, 8))


def test_spw_sweep_rows_and_byte_accounting() -> None:
    p = _contiguous()
    n = distinct_words(p)
    specs = [
        SignatureSpec("granule", "modulo", 0.0, 4),
        SignatureSpec("discopop", "discopop", 0.25),
    ]
    rows = signature_sweep_spw(p, specs, (1.0, 0.25))
    assert len(rows) == 4
    for r in rows:
        assert r["words"] == n
        assert r["exact_bytes"] == exact_table_bytes(n)
        assert r["bytes"] == r["slots"] * r["slot_bytes"]
        assert r["bytes_per_word"] == pytest.approx(float(r["bytes"]) / n)
        assert r["exact_bytes_per_word"] == pytest.approx(exact_table_bytes(n) / n)
        assert int(r["slots"]) <= max(3, float(r["spw"]) * n + 1)
    gran = [r for r in rows if r["design"] == "granule"]
    assert all(r["slot_bytes"] == 16 and r["precision"] == 1.0 for r in gran)
    assert gran[0]["f1"] == 1.0 and gran[0]["pattern"] == gran[0]["exact_pattern"]
    assert signature_bytes(100, 0, "granule", 4) == 1600 == 100 * slot_bytes("granule", 4)
    assert signature_bytes(7, 3) == 10 and slot_bytes("granule", 1) == 13
    assert exact_table_bytes(n) / n >= 34  # 17-byte entries at most half full


def test_held_out_choice_never_sees_the_scored_kernels() -> None:
    names = ["jacobi", "transpose", "tree_reduction", "pipeline"]
    rows = []
    for name in names:
        p, ok = profile_case(name, 12, 4)
        assert ok
        specs = default_specs(granules=(1, 4), read_shares=(0.25,))
        rows += [{"kernel": name, **r} for r in signature_sweep_spw(p, specs, (0.25,))]
    tune, score = split_kernels(names, 0.5, seed=0)
    choice = choose_signature(rows, tune, 0.25, by="spw")
    assert choice.tuned_on == tune and choice.by == "spw"
    # rewriting the scored kernels' rows cannot change the choice
    other = next(r for r in rows if not choice.matches(r))
    forged = [
        {**r, "f1": 1.0 if _same(r, other) else 0.0} if r["kernel"] in score else r for r in rows
    ]
    again = choose_signature(forged, tune, 0.25, by="spw")
    assert again.config == choice.config
    held = held_out_rows(rows, choice, score)
    assert list(held) == list(score) and all(choice.matches(r) for r in held.values())
    assert held_out_f1(rows, choice, score).per_kernel == {k: r["f1"] for k, r in held.items()}
    with pytest.raises(InvalidInputError, match="used to choose"):
        held_out_rows(rows, choice, [tune[0]])
    assert isinstance(choice.spec, SignatureSpec) and choice.spec.design == choice.design


def _same(a: dict, b: dict) -> bool:
    keys = ("design", "hash", "read_share", "granule", "tag_bits", "pow2")
    return all(a[k] == b[k] for k in keys)


def test_bad_input_names_what_was_wrong() -> None:
    p = _contiguous(nthreads=2, n=8)
    with pytest.raises(InvalidInputError, match="design"):
        MemoryConfig(write_slots=8, design="bloom")
    with pytest.raises(InvalidInputError, match="hash"):
        MemoryConfig(write_slots=8, hash="crc")
    with pytest.raises(InvalidInputError, match="hash 'discopop' for the granule design"):
        MemoryConfig(write_slots=8, design="granule", hash="discopop")
    with pytest.raises(InvalidInputError, match="granule=3"):
        MemoryConfig(write_slots=8, design="granule", hash="modulo", granule=3)
    with pytest.raises(InvalidInputError, match="tag_bits"):
        MemoryConfig(write_slots=8, design="granule", hash="modulo", tag_bits=40)
    with pytest.raises(InvalidInputError, match="read_slots"):
        MemoryConfig(write_slots=8, read_slots=4, design="granule", hash="modulo")
    with pytest.raises(InvalidInputError, match="slots"):
        MemoryConfig(write_slots=-1)
    with pytest.raises(InvalidInputError, match="slots must be >= 1"):
        replay_signature(p, 0, design="granule", hash="modulo")
    with pytest.raises(InvalidInputError, match="slots must be >= 1"):
        replay_signature(p, 0)
    with pytest.raises(InvalidInputError, match="hash"):
        replay_signature(p, 8, hash="nope")
    with pytest.raises(InvalidInputError, match="no signature memory"):
        replay_trace(p.trace, 1, 2, MemoryConfig())
    with pytest.raises(InvalidInputError, match="spw"):
        SignatureSpec().slots(10, 0.0)
    with pytest.raises(InvalidInputError, match="read_share"):
        SignatureSpec("discopop", "discopop", 0.0)
    with pytest.raises(InvalidInputError, match="design"):
        default_specs(("bloom",))
    with pytest.raises(InvalidInputError, match="tag_bits"):
        false_positive_bound(0.25, 32, 8)
    with pytest.raises(InvalidInputError, match="no reads"):
        false_positive_rate(random_trace(8, 2)[:8], 2, SignatureSpec().memory(4))
