"""Virtual threads: run a kernel's native or instrumented variant on T logical threads.

Execution model: ``nphases`` barrier phases; in each phase every thread ``tid`` calls the
kernel once, ``kernel(tid, T, phase, ...)``. The instrumented run executes the threads of a
phase one after another in a deterministic order (ascending ids by default, or descending,
or a seeded permutation per phase), which is a legal interleaving of a race-free phase.
The native variant runs the same schedule serially (``drive_native``) or truly in
parallel with Numba's ``prange`` (``drive_parallel``) for timing.

Addresses: array ``k`` of the kernel occupies a simulated byte range starting on a
64-byte (cache-line) boundary right after the previous array, as a bump allocator would
place them; element ``e`` of it has byte address
``base_k + e * itemsize``. The exact shadow memory holds one writer byte (int8) and one
readers-since mask (uint64) per element; the signature memory has ``write_slots`` writer
bytes and ``read_slots`` last-reader bytes, indexed by a hash of the byte address.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import hpcnb.commprof.hooks as hooks
from hpcnb.commprof.instrument import Kernel, Region
from hpcnb.errors import InvalidInputError, InvalidTypeError
from hpcnb.timing import Clock, Fresh, Timing, interleaved

__all__ = [
    "EXACT_BYTES_PER_ELEMENT",
    "KernelArg",
    "MemoryConfig",
    "Profile",
    "Schedule",
    "ScheduledKernel",
    "make_state",
    "profile",
    "run_native",
    "signature_bytes",
    "slot_bytes",
    "time_variant_samples",
    "time_variants",
]

#: Bytes of exact shadow memory per array element (int8 writer + uint64 reader mask).
EXACT_BYTES_PER_ELEMENT = 9
_ALIGN = 64
_BASE = 0x10000
_MAX_THREADS = 64

#: One of a kernel's own arguments (after ``tid, nthreads, phase``): an array or a scalar.
KernelArg = np.ndarray | int | float | np.integer | np.floating


@dataclass(frozen=True)
class Schedule:
    """How ``prange`` loops deal iterations to threads.

    Attributes:
        kind: ``"static"`` (one contiguous block per thread), ``"cyclic"`` (chunks of
            ``chunk`` iterations dealt round-robin) or ``"dynamic"`` (chunks handed in order
            to the thread that is free first under seeded per-chunk costs).
        chunk: Chunk size for cyclic and dynamic.
        seed: Seed of the dynamic schedule's cost jitter.
    """

    kind: str = "static"
    chunk: int = 1
    seed: int = 0

    def encode(self) -> np.ndarray:
        """Return the ``int64[3]`` form used by compiled code.

        Raises:
            InvalidInputError: An unknown kind or a chunk below 1.
        """
        if self.kind not in hooks.SCHEDULE_KINDS:
            raise InvalidInputError(
                f"schedule kind {self.kind!r}: expected one of {sorted(hooks.SCHEDULE_KINDS)}"
            )
        if self.chunk < 1:
            raise InvalidInputError(f"schedule chunk {self.chunk}: expected >= 1")
        return np.array([hooks.SCHEDULE_KINDS[self.kind], self.chunk, self.seed], np.int64)


@dataclass(frozen=True)
class MemoryConfig:
    """Which shadow memories the instrumented run maintains.

    Attributes:
        exact: Keep the exact shadow memory (ground truth).
        write_slots: Slots of the write signature (0: no signature memory); for the
            ``granule`` design, the slots of its one table.
        read_slots: Slots of the read signature (defaults to ``write_slots`` when 0); the
            ``granule`` design has no separate read table and takes 0.
        hash: Hash name, one of :data:`hpcnb.commprof.hooks.HASH_KINDS` that the design
            accepts (:data:`hpcnb.commprof.hooks.DESIGN_HASHES`).
        design: Signature design, ``"discopop"`` or ``"granule"``
            (:mod:`hpcnb.commprof.signature`).
        granule: Consecutive 8-byte words per slot of the ``granule`` design (a power of
            two, 1 to :data:`hpcnb.commprof.hooks.MAX_GRANULE`).
        tag_bits: Tag bits per slot of the ``granule`` design (0 to
            :data:`hpcnb.commprof.hooks.MAX_TAG_BITS`).
        sample_every: Sampling period k (1: no sampling); see :mod:`hpcnb.commprof.hooks`.
            The profile's matrices and access counts then cover the profiled accesses only
            (:func:`hpcnb.commprof.sampling.scaled` estimates the full matrix).
        sample_mode: ``"words"`` (a hashed 1/k of the words, all their accesses) or
            ``"reads"`` (every k-th read of each thread).

    Raises:
        InvalidInputError: ``sample_every`` < 1, an unknown ``sample_mode``, design or hash,
            a hash the design does not accept, negative slots, read slots for the granule
            design, or a granule or tag width out of range (the message names the field).
    """

    exact: bool = True
    write_slots: int = 0
    read_slots: int = 0
    hash: str = "discopop"
    design: str = "discopop"
    granule: int = 1
    tag_bits: int = hooks.MAX_TAG_BITS
    sample_every: int = 1
    sample_mode: str = "words"

    def __post_init__(self) -> None:
        if int(self.sample_every) < 1:
            raise InvalidInputError(f"sample_every={self.sample_every}: expected >= 1")
        if self.sample_mode not in hooks.SAMPLE_MODES:
            raise InvalidInputError(
                f"sample_mode {self.sample_mode!r}: expected one of {sorted(hooks.SAMPLE_MODES)}"
            )
        _check_signature(self)

    @property
    def signature(self) -> bool:
        """Whether a signature memory is used."""
        return self.write_slots > 0

    @property
    def reads(self) -> int:
        """Effective read-signature slot count."""
        return self.read_slots if self.read_slots > 0 else self.write_slots

    @property
    def slots(self) -> int:
        """Slots of the signature memory, all its tables together (0 without one)."""
        if not self.signature:
            return 0
        return self.write_slots if self.design == "granule" else self.write_slots + self.reads


def _check_signature(m: MemoryConfig) -> None:
    if m.design not in hooks.SIGNATURE_DESIGNS:
        raise InvalidInputError(
            f"signature design {m.design!r}: expected one of {sorted(hooks.SIGNATURE_DESIGNS)}"
        )
    if m.hash not in hooks.DESIGN_HASHES[m.design]:
        raise InvalidInputError(
            f"hash {m.hash!r} for the {m.design} design: expected one of "
            f"{sorted(hooks.DESIGN_HASHES[m.design])}"
        )
    if m.write_slots < 0 or m.read_slots < 0:
        raise InvalidInputError(
            f"signature slots must be >= 0, got write_slots={m.write_slots}, "
            f"read_slots={m.read_slots}"
        )
    if m.design != "granule":
        return
    if m.read_slots:
        raise InvalidInputError(
            f"read_slots={m.read_slots}: the granule design has one table (write_slots)"
        )
    g = int(m.granule)
    if not 1 <= g <= hooks.MAX_GRANULE or g & (g - 1):
        raise InvalidInputError(
            f"granule={m.granule}: expected a power of two from 1 to {hooks.MAX_GRANULE}"
        )
    if not 0 <= int(m.tag_bits) <= hooks.MAX_TAG_BITS:
        raise InvalidInputError(f"tag_bits={m.tag_bits}: expected 0 to {hooks.MAX_TAG_BITS}")


def slot_bytes(design: str = "discopop", granule: int = 1) -> int:
    """Bytes per slot of a signature design.

    DiscoPoP: one int8 thread id per slot of either table. Granule: a 4-byte tag, one
    writer byte per word (``granule`` of them) and 8 bytes of reader bits.

    Args:
        design: Signature design.
        granule: Words per slot (granule design).

    Raises:
        InvalidInputError: An unknown design.
    """
    if design not in hooks.SIGNATURE_DESIGNS:
        raise InvalidInputError(
            f"signature design {design!r}: expected one of {sorted(hooks.SIGNATURE_DESIGNS)}"
        )
    return 1 if design == "discopop" else 12 + int(granule)


def signature_bytes(
    write_slots: int, read_slots: int, design: str = "discopop", granule: int = 1
) -> int:
    """Bytes of a signature memory (:func:`slot_bytes` per slot of its tables).

    Args:
        write_slots: Slots of the write signature (the granule design: of its one table).
        read_slots: Slots of the read signature (0 for the granule design).
        design: Signature design.
        granule: Words per slot (granule design).

    Raises:
        InvalidInputError: An unknown design.
    """
    return slot_bytes(design, granule) * (int(write_slots) + int(read_slots))


@dataclass
class Profile:
    """Result of an instrumented run.

    Attributes:
        kernel: Kernel name.
        regions: Regions of the kernel (region 0 = kernel body).
        nthreads: Number of virtual threads.
        exact: Exclusive communication events ``[region, writer, reader]`` (exact memory).
        exact_bytes: The same in bytes.
        signature: Exclusive events detected by the signature memory (or ``None``).
        accesses: ``[region, 0=reads / 1=writes]`` counts.
        trace: ``int64[n, 6]`` access trace (columns :data:`hooks.TRACE_COLUMNS`) or ``None``.
        n_elements: Elements of all kernel arrays (exact shadow size).
        itemsizes: Item size of each array.
        memory: The memory configuration used.
    """

    kernel: str
    regions: list[Region]
    nthreads: int
    exact: np.ndarray
    exact_bytes: np.ndarray
    signature: np.ndarray | None
    accesses: np.ndarray
    trace: np.ndarray | None
    n_elements: int
    itemsizes: list[int]
    memory: MemoryConfig = field(default_factory=MemoryConfig)

    @property
    def exact_shadow_bytes(self) -> int:
        """Bytes of the exact shadow memory for this run."""
        return EXACT_BYTES_PER_ELEMENT * self.n_elements

    def total(self, which: str = "exact") -> int:
        """Total communication events over all regions.

        Args:
            which: ``"exact"`` or ``"signature"``: the memory whose events are added up.

        Raises:
            InvalidInputError: ``"signature"`` for a profile without a signature memory.
        """
        m = self.exact if which == "exact" else self.signature
        if m is None:
            raise InvalidInputError("this profile has no signature memory")
        return int(m.sum())


def make_state(
    n_exact: int,
    write_slots: int,
    read_slots: int,
    R: int,
    T: int,
    flags: int,
    hash_kind: int,
    trace_capacity: int,
    n_arrays: int = 1,
    *,
    memory: MemoryConfig | None = None,
) -> tuple[np.ndarray, ...]:
    """Allocate the profiler state tuple ``S`` (layout: the ``I_*`` indices of ``hooks``).

    Args:
        n_exact: Elements of the exact shadow memory.
        write_slots: Write-signature slots (the granule design: its slots).
        read_slots: Read-signature slots (unused by the granule design).
        R: Regions.
        T: Threads.
        flags: ``hooks.FLAG_*`` bits.
        hash_kind: Hash code (``hooks.HASH_KINDS`` value).
        trace_capacity: Rows of the trace buffer.
        n_arrays: Kernel arrays (address table length).
        memory: The memory configuration whose signature design, granule and tag width
            the state follows (the DiscoPoP design when ``None``).

    Returns:
        The 14 arrays up to ``I_MBY`` when ``flags`` has no signature memory; with one, the
        signature arrays ``I_SGP`` .. ``I_SGB`` follow, with uint32 slot tags in ``I_SGH``
        for the granule design and a one-byte placeholder there for DiscoPoP's. The hooks
        compile for each tuple type only the updates it carries.
    """
    ctl = np.zeros(hooks.CTL_SIZE, np.int64)
    ctl[hooks.CTL_FLAGS] = flags
    ctl[hooks.CTL_SAMPLE_THRESHOLD] = 1 << 32  # no word sampling
    ctl[hooks.CTL_HASH] = hash_kind
    A = max(1, n_arrays)
    prm = np.zeros(hooks.SGP_SIZE, np.int64)
    sw, sr, sg = max(1, write_slots), max(1, read_slots), 1
    if memory is not None and memory.design == "granule":
        g = int(memory.granule).bit_length() - 1
        prm[hooks.SGP_DESIGN] = hooks.SIGNATURE_DESIGNS["granule"]
        ctl[hooks.CTL_FLAGS] |= hooks.FLAG_GRANULE
        prm[hooks.SGP_SHIFT] = g
        prm[hooks.SGP_TAG_BITS] = memory.tag_bits
        prm[hooks.SGP_READER_SETS] = int((1 << g) * T <= 64)
        prm[hooks.SGP_HASH] = hash_kind
        sg = max(1, write_slots)
        sw, sr = sg << g, 1  # one writer byte per word of each slot
        pow2 = sg & (sg - 1) == 0
        prm[hooks.SGP_MASK] = sg - 1 if pow2 else -1
        prm[hooks.SGP_LOG] = sg.bit_length() - 1
        prm[hooks.SGP_TAG_MASK] = (1 << memory.tag_bits) - 1
        prm[hooks.SGP_WORD_MASK] = (1 << g) - 1
        fast = pow2 and hash_kind == hooks.HASH_KINDS["modulo"]
        prm[hooks.SGP_KMASK] = (sg << g) - 1 if fast else -1
        ctl[hooks.CTL_FLAGS] |= hooks.FLAG_GRANULE_MASKED if fast else 0
        prm[hooks.SGP_QSHIFT] = prm[hooks.SGP_LOG] + g
        if prm[hooks.SGP_READER_SETS]:
            tmask = (1 << T) - 1
            prm[hooks.SGP_READER_MASK] = tmask - (1 << 64) if tmask >= 1 << 63 else tmask
            prm[hooks.SGP_READER_BASE], prm[hooks.SGP_READER_STRIDE] = 0, T
        else:
            prm[hooks.SGP_READER_MASK] = 1
            prm[hooks.SGP_READER_BASE], prm[hooks.SGP_READER_STRIDE] = 8, 1
    base = (
        ctl,
        np.zeros(A, np.int64),
        np.zeros(A, np.int64),
        np.ones(A, np.int64),
        np.full(n_exact, -1, np.int8),
        np.zeros(n_exact, np.uint64),
        np.full(sw, -1, np.int8),
        np.full(sr, -1, np.int8),
        np.zeros((R, T, T), np.int64),
        np.zeros((R, T, T), np.int64),
        np.zeros(4096, np.int64),
        np.zeros((R, 2), np.int64),
        np.zeros((trace_capacity, 6), np.int64),
        np.zeros((R, T, T), np.int64),
    )
    if not ctl[hooks.CTL_FLAGS] & hooks.FLAG_SIGNATURE:
        return base  # no signature arrays: the hooks compile without the signature update
    return (
        *base,
        prm,
        np.array([1.0 / (sg if prm[hooks.SGP_DESIGN] else sw), 1.0 / sr]),
        np.zeros(sg, np.uint32) if prm[hooks.SGP_DESIGN] else np.zeros(1, np.uint8),
        np.zeros(sg, np.uint64),
    )


def _check_args(k: Kernel, args: Sequence[KernelArg]) -> list[KernelArg]:
    own = k.params[3:]
    if len(args) != len(own):
        raise InvalidTypeError(
            f"kernel {k.name} expects {len(own)} arguments {own}, got {len(args)}"
        )
    out: list[KernelArg] = []
    for name, value in zip(own, args, strict=True):
        if name in k.arrays:
            if not isinstance(value, np.ndarray) or not 1 <= value.ndim <= 3:
                raise InvalidTypeError(
                    f"kernel {k.name}: argument '{name}' must be a 1-3 d ndarray"
                )
            if not value.flags.c_contiguous:
                raise InvalidInputError(f"kernel {k.name}: argument '{name}' must be C-contiguous")
        elif not isinstance(value, int | float | np.integer | np.floating):
            raise InvalidTypeError(
                f"kernel {k.name}: argument '{name}' must be an int or float scalar"
            )
        out.append(value)
    return out


def _order(nthreads: int, nphases: int, interleave: str, seed: int) -> np.ndarray:
    base = np.arange(nthreads, dtype=np.int64)
    if interleave == "ascending":
        return np.tile(base, (nphases, 1))
    if interleave == "descending":
        return np.tile(base[::-1].copy(), (nphases, 1))
    if interleave == "seeded":
        rng = np.random.default_rng(seed)
        return np.stack([rng.permutation(nthreads) for _ in range(nphases)]).astype(np.int64)
    raise InvalidInputError(f"interleave {interleave!r}: expected ascending, descending or seeded")


def _check_threads(nthreads: int, nphases: int) -> None:
    if not 1 <= nthreads <= _MAX_THREADS:
        raise InvalidInputError(f"nthreads={nthreads}: expected 1..{_MAX_THREADS}")
    if nphases < 1:
        raise InvalidInputError(f"nphases={nphases}: expected >= 1")


#: Largest shadow (elements) indexed by the word sample's compact id (see _word_sample).
_COMPACT_MAX = 1 << 28


def _word_sample(k: int, base: np.ndarray, n: int, compact: bool) -> tuple[np.ndarray, int]:
    """Locals of a kernel's sampled variant (``_cp_P``) and the exact shadow's length.

    Element ``e`` is sampled when ``h = (e * FIB) mod 2**64 < t`` with
    ``t = (2**32 // k) << 32`` (the same words as ``(h >> 32) < 2**32 // k``). With
    ``compact``, the exact shadow holds only the sampled words, at the compact id
    ``((h >> 32) * m) >> 32`` with ``m = 3 n``: it is injective on ``[0, n)`` because the
    Fibonacci hash spreads any ``n`` consecutive indices at least ``2**64 / (sqrt(5) n)``
    apart (three-gap theorem), so the ids differ by at least ``3 / sqrt(5) > 1``, and it
    maps the sampled words into ``[0, m / k + 1)`` (used when that is shorter than ``n``).

    Args:
        k: Sampling period (> 1).
        base: Element base of each kernel array.
        n: Elements of all kernel arrays.
        compact: Index the exact shadow by the compact id (else by the element index).

    Returns:
        ``uint64`` array ``[t, m (0: element index), base...]`` and the shadow length.
    """
    thr = (1 << 32) // k
    m = 3 * n if compact and 0 < n <= _COMPACT_MAX else 0
    size = (((thr - 1) * m) >> 32) + 1
    if not m or size >= n:  # no compact id, or small k: the element index is as short
        m, size = 0, max(1, n)
    P = np.empty(2 + len(base), np.uint64)
    P[0], P[1], P[2:] = thr << 32, m, base
    return P, size


def _set_sampling(ctl: np.ndarray, memory: MemoryConfig, words: bool) -> None:
    """Write the sampling fields of a state's ``ctl`` array (nothing without sampling)."""
    if memory.sample_every > 1:
        ctl[hooks.CTL_SAMPLE] = memory.sample_every
        ctl[hooks.CTL_SAMPLE_MODE] = hooks.SAMPLE_MODES[memory.sample_mode]
        if words:
            ctl[hooks.CTL_SAMPLE_THRESHOLD] = (1 << 32) // memory.sample_every
        ctl[hooks.CTL_COUNTDOWN :] = memory.sample_every


def profile(
    k: Kernel,
    args: Sequence[KernelArg],
    *,
    nthreads: int,
    nphases: int = 1,
    schedule: Schedule | None = None,
    memory: MemoryConfig | None = None,
    trace: bool = False,
    interleave: str = "ascending",
    seed: int = 0,
) -> Profile:
    """Run the instrumented variant on virtual threads and collect communication.

    Args:
        k: The kernel.
        args: The kernel's own arguments (arrays are modified in place).
        nthreads: Virtual threads (1..64).
        nphases: Barrier phases.
        schedule: Schedule of ``prange`` loops (static by default).
        memory: Shadow memories to maintain (exact only by default).
        trace: Also record the access trace (for replay through other memories).
        interleave: Thread order within a phase: ascending, descending or seeded.
        seed: Seed of the seeded interleaving.

    Returns:
        The :class:`Profile`.

    Raises:
        InvalidInputError: Bad thread or phase count, an unknown hash, interleaving or
            schedule, or a non-contiguous array.
        InvalidTypeError: Arguments that do not fit the kernel's parameters.
    """
    _check_threads(nthreads, nphases)
    schedule = schedule or Schedule()
    memory = memory or MemoryConfig()
    if memory.hash not in hooks.HASH_KINDS:
        raise InvalidInputError(f"hash {memory.hash!r}: expected one of {sorted(hooks.HASH_KINDS)}")
    vals = _check_args(k, args)
    own = zip(k.params[3:], vals, strict=True)
    arrays = [v for n, v in own if n in k.arrays and isinstance(v, np.ndarray)]
    base = np.zeros(max(1, len(arrays)), np.int64)
    bbase = np.zeros_like(base)
    isz = np.ones_like(base)
    elem, addr = 0, _BASE
    for i, a in enumerate(arrays):
        base[i], bbase[i], isz[i] = elem, addr, a.itemsize
        elem += a.size
        addr += -(-a.nbytes // _ALIGN) * _ALIGN
    R, T = len(k.regions), nthreads
    flags = (hooks.FLAG_EXACT if memory.exact else 0) | (
        hooks.FLAG_SIGNATURE if memory.signature else 0
    )
    flags |= hooks.FLAG_TRACE if trace else 0
    n_ex = elem if memory.exact else 1
    sw = memory.write_slots if memory.signature else 1
    sr = memory.reads if memory.signature else 1
    cap = 1 << 16 if trace else 1
    order = _order(nthreads, nphases, interleave, seed)
    sched = schedule.encode()
    snapshot = [a.copy() for a in arrays] if trace else []
    mod = k.compiled()
    words = memory.sample_every > 1 and memory.sample_mode == "words"
    if words:
        P, n_words = _word_sample(memory.sample_every, base, elem, compact=not trace)
        n_ex = n_words if memory.exact else 1
    while True:
        S = make_state(
            n_ex, sw, sr, R, T, flags, hooks.HASH_KINDS[memory.hash], cap, len(base), memory=memory
        )
        S[hooks.I_BASE][:], S[hooks.I_BYTES][:], S[hooks.I_ISZ][:] = base, bbase, isz
        ctl = S[hooks.I_CTL]
        _set_sampling(ctl, memory, words)
        if words:
            mod.drive_samp(nthreads, nphases, order, sched, *vals, S, P)
        else:
            mod.drive_instr(nthreads, nphases, order, sched, *vals, S)
        if ctl[hooks.CTL_TRACE_N] <= cap:
            break
        cap = int(ctl[hooks.CTL_TRACE_N])
        for a, s in zip(arrays, snapshot, strict=True):
            a[...] = s
    n_tr = int(ctl[hooks.CTL_TRACE_N])
    return Profile(
        kernel=k.name,
        regions=k.regions,
        nthreads=T,
        exact=S[8],
        exact_bytes=S[13],
        signature=S[9] if memory.signature else None,
        accesses=S[11],
        trace=S[12][:n_tr].copy() if trace else None,
        n_elements=int(elem),
        itemsizes=[int(x) for x in isz[: len(arrays)]],
        memory=memory,
    )


def run_native(
    k: Kernel,
    args: Sequence[KernelArg],
    *,
    nthreads: int,
    nphases: int = 1,
    schedule: Schedule | None = None,
    parallel: bool = False,
) -> None:
    """Run the native (hook-free) variant: serially in phase/thread order, or with ``prange``.

    Args:
        k: The kernel.
        args: The kernel's own arguments (arrays are modified in place).
        nthreads: Threads (1..64).
        nphases: Barrier phases.
        schedule: Schedule of ``prange`` loops (static by default).
        parallel: Run each phase's threads in parallel with Numba's ``prange``.

    Raises:
        InvalidInputError: Bad thread or phase count, or a non-contiguous array.
        InvalidTypeError: Arguments that do not fit the kernel's parameters.
    """
    _check_threads(nthreads, nphases)
    vals = _check_args(k, args)
    sched = (schedule or Schedule()).encode()
    mod = k.compiled()
    if parallel:
        mod.drive_parallel(nthreads, nphases, sched, *vals)
    else:
        mod.drive_native(nthreads, nphases, _order(nthreads, nphases, "ascending", 0), sched, *vals)


def time_variant_samples(
    k: Kernel,
    make_args: Callable[[], Sequence[KernelArg]],
    *,
    nthreads: int,
    nphases: int,
    schedule: Schedule | None = None,
    memory: MemoryConfig | None = None,
    repeats: int = 5,
    warmup: int = 1,
    variants: tuple[str, ...] = ("native", "parallel", "instrumented"),
    clock: str = "wall",
) -> dict[str, Timing]:
    """Wall times of native serial, native parallel and instrumented runs, interleaved.

    Every round runs each variant once, in the order given, on fresh arguments (argument
    creation is not timed, :class:`hpcnb.timing.Fresh`), so a drift in machine load
    affects all variants alike; pair the rounds with :func:`hpcnb.timing.ratios` (e.g.
    ``ratios(t["instrumented"], t["native"])`` are per-round overheads).

    Args:
        k: The kernel.
        make_args: Callable returning fresh arguments for one run.
        nthreads: Virtual threads.
        nphases: Barrier phases.
        schedule: Loop schedule.
        memory: Shadow memory of the ``instrumented`` variant.
        repeats: Timed rounds.
        warmup: Untimed rounds first (compilation, caches).
        variants: Some of ``native``, ``parallel``, ``instrumented`` (with ``memory``) and
            ``exact`` (instrumented with the exact shadow memory).
        clock: ``"wall"`` (``time.perf_counter``) or ``"cpu"`` (``time.thread_time``, the
            calling thread's CPU time). The serial variants run on the calling thread, so
            their CPU time leaves out the time the operating system gave to other
            processes; on a shared machine wall time inflates a long run (instrumented)
            by preemption far more than a short one (native), which biases their ratio.
            ``"cpu"`` cannot time ``parallel`` (its worker threads are not counted).

    Returns:
        ``{variant: Timing}`` with ``repeats`` samples each.

    Raises:
        InvalidTypeError: ``make_args`` is not callable.
        InvalidInputError: An unknown variant or clock, or ``parallel`` with the CPU clock.
        TimingError: ``repeats`` < 1 or ``warmup`` < 0.
    """
    if not callable(make_args):
        raise InvalidTypeError("make_args must be a callable returning the kernel arguments")
    clocks: dict[str, Clock] = {"wall": "wall", "cpu": "thread"}
    if clock not in clocks:
        raise InvalidInputError(f"clock {clock!r}: expected one of {sorted(clocks)}")
    if clock == "cpu" and "parallel" in variants:
        raise InvalidInputError(
            "the cpu clock counts the calling thread only; time parallel with wall"
        )
    runs = {
        "native": lambda a: run_native(k, a, nthreads=nthreads, nphases=nphases, schedule=schedule),
        "parallel": lambda a: run_native(
            k, a, nthreads=nthreads, nphases=nphases, schedule=schedule, parallel=True
        ),
        "instrumented": lambda a: profile(
            k, a, nthreads=nthreads, nphases=nphases, schedule=schedule, memory=memory
        ),
        "exact": lambda a: profile(
            k, a, nthreads=nthreads, nphases=nphases, schedule=schedule, memory=MemoryConfig()
        ),
    }
    unknown = set(variants) - set(runs)
    if unknown:
        raise InvalidInputError(
            f"unknown variants {sorted(unknown)}; expected some of {sorted(runs)}"
        )
    return interleaved(
        {name: Fresh(make_args, runs[name]) for name in variants},
        repeats=repeats,
        warmup=warmup,
        clock=clocks[clock],
    )


class ScheduledKernel:
    """A kernel bound to the schedule of its ``prange`` loops.

    Base of configurations that carry both (:class:`hpcnb.commprof.suite.SuiteCase`,
    :class:`hpcnb.commprof.cases.Variant`): its methods run the kernel with that schedule.

    Attributes:
        kernel: The kernel.
        schedule: Schedule of its ``prange`` loops.
    """

    kernel: Kernel
    schedule: Schedule

    def profile(self, args: Sequence[KernelArg], **options: Any) -> Profile:
        """:func:`profile` the kernel with its schedule.

        Args:
            args: The kernel's own arguments (arrays are modified in place).
            **options: The other keyword arguments of :func:`profile` (``nthreads`` is
                required).
        """
        return profile(self.kernel, args, schedule=self.schedule, **options)

    def run_native(self, args: Sequence[KernelArg], **options: Any) -> None:
        """:func:`run_native` the kernel with its schedule.

        Args:
            args: The kernel's own arguments (arrays are modified in place).
            **options: The other keyword arguments of :func:`run_native` (``nthreads`` is
                required).
        """
        run_native(self.kernel, args, schedule=self.schedule, **options)

    def time_samples(
        self, make_args: Callable[[], Sequence[KernelArg]], **options: Any
    ) -> dict[str, Timing]:
        """:func:`time_variant_samples` of the kernel with its schedule.

        Args:
            make_args: Callable returning fresh arguments for one run.
            **options: The other keyword arguments of :func:`time_variant_samples`
                (``nthreads`` and ``nphases`` are required).
        """
        return time_variant_samples(self.kernel, make_args, schedule=self.schedule, **options)


def time_variants(
    k: Kernel, make_args: Callable[[], Sequence[KernelArg]], **options: Any
) -> dict[str, float]:
    """Median wall times (s) of the variants of :func:`time_variant_samples` (interleaved).

    Args:
        k: The kernel.
        make_args: Callable returning fresh arguments for one run.
        **options: Keyword arguments of :func:`time_variant_samples` (``nthreads`` and
            ``nphases`` are required).

    Returns:
        ``{variant: median seconds}``.
    """
    t = time_variant_samples(k, make_args, **options)
    return {name: timing.median for name, timing in t.items()}
