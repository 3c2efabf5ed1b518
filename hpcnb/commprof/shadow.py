"""Shadow memories replayed over a recorded trace, and signature accuracy against exact.

The instrumented run can record its access trace (``profile(..., trace=True)``). Replaying
the trace through another memory configuration gives exactly the matrices an online run
with that configuration would give (the hooks and the replay share
:func:`hpcnb.commprof.hooks.record_access`),
so one run serves a whole sweep of signature sizes, read/write splits and hashes.

Two exact memories give identical matrices: the dense per-element shadow of the online
run (it relies on knowing the kernel's array layout) and :func:`replay_exact_table`, an
open-addressing hash table keyed by byte address, the kind of exact shadow a profiler
needs for arbitrary addresses (DiscoPoP's "perfect signature" is a hash map). Its size,
``HASH_ENTRY_BYTES`` per entry (8-byte key, 1-byte writer, 8-byte reader mask) times a
power-of-two capacity kept at most half full, is the reference the signature memory's
bytes are compared with.

Accuracy of detected communication against the exact memory is measured on event counts
per (region, writer, reader) cell: true positives ``TP = sum(min(exact, signature))``,
precision ``TP / sum(signature)``, recall ``TP / sum(exact)``, F1 their harmonic mean.

Choosing the signature's hash and read share is a tuning step, so it is done on some
kernels and scored on others (:func:`split_kernels`, :func:`choose_signature`,
:func:`held_out_f1`): a configuration picked on the very kernels it is scored on would
report its best case, not what a profiler shipped with that configuration gets on a new
program.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

import hpcnb.commprof.hooks as hooks
from hpcnb.commprof.runtime import Profile, make_state, signature_bytes
from hpcnb.errors import InvalidInputError, InvalidStateError
from hpcnb.stats import Estimate, mean_interval

__all__ = [
    "HASH_ENTRY_BYTES",
    "DetectionAccuracy",
    "HeldOutScore",
    "SignatureChoice",
    "detection_accuracy",
    "choose_signature",
    "exact_table_bytes",
    "held_out_f1",
    "replay_exact",
    "replay_exact_table",
    "replay_signature",
    "signature_slots",
    "signature_sweep",
    "split_kernels",
    "trace_events",
]


@njit(cache=True)
def _replay(S, trace, keys):
    """Feed a trace through ``record_access``; ``keys`` non-empty: hash-table exact shadow."""
    ctl = S[hooks.I_CTL]
    cap = keys.shape[0]
    mask = np.int64(cap - 1)
    used = 0
    for n in range(trace.shape[0]):
        ctl[hooks.CTL_TID] = trace[n, 0]
        ctl[hooks.CTL_REGION] = trace[n, 1]
        ctl[hooks.CTL_PHASE] = trace[n, 5]
        addr = trace[n, 3]
        e = trace[n, 2]
        if cap > 0:
            h = (np.uint64(addr) * hooks._FIB) >> np.uint64(20)
            e = np.int64(h & np.uint64(mask))
            while keys[e] != addr and keys[e] != -1:
                e = np.int64((e + 1) & mask)
            if keys[e] == -1:
                keys[e] = addr
                used += 1
        hooks.record_access(S, e, addr, 0, trace[n, 4] == 1)
    return used


@njit(cache=True)
def _replay_flags(S, trace):
    ctl = S[hooks.I_CTL]
    mex = S[hooks.I_MEX]
    flags = np.zeros(trace.shape[0], np.bool_)
    for n in range(trace.shape[0]):
        tid, region = trace[n, 0], trace[n, 1]
        ctl[hooks.CTL_TID] = tid
        ctl[hooks.CTL_REGION] = region
        before = mex[region, :, tid].sum()
        hooks.record_access(S, trace[n, 2], trace[n, 3], 0, trace[n, 4] == 1)
        flags[n] = mex[region, :, tid].sum() > before
    return flags


def trace_events(p: Profile) -> np.ndarray:
    """Boolean per trace row: True where the access is a communication event (exact)."""
    S = make_state(max(1, p.n_elements), 1, 1, len(p.regions), p.nthreads, hooks.FLAG_EXACT, 0, 1)
    return _replay_flags(S, _need_trace(p))


def _need_trace(p: Profile) -> np.ndarray:
    if p.trace is None:
        raise InvalidInputError(f"profile of {p.kernel} has no trace: run profile(..., trace=True)")
    return p.trace


def replay_exact(p: Profile) -> np.ndarray:
    """Exclusive event matrices ``[region, writer, reader]`` of the exact memory.

    Args:
        p: A profile with a trace.

    Raises:
        InvalidInputError: The profile has no trace.
    """
    S = make_state(max(1, p.n_elements), 1, 1, len(p.regions), p.nthreads, hooks.FLAG_EXACT, 0, 1)
    _replay(S, _need_trace(p), np.zeros(0, np.int64))
    return S[hooks.I_MEX]


#: Bytes per entry of the hash-table exact shadow (int64 key, int8 writer, uint64 mask).
HASH_ENTRY_BYTES = 17


def exact_table_bytes(n_addresses: int) -> int:
    """Bytes of the hash-table exact shadow holding ``n_addresses`` distinct addresses."""
    cap = 1
    while cap < 2 * max(1, n_addresses):
        cap *= 2
    return HASH_ENTRY_BYTES * cap


def replay_exact_table(p: Profile) -> tuple[np.ndarray, int]:
    """Replay through the hash-table exact shadow (open addressing, linear probing).

    Args:
        p: A profile with a trace.

    Returns:
        The exclusive event matrices (equal to :func:`replay_exact`) and the table's bytes.

    Raises:
        InvalidInputError: The profile has no trace.
        InvalidStateError: The table lost addresses (an internal error).
    """
    tr = _need_trace(p)
    n_addr = len(np.unique(tr[:, 3])) if len(tr) else 0
    nbytes = exact_table_bytes(n_addr)
    cap = nbytes // HASH_ENTRY_BYTES
    S = make_state(cap, 1, 1, len(p.regions), p.nthreads, hooks.FLAG_EXACT, 0, 1)
    used = _replay(S, tr, np.full(cap, -1, np.int64))
    if used != n_addr:
        raise InvalidStateError(f"hash shadow holds {used} addresses, trace has {n_addr}")
    return S[hooks.I_MEX], nbytes


def replay_signature(
    p: Profile, write_slots: int, read_slots: int | None = None, hash: str = "discopop"
) -> np.ndarray:
    """Exclusive event matrices detected by a signature memory of the given shape.

    Args:
        p: A profile recorded with ``trace=True``.
        write_slots: Slots of the write signature.
        read_slots: Slots of the read signature (``write_slots`` when ``None``).
        hash: Hash name (:data:`hpcnb.commprof.hooks.HASH_KINDS`).

    Raises:
        InvalidInputError: No trace, an unknown hash, or fewer than one slot.
    """
    if hash not in hooks.HASH_KINDS:
        raise InvalidInputError(f"hash {hash!r}: expected one of {sorted(hooks.HASH_KINDS)}")
    sr = write_slots if read_slots is None else read_slots
    if write_slots < 1 or sr < 1:
        raise InvalidInputError(f"slots must be >= 1, got write={write_slots}, read={sr}")
    S = make_state(
        1,
        int(write_slots),
        int(sr),
        len(p.regions),
        p.nthreads,
        hooks.FLAG_SIGNATURE,
        hooks.HASH_KINDS[hash],
        1,
    )
    _replay(S, _need_trace(p), np.zeros(0, np.int64))
    return S[hooks.I_MSG]


def signature_slots(exact_bytes: int, fraction: float, read_share: float) -> tuple[int, int]:
    """Write and read slots of a signature of ``fraction * exact_bytes`` bytes.

    ``read = share * budget`` and ``write = budget - read`` slots of one byte each, both
    made odd (the DiscoPoP hash of 8-byte-aligned addresses would otherwise use only part
    of an even-sized table).

    Args:
        exact_bytes: Bytes of the exact shadow memory.
        fraction: Share of those bytes the signature gets.
        read_share: Share of the signature's bytes given to the read table.

    Raises:
        InvalidInputError: ``fraction`` not positive or ``read_share`` not in (0, 1).
    """
    if fraction <= 0 or not 0 < read_share < 1:
        raise InvalidInputError(
            f"need fraction > 0 and 0 < read_share < 1, got {fraction}, {read_share}"
        )
    budget = int(fraction * exact_bytes)
    sr = max(1, int(read_share * budget) - 1) | 1
    sw = max(1, budget - sr - 1) | 1
    return sw, sr


@dataclass(frozen=True)
class DetectionAccuracy:
    """Precision, recall and F1 of detected against exact communication events."""

    precision: float
    recall: float
    f1: float


def detection_accuracy(exact: np.ndarray, detected: np.ndarray) -> DetectionAccuracy:
    """Compare event-count matrices cell by cell (see module docstring).

    Two empty matrices count as perfect agreement.

    Args:
        exact: Events of the exact memory, the reference.
        detected: Events detected by the signature memory, same shape.

    Raises:
        InvalidInputError: The shapes differ.
    """
    if exact.shape != detected.shape:
        raise InvalidInputError(f"shape mismatch: exact {exact.shape} vs detected {detected.shape}")
    tp = float(np.minimum(exact, detected).sum())
    se, sd = float(exact.sum()), float(detected.sum())
    if se == 0 and sd == 0:
        return DetectionAccuracy(1.0, 1.0, 1.0)
    p = tp / sd if sd else 0.0
    r = tp / se if se else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return DetectionAccuracy(p, r, f)


def signature_sweep(
    p: Profile,
    fractions: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125, 0.0625),
    read_shares: tuple[float, ...] = (0.1, 0.25, 0.5),
    hashes: tuple[str, ...] = ("discopop",),
) -> list[dict[str, float | int | str]]:
    """Accuracy of signature memories whose bytes are a fraction of the exact shadow's.

    The reference is the hash-table exact shadow (:func:`replay_exact_table`). For each
    byte budget ``fraction * exact bytes`` and share of it given to the read signature,
    ``read = share * budget`` and ``write = budget - read`` slots (one byte each), both
    made odd (:func:`signature_slots`).

    Args:
        p: A profile with a trace.
        fractions: Byte budgets as fractions of the exact shadow's bytes.
        read_shares: Shares of a budget given to the read signature.
        hashes: Hash functions (keys of ``hooks.HASH_KINDS``).

    Returns:
        One row per (hash, fraction, read share) with slot counts, bytes and accuracy.
    """
    ex, full = replay_exact_table(p)
    rows: list[dict[str, float | int | str]] = []
    for h in hashes:
        for frac in fractions:
            for share in read_shares:
                sw, sr = signature_slots(full, frac, share)
                acc = detection_accuracy(ex, replay_signature(p, sw, sr, h))
                rows.append(
                    {
                        "hash": h,
                        "fraction": frac,
                        "read_share": share,
                        "write_slots": sw,
                        "read_slots": sr,
                        "exact_bytes": full,
                        "bytes": signature_bytes(sw, sr),
                        "precision": acc.precision,
                        "recall": acc.recall,
                        "f1": acc.f1,
                    }
                )
    return rows


Row = Mapping[str, float | int | str]


def split_kernels(
    names: Sequence[str], tune_fraction: float = 0.5, seed: int = 0
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split kernels into a tuning set and a scoring set (seeded, disjoint, both non-empty).

    Args:
        names: Kernel names (at least two, distinct).
        tune_fraction: Share of the kernels used for tuning (rounded, at least one kernel
            on each side).
        seed: Seed of the permutation.

    Returns:
        ``(tune, score)``, each in the order of ``names``.

    Raises:
        InvalidInputError: Fewer than two kernels, duplicates, or ``tune_fraction`` not in (0, 1).
    """
    names = list(names)
    if len(names) < 2 or len(set(names)) != len(names):
        raise InvalidInputError(f"need at least two distinct kernels to split, got {names}")
    if not 0 < tune_fraction < 1:
        raise InvalidInputError(f"tune_fraction must be in (0, 1), got {tune_fraction}")
    n_tune = min(len(names) - 1, max(1, round(tune_fraction * len(names))))
    perm = np.random.default_rng(seed).permutation(len(names))
    chosen = set(perm[:n_tune].tolist())
    tune = tuple(n for i, n in enumerate(names) if i in chosen)
    score = tuple(n for i, n in enumerate(names) if i not in chosen)
    return tune, score


