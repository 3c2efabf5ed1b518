"""Subnet search on a trained supernet: Pareto fronts of accuracy against cost.

The cost is any number to minimise (FLOPs, measured latency, parameters) and the
objective an accuracy to maximise; both are callables on a :class:`SubnetConfig`.
:func:`exhaustive_search` enumerates small spaces; :func:`evolutionary_search` is a
small NSGA-II-style evolution (non-dominated sorting, crowding distance, crossover and
mutation) for large ones. Both honour a cost budget and return every evaluated
candidate together with the Pareto front.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from hpcnb.errors import InvalidInputError

from .pareto import crowding_distance, pareto_ranks
from .space import SearchSpace, SubnetConfig
from .training import subnet_accuracy

if TYPE_CHECKING:  # pragma: no cover
    from .supernet import Supernet

__all__ = [
    "Candidate",
    "SubnetSearchResult",
    "evolutionary_search",
    "exhaustive_search",
    "pareto_front",
    "search_supernet",
]


@dataclass(frozen=True)
class Candidate:
    """An evaluated subnet.

    Attributes:
        config: The subnet.
        accuracy: Objective to maximise (validation accuracy).
        cost: Objective to minimise (FLOPs or latency).
    """

    config: SubnetConfig
    accuracy: float
    cost: float


@dataclass
class SubnetSearchResult:
    """What a search found.

    Attributes:
        evaluated: Every candidate evaluated, in evaluation order.
        front: The Pareto front (max accuracy, min cost), by increasing cost.
        budget: The cost budget (``None`` for no budget).
        method: ``"exhaustive"`` or ``"evolutionary"``.
    """

    evaluated: list[Candidate]
    front: list[Candidate]
    budget: float | None
    method: str
    history: list[float] = field(default_factory=list)

    def cheapest_within(self, accuracy: float) -> Candidate:
        """Return the cheapest front member with accuracy at least ``accuracy``.

        Falls back to the most accurate front member when none reaches it.
        """
        fits = [c for c in self.front if c.accuracy >= accuracy]
        if not fits:
            return max(self.front, key=lambda c: (c.accuracy, -c.cost))
        return min(fits, key=lambda c: (c.cost, -c.accuracy))

    def best_under(self, budget: float) -> Candidate:
        """Return the most accurate front member whose cost is at most ``budget``.

        Raises:
            InvalidInputError: No front member fits the budget.
        """
        fits = [c for c in self.front if c.cost <= budget]
        if not fits:
            raise InvalidInputError(f"no subnet on the front costs <= {budget:g}")
        return max(fits, key=lambda c: (c.accuracy, -c.cost))


def search_supernet(
    supernet: Supernet,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    *,
    calib_x: torch.Tensor | None = None,
    budget: float | None = None,
    population: int = 16,
    generations: int = 8,
    seed: int = 0,
    exhaustive_limit: int = 256,
) -> SubnetSearchResult:
    """Search a trained supernet for the (validation accuracy, FLOPs) Pareto front.

    Exhaustive when the space has at most ``exhaustive_limit`` configurations, else
    evolutionary. Batch-norm statistics of each subnet are recalibrated on ``calib_x``.

    Args:
        supernet: The trained supernet.
        x_val: Validation inputs.
        y_val: Validation labels.
        calib_x: Inputs for batch-norm recalibration (``None``: none).
        budget: FLOPs budget.
        population: Population of the evolutionary search.
        generations: Generations of the evolutionary search.
        seed: Random seed.
        exhaustive_limit: Largest space searched exhaustively.
    """

    def evaluate(config: SubnetConfig) -> float:
        return subnet_accuracy(supernet, config, x_val, y_val, calib_x)

    def cost(config: SubnetConfig) -> float:
        return float(supernet.flops(config))

    if supernet.space.size() <= exhaustive_limit:
        return exhaustive_search(supernet.space, evaluate, cost, budget=budget)
    return evolutionary_search(
        supernet.space,
        evaluate,
        cost,
        budget=budget,
        population=population,
        generations=generations,
        seed=seed,
    )


def pareto_front(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Return the candidates not dominated in (max accuracy, min cost), by cost."""
    if not candidates:
        return []
    pts = np.array([[-c.accuracy, c.cost] for c in candidates])
    ranks = pareto_ranks(pts)
    front = {c.config: c for c, r in zip(candidates, ranks, strict=True) if r == 0}
    return sorted(front.values(), key=lambda c: (c.cost, -c.accuracy))


