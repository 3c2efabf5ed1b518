"""A compiled fast path for rigid workloads under FCFS and EASY backfilling.

When every job is rigid with a fixed run time, the general event loop spends most of
its time in Python bookkeeping. This kernel replays the same schedule in Numba: a
binary heap of completion times, the waiting queue as a head pointer over job indices
(jobs enter it in index order) with, for EASY, a tree of the waiting jobs' minimum sizes
and estimates that finds the next backfill candidate in O(log n), so the cost per event
does not grow with the queue; and the same tie-breaking as :class:`~hpcnb.batchsim.engine.Simulator`
(all events of a time stamp first, then one scheduling pass). Tests check that it
gives the same start times as the general engine with
:class:`~hpcnb.batchsim.scheduler.FCFS` and
:class:`~hpcnb.batchsim.scheduler.EasyBackfilling`.
"""

from __future__ import annotations

import numba
import numpy as np

from hpcnb.batchsim.index import NOT_WAITING, first_fit, profile_shadow, tree_set
from hpcnb.batchsim.swf import MAX_NODES
from hpcnb.errors import InvalidInputError

__all__ = ["KERNEL_POLICIES", "simulate_rigid_arrays"]

KERNEL_POLICIES = {"fcfs": 0, "easy": 1}


@numba.njit(cache=True)
def _heap_push(keys: np.ndarray, vals: np.ndarray, n: int, key: float, val: int) -> int:
    i = n
    keys[i] = key
    vals[i] = val
    while i > 0:
        parent = (i - 1) >> 1
        if keys[parent] < keys[i] or (keys[parent] == keys[i] and vals[parent] <= vals[i]):
            break
        keys[parent], keys[i] = keys[i], keys[parent]
        vals[parent], vals[i] = vals[i], vals[parent]
        i = parent
    return n + 1


@numba.njit(cache=True)
def _heap_pop(keys: np.ndarray, vals: np.ndarray, n: int) -> int:
    n -= 1
    keys[0] = keys[n]
    vals[0] = vals[n]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        child = left
        right = left + 1
        if right < n and (
            keys[right] < keys[left] or (keys[right] == keys[left] and vals[right] < vals[left])
        ):
            child = right
        if keys[i] < keys[child] or (keys[i] == keys[child] and vals[i] <= vals[child]):
            break
        keys[child], keys[i] = keys[i], keys[child]
        vals[child], vals[i] = vals[i], vals[child]
        i = child
    return n


@numba.njit(cache=True)
def _start_job(
    j: int,
    now: float,
    start: np.ndarray,
    runtime: np.ndarray,
    heap_keys: np.ndarray,
    heap_vals: np.ndarray,
    heap_n: int,
) -> int:
    """Start job ``j`` at ``now``: its completion into the heap; return the new heap size.

    The heap holds one entry for each running job, so ``heap_vals[:heap_n]`` is the set
    of running jobs.
    """
    start[j] = now
    return _heap_push(heap_keys, heap_vals, heap_n, now + runtime[j], j)


@numba.njit(cache=True)
def _release(
    now: float,
    size: np.ndarray,
    heap_keys: np.ndarray,
    heap_vals: np.ndarray,
    heap_n: int,
    free: int,
) -> tuple[int, int]:
    """End every job whose completion is at ``now``; free its nodes.

    Returns:
        The new heap size and free nodes.
    """
    while heap_n > 0 and heap_keys[0] == now:
        free += size[heap_vals[0]]
        heap_n = _heap_pop(heap_keys, heap_vals, heap_n)
    return heap_n, free