@dataclass(frozen=True)
class SignatureChoice:
    """A signature configuration chosen on tuning kernels.

    Attributes:
        hash: Hash name.
        read_share: Share of the bytes given to the read signature.
        fraction: Byte budget (fraction of the exact shadow) it was chosen at.
        tuned_on: The kernels it was chosen on.
        tune_f1: Its mean F1 over those kernels at ``fraction``.
    """

    hash: str
    read_share: float
    fraction: float
    tuned_on: tuple[str, ...]
    tune_f1: float


def _rows_at(rows: Iterable[Row], kernels: Iterable[str], fraction: float | None) -> list[Row]:
    want = set(kernels)
    return [
        r
        for r in rows
        if r["kernel"] in want
        and (fraction is None or math.isclose(float(r["fraction"]), fraction))
    ]


def choose_signature(rows: Iterable[Row], tune: Sequence[str], fraction: float) -> SignatureChoice:
    """Pick the hash and read share with the best mean F1 over the tuning kernels only.

    Ties (several configurations at the same mean F1, e.g. all perfect) are broken by the
    mean F1 over every fraction in ``rows`` at or below ``fraction`` (smaller memories),
    then by the order of first appearance in ``rows``.

    Args:
        rows: Sweep rows (:func:`signature_sweep`), each with a ``kernel`` key added.
        tune: Kernels to tune on.
        fraction: Byte budget to choose at.

    Raises:
        InvalidInputError: No row of a tuning kernel at ``fraction``, or a tuning kernel
            without rows.
    """
    rows = list(rows)
    at = _rows_at(rows, tune, fraction)
    missing = set(tune) - {str(r["kernel"]) for r in at}
    if not at or missing:
        raise InvalidInputError(
            f"no sweep rows at fraction {fraction} for tuning kernels {sorted(missing)}"
        )
    below = [r for r in _rows_at(rows, tune, None) if float(r["fraction"]) <= fraction + 1e-12]
    configs: dict[tuple[str, float], tuple[list[float], list[float]]] = {}
    for r in at:
        configs.setdefault((str(r["hash"]), float(r["read_share"])), ([], []))[0].append(
            float(r["f1"])
        )
    for r in below:
        key = (str(r["hash"]), float(r["read_share"]))
        if key in configs:
            configs[key][1].append(float(r["f1"]))
    order = list(configs)
    best = max(
        order,
        key=lambda k: (np.mean(configs[k][0]), np.mean(configs[k][1]), -order.index(k)),
    )
    return SignatureChoice(
        best[0], best[1], fraction, tuple(tune), float(np.mean(configs[best][0]))
    )


