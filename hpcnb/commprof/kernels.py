"""Suite kernels: our own small versions of Rodinia / SPLASH-style programs.

Each kernel follows the :mod:`hpcnb.commprof.instrument` conventions (``tid, nthreads,
phase`` first; scratch arrays are arguments). :mod:`hpcnb.commprof.suite` supplies inputs,
phase counts and the ground-truth pattern of each.
"""

from __future__ import annotations

from hpcnb.commprof.instrument import kernel, prange

__all__ = [
    "bfs",
    "fft",
    "hotspot",
    "jacobi",
    "kmeans",
    "lu",
    "needleman_wunsch",
    "pipeline",
    "radix_sort",
    "transpose",
    "tree_reduction",
]


@kernel
def jacobi(tid, nthreads, phase, a, b):
    """Jacobi sweeps over row blocks, alternating the source and target grid.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        a: Grid read in even phases and written in odd ones.
        b: Grid written in even phases and read in odd ones.
    """
    n = a.shape[0]
    m = a.shape[1]
    for i in prange(1, n - 1):
        for j in range(1, m - 1):
            if phase % 2 == 0:
                b[i, j] = 0.25 * (a[i - 1, j] + a[i + 1, j] + a[i, j - 1] + a[i, j + 1])
            else:
                a[i, j] = 0.25 * (b[i - 1, j] + b[i + 1, j] + b[i, j - 1] + b[i, j + 1])


@kernel
def hotspot(tid, nthreads, phase, t0, t1, power, px, cap, rx, ry, rz, amb):
    """Hotspot thermal simulation on 2-D thread tiles (``px`` tile columns).

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        t0: Temperatures read in even phases, written in odd ones.
        t1: Temperatures written in even phases, read in odd ones.
        power: Power dissipated per cell.
        px: Thread tiles per grid row (``nthreads // px`` tile rows).
        cap: Step size over the thermal capacitance.
        rx: Conductance between horizontal neighbours.
        ry: Conductance between vertical neighbours.
        rz: Conductance to the ambient.
        amb: Ambient temperature.
    """
    n = t0.shape[0]
    m = t0.shape[1]
    py = nthreads // px
    ti = tid // px
    tj = tid % px
    r0 = (n * ti) // py
    r1 = (n * (ti + 1)) // py
    c0 = (m * tj) // px
    c1 = (m * (tj + 1)) // px
    for i in range(r0, r1):
        up = max(i - 1, 0)
        dn = min(i + 1, n - 1)
        for j in range(c0, c1):
            lf = max(j - 1, 0)
            rt = min(j + 1, m - 1)
            if phase % 2 == 0:
                c = t0[i, j]
                d = (t0[up, j] + t0[dn, j] - 2.0 * c) * ry + (t0[i, lf] + t0[i, rt] - 2.0 * c) * rx
                t1[i, j] = c + cap * (power[i, j] + d + (amb - c) * rz)
            else:
                c = t1[i, j]
                d = (t1[up, j] + t1[dn, j] - 2.0 * c) * ry + (t1[i, lf] + t1[i, rt] - 2.0 * c) * rx
                t0[i, j] = c + cap * (power[i, j] + d + (amb - c) * rz)


@kernel
def kmeans(tid, nthreads, phase, x, cent, psum, pcnt, label):
    """One k-means iteration per two phases: workers assign points, thread 0 updates.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        x: Points, one row each.
        cent: Centroids, updated by thread 0 in odd phases.
        psum: Per-thread sums of the points assigned to each centroid.
        pcnt: Per-thread counts of the points assigned to each centroid.
        label: Centroid assigned to each point.
    """
    npts = x.shape[0]
    dim = x.shape[1]
    k = cent.shape[0]
    if phase % 2 == 0:
        for c in range(k):
            pcnt[tid, c] = 0
            for d in range(dim):
                psum[tid, c, d] = 0.0
        for i in prange(npts):
            best = 0
            bestd = 1e300
            for c in range(k):
                dist = 0.0
                for d in range(dim):
                    diff = x[i, d] - cent[c, d]
                    dist += diff * diff
                if dist < bestd:
                    bestd = dist
                    best = c
            label[i] = best
            pcnt[tid, best] += 1
            for d in range(dim):
                psum[tid, best, d] += x[i, d]
    elif tid == 0:
        for c in range(k):
            cnt = 0
            for t in range(nthreads):
                cnt += pcnt[t, c]
            if cnt > 0:
                for d in range(dim):
                    s = 0.0
                    for t in range(nthreads):
                        s += psum[t, c, d]
                    cent[c, d] = s / cnt


@kernel
def needleman_wunsch(tid, nthreads, phase, score, s1, s2, penalty, ncb):
    """Needleman-Wunsch alignment scores as a wavefront of tiles.

    Thread ``tid`` owns a block of rows cut into ``ncb`` column tiles; tile ``cb`` runs in
    phase ``tid + cb``.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        score: Score matrix (row and column 0 hold the gap penalties).
        s1: First sequence (one code per row).
        s2: Second sequence (one code per column).
        penalty: Gap penalty.
        ncb: Column tiles per row block.
    """
    # Thread tid owns a block of rows, cut into ncb column tiles; tile cb runs in phase tid + cb.
    n = score.shape[0] - 1
    m = score.shape[1] - 1
    cb = phase - tid
    if cb >= 0 and cb < ncb:
        r0 = 1 + (n * tid) // nthreads
        r1 = 1 + (n * (tid + 1)) // nthreads
        c0 = 1 + (m * cb) // ncb
        c1 = 1 + (m * (cb + 1)) // ncb
        for i in range(r0, r1):
            for j in range(c0, c1):
                sim = 1 if s1[i - 1] == s2[j - 1] else -1
                best = score[i - 1, j - 1] + sim
                up = score[i - 1, j] - penalty
                left = score[i, j - 1] - penalty
                if up > best:
                    best = up
                if left > best:
                    best = left
                score[i, j] = best


