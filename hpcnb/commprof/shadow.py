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

Budgets: :func:`signature_sweep` states them as fractions of the exact table's bytes
(DiscoPoP design only); :func:`signature_sweep_spw` as slots per distinct word (spw), for
every design of :mod:`hpcnb.commprof.signature`, with each row's bytes per slot and per
distinct word beside the exact table's.

Choosing the signature's configuration (design, hash, read share, granule) is a tuning
step, so it is done on some kernels and scored on others (:func:`split_kernels`,
:func:`choose_signature`, :func:`held_out_f1`, :func:`held_out_rows`): a configuration
picked on the very kernels it is scored on would report its best case, not what a profiler
shipped with that configuration gets on a new program.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

import hpcnb.commprof.hooks as hooks
from hpcnb.commprof.analysis import classify_pattern, inclusive
from hpcnb.commprof.runtime import MemoryConfig, Profile, make_state, signature_bytes
from hpcnb.commprof.signature import SPW_BUDGETS, SignatureSpec, default_specs, signature_slots
from hpcnb.errors import InvalidInputError, InvalidStateError
from hpcnb.stats import Estimate, mean_interval

__all__ = [
    "HASH_ENTRY_BYTES",
    "DetectionAccuracy",
    "HeldOutScore",
    "SignatureChoice",
    "detection_accuracy",
    "choose_signature",
    "distinct_words",
    "exact_table_bytes",
    "false_positive_rate",
    "held_out_f1",
    "held_out_rows",
    "replay_exact",
    "replay_exact_table",
    "replay_signature",
    "replay_trace",
    "signature_slots",
    "signature_sweep",
    "signature_sweep_spw",
    "split_kernels",
    "trace_events",
]


def trace_events(p: Profile) -> np.ndarray:
    """Boolean per trace row: True where the access is a communication event (exact)."""
    S = make_state(max(1, p.n_elements), 1, 1, len(p.regions), p.nthreads, hooks.FLAG_EXACT, 0, 1)
    return hooks.replay_flags(S, _need_trace(p))


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
    hooks.replay(S, _need_trace(p), np.zeros(0, np.int64))
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
    used = hooks.replay(S, tr, np.full(cap, -1, np.int64))
    if used != n_addr:
        raise InvalidStateError(f"hash shadow holds {used} addresses, trace has {n_addr}")
    return S[hooks.I_MEX], nbytes


def replay_trace(
    trace: np.ndarray, n_regions: int, nthreads: int, memory: MemoryConfig
) -> np.ndarray:
    """Exclusive event matrices of the signature memory ``memory`` over a raw trace.

    Args:
        trace: ``int64[n, 6]`` trace (columns :data:`hpcnb.commprof.hooks.TRACE_COLUMNS`).
        n_regions: Regions (region ids in the trace are below it).
        nthreads: Threads (thread ids in the trace are below it).
        memory: A configuration with a signature memory (its ``exact`` flag is ignored).

    Raises:
        InvalidInputError: ``memory`` has no signature memory.
    """
    if not memory.signature:
        raise InvalidInputError("memory has no signature memory: give it write_slots >= 1")
    S = _signature_state(memory, n_regions, nthreads, hooks.FLAG_SIGNATURE, 1)
    hooks.replay(S, np.ascontiguousarray(trace, np.int64), np.zeros(0, np.int64))
    return S[hooks.I_MSG]


def _signature_state(
    memory: MemoryConfig, R: int, T: int, flags: int, n_exact: int
) -> tuple[np.ndarray, ...]:
    return make_state(
        n_exact,
        memory.write_slots,
        memory.reads,
        R,
        T,
        flags,
        hooks.HASH_KINDS[memory.hash],
        1,
        memory=memory,
    )


