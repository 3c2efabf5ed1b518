"""A tree of minima over waiting jobs: the next job a backfilling pass may start, in O(log n).

EASY backfilling looks, behind the queue head, for the first waiting job (in submit
order) that fits the free nodes now and either ends by the head's reservation (the
*shadow* time) or fits the nodes left over then (the *extra* nodes). Scanning the queue
for it costs O(queue) per pass, so a long backlog makes every event slower. Here the
waiting jobs are leaves of a complete binary tree indexed by submission position; each
node holds the minima of its leaves' smallest size, preferred size and requested time,
and the search descends left to right, skipping every subtree whose minima rule out a
candidate. Both the compiled rigid kernel (:mod:`~hpcnb.batchsim.rigid`) and the general
engine's :class:`~hpcnb.batchsim.scheduler.EasyBackfilling` (through
:meth:`~hpcnb.batchsim.engine.SchedulerView.fit_index`) use it.

The pruning is conservative: a skipped subtree holds no candidate, so the caller's exact
test on the returned job decides, and a pass with nothing to start costs O(log n).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["NOT_WAITING", "FitIndex", "first_fit", "profile_shadow", "tree_set"]

#: Leaf value of a position that holds no waiting job.
NOT_WAITING = np.iinfo(np.int64).max


@numba.njit(cache=True)
def tree_set(
    min_fit: np.ndarray,
    min_size: np.ndarray,
    min_est: np.ndarray,
    leaves: int,
    j: int,
    fit: int,
    size: int,
    est: float,
) -> None:
    """Set leaf ``j`` and update its ancestors' minima.

    A job leaves the tree with ``fit = size = NOT_WAITING`` and ``est = inf``.

    Args:
        min_fit: Minima of the smallest sizes (``2 * leaves`` nodes, root at 1).
        min_size: Minima of the preferred sizes.
        min_est: Minima of the requested times.
        leaves: Leaves of the tree (a power of two).
        j: The leaf (submission position).
        fit: The job's smallest size.
        size: Its preferred size.
        est: Its requested time (s).
    """
    k = leaves + j
    min_fit[k] = fit
    min_size[k] = size
    min_est[k] = est
    k >>= 1
    while k >= 1:
        a, b = 2 * k, 2 * k + 1
        min_fit[k] = min(min_fit[a], min_fit[b])
        min_size[k] = min(min_size[a], min_size[b])
        min_est[k] = min(min_est[a], min_est[b])
        k >>= 1


@numba.njit(cache=True)
def first_fit(
    min_fit: np.ndarray,
    min_size: np.ndarray,
    min_est: np.ndarray,
    leaves: int,
    lo: int,
    free: int,
    extra: int,
    now: float,
    shadow: float,
    stack: np.ndarray,
) -> int:
    """Return the first leaf ``>= lo`` that may be backfilled now, or -1.

    A leaf qualifies when its smallest size fits (``fit <= free``) and it either ends by
    the shadow time (``now + est <= shadow``) or the size it starts with,
    ``min(size, free)``, fits the extra nodes.

    Args:
        min_fit: Minima of the smallest sizes (see :func:`tree_set`).
        min_size: Minima of the preferred sizes.
        min_est: Minima of the requested times.
        leaves: Leaves of the tree.
        lo: First leaf to consider.
        free: Nodes free now.
        extra: Nodes left over at the shadow time.
        now: Current time (s).
        shadow: The shadow time (s).
        stack: Scratch of shape ``(2 * depth + 2, 3)``.
    """
    top = 0
    stack[0, 0], stack[0, 1], stack[0, 2] = 1, 0, leaves
    spare = free <= extra  # every job that fits also fits the extra nodes
    while top >= 0:
        k, first, width = stack[top, 0], stack[top, 1], stack[top, 2]
        top -= 1  # node k holds the leaves [first, first + width)
        if first + width <= lo or min_fit[k] > free:
            continue
        if not spare and min_size[k] > extra and not now + min_est[k] <= shadow:
            continue
        if k >= leaves:
            return k - leaves
        half = width >> 1
        top += 1
        stack[top, 0], stack[top, 1], stack[top, 2] = 2 * k + 1, first + half, half
        top += 1
        stack[top, 0], stack[top, 1], stack[top, 2] = 2 * k, first, half
    return -1


@numba.njit(cache=True)
def profile_shadow(
    now: float,
    free: int,
    need: int,
    start: np.ndarray,
    estimate: np.ndarray,
    size: np.ndarray,
    running: np.ndarray,
    r_len: int,
    ends: np.ndarray,
    sizes: np.ndarray,
) -> tuple[float, int]:
    """EASY's shadow time and extra nodes for a head that needs ``need`` nodes.

    The availability profile: the running jobs ``running[:r_len]`` (any order; all jobs
    ending at one time are counted together) ordered by expected end, scanned until
    ``need`` nodes are free.

    Args:
        now: Current time (s); ends already passed count as now.
        free: Nodes free now (fewer than ``need``).
        need: Nodes the queue head needs.
        start: Per job, the base of its expected end.
        estimate: Per job, the length added to it (expected end = start + estimate).
        size: Per job, its nodes.
        running: Job indices of the running jobs in ``[:r_len]``.
        r_len: Number of running jobs.
        ends: Scratch of at least ``r_len`` floats.
        sizes: Scratch of at least ``r_len`` integers.

    Returns:
        ``(shadow, extra)``; ``(inf, 0)`` if the nodes never suffice.
    """
    for m in range(r_len):
        r = running[m]
        ends[m] = max(now, start[r] + estimate[r])
        sizes[m] = size[r]
    order = np.argsort(ends[:r_len], kind="mergesort")
    avail = free
    m = 0
    while m < r_len:
        end = ends[order[m]]
        while m < r_len and ends[order[m]] == end:
            avail += sizes[order[m]]
            m += 1
        if avail >= need:
            return end, avail - need
    return np.inf, 0


def tree_arrays(n: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(leaves, min_fit, min_size, min_est, stack)`` of an empty tree of ``n`` leaves."""
    leaves = 1
    while leaves < max(n, 1):
        leaves *= 2
    return (
        leaves,
        np.full(2 * leaves, NOT_WAITING, dtype=np.int64),
        np.full(2 * leaves, NOT_WAITING, dtype=np.int64),
        np.full(2 * leaves, np.inf),
        np.empty((2 * leaves.bit_length() + 2, 3), dtype=np.int64),
    )