@dataclass(frozen=True)
class HeldOutScore:
    """Mean F1 of one configuration on kernels it was not chosen on.

    Attributes:
        mean: Mean F1 over the scored kernels.
        low: Low end of a 95 % seeded bootstrap interval of the mean (kernels resampled).
        high: High end of that interval.
        per_kernel: Kernel -> F1.
    """

    mean: float
    low: float
    high: float
    per_kernel: dict[str, float]

    @property
    def n(self) -> int:
        """Number of scored kernels."""
        return len(self.per_kernel)

    @property
    def estimate(self) -> Estimate:
        """The mean F1 with its interval and ``n`` (for :func:`hpcnb.records.record`)."""
        return Estimate(self.mean, self.low, self.high, self.n)


def held_out_f1(
    rows: Iterable[Row],
    choice: SignatureChoice,
    kernels: Sequence[str],
    fraction: float | None = None,
    *,
    resamples: int = 10_000,
    seed: int = 0,
) -> HeldOutScore:
    """Score a chosen configuration on held-out kernels at a byte budget.

    Args:
        rows: Sweep rows with a ``kernel`` key.
        choice: The configuration (from :func:`choose_signature`).
        kernels: Kernels to score on; none of them may be one it was tuned on.
        fraction: Byte budget (default: the one it was chosen at).
        resamples: Bootstrap resamples of the kernels for the interval of the mean.
        seed: Seed of the bootstrap.

    Raises:
        InvalidInputError: A scored kernel was used for tuning, or has no row for the configuration.
    """
    leaked = set(kernels) & set(choice.tuned_on)
    if leaked:
        raise InvalidInputError(f"kernels {sorted(leaked)} were used to choose the configuration")
    frac = choice.fraction if fraction is None else fraction
    f1: dict[str, float] = {}
    for r in _rows_at(rows, kernels, frac):
        if r["hash"] == choice.hash and math.isclose(float(r["read_share"]), choice.read_share):
            f1[str(r["kernel"])] = float(r["f1"])
    missing = [k for k in kernels if k not in f1]
    if missing or not kernels:
        raise InvalidInputError(
            f"no sweep row at fraction {frac} for {choice.hash}/{choice.read_share} "
            f"on kernels {missing}"
        )
    estimate = mean_interval([f1[k] for k in kernels], resamples=resamples, seed=seed)
    low, high = estimate.bounds
    return HeldOutScore(estimate.value, low, high, {k: f1[k] for k in kernels})