def replay_signature(
    p: Profile,
    write_slots: int,
    read_slots: int | None = None,
    hash: str = "discopop",
    *,
    design: str = "discopop",
    granule: int = 1,
    tag_bits: int = hooks.MAX_TAG_BITS,
) -> np.ndarray:
    """Exclusive event matrices detected by a signature memory of the given shape.

    Args:
        p: A profile recorded with ``trace=True``.
        write_slots: Slots of the write signature (the granule design: all its slots).
        read_slots: Slots of the read signature (``write_slots`` when ``None``; the granule
            design takes ``None`` or 0).
        hash: Hash name (:data:`hpcnb.commprof.hooks.DESIGN_HASHES` of the design).
        design: ``"discopop"`` or ``"granule"`` (:mod:`hpcnb.commprof.signature`).
        granule: Granule design: words per slot.
        tag_bits: Granule design: tag bits per slot.

    Raises:
        InvalidInputError: No trace, an unknown design or hash, fewer than one slot, or a
            granule or tag width out of range.
    """
    if design == "granule":
        sr = 0 if read_slots is None else read_slots
    else:
        sr = write_slots if read_slots is None else read_slots
    if write_slots < 1 or (design != "granule" and sr < 1):
        raise InvalidInputError(f"slots must be >= 1, got write={write_slots}, read={sr}")
    memory = MemoryConfig(
        exact=False,
        write_slots=int(write_slots),
        read_slots=int(sr),
        hash=hash,
        design=design,
        granule=granule,
        tag_bits=tag_bits,
    )
    return replay_trace(_need_trace(p), len(p.regions), p.nthreads, memory)


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


def distinct_words(p: Profile) -> int:
    """Distinct addresses (words) in the profile's trace.

    Raises:
        InvalidInputError: The profile has no trace.
    """
    return len(np.unique(_need_trace(p)[:, 3]))


def signature_sweep_spw(
    p: Profile,
    specs: Sequence[SignatureSpec] | None = None,
    spws: Sequence[float] = SPW_BUDGETS,
) -> list[dict[str, float | int | str]]:
    """Accuracy of signature memories at budgets in slots per distinct word.

    For each spec (default: :func:`hpcnb.commprof.signature.default_specs`) and budget
    ``spw``, the signature gets ``spw * n`` slots (``n`` = :func:`distinct_words`,
    :meth:`SignatureSpec.slots`) and is scored against the hash-table exact shadow.

    Args:
        p: A profile with a trace.
        specs: Signature configurations.
        spws: Budgets in slots per distinct word.

    Returns:
        One row per (spec, spw): the spec's columns (:meth:`SignatureSpec.row`), ``label``,
        ``spw``, ``words``, ``write_slots``, ``read_slots``, ``slots``, ``slot_bytes``,
        ``bytes``, ``bytes_per_word``, ``exact_bytes``, ``exact_bytes_per_word``,
        ``precision``, ``recall``, ``f1``, ``pattern`` (whole-kernel pattern of the
        signature's matrix, :func:`hpcnb.commprof.analysis.classify_pattern`) and
        ``exact_pattern`` (the exact memory's).

    Raises:
        InvalidInputError: No trace, or an empty trace.
    """
    ex, full = replay_exact_table(p)
    n = distinct_words(p)
    if n == 0:
        raise InvalidInputError(f"profile of {p.kernel} has an empty trace")
    exact_pattern = classify_pattern(inclusive(p.regions, ex)[0])
    rows: list[dict[str, float | int | str]] = []
    for spec in default_specs() if specs is None else specs:
        for spw in spws:
            sw, sr = spec.slots(n, spw)
            m = replay_trace(_need_trace(p), len(p.regions), p.nthreads, spec.memory(sw, sr))
            acc = detection_accuracy(ex, m)
            nbytes = signature_bytes(sw, sr, spec.design, spec.granule)
            rows.append(
                {
                    **spec.row(),
                    "label": spec.label,
                    "spw": float(spw),
                    "words": n,
                    "write_slots": sw,
                    "read_slots": sr,
                    "slots": sw + sr,
                    "slot_bytes": spec.slot_bytes,
                    "bytes": nbytes,
                    "bytes_per_word": nbytes / n,
                    "exact_bytes": full,
                    "exact_bytes_per_word": full / n,
                    "precision": acc.precision,
                    "recall": acc.recall,
                    "f1": acc.f1,
                    "pattern": classify_pattern(inclusive(p.regions, m)[0]),
                    "exact_pattern": exact_pattern,
                }
            )
    return rows


