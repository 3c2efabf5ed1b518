"""Subnet samplers for supernet training: uniform, sandwich and prioritised.

A sampler returns the subnets of one training step (``draw``) and may learn from the
training so far (``update``, called by the trainer every step).

* :class:`UniformSampler` — every subnet drawn uniformly from the space (optionally
  with the largest subnet first, as the teacher of in-place distillation).
* :class:`SandwichSampler` — the sandwich rule: largest, smallest and uniform ones.
* :class:`PrioritizedSampler` — *our design* (the OSF paper describes a sampler that
  prioritises the most promising candidates, but its code is not released). It keeps a
  pool of candidate subnets spread over the FLOPs range, scores them every
  ``refresh_every`` steps by validation loss on a small held-out batch, ranks them by
  Pareto rank on (validation loss, FLOPs), and draws each step's subnets with
  probability proportional to ``exp(-rank / temperature)``. At each refresh the most
  dominated quarter of the pool is replaced by mutations of front members, so the pool
  drifts towards the loss-FLOPs front that the final search will pick from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from hpcnb.errors import InvalidInputError

from .pareto import pareto_ranks
from .space import SearchSpace, SubnetConfig

if TYPE_CHECKING:  # pragma: no cover
    from .supernet import Supernet

__all__ = ["PrioritizedSampler", "Sampler", "SandwichSampler", "UniformSampler"]


class Sampler(Protocol):
    """What a trainer needs from a sampler."""

    def draw(self, rng: np.random.Generator, n: int) -> list[SubnetConfig]:
        """Return the ``n`` subnets of one step.

        Args:
            rng: The trainer's generator.
            n: Subnets per step.
        """
        ...

    def update(self, supernet: Supernet, step: int) -> None:
        """Learn from the supernet after training step ``step``.

        Args:
            supernet: The supernet being trained.
            step: Index of the step just taken (from 0).
        """
        ...


class _FixedSampler:
    """A sampler that learns nothing: its fixed subnets of a step, then uniform ones.

    Args:
        space: The search space.
    """

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def _fixed(self, n: int) -> list[SubnetConfig]:
        """The subnets that open a step of ``n`` (at most ``n``)."""
        raise NotImplementedError

    def draw(self, rng: np.random.Generator, n: int) -> list[SubnetConfig]:
        """Return ``n`` subnets: the fixed ones first, the rest drawn uniformly.

        Args:
            rng: The trainer's generator.
            n: Subnets per step.
        """
        head = self._fixed(n)
        return head + [self.space.sample(rng) for _ in range(n - len(head))]

    def update(self, supernet: Supernet, step: int) -> None:
        """Nothing to learn.

        Args:
            supernet: The supernet being trained.
            step: Index of the step just taken.
        """


class UniformSampler(_FixedSampler):
    """Draw subnets uniformly (the largest first when ``include_max``).

    Args:
        space: The search space.
        include_max: Put the largest subnet first (the in-place distillation teacher).
    """

    name = "uniform"

    def __init__(self, space: SearchSpace, include_max: bool = True) -> None:
        super().__init__(space)
        self.include_max = include_max

    def _fixed(self, n: int) -> list[SubnetConfig]:
        return [self.space.max()] if self.include_max and n > 0 else []


class SandwichSampler(_FixedSampler):
    """The sandwich rule: the largest, the smallest and ``n - 2`` uniform subnets.

    A step of fewer than two subnets keeps the first ``n`` of ``[max, min]``.

    Args:
        space: The search space.
    """

    name = "sandwich"

    def _fixed(self, n: int) -> list[SubnetConfig]:
        return [self.space.max(), self.space.min()][:n]


class PrioritizedSampler:
    """Draw subnets from a pool in proportion to their promise (our design).

    Args:
        supernet: The supernet (used to count FLOPs and score candidates).
        val_x: A small validation batch for scoring.
        val_y: Its labels.
        pool_size: Number of candidates kept.
        refresh_every: Steps between re-scoring the pool.
        temperature: Softness of the rank-to-probability map (higher = closer to uniform).
        replace_fraction: Fraction of the most dominated candidates replaced at a refresh.
        include_max: Put the largest subnet first (the distillation teacher).
        seed: Seed of the pool's own random generator.
    """

    name = "prioritized"

    def __init__(
        self,
        supernet: Supernet,
        val_x: torch.Tensor,
        val_y: torch.Tensor,
        *,
        pool_size: int = 16,
        refresh_every: int = 10,
        temperature: float = 1.0,
        replace_fraction: float = 0.25,
        include_max: bool = True,
        seed: int = 0,
    ) -> None:
        if pool_size < 2:
            raise InvalidInputError(f"pool_size={pool_size}: the pool needs at least 2 candidates")
        if refresh_every < 1:
            raise InvalidInputError(f"refresh_every={refresh_every}: expected >= 1")
        if temperature <= 0:
            raise InvalidInputError(f"temperature={temperature}: expected > 0")
        self.supernet = supernet
        self.space = supernet.space
        self.val_x, self.val_y = val_x, val_y
        self.refresh_every = refresh_every
        self.temperature = temperature
        self.replace_fraction = replace_fraction
        self.include_max = include_max
        self._rng = np.random.default_rng(seed)
        self.pool = self._initial_pool(pool_size)
        self.losses = np.zeros(len(self.pool))
        self.ranks = np.zeros(len(self.pool), dtype=int)
        self.history: list[dict[str, float]] = []
        self._score()

    def _initial_pool(self, size: int) -> list[SubnetConfig]:
        """Candidates spread over the FLOPs range: one per FLOPs quantile of many draws."""
        draws = {self.space.sample(self._rng) for _ in range(4 * size)}
        draws.discard(self.space.max())
        ordered = sorted(draws, key=self.supernet.flops)
        picks = np.linspace(0, len(ordered) - 1, num=min(size, len(ordered))).round()
        pool = [ordered[int(i)] for i in dict.fromkeys(picks.tolist())]
        if self.space.min() not in pool:
            pool[0] = self.space.min()
        return pool

    @torch.no_grad()
    def _loss(self, config: SubnetConfig) -> float:
        # Train mode: normalisation layers use the batch's statistics, a cheap stand-in
        # for recalibrating them per candidate; the shared weights are not touched.
        module = self.supernet.bind(config).pull().train()
        return float(F.cross_entropy(module(self.val_x), self.val_y))

    def _score(self) -> None:
        self.losses = np.array([self._loss(c) for c in self.pool])
        flops = np.array([self.supernet.flops(c) for c in self.pool], dtype=float)
        self.ranks = pareto_ranks(np.stack([self.losses, flops], axis=1))

    def probabilities(self) -> np.ndarray:
        """Return the current draw probability of each pool member."""
        w = np.exp(-self.ranks / self.temperature)
        return w / w.sum()

    def draw(self, rng: np.random.Generator, n: int) -> list[SubnetConfig]:
        """Return ``n`` subnets: the largest first (optional), then pool draws by promise.

        Args:
            rng: The trainer's generator.
            n: Subnets per step.
        """
        head = [self.space.max()] if self.include_max and n > 0 else []
        k = n - len(head)
        idx = rng.choice(len(self.pool), size=k, p=self.probabilities(), replace=k > len(self.pool))
        return head + [self.pool[int(i)] for i in idx]

    def update(self, supernet: Supernet, step: int) -> None:
        """Every ``refresh_every`` steps: re-score, replace the most dominated, re-rank.

        Args:
            supernet: The supernet being trained (scores the pool).
            step: Index of the step just taken (from 0).
        """
        if (step + 1) % self.refresh_every:
            return
        self._score()
        n_replace = int(len(self.pool) * self.replace_fraction)
        if n_replace:
            worst = np.argsort(-self.ranks, kind="stable")[:n_replace]
            front = [c for c, r in zip(self.pool, self.ranks, strict=True) if r == 0]
            present = set(self.pool)
            for i in worst:
                if self.ranks[i] == 0:
                    continue
                child = self.space.mutate(front[int(self._rng.integers(len(front)))], self._rng)
                if child not in present and child != self.space.max():
                    present.discard(self.pool[i])
                    self.pool[i] = child
                    present.add(child)
            self._score()
        self.history.append(
            {
                "step": float(step),
                "front_size": float((self.ranks == 0).sum()),
                "mean_loss": float(self.losses.mean()),
            }
        )