@numba.njit(cache=True)
def _kernel(
    submit: np.ndarray,
    runtime: np.ndarray,
    estimate: np.ndarray,
    size: np.ndarray,
    total: int,
    policy: int,
) -> np.ndarray:
    """Start times under FCFS (0) or EASY (1) (see the module docstring).

    The queue is the set of waiting indices ``>= head`` below ``nxt`` (the next
    submission); EASY's candidates come from the tree (:func:`~.index.first_fit`), its
    shadow time is reused while no job started or ended since.
    """
    n = submit.shape[0]
    start = np.full(n, np.nan)
    heap_keys = np.empty(n + 1)
    heap_vals = np.empty(n + 1, dtype=np.int64)
    heap_n = 0  # the heap's values are the running jobs
    ends = np.empty(n)
    sizes = np.empty(n, dtype=np.int64)
    easy = policy == 1
    leaves = 1
    while leaves < max(n, 1) and easy:
        leaves *= 2
    min_size = np.full(2 * leaves, NOT_WAITING, dtype=np.int64)  # also the smallest size
    min_est = np.full(2 * leaves, np.inf)
    stack = np.empty((130, 3), dtype=np.int64)  # two entries per tree level
    free = total
    nxt = 0
    head = 0  # first waiting job (or nxt when none waits)
    waiting = 0
    version = 0  # bumped whenever a job starts or ends
    cached_version = -1
    cached_head = -1
    shadow = np.inf
    base_extra = 0
    while nxt < n or heap_n > 0:
        now = np.inf
        if nxt < n:
            now = submit[nxt]
        if heap_n > 0 and heap_keys[0] < now:
            now = heap_keys[0]
        old_n = heap_n
        heap_n, free = _release(now, size, heap_keys, heap_vals, heap_n, free)
        if heap_n != old_n:
            version += 1
        while nxt < n and submit[nxt] == now:
            if easy:
                tree_set(
                    min_size, min_size, min_est, leaves, nxt, size[nxt], size[nxt], estimate[nxt]
                )
            nxt += 1
            waiting += 1
        if waiting == 0:
            continue
        # start in order
        while head < nxt and size[head] <= free:
            free -= size[head]
            heap_n = _start_job(head, now, start, runtime, heap_keys, heap_vals, heap_n)
            if easy:
                tree_set(
                    min_size, min_size, min_est, leaves, head, NOT_WAITING, NOT_WAITING, np.inf
                )
            waiting -= 1
            version += 1
            head += 1
            while head < nxt and not np.isnan(start[head]):
                head += 1
        if not easy or waiting < 2 or free == 0:
            continue
        # backfill: only when some waiting job after the head fits the free nodes
        if (
            first_fit(min_size, min_size, min_est, leaves, head + 1, free, free, now, np.inf, stack)
            < 0
        ):
            continue
        if version != cached_version or head != cached_head or shadow < now:
            shadow, base_extra = profile_shadow(
                now, free, size[head], start, estimate, size, heap_vals, heap_n, ends, sizes
            )
            cached_version, cached_head = version, head
        extra = base_extra
        lo = head + 1
        while free > 0:
            j = first_fit(min_size, min_size, min_est, leaves, lo, free, extra, now, shadow, stack)
            if j < 0:
                break
            s = size[j]
            if not now + estimate[j] <= shadow:
                extra -= s
            free -= s
            heap_n = _start_job(j, now, start, runtime, heap_keys, heap_vals, heap_n)
            tree_set(min_size, min_size, min_est, leaves, j, NOT_WAITING, NOT_WAITING, np.inf)
            waiting -= 1
            version += 1
            lo = j + 1
    return start


def simulate_rigid_arrays(
    submit: np.ndarray,
    runtime: np.ndarray,
    estimate: np.ndarray,
    size: np.ndarray,
    total_nodes: int,
    policy: str,
) -> np.ndarray:
    """Return start times of rigid jobs under FCFS or EASY backfilling.

    Args:
        submit: Submit times, non-decreasing (ties keep array order).
        runtime: Actual run times (s).
        estimate: Requested times used for reservations (s).
        size: Nodes of each job (each <= ``total_nodes``).
        total_nodes: Nodes of the machine, in ``[1, MAX_NODES]`` (2**31 - 1), so that
            the kernel's int64 node counts cannot overflow.
        policy: ``"fcfs"`` or ``"easy"``.

    Raises:
        InvalidInputError: Unknown policy, arrays of different lengths, unsorted or non-finite
            submit times, non-finite or negative run times or estimates, a machine size
            outside ``[1, MAX_NODES]``, or a job size outside ``[1, total_nodes]``.
    """
    if policy not in KERNEL_POLICIES:
        raise InvalidInputError(f"policy={policy!r}: expected one of {sorted(KERNEL_POLICIES)}")
    if (
        isinstance(total_nodes, bool)
        or not isinstance(total_nodes, (int, np.integer))
        or not (1 <= total_nodes <= MAX_NODES)
    ):
        raise InvalidInputError(
            f"total_nodes={total_nodes!r}: expected an integer in [1, {MAX_NODES}]"
        )
    submit = np.ascontiguousarray(submit, dtype=np.float64)
    runtime = np.ascontiguousarray(runtime, dtype=np.float64)
    estimate = np.ascontiguousarray(estimate, dtype=np.float64)
    sizes = np.asarray(size)
    if not submit.shape == runtime.shape == estimate.shape == sizes.shape or submit.ndim != 1:
        raise InvalidInputError(
            "submit, runtime, estimate and size must be 1-D arrays of one length"
        )
    if sizes.size and not (np.all(sizes >= 1) and np.all(sizes <= total_nodes)):
        raise InvalidInputError(f"job sizes must be in [1, {total_nodes}]")
    size = np.ascontiguousarray(sizes, dtype=np.int64)
    if not (
        np.all(np.isfinite(submit))
        and np.all(np.isfinite(runtime))
        and np.all(np.isfinite(estimate))
    ):
        raise InvalidInputError("submit times, run times and estimates must be finite")
    if np.any(runtime < 0) or np.any(estimate < 0):
        raise InvalidInputError("run times and estimates must be >= 0")
    if submit.size and np.any(np.diff(submit) < 0):
        raise InvalidInputError("submit times must be non-decreasing")
    return _kernel(submit, runtime, estimate, size, int(total_nodes), KERNEL_POLICIES[policy])