def false_positive_rate(trace: np.ndarray, nthreads: int, memory: MemoryConfig) -> float:
    """False events of a signature memory per read of a trace.

    A read is a false positive when the signature reports an event there and the exact
    memory reports none, or one with another writer (the measured counterpart of
    :func:`hpcnb.commprof.signature.false_positive_bound`).

    Args:
        trace: ``int64[n, 6]`` trace whose element column indexes an exact shadow of
            ``max(element) + 1`` words (e.g. :func:`hpcnb.commprof.signature.random_trace`).
        nthreads: Threads.
        memory: A configuration with a signature memory.

    Raises:
        InvalidInputError: ``memory`` has no signature memory, or the trace has no reads.
    """
    if not memory.signature:
        raise InvalidInputError("memory has no signature memory: give it write_slots >= 1")
    trace = np.ascontiguousarray(trace, np.int64)
    reads = int((trace[:, 4] == 0).sum()) if len(trace) else 0
    if reads == 0:
        raise InvalidInputError("the trace has no reads")
    R = int(trace[:, 1].max()) + 1
    flags = hooks.FLAG_EXACT | hooks.FLAG_SIGNATURE
    S = _signature_state(memory, R, nthreads, flags, int(trace[:, 2].max()) + 1)
    who = hooks.replay_writers(S, trace)
    false = (who[:, 1] >= 0) & (who[:, 1] != who[:, 0])
    return float(false.sum()) / reads


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


#: Row columns that make up a signature configuration (those present in a row count).
CONFIG_KEYS = ("design", "hash", "read_share", "granule", "tag_bits", "pow2")


def _config(r: Row) -> tuple[tuple[str, str | float], ...]:
    return tuple(
        (k, str(r[k]) if k in ("design", "hash") else float(r[k])) for k in CONFIG_KEYS if k in r
    )


@dataclass(frozen=True)
class SignatureChoice:
    """A signature configuration chosen on tuning kernels.

    Attributes:
        hash: Hash name.
        read_share: Share of the slots given to the read signature (0: the granule design).
        fraction: Budget it was chosen at, in the unit of ``by``.
        tuned_on: The kernels it was chosen on.
        tune_f1: Its mean F1 over those kernels at ``fraction``.
        config: The configuration columns of its rows (:data:`CONFIG_KEYS` present).
        by: Row column holding the budget: ``"fraction"`` (bytes of the exact shadow) or
            ``"spw"`` (slots per distinct word).
    """

    hash: str
    read_share: float
    fraction: float
    tuned_on: tuple[str, ...]
    tune_f1: float
    config: tuple[tuple[str, str | float], ...] = ()
    by: str = "fraction"

    @property
    def design(self) -> str:
        """Signature design (``discopop`` for rows without a design column)."""
        return str(dict(self.config).get("design", "discopop"))

    @property
    def granule(self) -> int:
        """Words per slot (1 for rows without a granule column)."""
        return int(dict(self.config).get("granule", 1))

    @property
    def tag_bits(self) -> int:
        """Tag bits per slot (the default width for rows without a tag column)."""
        return int(dict(self.config).get("tag_bits", hooks.MAX_TAG_BITS))

    @property
    def spec(self) -> SignatureSpec:
        """The chosen configuration as a :class:`~hpcnb.commprof.signature.SignatureSpec`."""
        pow2 = bool(dict(self.config).get("pow2", 1))
        return SignatureSpec(
            self.design, self.hash, self.read_share, self.granule, self.tag_bits, pow2
        )

    def matches(self, r: Row) -> bool:
        """Whether sweep row ``r`` has this configuration.

        Args:
            r: A sweep row.
        """
        return _config(r) == self.config


def _rows_at(
    rows: Iterable[Row], kernels: Iterable[str], budget: float | None, by: str = "fraction"
) -> list[Row]:
    want = set(kernels)
    return [
        r
        for r in rows
        if r["kernel"] in want and (budget is None or math.isclose(float(r[by]), budget))
    ]