class FitIndex:
    """The tree over the waiting jobs of one simulation, by submission position.

    Args:
        n: Number of positions (jobs of the run).
    """

    def __init__(self, n: int) -> None:
        self.leaves, self.min_fit, self.min_size, self.min_est, self._stack = tree_arrays(n)

    def add(self, position: int, fit: int, size: int, requested: float) -> None:
        """Enter a waiting job.

        Args:
            position: Its submission position.
            fit: Its smallest size.
            size: Its preferred size.
            requested: Its requested time (s).
        """
        tree_set(
            self.min_fit, self.min_size, self.min_est, self.leaves, position, fit, size, requested
        )

    def remove(self, position: int) -> None:
        """Take a job out (started or killed).

        Args:
            position: Its submission position.
        """
        tree_set(
            self.min_fit,
            self.min_size,
            self.min_est,
            self.leaves,
            position,
            NOT_WAITING,
            NOT_WAITING,
            np.inf,
        )

    def first(self, lo: int, free: int, extra: int, now: float, shadow: float) -> int:
        """Return the first position ``>= lo`` that may be backfilled, or -1.

        Args:
            lo: First position to consider.
            free: Nodes free now.
            extra: Nodes left over at the shadow time.
            now: Current time (s).
            shadow: The shadow time (s).
        """
        return int(
            first_fit(
                self.min_fit,
                self.min_size,
                self.min_est,
                self.leaves,
                lo,
                free,
                extra,
                now,
                shadow,
                self._stack,
            )
        )
