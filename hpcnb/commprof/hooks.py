"""Numba-compiled profiler hooks, schedules and shadow-memory updates.

The instrumented variant of a kernel calls :func:`ld1` … :func:`st3` for every array
load and store and :func:`enter` / :func:`leave` around every loop. All profiler state
travels in one tuple ``S`` of NumPy arrays (Numba compiles heterogeneous tuples), laid out
by the ``I_*`` indices below; :mod:`hpcnb.commprof.runtime` builds it.

Communication event: a thread reads an address whose last writer is another thread,
counted once per (write, reading thread): the exact memory's "readers since the last
write" bit mask suppresses repeated reads of the same value by the same thread (the value
is then in that thread's cache); the signature's read table approximates it with the last
reader per slot. :func:`record_access` is the one implementation, used by the hooks and
by trace replay.

Sampling (``ctl[CTL_SAMPLE] = k > 1``), two modes (:data:`SAMPLE_MODES`):

* ``words``: a word (array element) is in the sample when a multiplicative (Fibonacci)
  hash of its element index falls below ``2**32 / k``; every access to a sampled word is
  profiled, every other access costs one multiply and compare. Events on the sampled
  words are exact, so k times the sampled matrix estimates the full one without bias.
* ``reads``: every write is applied, and only every k-th read of each thread (a per-thread
  countdown) is checked; the others cost one decrement. Periodic sampling aliases with
  loop strides, and a value read r times is caught about r times as often as one read once.

:mod:`hpcnb.commprof.sampling` scales the matrix and bounds its error.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
    "FLAG_SIGNATURE",
    "FLAG_TRACE",
    "HASH_KINDS",
    "SAMPLE_MODES",
    "SCHEDULE_KINDS",
    "TRACE_COLUMNS",
    "enter",
    "hash_slot",
    "ld1",
    "ld2",
    "ld3",
    "leave",
    "record_access",
    "sched_iters",
    "st1",
    "st2",
    "st3",
]

# ---- layout of the state tuple S -------------------------------------------------------
I_CTL, I_BASE, I_BYTES, I_ISZ = 0, 1, 2, 3
I_EXW, I_EXR, I_SGW, I_SGR = 4, 5, 6, 7
I_MEX, I_MSG, I_STACK, I_ACC, I_TRACE, I_MBY = 8, 9, 10, 11, 12, 13

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

#: Trace columns (one row per access, in execution order).
TRACE_COLUMNS = ("tid", "region", "element", "address", "is_write", "phase")

#: Hash functions of the signature memory, by name -> code used in compiled code.
HASH_KINDS = {"discopop": 0, "modulo": 1, "word": 2, "fibonacci": 3}

#: Loop schedules of ``prange`` work-sharing loops, by name -> code.
SCHEDULE_KINDS = {"static": 0, "cyclic": 1, "dynamic": 2}

_FIB = np.uint64(0x9E3779B97F4A7C15)

#: Decorator of the hot hooks: cached and compiled without Numba's reference counting
#: (``_nrt=False``, an option that Numba's type stubs do not list; see :func:`record_access`).
_hot = njit(cache=True, _nrt=False)  # type: ignore[call-overload]


@_hot
def hash_slot(addr: int, kind: int, slots: int) -> int:
    """Map a byte address to a signature slot.

    Args:
        addr: Byte address (non-negative).
        kind: 0 DiscoPoP ``((addr >> 8) + addr) mod slots``, 1 ``addr mod slots``,
            2 word ``(addr >> 3) mod slots``, 3 Fibonacci (multiplicative) hashing.
        slots: Number of slots (> 0). For the DiscoPoP hash, a power of two turns the
            modulo into a mask (a 64-bit division costs tens of cycles per access).

    Returns:
        The slot index in ``[0, slots)``.
    """
    pow2 = slots & (slots - 1) == 0
    if kind == 0:
        h0 = (addr >> 8) + addr
        return h0 & (slots - 1) if pow2 else h0 % slots
    if kind == 1:
        return addr % slots
    if kind == 2:
        return (addr >> 3) % slots
    h = np.uint64(addr) * _FIB
    return int(h >> np.uint64(24)) % slots


@_hot
def record_access(S, e, addr, isz, is_write) -> None:
    """Apply one access of the current thread (``ctl``) to every enabled shadow memory.

    Exact memory: per element ``e`` the last writer (int8) and the readers-since mask
    (uint64). Signature memory: the write signature keeps the last writer per slot and the
    read signature the last reader per slot since the slot's last write (int8 each); their
    slot counts differ and they share the hash of the byte address ``addr``. A read is an
    event when the writer is another thread that this reader has not yet read from since
    the write. Collisions in the signatures mis-attribute writers or merge readers.

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
        sgw = S[I_SGW]
        sgr = S[I_SGR]
        hw = hash_slot(addr, ctl[CTL_HASH], sgw.shape[0])
        hr = hash_slot(addr, ctl[CTL_HASH], sgr.shape[0])
        if is_write:
            sgw[hw] = tid
            sgr[hr] = -1
        else:
            w = sgw[hw]
            last = sgr[hr]
            sgr[hr] = tid
            if w >= 0 and w != tid and last != tid:
                S[I_MSG][region, w, tid] += 1
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