def choose_signature(
    rows: Iterable[Row], tune: Sequence[str], fraction: float, by: str = "fraction"
) -> SignatureChoice:
    """Pick the configuration with the best mean F1 over the tuning kernels only.

    A configuration is the row's :data:`CONFIG_KEYS` columns (hash and read share for
    :func:`signature_sweep` rows; design, hash, read share, granule and tag bits for
    :func:`signature_sweep_spw` rows). Ties (several configurations at the same mean F1,
    e.g. all perfect) are broken by the mean F1 over every budget in ``rows`` at or below
    ``fraction`` (smaller memories), then by the order of first appearance in ``rows``.

    Args:
        rows: Sweep rows, each with a ``kernel`` key added.
        tune: Kernels to tune on.
        fraction: Budget to choose at (in the unit of ``by``).
        by: Row column holding the budget (``"fraction"`` or ``"spw"``).

    Raises:
        InvalidInputError: No row of a tuning kernel at ``fraction``, or a tuning kernel
            without rows.
    """
    rows = list(rows)
    at = _rows_at(rows, tune, fraction, by)
    missing = set(tune) - {str(r["kernel"]) for r in at}
    if not at or missing:
        raise InvalidInputError(
            f"no sweep rows at {by} {fraction} for tuning kernels {sorted(missing)}"
        )
    below = [r for r in _rows_at(rows, tune, None, by) if float(r[by]) <= fraction + 1e-12]
    configs: dict[tuple[tuple[str, str | float], ...], tuple[list[float], list[float]]] = {}
    for r in at:
        configs.setdefault(_config(r), ([], []))[0].append(float(r["f1"]))
    for r in below:
        key = _config(r)
        if key in configs:
            configs[key][1].append(float(r["f1"]))
    order = list(configs)
    best = max(
        order,
        key=lambda k: (np.mean(configs[k][0]), np.mean(configs[k][1]), -order.index(k)),
    )
    fields = dict(best)
    return SignatureChoice(
        hash=str(fields.get("hash", "discopop")),
        read_share=float(fields.get("read_share", 0.0)),
        fraction=fraction,
        tuned_on=tuple(tune),
        tune_f1=float(np.mean(configs[best][0])),
        config=best,
        by=by,
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


def held_out_rows(
    rows: Iterable[Row],
    choice: SignatureChoice,
    kernels: Sequence[str],
    fraction: float | None = None,
) -> dict[str, Row]:
    """The chosen configuration's row of each held-out kernel at a budget.

    Args:
        rows: Sweep rows with a ``kernel`` key.
        choice: The configuration (from :func:`choose_signature`).
        kernels: Kernels to score on; none of them may be one it was tuned on.
        fraction: Budget in the unit of ``choice.by`` (default: the one it was chosen at).

    Returns:
        Kernel -> row (precision, recall, F1, and for :func:`signature_sweep_spw` rows the
        classified ``pattern``), in the order of ``kernels``.

    Raises:
        InvalidInputError: A scored kernel was used for tuning, or has no row for the
            configuration.
    """
    leaked = set(kernels) & set(choice.tuned_on)
    if leaked:
        raise InvalidInputError(f"kernels {sorted(leaked)} were used to choose the configuration")
    budget = choice.fraction if fraction is None else fraction
    found: dict[str, Row] = {}
    for r in _rows_at(rows, kernels, budget, choice.by):
        if choice.matches(r):
            found[str(r["kernel"])] = r
    missing = [k for k in kernels if k not in found]
    if missing or not kernels:
        raise InvalidInputError(
            f"no sweep row at {choice.by} {budget} for {dict(choice.config)} on kernels {missing}"
        )
    return {k: found[k] for k in kernels}


def held_out_f1(
    rows: Iterable[Row],
    choice: SignatureChoice,
    kernels: Sequence[str],
    fraction: float | None = None,
    *,
    resamples: int = 10_000,
    seed: int = 0,
) -> HeldOutScore:
    """Score a chosen configuration on held-out kernels at a budget.

    Args:
        rows: Sweep rows with a ``kernel`` key.
        choice: The configuration (from :func:`choose_signature`).
        kernels: Kernels to score on; none of them may be one it was tuned on.
        fraction: Budget in the unit of ``choice.by`` (default: the one it was chosen at).
        resamples: Bootstrap resamples of the kernels for the interval of the mean.
        seed: Seed of the bootstrap.

    Raises:
        InvalidInputError: A scored kernel was used for tuning, or has no row for the configuration.
    """
    found = held_out_rows(rows, choice, kernels, fraction)
    f1 = {k: float(r["f1"]) for k, r in found.items()}
    estimate = mean_interval(list(f1.values()), resamples=resamples, seed=seed)
    low, high = estimate.bounds
    return HeldOutScore(estimate.value, low, high, f1)
