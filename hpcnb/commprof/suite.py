"""The kernel suite: inputs, phase counts, schedules and ground-truth patterns.

Ground truth is the pattern of the whole kernel (region 0, inclusive of all loops) that the
decomposition implies by construction, with T = 8 threads:

========================  ===========================================  ==================
kernel                    decomposition                                ground truth
========================  ===========================================  ==================
jacobi                    row blocks, 5-point stencil, ping-pong       nearest-neighbour
hotspot                   2-D tiles (px × T/px), 5-point, clamped      nearest-neighbour
kmeans                    point blocks; master 0 reduces and updates   broadcast (master–worker)
needleman_wunsch          row blocks × T column tiles, anti-diagonals  pipeline (wavefront)
lu                        rows dealt cyclically, pivot row per phase   all-to-all
bfs                       vertex blocks, pull-based level-synchronous  all-to-all
fft                       radix-2 DIF, index blocks, ping-pong         butterfly
radix_sort                LSD 4-bit digits, per-thread histograms      all-to-all
tree_reduction            block sums then a binary combining tree      reduction
transpose                 row blocks of the output                     all-to-all
pipeline                  thread = stage, one item per phase           pipeline
========================  ===========================================  ==================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import hpcnb.commprof.kernels as K
from hpcnb.commprof.instrument import Kernel
from hpcnb.commprof.runtime import KernelArg, MemoryConfig, Profile, Schedule, ScheduledKernel
from hpcnb.errors import UnknownNameError

__all__ = ["SUITE", "SuiteCase", "check_result", "profile_case", "suite_case"]

Args = list[KernelArg]


@dataclass(frozen=True)
class SuiteCase(ScheduledKernel):
    """One suite kernel with its input generator and ground truth.

    Attributes:
        name: Kernel name.
        kernel: The instrumented kernel.
        pattern: Ground-truth pattern of region 0 (see :data:`analysis.PATTERNS`).
        make: ``make(size, nthreads, seed) -> (args, nphases)`` with fresh arrays.
        schedule: Schedule of the kernel's ``prange`` loops.
        description: One line on the decomposition.
    """

    name: str
    kernel: Kernel
    pattern: str
    make: Callable[[int, int, int], tuple[Args, int]]
    schedule: Schedule
    description: str


def _jacobi(n: int, T: int, seed: int) -> tuple[Args, int]:
    a = np.random.default_rng(seed).random((n, n))
    return [a, a.copy()], 4


def _hotspot(n: int, T: int, seed: int) -> tuple[Args, int]:
    rng = np.random.default_rng(seed)
    t0 = 320.0 + rng.random((n, n))
    px = 1 << ((T.bit_length() - 1 + 1) // 2)
    while T % px:
        px //= 2
    return [t0, t0.copy(), rng.random((n, n)) * 0.5, px, 0.5, 0.1, 0.1, 0.01, 300.0], 4


def _kmeans(n: int, T: int, seed: int) -> tuple[Args, int]:
    rng = np.random.default_rng(seed)
    k, dim = 4, 2
    x = rng.normal(size=(n * 4, dim)) + rng.integers(0, 4, size=(n * 4, 1)) * 3.0
    cent = x[:k].copy()
    args: Args = [
        x,
        cent,
        np.zeros((T, k, dim)),
        np.zeros((T, k), np.int64),
        np.zeros(n * 4, np.int64),
    ]
    return args, 6


def _nw(n: int, T: int, seed: int) -> tuple[Args, int]:
    rng = np.random.default_rng(seed)
    score = np.zeros((n + 1, n + 1), np.int64)
    score[0, :] = -np.arange(n + 1)
    score[:, 0] = -np.arange(n + 1)
    return [score, rng.integers(0, 4, n), rng.integers(0, 4, n), 1, T], 2 * T - 1


def _lu(n: int, T: int, seed: int) -> tuple[Args, int]:
    a = np.random.default_rng(seed).random((n, n)) + n * np.eye(n)
    return [a], n - 1


def _bfs(n: int, T: int, seed: int) -> tuple[Args, int]:
    rng = np.random.default_rng(seed)
    nv, deg = n * 8, 4
    src = rng.integers(0, nv, nv * deg)
    dst = rng.integers(0, nv, nv * deg)
    ring = np.arange(nv)
    u = np.concatenate([src, dst, ring, (ring + 1) % nv])
    v = np.concatenate([dst, src, (ring + 1) % nv, ring])
    order = np.lexsort((v, u))
    u, v = u[order], v[order]
    indptr = np.zeros(nv + 1, np.int64)
    np.add.at(indptr, u + 1, 1)
    level = np.full(nv, -1, np.int64)
    level[0] = 0
    return [np.cumsum(indptr), v.astype(np.int64), level, np.zeros(nv, np.int64)], 16


def _fft(n: int, T: int, seed: int) -> tuple[Args, int]:
    m = 1 << max(3, int(np.ceil(np.log2(max(n, T)))))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=m) + 1j * rng.normal(size=m)
    w = np.exp(-2j * np.pi * np.arange(m // 2) / m)
    return [x, np.zeros(m, complex), np.zeros(m, complex), w], 1 + int(np.log2(m))


def _radix(n: int, T: int, seed: int) -> tuple[Args, int]:
    keys = np.random.default_rng(seed).integers(0, 1 << 8, n * 32).astype(np.int64)
    return [keys, np.zeros_like(keys), np.zeros((T, 16), np.int64), np.zeros((T, 16), np.int64)], 6


def _tree(n: int, T: int, seed: int) -> tuple[Args, int]:
    x = np.random.default_rng(seed).random(n * 4)
    return [x, np.zeros(T)], 1 + int(np.ceil(np.log2(T)))


def _transpose(n: int, T: int, seed: int) -> tuple[Args, int]:
    return [np.zeros((n, n)), np.zeros((n, n))], 2


def _pipeline(n: int, T: int, seed: int) -> tuple[Args, int]:
    src = np.random.default_rng(seed).random(n)
    return [src, np.zeros((T, n))], n + T - 1


_S = Schedule()
SUITE: dict[str, SuiteCase] = {
    c.name: c
    for c in (
        SuiteCase("jacobi", K.jacobi, "nearest-neighbour", _jacobi, _S, "row blocks, 4 sweeps"),
        SuiteCase("hotspot", K.hotspot, "nearest-neighbour", _hotspot, _S, "2-D thread tiles"),
        SuiteCase("kmeans", K.kmeans, "broadcast", _kmeans, _S, "workers + master update"),
        SuiteCase("needleman_wunsch", K.needleman_wunsch, "pipeline", _nw, _S, "tile wavefront"),
        SuiteCase("lu", K.lu, "all-to-all", _lu, _S, "cyclic rows, pivot-row broadcasts"),
        SuiteCase("bfs", K.bfs, "all-to-all", _bfs, _S, "random graph, pull BFS"),
        SuiteCase("fft", K.fft, "butterfly", _fft, _S, "radix-2 DIF on index blocks"),
        SuiteCase("radix_sort", K.radix_sort, "all-to-all", _radix, _S, "2 LSD passes"),
        SuiteCase("tree_reduction", K.tree_reduction, "reduction", _tree, _S, "combining tree"),
        SuiteCase("transpose", K.transpose, "all-to-all", _transpose, _S, "row blocks of B"),
        SuiteCase("pipeline", K.pipeline, "pipeline", _pipeline, _S, "stage per thread"),
    )
}


def suite_case(name: str) -> SuiteCase:
    """Return the suite case ``name``.

    Raises:
        UnknownNameError: ``name`` is not a suite kernel (the message lists the known ones).
    """
    if name not in SUITE:
        raise UnknownNameError(f"unknown suite kernel {name!r}; known: {sorted(SUITE)}")
    return SUITE[name]


def check_result(name: str, args: Args, original: Args) -> bool:
    """Check a finished run's output against a NumPy reference where one is cheap.

    Args:
        name: Suite kernel name.
        args: Arguments after the run.
        original: The same arguments before the run (copies).

    Returns:
        True when the output matches (kernels without a reference return True).
    """
    if name == "fft":
        xin, xa = np.asarray(original[0]), args[1]
        m = xin.shape[0]
        bits = int(np.log2(m))
        rev = np.array([int(f"{i:0{bits}b}"[::-1], 2) for i in range(m)])
        out = xa if bits % 2 == 0 else args[2]
        return bool(np.allclose(np.asarray(out)[rev], np.fft.fft(xin)))
    if name == "radix_sort":
        return bool(np.array_equal(args[0], np.sort(np.asarray(original[0]))))
    if name == "tree_reduction":
        return bool(np.isclose(np.asarray(args[1])[0], np.sum(np.asarray(original[0]))))
    if name == "transpose":
        n = np.asarray(args[0]).shape[0]
        return bool(np.array_equal(args[1], np.arange(n * n).reshape(n, n).T))
    if name == "lu":
        a0, a = np.asarray(original[0]), np.asarray(args[0])
        low = np.tril(a, -1) + np.eye(a.shape[0])
        return bool(np.allclose(low @ np.triu(a), a0))
    if name == "needleman_wunsch":
        s, s1, s2 = np.asarray(original[0]).copy(), np.asarray(original[1]), np.asarray(original[2])
        n = s.shape[0] - 1
        for i in range(1, n + 1):
            for j in range(1, n + 1):
                sim = 1 if s1[i - 1] == s2[j - 1] else -1
                s[i, j] = max(s[i - 1, j - 1] + sim, s[i - 1, j] - 1, s[i, j - 1] - 1)
        return bool(np.array_equal(s, args[0]))
    return True


def profile_case(
    name: str,
    size: int,
    nthreads: int,
    seed: int = 0,
    memory: MemoryConfig | None = None,
    trace: bool = True,
) -> tuple[Profile, bool]:
    """Profile one suite kernel on fresh inputs.

    Args:
        name: Suite kernel.
        size: Problem-size unit of its inputs.
        nthreads: Virtual threads.
        seed: Input seed.
        memory: Shadow memories (exact only by default).
        trace: Also record the access trace.

    Returns:
        The profile and whether the kernel's output matched its NumPy reference.
    """
    c = suite_case(name)
    args, nphases = c.make(size, nthreads, seed)
    original = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    p = c.profile(args, nthreads=nthreads, nphases=nphases, memory=memory, trace=trace)
    return p, check_result(name, args, original)
