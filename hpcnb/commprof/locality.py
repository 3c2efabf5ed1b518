"""Hardware-independent communication-locality metrics from an access trace.

Definitions (ours; the ICPP 2018 paper's exact formulas were not retrievable). The trace
is the virtual-thread execution order recorded by ``profile(..., trace=True)``.

* **Communication event**: as in :mod:`hpcnb.commprof.hooks` (a read of a word last written
  by another thread, once per write and reader), attributed to the reader's region.
* **Communication distance** of an event whose write happened at trace position ``i`` and
  whose read is at ``j``: the number of *distinct* words accessed strictly between ``i``
  and ``j`` (the word itself excluded), counted three ways: over all threads (``all``),
  over the producer's own accesses (``producer``) and over the consumer's own accesses
  (``consumer``). It is a reuse distance (Olken-style): a Fenwick tree over trace positions
  holds a 1 at the latest access of every word, so a distance is one prefix-sum query.
  Distances go into log2 histograms (bin ``k`` holds distances in ``[2^k - 1, 2^(k+1) - 1)``).
* **Near fraction**: the fraction of events whose all-thread distance is at most
  ``capacity`` words (a cache-capacity threshold).
* **False sharing** at cache-line granularity (``line_bytes``): an access by thread ``t`` to
  word ``x`` of line ``L`` whose last writer is another thread that wrote a different word
  of ``L``, counted once per (write, thread) like events.
* **Locality score** = ``1 - (far events + false-sharing events) / accesses``: the fraction
  of accesses that do not cause a transfer from far away or a useless line transfer.
* **Sharing** of a word within a region and the loops nested in it: private (one
  thread), read-only (several readers, no writer), producer–consumer (one writer, other
  readers) or migratory (several writers).
  The **sharing degree** is the mean number of threads per word touched by two or more.
* **Line utilisation**: per access, the fraction of the words of its line that the
  accessing thread touches in the region, averaged over accesses (1 = whole lines used).
* **Concurrent interleaving.** Virtual threads run one after another within a phase,
  which would hide false sharing and stretch distances; the metrics are therefore
  computed on the trace re-ordered as concurrent threads would make the accesses: within each
  phase, the threads' access streams are merged round-robin, ``quantum`` accesses at a
  time (:func:`interleave`). True communication between phases is unchanged.
* **Imbalance**: max over threads of events sent + received, over the mean (1 = even).
* **Occupancy** of a region: the share of (phase, thread) pairs with accesses in the region
  among the phases in which any thread accesses it (1 = every thread works in every phase
  the region runs). A region is **staggered** when every thread accesses it and both the
  first and the last phase in which a thread does rise strictly with the thread id: the
  threads work in a window of phases shifted by one per thread, as in a wavefront or a
  software pipeline, whose idle pairs are the fill and the drain.
* **Cache capacity at the timed size.** Distances grow with the footprint, so a profile of
  a small input is judged against a cache scaled down by the same factor
  (:func:`scaled_capacity`: the cache's words times the profiled over the timed footprint);
  :func:`cache_bytes` reads this machine's cache sizes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from hpcnb.commprof.runtime import Profile
from hpcnb.errors import HpcnbError, InvalidInputError

__all__ = [
    "LocalityConfig",
    "RegionLocality",
    "TracePositionError",
    "analyse_locality",
    "brute_force_distances",
    "cache_bytes",
    "communication_distances",
    "interleave",
    "producing_write",
    "scaled_capacity",
]

NBINS = 40


class TracePositionError(HpcnbError, IndexError):
    """A position that is not in the access trace it indexes."""


@dataclass(frozen=True)
class LocalityConfig:
    """Parameters of the locality metrics.

    Attributes:
        line_bytes: Cache-line size for false sharing and line utilisation.
        capacity: Cache-capacity threshold in words for the near fraction / locality score.
        quantum: Accesses per thread per round of the concurrent interleaving (0: keep the
            serial virtual-thread order).
    """

    line_bytes: int = 64
    capacity: int = 4096
    quantum: int = 1


@njit(cache=True)
def _fen_add(f, i, v):
    i += 1
    n = f.shape[0]
    while i < n:
        f[i] += v
        i += i & (-i)


@njit(cache=True)
def _fen_sum(f, i):
    """Sum of positions 0..i-1."""
    s = 0
    while i > 0:
        s += f[i]
        i -= i & (-i)
    return s


@njit(cache=True)
def _distances(trace, n_words, T):
    """Events and their three distances; see module docstring."""
    n = trace.shape[0]
    fg = np.zeros(n + 1, np.int32)
    ft = np.zeros((T, n + 1), np.int32)
    last_g = np.full(n_words, -1, np.int64)
    last_t = np.full((T, n_words), -1, np.int64)
    writer = np.full(n_words, -1, np.int64)
    wtime = np.full(n_words, -1, np.int64)
    readers = np.zeros(n_words, np.uint64)
    out = np.zeros((n, 7), np.int64)  # time, region, producer, consumer, d_all, d_prod, d_cons
    ne = 0
    for j in range(n):
        t = trace[j, 0]
        x = trace[j, 2]
        if trace[j, 4] == 1:
            writer[x] = t
            wtime[x] = j
            readers[x] = 0
        else:
            w = writer[x]
            bit = np.uint64(1) << np.uint64(t)
            if w >= 0 and w != t and not (readers[x] & bit):
                readers[x] |= bit
                i = wtime[x]
                d_all = _fen_sum(fg, j) - _fen_sum(fg, i + 1)
                if last_g[x] > i:
                    d_all -= 1
                d_prod = _fen_sum(ft[w], j) - _fen_sum(ft[w], i + 1)
                if last_t[w, x] > i:
                    d_prod -= 1
                d_cons = _fen_sum(ft[t], j) - _fen_sum(ft[t], i + 1)
                if last_t[t, x] > i:
                    d_cons -= 1
                out[ne, 0] = j
                out[ne, 1] = trace[j, 1]
                out[ne, 2] = w
                out[ne, 3] = t
                out[ne, 4] = d_all
                out[ne, 5] = d_prod
                out[ne, 6] = d_cons
                ne += 1
        if last_g[x] >= 0:
            _fen_add(fg, last_g[x], -1)
        _fen_add(fg, j, 1)
        last_g[x] = j
        if last_t[t, x] >= 0:
            _fen_add(ft[t], last_t[t, x], -1)
        _fen_add(ft[t], j, 1)
        last_t[t, x] = j
    return out[:ne]


@njit(cache=True)
def _line_metrics(trace, line_bytes, n_words, R, T):
    """False-sharing counts, sharing masks and line utilisation per region."""
    n = trace.shape[0]
    base = trace[:, 3].min() // line_bytes if n else 0
    n_lines = (trace[:, 3].max() // line_bytes - base + 1) if n else 1
    lw = np.full(n_lines, -1, np.int64)  # last writer per line
    lwa = np.full(n_lines, -1, np.int64)  # word it wrote
    lseen = np.zeros(n_lines, np.uint64)  # threads already charged since that write
    fs = np.zeros((R, T, T), np.int64)
    fsp = np.zeros(R, np.int64)  # false sharing between per-thread words
    wmask = np.zeros((R, n_words), np.uint64)
    rmask = np.zeros((R, n_words), np.uint64)
    wcount = np.zeros((R, n_words), np.int64)
    writers = np.zeros(n_words, np.uint64)  # every thread that ever writes each word
    for j in range(n):
        if trace[j, 4] == 1:
            writers[trace[j, 2]] |= np.uint64(1) << np.uint64(trace[j, 0])
    for j in range(n):
        t, r, x, a, isw = trace[j, 0], trace[j, 1], trace[j, 2], trace[j, 3], trace[j, 4]
        bit = np.uint64(1) << np.uint64(t)
        L = a // line_bytes - base
        if isw == 1:
            wmask[r, x] |= bit
            wcount[r, x] += 1
        else:
            rmask[r, x] |= bit
        w = lw[L]
        if w >= 0 and w != t and lwa[L] != x and not (lseen[L] & bit):
            lseen[L] |= bit
            fs[r, w, t] += 1
            mine = writers[x] == 0 or writers[x] == bit
            if mine and writers[lwa[L]] == np.uint64(1) << np.uint64(w):
                fsp[r] += 1
        if isw == 1:
            lw[L] = t
            lwa[L] = x
            lseen[L] = 0
    return fs, fsp, wmask, rmask, wcount


@dataclass(frozen=True)
class RegionLocality:
    """Locality metrics of one region (see module docstring).

    Attributes:
        rid: Region id.
        accesses: Reads plus writes in the region.
        volume: Communication events (exclusive to the region).
        pair_volume: ``[T, T]`` events per (producer, consumer).
        hist: ``[3, NBINS]`` log2 histograms of the all / producer / consumer distances.
        pair_near: ``[T, T]`` events within ``capacity`` per pair.
        near_fraction: Fraction of events within ``capacity`` (1 when there are none).
        false_sharing: False-sharing events.
        locality_score: ``1 - (far events + false sharing) / accesses``.
        sharing: Words per class: private, read-only, producer-consumer, migratory.
        sharing_degree: Mean threads per word shared by two or more threads.
        write_repeat: Writes per written word (high: an accumulator).
        written_words: Distinct words written in the region.
        line_utilisation: Mean fraction of a line's words a thread touches.
        imbalance: Max over threads of (sent + received) events over the mean.
        occupancy: Share of (phase, thread) pairs with accesses among the region's phases.
        staggered: Whether the threads' phase windows shift with the thread id (wavefront).
        writer_words: Mean distinct words written per thread that writes in the region
            (1 with a write repeat of many: one running value per thread at a fixed address).
        private_false_sharing: False-sharing events between per-thread words: the accessed
            word and the word the line's last writer wrote are each written by one thread
            only over the whole trace (per-thread slots that padding separates, unlike a
            shared array that several threads write in turn).
    """

    rid: int
    accesses: int
    volume: int
    pair_volume: np.ndarray
    hist: np.ndarray
    pair_near: np.ndarray
    near_fraction: float
    false_sharing: int
    locality_score: float
    sharing: dict[str, int]
    sharing_degree: float
    write_repeat: float
    written_words: int
    line_utilisation: float
    imbalance: float
    occupancy: float = 1.0
    staggered: bool = False
    writer_words: float = 0.0
    private_false_sharing: int = 0


def interleave(trace: np.ndarray, quantum: int = 1) -> np.ndarray:
    """Re-order a trace as concurrent threads would make the accesses (see module docstring).

    Args:
        trace: Access trace in virtual-thread order (columns of ``hooks.TRACE_COLUMNS``).
        quantum: Accesses per thread per round-robin turn within a phase.

    Returns:
        The same rows, re-ordered.
    """
    if quantum < 1 or not len(trace):
        return trace
    tid, phase = trace[:, 0], trace[:, 5]
    rank = np.zeros(len(trace), np.int64)
    key = phase * 64 + tid
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sk)) + 1]
    counts = np.diff(np.r_[starts, len(sk)])
    rank[order] = np.arange(len(sk)) - np.repeat(starts, counts)
    new = np.lexsort((rank % quantum, tid, rank // quantum, phase))
    return trace[new]


def producing_write(trace: np.ndarray, j: int) -> int:
    """Trace position of the last write, before position ``j``, of the word accessed at ``j``.

    For a communication event read at ``j`` this is the write that produced the value
    (position ``i`` of the distance definition); ``-1`` when the word was not written before.

    Args:
        trace: Access trace (columns of ``hooks.TRACE_COLUMNS``).
        j: Position of the access.

    Raises:
        TracePositionError: ``j`` is not a position of the trace.
    """
    if not 0 <= j < len(trace):
        raise TracePositionError(f"position {j} is outside the trace of {len(trace)} accesses")
    prior = trace[:j]
    hits = np.flatnonzero((prior[:, 2] == trace[j, 2]) & (prior[:, 4] == 1))
    return int(hits[-1]) if len(hits) else -1


def communication_distances(p: Profile) -> np.ndarray:
    """Events with distances.

    Args:
        p: A profile with a trace.

    Returns:
        ``int64[n, 7]``: time, region, producer, consumer, all, producer and consumer distance.

    Raises:
        InvalidInputError: The profile has no trace.
    """
    if p.trace is None:
        raise InvalidInputError(f"profile of {p.kernel} has no trace: run profile(..., trace=True)")
    return _distances(p.trace, max(1, p.n_elements), p.nthreads)


def brute_force_distances(p: Profile) -> np.ndarray:
    """Reference implementation of :func:`communication_distances` (quadratic, for tests).

    Args:
        p: A profile with a trace.

    Raises:
        InvalidInputError: The profile has no trace.
    """
    tr = p.trace
    if tr is None:
        raise InvalidInputError("profile has no trace")
    writer: dict[int, tuple[int, int]] = {}
    seen: dict[int, set[int]] = {}
    rows = []
    for j, (t, r, x, _a, isw, _ph) in enumerate(tr.tolist()):
        if isw:
            writer[x] = (t, j)
            seen[x] = set()
            continue
        if x in writer and writer[x][0] != t and t not in seen[x]:
            seen[x].add(t)
            w, i = writer[x]
            mid = tr[i + 1 : j]
            d = [
                len(set(mid[sel, 2].tolist()) - {x})
                for sel in (slice(None), mid[:, 0] == w, mid[:, 0] == t)
            ]
            rows.append([j, r, w, t, *d])
    return np.array(rows, dtype=np.int64).reshape(-1, 7)


def _log2_bins(d: np.ndarray) -> np.ndarray:
    return np.minimum(np.floor(np.log2(d + 1)).astype(np.int64), NBINS - 1)


def analyse_locality(
    p: Profile, config: LocalityConfig | None = None
) -> tuple[list[RegionLocality], dict[str, float]]:
    """Compute the locality metrics of every region of a traced profile.

    Args:
        p: A profile with a trace (``profile(..., trace=True)``).
        config: Line size, capacity and interleaving (defaults of :class:`LocalityConfig`).

    Returns:
        One :class:`RegionLocality` per region (exclusive attribution) and run statistics
        (``accesses``, ``seconds``, ``rate`` = accesses analysed per second).

    Raises:
        InvalidInputError: ``line_bytes`` is not a power of two >= 8, or no trace.
    """
    config = config or LocalityConfig()
    if config.line_bytes < 8 or config.line_bytes & (config.line_bytes - 1):
        raise InvalidInputError(f"line_bytes={config.line_bytes}: expected a power of two >= 8")
    if p.trace is None:
        raise InvalidInputError(f"profile of {p.kernel} has no trace: run profile(..., trace=True)")
    R, T, W = len(p.regions), p.nthreads, max(1, p.n_elements)
    tr = interleave(p.trace, config.quantum) if config.quantum else p.trace
    t0 = time.perf_counter()
    ev = _distances(tr, W, T)
    fs, fsp, wmask, rmask, wcount = _line_metrics(tr, config.line_bytes, W, R, T)
    seconds = time.perf_counter() - t0
    for reg in sorted(p.regions, key=lambda x: x.rid, reverse=True):  # sharing: inclusive
        if reg.parent >= 0:
            wmask[reg.parent] |= wmask[reg.rid]
            rmask[reg.parent] |= rmask[reg.rid]
    out = []
    for r in range(R):
        e = ev[ev[:, 1] == r]
        pv = np.zeros((T, T), np.int64)
        np.add.at(pv, (e[:, 2], e[:, 3]), 1)
        near = e[:, 4] <= config.capacity
        pn = np.zeros((T, T), np.int64)
        np.add.at(pn, (e[near, 2], e[near, 3]), 1)
        hist = np.zeros((3, NBINS), np.int64)
        for k in range(3):
            np.add.at(hist[k], _log2_bins(e[:, 4 + k]), 1)
        acc = int((tr[:, 1] == r).sum())
        nfs = int(fs[r].sum())
        far = int((~near).sum())
        wm, rm = wmask[r], rmask[r]
        nthr = np.array([bin(int(v)).count("1") for v in (wm | rm)])
        nwri = np.array([bin(int(v)).count("1") for v in wm])
        touched = nthr > 0
        sharing = {
            "private": int((nthr == 1).sum()),
            "read-only": int(((nthr >= 2) & (nwri == 0)).sum()),
            "producer-consumer": int(((nthr >= 2) & (nwri == 1)).sum()),
            "migratory": int(((nthr >= 2) & (nwri >= 2)).sum()),
        }
        shared = nthr >= 2
        written = wcount[r] > 0
        sel = tr[tr[:, 1] == r]
        util = _line_utilisation(sel, config.line_bytes, p.itemsizes)
        sent_recv = pv.sum(axis=0) + pv.sum(axis=1)
        occupancy, staggered = _phase_windows(sel, T)
        out.append(
            RegionLocality(
                rid=r,
                accesses=acc,
                volume=len(e),
                pair_volume=pv,
                hist=hist,
                pair_near=pn,
                near_fraction=float(near.mean()) if len(e) else 1.0,
                false_sharing=nfs,
                locality_score=1.0 - (far + nfs) / acc if acc else 1.0,
                sharing=sharing,
                sharing_degree=float(nthr[shared].mean()) if shared.any() else 0.0,
                write_repeat=float(wcount[r][written].mean()) if written.any() else 0.0,
                written_words=int(written.sum()),
                line_utilisation=util if touched.any() else 1.0,
                imbalance=float(sent_recv.max() / sent_recv.mean()) if len(e) else 1.0,
                occupancy=occupancy,
                staggered=staggered,
                writer_words=_writer_words(sel),
                private_false_sharing=int(fsp[r]),
            )
        )
    n = len(tr)
    return out, {"accesses": n, "seconds": seconds, "rate": n / seconds if seconds else 0.0}


def _phase_windows(sel: np.ndarray, nthreads: int) -> tuple[float, bool]:
    """Occupancy and staggering of one region's accesses (module docstring)."""
    if not len(sel):
        return 1.0, False
    phases = np.unique(sel[:, 5])
    pairs = np.unique(sel[:, 5] * (1 << 20) + sel[:, 0])
    occupancy = len(pairs) / (len(phases) * nthreads)
    first = np.full(nthreads, -1, np.int64)
    last = np.full(nthreads, -1, np.int64)
    for t in range(nthreads):
        mine = sel[sel[:, 0] == t, 5]
        if len(mine):
            first[t], last[t] = mine.min(), mine.max()
    staggered = bool(
        nthreads > 1
        and (first >= 0).all()
        and (np.diff(first) > 0).all()
        and (np.diff(last) > 0).all()
    )
    return float(occupancy), staggered