@kernel
def lu(tid, nthreads, phase, a):
    """LU factorisation in place: phase ``k`` eliminates column ``k`` on cyclic rows.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        a: Square matrix, replaced by its L (below the diagonal) and U factors.
    """
    n = a.shape[0]
    k = phase
    first = k + 1 + (tid - (k + 1)) % nthreads
    for i in range(first, n, nthreads):
        f = a[i, k] / a[k, k]
        a[i, k] = f
        for j in range(k + 1, n):
            a[i, j] -= f * a[k, j]


@kernel
def bfs(tid, nthreads, phase, indptr, indices, level, nxt):
    """Pull breadth-first search: even phases mark the next frontier, odd ones commit it.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        indptr: CSR row pointers of the graph.
        indices: CSR column indices (neighbours).
        level: Depth of each vertex (-1: not reached yet).
        nxt: Flags of the vertices found in this step.
    """
    nv = level.shape[0]
    depth = phase // 2
    if phase % 2 == 0:
        for v in prange(nv):
            if level[v] < 0:
                for e in range(indptr[v], indptr[v + 1]):
                    if level[indices[e]] == depth:
                        nxt[v] = 1
                        break
    else:
        for v in prange(nv):
            if nxt[v] == 1:
                level[v] = depth + 1
                nxt[v] = 0


@kernel
def fft(tid, nthreads, phase, xin, xa, xb, w):
    """Radix-2 decimation-in-frequency FFT, one butterfly stage per phase.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        xin: Input signal (copied in phase 0).
        xa: Work array of the even stages.
        xb: Work array of the odd stages.
        w: Twiddle factors.
    """
    n = xin.shape[0]
    if phase == 0:
        for i in prange(n):
            xa[i] = xin[i]
    else:
        h = n >> phase
        stride = n // (2 * h)
        for i in prange(n):
            if phase % 2 == 1:
                if i & h == 0:
                    xb[i] = xa[i] + xa[i + h]
                else:
                    xb[i] = (xa[i - h] - xa[i]) * w[(i & (h - 1)) * stride]
            else:
                if i & h == 0:
                    xa[i] = xb[i] + xb[i + h]
                else:
                    xa[i] = (xb[i - h] - xb[i]) * w[(i & (h - 1)) * stride]


@kernel
def radix_sort(tid, nthreads, phase, keys, tmp, hist, offs):
    """LSD radix sort of 4-bit digits, three phases per digit.

    Per digit: histogram per thread, prefix sums by thread 0, scatter.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        keys: Keys to sort (sorted in place after an even number of passes).
        tmp: Scratch array the passes alternate with.
        hist: Per-thread digit histograms.
        offs: Per-thread output offsets of each digit.
    """
    n = keys.shape[0]
    nb = hist.shape[1]
    shift = (phase // 3) * 4
    step = phase % 3
    src_is_keys = (phase // 3) % 2 == 0
    if step == 0:
        for d in range(nb):
            hist[tid, d] = 0
        for i in prange(n):
            v = keys[i] if src_is_keys else tmp[i]
            hist[tid, (v >> shift) & (nb - 1)] += 1
    elif step == 1:
        if tid == 0:
            run = 0
            for d in range(nb):
                for t in range(nthreads):
                    offs[t, d] = run
                    run += hist[t, d]
    else:
        for i in prange(n):
            v = keys[i] if src_is_keys else tmp[i]
            d = (v >> shift) & (nb - 1)
            pos = offs[tid, d]
            offs[tid, d] = pos + 1
            if src_is_keys:
                tmp[pos] = v
            else:
                keys[pos] = v


@kernel
def tree_reduction(tid, nthreads, phase, x, part):
    """Sum of ``x``: partial sums per thread, then a combining tree.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        x: Values to add.
        part: Per-thread partial sums; ``part[0]`` ends with the total.
    """
    if phase == 0:
        s = 0.0
        for i in prange(x.shape[0]):
            s += x[i]
        part[tid] = s
    else:
        step = 1 << (phase - 1)
        if tid % (2 * step) == 0 and tid + step < nthreads:
            part[tid] += part[tid + step]


@kernel
def transpose(tid, nthreads, phase, a, b):
    """Fill ``a`` in phase 0, then write its transpose into ``b`` by row blocks.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        a: Source matrix (filled with ``i * n + j``).
        b: Its transpose.
    """
    n = a.shape[0]
    if phase == 0:
        for i in prange(n):
            for j in range(n):
                a[i, j] = i * n + j
    else:
        for i in prange(n):
            for j in range(n):
                b[i, j] = a[j, i]


@kernel
def pipeline(tid, nthreads, phase, src, buf):
    """A pipeline: thread ``t`` is stage ``t`` and handles item ``phase - t``.

    Args:
        tid, nthreads, phase: This thread's id, the thread count and the barrier phase (0-based).
        src: Items entering stage 0.
        buf: Output of each stage per item.
    """
    nitems = src.shape[0]
    q = phase - tid
    if q >= 0 and q < nitems:
        v = src[q] if tid == 0 else buf[tid - 1, q]
        for r in range(8):
            v = v * 0.5 + 1.0 + r
        buf[tid, q] = v
