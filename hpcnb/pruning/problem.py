"""The abstract pruning problem: prunable groups, FLOPs as a function of keep ratios.

A channel-pruning problem, as the environment and every search method see it, is

* a list of prunable groups ``g`` of sizes ``n_g`` (the IR's channel groups: channels that
  must be removed together, e.g. all convolutions feeding one residual sum),
* the FLOPs of the network as a function of the kept counts ``k_g`` — for convolutions and
  linear layers exactly ``sum_l F_l * (k_out(l)/n_out(l)) * (k_in(l)/n_in(l))`` plus
  constant terms (:class:`FlopsModel`),
* an accuracy oracle ``accuracy(k)`` of the pruned, not yet fine-tuned network on a
  held-out split of the training data,
* a hierarchical graph observation (:class:`~hpcnb.pruning.hiergraph.HierarchicalGraph`).

:class:`PruningProblem` is the protocol; :class:`~hpcnb.pruning.task.ModelPruningTask`
implements it for a real ``nn.Module`` through ``hpcnb.ir``.

Example: the FLOPs of ``Linear(8, 16) -> Linear(16, 4)`` (one group: the 16 hidden
channels; multiply-add = 2) when half the hidden channels are kept:

    >>> import numpy as np
    >>> from hpcnb.pruning.problem import FlopsModel, keep_counts
    >>> fm = FlopsModel(
    ...     constant=0.0,
    ...     coef=np.array([2 * 8 * 16, 2 * 16 * 4], dtype=float),
    ...     out_group=np.array([0, -1]),  # the first layer's outputs are the group
    ...     in_group=np.array([-1, 0]),  # the second layer's inputs are the group
    ...     num_groups=1,
    ... )
    >>> fm.total, fm(np.array([0.5]))
    (384.0, 192.0)
    >>> keep_counts(np.array([0.3]), np.array([16])).tolist()  # 0.3 * 16 rounds to 5
    [5]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from hpcnb.errors import InvalidInputError

if TYPE_CHECKING:
    from hpcnb.pruning.hiergraph import HierarchicalGraph

__all__ = [
    "FlopsModel",
    "PruningProblem",
    "keep_counts",
    "project_to_budget",
    "snap_counts",
    "snap_counts_preferring",
    "uniform_ratios",
]


@dataclass(frozen=True)
class FlopsModel:
    """FLOPs of a network as a bilinear function of per-group keep fractions.

    ``flops(f) = constant + sum_t coef[t] * f[out_group[t]] * f[in_group[t]]`` where
    ``f[-1]`` is taken as 1 (a term not affected by pruning on that side). With ``f`` the
    exact fractions ``k_g / n_g`` of kept channels this is exact for convolutions
    (grouped/depthwise included) and linear layers, whose multiply-adds scale with the
    kept output and input channels.

    Attributes:
        constant: FLOPs no group affects.
        coef: ``(T,)`` FLOPs of each term at full width.
        out_group: ``(T,)`` group of the output channels, ``-1`` for none.
        in_group: ``(T,)`` group of the input channels, ``-1`` for none.
        num_groups: Number of groups.
    """

    constant: float
    coef: np.ndarray
    out_group: np.ndarray
    in_group: np.ndarray
    num_groups: int

    def __post_init__(self) -> None:
        t = len(self.coef)
        if len(self.out_group) != t or len(self.in_group) != t:
            raise InvalidInputError(
                f"FlopsModel: coef has {t} terms but out_group has {len(self.out_group)} "
                f"and in_group {len(self.in_group)}: expected equal lengths"
            )
        for name, arr in (("out_group", self.out_group), ("in_group", self.in_group)):
            if t and (arr.min() < -1 or arr.max() >= self.num_groups):
                raise InvalidInputError(
                    f"FlopsModel.{name}: entries must be in [-1, {self.num_groups})"
                )

    @property
    def total(self) -> float:
        """FLOPs of the unpruned network."""
        return float(self.constant + self.coef.sum())

    def __call__(self, fractions: np.ndarray) -> float:
        """Return the FLOPs at per-group keep fractions ``fractions`` (shape ``(G,)``)."""
        f = np.asarray(fractions, dtype=np.float64)
        if f.shape != (self.num_groups,):
            raise InvalidInputError(
                f"FlopsModel: fractions of shape {f.shape}, expected ({self.num_groups},)"
            )
        ext = np.append(f, 1.0)  # index -1 -> 1.0
        return float(self.constant + np.sum(self.coef * ext[self.out_group] * ext[self.in_group]))


def keep_counts(ratios: np.ndarray, sizes: np.ndarray, min_keep: int = 1) -> np.ndarray:
    """Round keep ratios to whole channel counts, at least ``min_keep`` per group.

    Args:
        ratios: ``(G,)`` keep ratios in ``[0, 1]``.
        sizes: ``(G,)`` group sizes.
        min_keep: Fewest channels a group keeps.
    """
    ratios = np.asarray(ratios, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.int64)
    if ratios.shape != sizes.shape:
        raise InvalidInputError(f"keep_counts: ratios {ratios.shape} vs sizes {sizes.shape}")
    counts = np.round(np.clip(ratios, 0.0, 1.0) * sizes).astype(np.int64)
    return np.clip(counts, np.minimum(min_keep, sizes), sizes)


def snap_counts(
    counts: np.ndarray,
    sizes: np.ndarray,
    round_to: int | np.ndarray,
    flops_model: FlopsModel | None = None,
    budget: float | None = None,
) -> np.ndarray:
    """Round channel counts to multiples of ``round_to`` without breaking a FLOPs budget.

    Every count goes to the nearest multiple of ``round_to`` (at least ``round_to``, at
    most the group size; a group no larger than ``round_to`` keeps its count). If the
    unrounded counts meet ``budget`` (FLOPs, of ``flops_model``) but the rounded ones do
    not, the group rounded up the most is lowered by ``round_to`` until the budget holds
    again; FLOPs grow with every count, so this ends. If even the smallest multiples miss
    the budget (a tight budget on a narrow network), the unrounded counts are returned, so
    snapping never breaks a budget the counts met. Counts that missed the budget before
    rounding are returned rounded, unrepaired.

    Args:
        counts: ``(G,)`` kept channels per group.
        sizes: ``(G,)`` group sizes.
        round_to: The multiple (1 returns ``counts`` unchanged), or one per group.
        flops_model: FLOPs as a function of keep fractions (with ``budget``).
        budget: Largest FLOPs allowed.

    Raises:
        InvalidInputError: ``round_to`` < 1 or shapes that differ.

    Example:
        >>> import numpy as np
        >>> snap_counts(np.array([5, 13, 30]), np.array([16, 32, 64]), 8).tolist()
        [8, 16, 32]
    """
    counts = np.asarray(counts, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    if counts.shape != sizes.shape:
        raise InvalidInputError(f"snap_counts: counts {counts.shape} vs sizes {sizes.shape}")
    multiple = np.broadcast_to(np.asarray(round_to, dtype=np.int64), counts.shape)
    if multiple.size and multiple.min() < 1:
        raise InvalidInputError(f"snap_counts: round_to={round_to}, expected >= 1")
    if (multiple == 1).all():
        return counts.copy()
    round_to = multiple
    snapped = np.round(counts / round_to).astype(np.int64) * round_to
    snapped = np.clip(snapped, round_to, sizes)
    snapped = np.where(sizes <= round_to, counts, snapped)
    if flops_model is None or budget is None:
        return snapped

    def flops(c: np.ndarray) -> float:
        return flops_model(c / sizes)

    if flops(counts) > budget:
        return snapped
    while flops(snapped) > budget:
        lowerable = snapped - round_to >= np.minimum(round_to, sizes)
        lowerable &= sizes > round_to
        if not lowerable.any():
            return counts.copy()  # multiples of round_to cannot meet this budget: unsnapped
        excess = np.where(lowerable, snapped - counts, -np.inf)
        j = int(np.argmax(excess))
        snapped[j] -= round_to[j]
    return snapped


def snap_counts_preferring(
    counts: np.ndarray,
    sizes: np.ndarray,
    multiples: tuple[int, ...],
    flops_model: FlopsModel,
    budget: float,
) -> np.ndarray:
    """Snap to the first of ``multiples`` that keeps the FLOPs budget, group by group.

    Attempt ``k`` gives every group the first of ``multiples[k:]`` that is smaller than
    the group (a group of 16 channels cannot be cut to a multiple of 16, so it takes 8),
    snaps with :func:`snap_counts` and is returned when every group is a multiple of its
    own multiple (a group no larger than all of them keeps its count) and the FLOPs stay
    within ``budget``. So ``(16, 8)`` gives multiples of 16 where the budget allows, and
    multiples of 8 in narrow groups and as the fallback. If no attempt does, the counts
    come back unsnapped, so snapping never breaks a budget the counts met.

    Args:
        counts: ``(G,)`` kept channels per group.
        sizes: ``(G,)`` group sizes.
        multiples: Channel multiples in order of preference, each >= 1.
        flops_model: FLOPs as a function of keep fractions.
        budget: Largest FLOPs allowed.

    Raises:
        InvalidInputError: No multiples, or one below 1.

    Example:
        >>> import numpy as np
        >>> fm = FlopsModel(0.0, np.array([1.0]), np.array([0]), np.array([-1]), 1)
        >>> snap_counts_preferring(np.array([20]), np.array([64]), (16, 8), fm, 0.4).tolist()
        [16]
        >>> snap_counts_preferring(np.array([12]), np.array([64]), (16, 8), fm, 0.19).tolist()
        [8]
        >>> fm2 = FlopsModel(0.0, np.array([1.0, 1.0]), np.array([0, 1]), np.array([-1, -1]), 2)
        >>> sizes = np.array([16, 64])
        >>> snap_counts_preferring(np.array([11, 22]), sizes, (16, 8), fm2, 1.1).tolist()
        [8, 16]
    """
    if not multiples or min(multiples) < 1:
        raise InvalidInputError(f"snap_counts_preferring: multiples={multiples}, need >= 1 each")
    counts = np.asarray(counts, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    for k in range(len(multiples)):
        per_group = np.array(
            [next((m for m in multiples[k:] if m < size), multiples[-1]) for size in sizes],
            dtype=np.int64,
        )
        snapped = snap_counts(counts, sizes, per_group, flops_model, budget)
        aligned = (snapped % per_group == 0) | (sizes <= per_group)
        if aligned.all() and flops_model(snapped / sizes) <= budget:
            return snapped
    return counts.copy()


@runtime_checkable
class PruningProblem(Protocol):
    """What :class:`~hpcnb.pruning.env.PruningEnv` and the baselines need from a task."""

    group_ids: list[str]
    group_sizes: np.ndarray
    flops_model: FlopsModel
    graph: HierarchicalGraph

    def accuracy(self, counts: np.ndarray) -> float:
        """Accuracy of the network pruned to ``counts`` channels per group (no fine-tuning)."""
        ...


def _flops_at(problem: PruningProblem, ratios: np.ndarray) -> float:
    counts = keep_counts(ratios, problem.group_sizes)
    return problem.flops_model(counts / problem.group_sizes)


def uniform_ratios(problem: PruningProblem, target: float, tol: float = 1e-4) -> np.ndarray:
    """Return the largest equal keep ratio for all groups whose FLOPs meet ``target``.

    Args:
        problem: The pruning problem.
        target: FLOPs budget as a fraction of the original (e.g. 0.5).
        tol: Bisection tolerance on the ratio.
    """
    if not 0 < target <= 1:
        raise InvalidInputError(f"uniform_ratios: target={target}, expected in (0, 1]")
    g = len(problem.group_sizes)
    budget = target * problem.flops_model.total
    lo, hi = 0.0, 1.0
    if _flops_at(problem, np.ones(g)) <= budget:
        return np.ones(g)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if _flops_at(problem, np.full(g, mid)) <= budget:
            lo = mid
        else:
            hi = mid
    return np.full(g, lo)


def project_to_budget(
    problem: PruningProblem,
    start: np.ndarray,
    proposal: np.ndarray,
    target: float,
    tol: float = 1e-4,
) -> np.ndarray:
    """Move from ``start`` towards ``proposal`` only as far as needed to meet the budget.

    Finds the smallest ``t`` in ``[0, 1]`` with ``flops(start + t (proposal - start)) <=
    target * flops0`` by bisection (FLOPs fall monotonically along the segment when
    ``proposal <= start``). If even ``proposal`` misses the budget it is returned as is.

    Args:
        problem: The pruning problem.
        start: ``(G,)`` keep ratios before the step (budget not yet met).
        proposal: ``(G,)`` keep ratios the agent asked for.
        target: FLOPs budget as a fraction of the original.
        tol: Bisection tolerance on ``t``.
    """
    budget = target * problem.flops_model.total
    if _flops_at(problem, proposal) > budget or _flops_at(problem, start) <= budget:
        return proposal if _flops_at(problem, start) > budget else start
    lo, hi = 0.0, 1.0  # flops(lo) > budget, flops(hi) <= budget
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if _flops_at(problem, start + mid * (proposal - start)) <= budget:
            hi = mid
        else:
            lo = mid
    return start + hi * (proposal - start)