class _Evaluator:
    def __init__(
        self,
        evaluate: Callable[[SubnetConfig], float],
        cost: Callable[[SubnetConfig], float],
        budget: float | None,
    ) -> None:
        self.evaluate, self.cost, self.budget = evaluate, cost, budget
        self.done: dict[SubnetConfig, Candidate] = {}
        self.order: list[Candidate] = []

    def feasible(self, config: SubnetConfig) -> bool:
        return self.budget is None or self.cost(config) <= self.budget

    def __call__(self, config: SubnetConfig) -> Candidate:
        if config not in self.done:
            cand = Candidate(config, float(self.evaluate(config)), float(self.cost(config)))
            self.done[config] = cand
            self.order.append(cand)
        return self.done[config]


def exhaustive_search(
    space: SearchSpace,
    evaluate: Callable[[SubnetConfig], float],
    cost: Callable[[SubnetConfig], float],
    *,
    budget: float | None = None,
    limit: int = 4096,
) -> SubnetSearchResult:
    """Evaluate every configuration within the budget and return the Pareto front.

    Args:
        space: A small search space.
        evaluate: Accuracy of a subnet.
        cost: Cost of a subnet.
        budget: Keep only subnets with ``cost <= budget``.
        limit: Refuse spaces larger than this.
    """
    ev = _Evaluator(evaluate, cost, budget)
    for config in space.enumerate(limit):
        if ev.feasible(config):
            ev(config)
    return SubnetSearchResult(ev.order, pareto_front(ev.order), budget, "exhaustive")


def evolutionary_search(
    space: SearchSpace,
    evaluate: Callable[[SubnetConfig], float],
    cost: Callable[[SubnetConfig], float],
    *,
    budget: float | None = None,
    population: int = 16,
    generations: int = 8,
    mutate_prob: float = 0.2,
    seed: int = 0,
    seeds: Sequence[SubnetConfig] = (),
) -> SubnetSearchResult:
    """NSGA-II-style evolution of subnets on (accuracy, cost) under a cost budget.

    Args:
        space: The search space.
        evaluate: Accuracy of a subnet (higher is better).
        cost: Cost of a subnet (lower is better).
        budget: Only subnets with ``cost <= budget`` are admitted.
        population: Population size.
        generations: Number of generations.
        mutate_prob: Per-dimension mutation probability.
        seed: Random seed.
        seeds: Configurations placed in the first population.

    Raises:
        InvalidInputError: Bad sizes, or no configuration fits the budget.
    """
    if population < 2 or generations < 0:
        raise InvalidInputError(f"population={population} (>= 2), generations={generations} (>= 0)")
    rng = np.random.default_rng(seed)
    ev = _Evaluator(evaluate, cost, budget)

    def draw_feasible(make: Callable[[], SubnetConfig], tries: int = 50) -> SubnetConfig | None:
        for _ in range(tries):
            c = make()
            if ev.feasible(c):
                return c
        return None

    start = [c for c in (*seeds, space.min(), space.max()) if ev.feasible(c)]
    pop = [ev(c) for c in dict.fromkeys(start)]
    while len(pop) < population:
        c = draw_feasible(lambda: space.sample(rng))
        if c is None:
            break
        pop.append(ev(c))
    if not pop:
        raise InvalidInputError(f"no configuration found with cost <= budget={budget}")
    history = [max(c.accuracy for c in pop)]
    for _ in range(generations):
        ranks, crowd = _rank_and_crowd(pop)

        def tournament(
            ranks: np.ndarray = ranks, crowd: np.ndarray = crowd, pop: list[Candidate] = pop
        ) -> Candidate:
            i, j = rng.integers(len(pop), size=2)
            better = i if (ranks[i], -crowd[i]) < (ranks[j], -crowd[j]) else j
            return pop[int(better)]

        children: list[Candidate] = []
        for _ in range(population):
            c = draw_feasible(
                lambda: space.mutate(
                    space.crossover(tournament().config, tournament().config, rng),
                    rng,
                    mutate_prob,
                )
            )
            if c is not None:
                children.append(ev(c))
        merged = list({c.config: c for c in pop + children}.values())
        ranks, crowd = _rank_and_crowd(merged)
        order = sorted(range(len(merged)), key=lambda i: (ranks[i], -crowd[i]))
        pop = [merged[i] for i in order[:population]]
        history.append(max(c.accuracy for c in pop))
    return SubnetSearchResult(ev.order, pareto_front(ev.order), budget, "evolutionary", history)


def _rank_and_crowd(pop: Sequence[Candidate]) -> tuple[np.ndarray, np.ndarray]:
    pts = np.array([[-c.accuracy, c.cost] for c in pop])
    ranks = pareto_ranks(pts)
    crowd = np.zeros(len(pop))
    for r in np.unique(ranks):
        idx = np.where(ranks == r)[0]
        crowd[idx] = crowding_distance(pts[idx])
    return ranks, crowd