def _writer_words(sel: np.ndarray) -> float:
    """Mean distinct words written per writing thread of one region's accesses."""
    writes = sel[sel[:, 4] == 1]
    if not len(writes):
        return 0.0
    pairs = np.unique(writes[:, 0] * (1 << 40) + writes[:, 2])
    return len(pairs) / len(np.unique(writes[:, 0]))


def cache_bytes(level: int | None = None) -> int | None:
    """Size of this machine's data or unified cache at ``level`` (default: the last level).

    Read from Linux's ``/sys/devices/system/cpu/cpu0/cache``; ``None`` where it is not
    available (another operating system, a container without it).

    Args:
        level: Cache level (1, 2, 3, ...); ``None`` for the highest level present.
    """
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes: dict[int, int] = {}
    for index in sorted(root.glob("index*")) if root.is_dir() else []:
        try:
            kind = (index / "type").read_text().strip()
            lvl = int((index / "level").read_text().strip())
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not text:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        digits = text[:-1] if text[-1] in "KMG" else text
        if digits.isdigit():
            sizes[lvl] = int(digits) * unit
    if not sizes:
        return None
    return sizes.get(max(sizes) if level is None else level)


def scaled_capacity(cache: int, profiled_words: int, timed_words: int, word_bytes: int = 8) -> int:
    """Cache-capacity threshold in words for a profile of a smaller input than the timed one.

    Args:
        cache: Cache size in bytes (e.g. :func:`cache_bytes`).
        profiled_words: Words of the profiled run's arrays.
        timed_words: Words of the run whose speed the advice is about.
        word_bytes: Bytes per word.

    Returns:
        ``cache / word_bytes * profiled_words / timed_words``, at least 1.

    Raises:
        InvalidInputError: A size that is not positive.
    """
    if min(cache, profiled_words, timed_words, word_bytes) <= 0:
        raise InvalidInputError(
            f"scaled_capacity(cache={cache}, profiled_words={profiled_words}, "
            f"timed_words={timed_words}, word_bytes={word_bytes}): sizes must be positive"
        )
    return max(1, int(cache / word_bytes * profiled_words / timed_words))


def _line_utilisation(sel: np.ndarray, line_bytes: int, itemsizes: list[int]) -> float:
    if not len(sel):
        return 1.0
    word = min(itemsizes) if itemsizes else 8
    words_per_line = max(1, line_bytes // word)
    key = sel[:, 0] * (1 << 40) + sel[:, 3] // line_bytes
    pairs = np.unique(np.stack([key, sel[:, 3] // word]), axis=1)
    lines, used = np.unique(pairs[0], return_counts=True)
    frac = dict(
        zip(
            lines.tolist(),
            (np.minimum(used, words_per_line) / words_per_line).tolist(),
            strict=True,
        )
    )
    return float(np.mean([frac[k] for k in key.tolist()]))
