"""Numba-compiled profiler hooks, schedules and shadow-memory updates.

The instrumented variant of a kernel calls :func:`ld1` … :func:`st3` for every array
load and store and :func:`enter` / :func:`leave` around every loop. All profiler state
travels in one tuple ``S`` of NumPy arrays (Numba compiles heterogeneous tuples), laid out
by the ``I_*`` indices below; :mod:`hpcnb.commprof.runtime` builds it.

Communication event: a thread reads an address whose last writer is another thread,
counted once per (write, reading thread): the exact memory's "readers since the last
write" bit mask suppresses repeated reads of the same value by the same thread (the value
is then in that thread's cache); the signature memory approximates both in a fixed number
of slots (:mod:`hpcnb.commprof.signature`). :func:`record_access` is the one
implementation, used by the hooks and by trace replay. The state's tuple type says which
memories a run keeps (:func:`hpcnb.commprof.runtime.make_state`), so the hooks of a run
without a signature memory compile without its update.

Sampling (``ctl[CTL_SAMPLE] = k > 1``), two modes (:data:`SAMPLE_MODES`):

* ``words``: a word (array element) is in the sample when a multiplicative (Fibonacci)
  hash of its element index falls below ``2**32 / k``; every access to a sampled word is
  profiled, every other access costs one multiply and compare. Events on the sampled
  words are exact, so k times the sampled matrix estimates the full one without bias.
  Sampled runs use a separately compiled variant of the kernel
  (:mod:`hpcnb.commprof.instrument`) whose hooks make that test first, with the threshold
  and the array's element base in locals, and call :func:`record_access` for sampled
  words only; their exact shadow holds the sampled words only.
* ``reads``: every write is applied, and only every k-th read of each thread (a per-thread
  countdown) is checked; the others cost one decrement. Periodic sampling aliases with
  loop strides, and a value read r times is caught about r times as often as one read once.

:mod:`hpcnb.commprof.sampling` scales the matrix and bounds its error.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

__all__ = [
    "CTL_DEPTH",
    "CTL_FLAGS",
    "CTL_HASH",
    "CTL_PHASE",
    "CTL_COUNTDOWN",
    "CTL_REGION",
    "CTL_SAMPLE",
    "CTL_SAMPLE_MODE",
    "CTL_SAMPLE_THRESHOLD",
    "CTL_SIZE",
    "CTL_TID",
    "CTL_TRACE_N",
    "FLAG_EXACT",
    "FLAG_GRANULE",
    "FLAG_GRANULE_MASKED",
    "FLAG_SIGNATURE",
    "FLAG_TRACE",
    "DESIGN_HASHES",
    "HASH_KINDS",
    "MAX_GRANULE",
    "MAX_TAG_BITS",
    "SAMPLE_MODES",
    "SCHEDULE_KINDS",
    "SIGNATURE_DESIGNS",
    "TRACE_COLUMNS",
    "enter",
    "hash_key",
    "hash_slot",
    "ld1",
    "ld2",
    "ld3",
    "leave",
    "record_access",
    "replay",
    "replay_flags",
    "replay_writers",
    "reduce_range",
    "sched_iters",
    "st1",
    "st2",
    "st3",
]

# ---- layout of the state tuple S -------------------------------------------------------
I_CTL, I_BASE, I_BYTES, I_ISZ = 0, 1, 2, 3
I_EXW, I_EXR, I_SGW, I_SGR = 4, 5, 6, 7
I_MEX, I_MSG, I_STACK, I_ACC, I_TRACE, I_MBY = 8, 9, 10, 11, 12, 13
#: Signature parameters (int64, ``SGP_*`` fields), table reciprocals (float64: write, read),
#: granule-design slot tags (uint32) and reader bits (uint64); the granule design keeps its
#: per-word writers (int8, ``G`` per slot) in ``S[I_SGW]``.
I_SGP, I_SGF, I_SGH, I_SGB = 14, 15, 16, 17
#: Fields of ``S[I_SGP]``: design code, log2 of the words per granule, tag bits, whether the
#: reader bits hold per-word reader sets (granule words x threads <= 64), hash code, slot
#: mask (``slots - 1`` for a power-of-two table, else -1), log2 of the slots (power of two),
#: tag mask, word-in-granule mask, and for a power-of-two table with the order-preserving
#: hash the mask of a word's writer-byte index (``slots * G - 1``, else -1) and the shift
#: of a word to its quotient.
SGP_DESIGN, SGP_SHIFT, SGP_TAG_BITS, SGP_READER_SETS, SGP_HASH = 0, 1, 2, 3, 4
SGP_MASK, SGP_LOG, SGP_TAG_MASK, SGP_WORD_MASK, SGP_KMASK, SGP_QSHIFT = 5, 6, 7, 8, 9, 10
#: Reader bits of word ``j`` of a slot: ``mask << (base + j * stride)`` (``mask`` stored as
#: int64: the T-bit reader set, or the last reader's one bit per word above its id byte).
SGP_READER_MASK, SGP_READER_BASE, SGP_READER_STRIDE = 11, 12, 13
#: Length of ``S[I_SGP]``.
SGP_SIZE = 14

CTL_TID, CTL_REGION, CTL_DEPTH, CTL_FLAGS, CTL_TRACE_N, CTL_HASH, CTL_PHASE, CTL_SAMPLE = range(8)
#: Sampling mode (:data:`SAMPLE_MODES`) and the word sample's 32-bit hash threshold.
CTL_SAMPLE_MODE, CTL_SAMPLE_THRESHOLD = 8, 9
#: ``ctl[CTL_COUNTDOWN + tid]``: reads of thread ``tid`` left until its next sampled read.
CTL_COUNTDOWN = 16
#: Sampling modes by name -> code used in compiled code.
SAMPLE_MODES = {"words": 0, "reads": 1}
#: Length of the ``ctl`` array (the countdowns of up to 64 threads after the fields).
CTL_SIZE = CTL_COUNTDOWN + 64
FLAG_EXACT, FLAG_SIGNATURE, FLAG_TRACE = 1, 2, 4
#: Set beside ``FLAG_SIGNATURE`` when the signature memory is the granule design, and
#: beside that when its table is a power of two with the order-preserving hash (a word's
#: writer byte is then at ``word & (len - 1)`` of ``S[I_SGW]``).
FLAG_GRANULE, FLAG_GRANULE_MASKED = 8, 16

#: Trace columns (one row per access, in execution order).
TRACE_COLUMNS = ("tid", "region", "element", "address", "is_write", "phase")

#: Hash functions of the signature memory, by name -> code used in compiled code.
HASH_KINDS = {"discopop": 0, "modulo": 1, "word": 2, "fibonacci": 3}
#: Signature-memory designs, by name -> code (see :mod:`hpcnb.commprof.signature`).
SIGNATURE_DESIGNS = {"discopop": 0, "granule": 1}
#: Hashes each design accepts: the granule design hashes granule indices, either keeping
#: their order (``modulo``: consecutive granules in consecutive slots) or multiplicatively.
DESIGN_HASHES = {
    "discopop": ("discopop", "modulo", "word", "fibonacci"),
    "granule": ("modulo", "fibonacci"),
}
#: Largest number of words per granule-design slot (one writer byte per word).
MAX_GRANULE = 4
#: Largest tag width of the granule design (a uint32 per slot: tag and a readers flag).
MAX_TAG_BITS = 31

#: Loop schedules of ``prange`` work-sharing loops, by name -> code.
SCHEDULE_KINDS = {"static": 0, "cyclic": 1, "dynamic": 2}

_FIB = np.uint64(0x9E3779B97F4A7C15)

#: Decorator of the hot hooks: cached and compiled without Numba's reference counting
#: (``_nrt=False``, an option that Numba's type stubs do not list; see :func:`record_access`).
_hot = njit(cache=True, _nrt=False)  # type: ignore[call-overload]


@_hot
def hash_key(key: int, kind: int) -> int:
    """Hash a signature key (a byte address, or a granule index) before range reduction.

    Args:
        key: Non-negative key.
        kind: 0 DiscoPoP ``(key >> 8) + key``, 1 ``key`` itself (order-preserving), 2 word
            ``key >> 3``, 3 Fibonacci (multiplicative) hashing, the top 40 bits of
            ``key * 0x9E3779B97F4A7C15 mod 2**64``.

    Returns:
        A non-negative integer below ``2**51`` for keys below ``2**50``.
    """
    if kind == 0:
        return (key >> 8) + key
    if kind == 1:
        return key
    if kind == 2:
        return key >> 3
    return np.int64((np.uint64(key) * _FIB) >> np.uint64(24))  # type: ignore[return-value]


@_hot
def reduce_range(x: int, slots: int, inv: float) -> tuple[int, int]:
    """``(x mod slots, x // slots)`` by a multiplication with the reciprocal, no division.

    ``q = int(x * inv)`` is off by at most one for ``0 <= x < 2**51`` (``inv`` is
    ``1 / slots`` rounded to double precision), and one correction step makes both results
    exact, for every slot count (a 64-bit integer division costs tens of cycles per access).

    Args:
        x: Non-negative integer below ``2**51``.
        slots: Table size (> 0).
        inv: ``1.0 / slots``.

    Returns:
        The slot and the quotient (the part of ``x`` the slot does not encode).
    """
    q = np.int64(np.float64(x) * inv)
    r = x - q * slots
    if r < 0:
        r += slots
        q -= 1
    elif r >= slots:
        r -= slots
        q += 1
    return r, q  # type: ignore[return-value]


@_hot
def hash_slot(addr: int, kind: int, slots: int) -> int:
    """Map a byte address to a slot of a DiscoPoP-design signature table.

    Args:
        addr: Byte address (non-negative).
        kind: Hash code (:func:`hash_key`): 0 DiscoPoP ``((addr >> 8) + addr) mod slots``,
            1 ``addr mod slots``, 2 word ``(addr >> 3) mod slots``, 3 Fibonacci.
        slots: Number of slots (> 0).

    Returns:
        The slot index in ``[0, slots)``.
    """
    return reduce_range(hash_key(addr, kind), slots, 1.0 / slots)[0]


_U0, _U1, _U8, _UFF = np.uint64(0), np.uint64(1), np.uint64(8), np.uint64(0xFF)
#: Granule-design slot tag word: the tag in the low 31 bits, the top bit set while the
#: slot's reader bits are in use (writes then need not touch them otherwise).
_TAG_BITS, _HAS_READERS = np.uint32(0x7FFFFFFF), np.uint32(0x80000000)

#: Decorator of the signature designs' access functions: :func:`_hot`, inlined into
#: :func:`record_access` by Numba (a call would pass the whole state tuple ``S``).
_hot_inline = njit(cache=True, _nrt=False, inline="always")  # type: ignore[call-overload]

#: Decorator of a slow path kept out of its callers: Numba marks functions compiled with
#: full debug information ``noinline`` for LLVM, so the fast path that calls it stays small
#: enough to be inlined into every access hook.
_apart = njit(cache=True, _nrt=False, debug=True)  # type: ignore[call-overload]


@_hot_inline
def _discopop_access(S, addr, tid, region, is_write) -> None:
    # last writer per write slot, last reader since the slot's write per read slot
    sgw = S[I_SGW]
    sgr = S[I_SGR]
    inv = S[I_SGF]
    key = hash_key(addr, S[I_CTL][CTL_HASH])
    hw = reduce_range(key, sgw.shape[0], inv[0])[0]
    hr = reduce_range(key, sgr.shape[0], inv[1])[0]
    if is_write:
        sgw[hw] = tid
        sgr[hr] = -1
    else:
        w = sgw[hw]
        last = sgr[hr]
        sgr[hr] = tid
        if w >= 0 and w != tid and last != tid:
            S[I_MSG][region, w, tid] += 1


@_hot_inline
def _granule_slot(prm, tags, inv, word):
    # (slot, tag, index of the word's writer byte) of the granule holding ``word``
    g = prm[SGP_SHIFT]
    kmask = prm[SGP_KMASK]
    if kmask >= 0:  # power-of-two table, order-preserving hash: masks and shifts only
        k = word & kmask
        return k >> g, np.uint32((word >> prm[SGP_QSHIFT]) & prm[SGP_TAG_MASK]), k
    x = word >> g
    if prm[SGP_HASH] != 1:
        x = np.int64((np.uint64(x) * _FIB) >> np.uint64(24))
    mask = prm[SGP_MASK]
    if mask >= 0:
        s, q = x & mask, x >> prm[SGP_LOG]
    else:
        s, q = reduce_range(x, tags.shape[0], inv[0])
    return s, np.uint32(q & prm[SGP_TAG_MASK]), (s << g) + (word & prm[SGP_WORD_MASK])


@_hot_inline
def _granule_fast(S, addr, tid, is_write) -> bool:
    # power-of-two table, order-preserving hash: a read of an own or unknown writer's word,
    # or a write to a slot that holds the granule and no readers, needs nothing else
    wr = S[I_SGW]
    prm = S[I_SGP]
    word = addr >> 3
    k = word & (wr.shape[0] - 1)
    if not is_write:
        w = wr[k]
        return w < 0 or w == tid
    s = k >> prm[SGP_SHIFT]
    if S[I_SGH][s] == np.uint32((word >> prm[SGP_QSHIFT]) & prm[SGP_TAG_MASK]):
        wr[k] = tid
        return True
    return False


@_apart
def _granule_access(wr, prm, tags, rbits, inv, msg, addr, tid, region, is_write) -> None:
    # slot s: tags[s] = tag | _HAS_READERS (reader bits rbits[s] valid), writer of word j of
    # the granule wr[s * G + j] (-1: unknown). Compiled apart and given only the arrays it
    # uses: the hooks inline the fast path and call this for the rest.
    word = addr >> 3
    s, tag, k = _granule_slot(prm, tags, inv, word)
    j = k & prm[SGP_WORD_MASK]
    ts = tags[s]
    if is_write:
        if ts & _TAG_BITS != tag:  # allocate: the previous granule's writers and readers go
            tags[s] = tag
            g = prm[SGP_SHIFT]
            for i in range(s << g, (s + 1) << g):
                wr[i] = -1
        elif ts & _HAS_READERS:  # forget word j's readers
            at = np.uint64(prm[SGP_READER_BASE] + j * prm[SGP_READER_STRIDE])
            rbits[s] &= ~(np.uint64(prm[SGP_READER_MASK]) << at)
        wr[k] = tid
        return
    # an own or unknown writer is no event whatever the tag: test it first
    w = wr[k]
    if w < 0 or w == tid or ts & _TAG_BITS != tag:
        return
    rb = rbits[s] if ts & _HAS_READERS else _U0
    T = msg.shape[1]
    if prm[SGP_READER_SETS]:  # the readers of word j since its write
        bit = _U1 << np.uint64(j * T + tid)
        if rb & bit:
            return
        rb |= bit
    else:  # the last reader of the granule and the words it read since their write
        bit = _U1 << (_U8 + np.uint64(j))
        if np.int64(rb & _UFF) - 1 == tid:
            if rb & bit:
                return
            rb |= bit
        else:
            rb = np.uint64(tid + 1) | bit
    rbits[s] = rb
    tags[s] = ts | _HAS_READERS
    msg[region, w, tid] += 1


def _signature(S, addr, tid, region, is_write) -> None:
    """The signature memory's part of :func:`record_access` (compiled by its overload)."""


@overload(_signature, jit_options={"cache": True, "_nrt": False})  # type: ignore[typeddict-unknown-key]
def _signature_impl(S, addr, tid, region, is_write):
    """Compile the signature update only for a state that carries a signature memory.

    :func:`hpcnb.commprof.runtime.make_state` returns the ``I_SGP`` .. ``I_SGB`` arrays only
    when the signature flag is set, so the state's tuple type says whether a run has a
    signature memory, and only the granule design's state keeps uint32 slot tags in
    ``S[I_SGH]`` (DiscoPoP's a one-byte placeholder), so each design compiles only its own
    update. For a state without one the update compiles
    to nothing: the exact path that every access hook inlines then holds no call, which
    keeps it small enough for LLVM to inline into the kernel (a call passing the whole
    state tuple made every hook an out-of-line call, several times slower).
    """
    if len(S) <= I_SGP:
        return lambda S, addr, tid, region, is_write: None
    if S[I_SGH].dtype == types.uint32:  # the granule design's slot tags

        def granule(S, addr, tid, region, is_write):
            if S[I_CTL][CTL_FLAGS] & FLAG_GRANULE_MASKED and _granule_fast(S, addr, tid, is_write):
                return
            _granule_access(
                S[I_SGW],
                S[I_SGP],
                S[I_SGH],
                S[I_SGB],
                S[I_SGF],
                S[I_MSG],
                addr,
                tid,
                region,
                is_write,
            )

        return granule
    return lambda S, addr, tid, region, is_write: _discopop_access(S, addr, tid, region, is_write)


@_hot
def record_access(S, e, addr, isz, is_write) -> None:
    """Apply one access of the current thread (``ctl``) to every enabled shadow memory.

    Exact memory: per element ``e`` the last writer (int8) and the readers-since mask
    (uint64). Signature memory (``S[I_SGP]`` selects the design, see
    :mod:`hpcnb.commprof.signature`): DiscoPoP's last writer per write slot and last reader
    per read slot, or the granule design's tagged slots of ``G`` consecutive words.
    A read is an event when the writer is another thread that this reader has not yet read
    from since the write.

    The hot hooks are compiled without Numba's reference counting (``_nrt=False``; they
    allocate nothing): with it, every call paid atomic reference-count updates for the
    arrays of ``S``, about 100x the cost of the shadow-memory update itself.

    Args:
        S: The profiler state tuple (layout: the ``I_*`` indices).
        e: Element index of the accessed word in the exact shadow memory.
        addr: Its simulated byte address (hashed by the signature memory).
        isz: Its item size in bytes (added to the byte matrix per event).
        is_write: Whether the access is a store.
    """
    ctl = S[I_CTL]
    tid = ctl[CTL_TID]
    if ctl[CTL_SAMPLE_MODE] == 1 and ctl[CTL_SAMPLE] > 1 and not is_write:
        left = ctl[CTL_COUNTDOWN + tid] - 1
        if left > 0:
            ctl[CTL_COUNTDOWN + tid] = left
            return
        ctl[CTL_COUNTDOWN + tid] = ctl[CTL_SAMPLE]
    region = ctl[CTL_REGION]
    S[I_ACC][region, 1 if is_write else 0] += 1
    flags = ctl[CTL_FLAGS]
    if flags & FLAG_EXACT:
        exw = S[I_EXW]
        if is_write:
            exw[e] = tid
            S[I_EXR][e] = 0
        else:
            w = exw[e]
            if w >= 0 and w != tid:
                bit = np.uint64(1) << np.uint64(tid)
                exr = S[I_EXR]
                if not (exr[e] & bit):
                    exr[e] |= bit
                    S[I_MEX][region, w, tid] += 1
                    S[I_MBY][region, w, tid] += isz
    if flags & FLAG_SIGNATURE:
        _signature(S, addr, tid, region, is_write)
    if flags & FLAG_TRACE:
        tr = S[I_TRACE]
        n = ctl[CTL_TRACE_N]
        if n < tr.shape[0]:
            tr[n, 0] = tid
            tr[n, 1] = region
            tr[n, 2] = e
            tr[n, 3] = addr
            tr[n, 4] = 1 if is_write else 0
            tr[n, 5] = ctl[CTL_PHASE]
        ctl[CTL_TRACE_N] = n + 1


# ---- trace replay: here, so that Numba's on-disk cache of these loops, which inline
# record_access, is invalidated whenever this file changes --------------------------------


@_hot  # allocates nothing: no reference counts on the state's arrays per access
def replay(S, trace, keys):
    """Feed a recorded trace through :func:`record_access` (trace replay).

    Args:
        S: The profiler state tuple (layout: the ``I_*`` indices).
        trace: ``int64[n, 6]`` trace (columns :data:`TRACE_COLUMNS`).
        keys: Empty, or the key array of an open-addressing hash table (``-1`` = free,
            power-of-two length) that maps each address to its exact-shadow entry.

    Returns:
        The number of table entries taken (0 without a table).
    """
    ctl = S[I_CTL]
    cap = keys.shape[0]
    mask = np.int64(cap - 1)
    used = 0
    for n in range(trace.shape[0]):
        ctl[CTL_TID] = trace[n, 0]
        ctl[CTL_REGION] = trace[n, 1]
        ctl[CTL_PHASE] = trace[n, 5]
        addr = trace[n, 3]
        e = trace[n, 2]
        if cap > 0:
            h = (np.uint64(addr) * _FIB) >> np.uint64(20)
            e = np.int64(h & np.uint64(mask))
            while keys[e] != addr and keys[e] != -1:
                e = np.int64((e + 1) & mask)
            if keys[e] == -1:
                keys[e] = addr
                used += 1
        record_access(S, e, addr, 0, trace[n, 4] == 1)
    return used


@njit(cache=True)
def replay_flags(S, trace):
    """Replay a trace; per row, whether it was a communication event of the exact memory.

    Args:
        S: The profiler state tuple (exact memory enabled).
        trace: ``int64[n, 6]`` trace (columns :data:`TRACE_COLUMNS`).
    """
    ctl = S[I_CTL]
    mex = S[I_MEX]
    flags = np.zeros(trace.shape[0], np.bool_)
    for n in range(trace.shape[0]):
        tid, region = trace[n, 0], trace[n, 1]
        ctl[CTL_TID] = tid
        ctl[CTL_REGION] = region
        before = mex[region, :, tid].sum()
        record_access(S, trace[n, 2], trace[n, 3], 0, trace[n, 4] == 1)
        flags[n] = mex[region, :, tid].sum() > before
    return flags


@njit(cache=True)
def replay_writers(S, trace):
    """Replay a trace; per row, the writer of the event each memory reports (-1: none).

    Args:
        S: The profiler state tuple (exact and signature memories enabled).
        trace: ``int64[n, 6]`` trace (columns :data:`TRACE_COLUMNS`).

    Returns:
        ``int64[n, 2]``: the exact memory's writer and the signature memory's.
    """
    ctl = S[I_CTL]
    mex, msg = S[I_MEX], S[I_MSG]
    out = np.full((trace.shape[0], 2), -1, np.int64)
    for n in range(trace.shape[0]):
        tid, region = trace[n, 0], trace[n, 1]
        ctl[CTL_TID] = tid
        ctl[CTL_REGION] = region
        before_x = mex[region, :, tid].copy()
        before_s = msg[region, :, tid].copy()
        record_access(S, trace[n, 2], trace[n, 3], 0, trace[n, 4] == 1)
        for w in range(mex.shape[1]):
            if mex[region, w, tid] != before_x[w]:
                out[n, 0] = w
            if msg[region, w, tid] != before_s[w]:
                out[n, 1] = w
    return out


@_hot
def _access(S, aid, flat, is_write) -> None:
    e = S[I_BASE][aid] + flat
    # word sampling: the threshold is 2**32 (nothing skipped) unless sampling by words
    if (np.uint64(e) * _FIB) >> np.uint64(32) >= np.uint64(S[I_CTL][CTL_SAMPLE_THRESHOLD]):
        return
    isz = S[I_ISZ][aid]
    record_access(S, e, S[I_BYTES][aid] + flat * isz, isz, is_write)


@_hot
def _wrap(i, n):
    return i + n if i < 0 else i


@_hot
def _at2(a, i, j):
    # (i, j, row-major element index) of a[i, j], negative indices counted from the end
    i = _wrap(i, a.shape[0])
    j = _wrap(j, a.shape[1])
    return i, j, i * a.shape[1] + j


@_hot
def _at3(a, i, j, k):
    # (i, j, k, row-major element index) of a[i, j, k], negative indices counted from the end
    i = _wrap(i, a.shape[0])
    j = _wrap(j, a.shape[1])
    k = _wrap(k, a.shape[2])
    return i, j, k, (i * a.shape[1] + j) * a.shape[2] + k


@_hot
def ld1(S, aid, a, i):
    """Load ``a[i]`` through the profiler.

    Args:
        S, aid, a: The access-hook convention: the profiler state tuple (layout: the ``I_*``
            indices), the array's index among the kernel's arrays and the array itself.
        i: Index (negative counts from the end).

    Returns:
        The element.
    """
    i = _wrap(i, a.shape[0])
    _access(S, aid, i, False)
    return a[i]


@_hot
def ld2(S, aid, a, i, j):
    """Load ``a[i, j]`` (C-contiguous) through the profiler.

    Args:
        S, aid, a: The access-hook convention: the profiler state tuple (layout: the ``I_*``
            indices), the array's index among the kernel's arrays and the array itself.
        i, j: Row and column index (negative ones count from the end).

    Returns:
        The element.
    """
    i, j, flat = _at2(a, i, j)
    _access(S, aid, flat, False)
    return a[i, j]


@_hot
def ld3(S, aid, a, i, j, k):
    """Load ``a[i, j, k]`` (C-contiguous) through the profiler.

    Args:
        S, aid, a: The access-hook convention: the profiler state tuple (layout: the ``I_*``
            indices), the array's index among the kernel's arrays and the array itself.
        i, j, k: The three indices, outermost first (negative ones count from the end).

    Returns:
        The element.
    """
    i, j, k, flat = _at3(a, i, j, k)
    _access(S, aid, flat, False)
    return a[i, j, k]


@_hot
def st1(S, aid, a, i, v) -> None:
    """Store ``a[i] = v`` through the profiler.

    Args:
        S, aid, a: The access-hook convention: the profiler state tuple (layout: the ``I_*``
            indices), the array's index among the kernel's arrays and the array itself.
        i: Index (negative counts from the end).
        v: Value stored.
    """
    i = _wrap(i, a.shape[0])
    a[i] = v
    _access(S, aid, i, True)


@_hot
def st2(S, aid, a, i, j, v) -> None:
    """Store ``a[i, j] = v`` through the profiler.

    Args:
        S, aid, a: The access-hook convention: the profiler state tuple (layout: the ``I_*``
            indices), the array's index among the kernel's arrays and the array itself.
        i, j: Row and column index (negative ones count from the end).
        v: Value stored.
    """
    i, j, flat = _at2(a, i, j)
    a[i, j] = v
    _access(S, aid, flat, True)


@_hot
def st3(S, aid, a, i, j, k, v) -> None:
    """Store ``a[i, j, k] = v`` through the profiler.

    Args:
        S, aid, a: The access-hook convention: the profiler state tuple (layout: the ``I_*``
            indices), the array's index among the kernel's arrays and the array itself.
        i, j, k: The three indices, outermost first (negative ones count from the end).
        v: Value stored.
    """
    i, j, k, flat = _at3(a, i, j, k)
    a[i, j, k] = v
    _access(S, aid, flat, True)


@_hot
def enter(S, rid) -> None:
    """Region entry hook: push the current region and make ``rid`` current.

    Args:
        S: The profiler state tuple (layout: the ``I_*`` indices).
        rid: Region id of the loop being entered.
    """
    ctl = S[I_CTL]
    d = ctl[CTL_DEPTH]
    S[I_STACK][d] = ctl[CTL_REGION]
    ctl[CTL_DEPTH] = d + 1
    ctl[CTL_REGION] = rid


@_hot
def leave(S, rid) -> None:
    """Region exit hook: pop back to the enclosing region.

    Args:
        S: The profiler state tuple (layout: the ``I_*`` indices).
        rid: Region id of the loop being left (the stack says where to return).
    """
    ctl = S[I_CTL]
    d = ctl[CTL_DEPTH] - 1
    ctl[CTL_DEPTH] = d
    ctl[CTL_REGION] = S[I_STACK][d]


@njit(cache=True)
def _jitter(seed, k):
    x = np.uint64(seed * 1000003 + k + 1) * _FIB
    x ^= x >> np.uint64(29)
    return int(x % np.uint64(1000))


@njit(cache=True)
def sched_iters(sched, tid, nthreads, lo, hi):
    """Iterations of ``range(lo, hi)`` that thread ``tid`` executes.

    Args:
        sched: ``int64[3]``: kind (0 static blocks, 1 cyclic chunks, 2 dynamic chunks),
            chunk size, seed. Dynamic hands each chunk, in order, to the thread that is
            free first under seeded per-chunk costs (a deterministic stand-in for an
            OpenMP dynamic schedule; ties go to the lowest thread id).
        tid: Thread id.
        nthreads: Number of threads.
        lo: First iteration.
        hi: One past the last iteration.

    Returns:
        ``int64`` array of the thread's iterations in execution order.
    """
    n = hi - lo
    if n <= 0:
        return np.empty(0, np.int64)
    kind = sched[0]
    c = max(1, sched[1])
    if kind == 0:
        s = lo + (n * tid) // nthreads
        e = lo + (n * (tid + 1)) // nthreads
        return np.arange(s, e).astype(np.int64)
    nch = (n + c - 1) // c
    owner = np.empty(nch, np.int64)
    if kind == 1:
        for k in range(nch):
            owner[k] = k % nthreads
    else:
        finish = np.zeros(nthreads, np.int64)
        for k in range(nch):
            best = 0
            for t in range(1, nthreads):
                if finish[t] < finish[best]:
                    best = t
            owner[k] = best
            length = min(c, n - k * c)
            finish[best] += length * (1000 + _jitter(sched[2], k))
    cnt = 0
    for k in range(nch):
        if owner[k] == tid:
            cnt += min(c, n - k * c)
    out = np.empty(cnt, np.int64)
    p = 0
    for k in range(nch):
        if owner[k] == tid:
            for q in range(k * c, min(n, (k + 1) * c)):
                out[p] = lo + q
                p += 1
    return out
