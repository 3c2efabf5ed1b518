"""Gymnasium environments: the GNN-RL pruning episode and the AMC layer-by-layer episode.

:class:`PruningEnv` follows the paper's public code: one action per prunable group per
step, keep ratio multiplied by ``1 - a`` and clipped to ``[min_keep, 1]``; the episode ends
when the FLOPs fall to the budget, with reward = accuracy of the pruned (not fine-tuned)
network on a held-out split of the training data, or after ``max_steps`` steps with the
failure reward (the paper: -100 with accuracy in percent; here -1 with accuracy in
``[0, 1]``). One addition, switchable: on the step that crosses the budget the move is
shortened to land on it (:func:`~hpcnb.pruning.problem.project_to_budget`).

:class:`LayerwiseEnv` is the AMC-style episode (He et al., ECCV 2018): one group per step
in network order, a small state embedding per group, the action is that group's keep
ratio, limited so that the budget stays reachable; reward = accuracy at the end.

Two switchable additions serve latency (both off by default, so the episodes above are
unchanged): ``EnvConfig.round_to`` snaps kept channel counts to multiples of 8 (or any
number; :func:`~hpcnb.pruning.problem.snap_counts`, which keeps the FLOPs budget), since
CPU and GPU kernels run fastest on channel counts that fill their vector registers, and
``EnvConfig.latency_weight`` with a :class:`~hpcnb.pruning.latency.LatencyModel` makes the
reward ``accuracy - latency_weight * latency(pruned) / latency(original)``, so that of two
policies with the same FLOPs and accuracy the one the latency model calls faster wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hpcnb.errors import InvalidInputError
from hpcnb.pruning.problem import (
    PruningProblem,
    keep_counts,
    project_to_budget,
    snap_counts,
    snap_counts_preferring,
)

if TYPE_CHECKING:
    from hpcnb.pruning.latency import LatencyModel

__all__ = ["EnvConfig", "EpisodeRecord", "LayerwiseEnv", "PruningEnv"]

ObsT = TypeVar("ObsT")


@dataclass(frozen=True)
class EnvConfig:
    """Settings of a pruning episode.

    Attributes:
        target: FLOPs budget as a fraction of the original network (0.5 = keep 50%).
        max_steps: Steps before the episode fails (paper: 5).
        max_prune_per_step: Largest per-step pruning fraction ``a`` (action 1 -> this).
        min_keep: Smallest keep ratio of any group (paper: 0.1).
        failure_reward: Reward when the budget is not met within ``max_steps``.
        project: Shorten the budget-crossing step to land on the budget.
        round_to: Snap kept channel counts to multiples of this (1: no snapping).
        round_fallback: A smaller multiple used where multiples of ``round_to`` cannot
            keep the FLOPs budget (0: none; e.g. ``round_to=16, round_fallback=8``).
        latency_weight: Weight of the latency term of the reward (0: accuracy only);
            needs a latency model given to the environment.
    """

    target: float = 0.5
    max_steps: int = 5
    max_prune_per_step: float = 0.5
    min_keep: float = 0.1
    failure_reward: float = -1.0
    project: bool = True
    round_to: int = 1
    round_fallback: int = 0
    latency_weight: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise InvalidInputError(f"EnvConfig.target={self.target}: expected in (0, 1]")
        if self.max_steps < 1:
            raise InvalidInputError(f"EnvConfig.max_steps={self.max_steps}: expected >= 1")
        if not 0 < self.max_prune_per_step < 1:
            raise InvalidInputError(
                f"EnvConfig.max_prune_per_step={self.max_prune_per_step}: expected in (0, 1)"
            )
        if not 0 < self.min_keep <= 1:
            raise InvalidInputError(f"EnvConfig.min_keep={self.min_keep}: expected in (0, 1]")
        if self.round_to < 1:
            raise InvalidInputError(f"EnvConfig.round_to={self.round_to}: expected >= 1")
        if not 0 <= self.round_fallback < max(self.round_to, 2):
            raise InvalidInputError(
                f"EnvConfig.round_fallback={self.round_fallback}: expected 0 (none) or a "
                f"multiple in [1, round_to={self.round_to})"
            )
        if not self.latency_weight >= 0:
            raise InvalidInputError(
                f"EnvConfig.latency_weight={self.latency_weight}: expected >= 0"
            )


@dataclass
class EpisodeRecord:
    """Outcome of one finished episode.

    Attributes:
        reward: The episode's reward.
        success: The episode met the FLOPs budget.
        flops_ratio: FLOPs kept at the episode's end / original.
        keep: Keep ratios at the episode's end.
        accuracy: Held-out accuracy of the final policy (``nan`` when the budget was missed).
    """

    reward: float
    success: bool
    flops_ratio: float
    keep: np.ndarray = field(repr=False)
    accuracy: float = float("nan")


class _PruningEpisode(gym.Env[ObsT, np.ndarray]):
    """What both episodes share: the problem's groups, the FLOPs ratio, finished episodes."""

    problem: PruningProblem
    config: EnvConfig
    sizes: np.ndarray
    history: list[EpisodeRecord]

    latency: LatencyModel | None
    keep: np.ndarray

    def __init__(
        self,
        problem: PruningProblem,
        config: EnvConfig = EnvConfig(),
        latency: LatencyModel | None = None,
    ) -> None:
        super().__init__()
        self._setup(self._bind(problem, config, latency))

    def _setup(self, g: int) -> None:
        """Build the episode's spaces and state for ``g`` groups (each environment's own)."""
        raise NotImplementedError

    def _start(self) -> tuple[ObsT, dict[str, Any]]:
        """Reset the environment's own episode state; return the first observation and info."""
        raise NotImplementedError

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[ObsT, dict[str, Any]]:
        """Start an episode at full width.

        Args:
            seed: Seed of the environment's generator (gymnasium's convention).
            options: Unused (gymnasium's signature).
        """
        super().reset(seed=seed)
        self.keep = np.ones(len(self.sizes))
        return self._start()

    def _bind(
        self, problem: PruningProblem, config: EnvConfig, latency: LatencyModel | None = None
    ) -> int:
        """Keep the problem and the settings, start an empty history; return the group count.

        Raises:
            InvalidInputError: The problem has no prunable groups, or a latency weight without a
                latency model.
        """
        self.problem = problem
        self.config = config
        self.latency = latency
        self.sizes = np.asarray(problem.group_sizes, dtype=np.int64)
        self.history = []
        if len(self.sizes) == 0:
            raise InvalidInputError(f"{type(self).__name__}: the problem has no prunable groups")
        if config.latency_weight > 0 and latency is None:
            raise InvalidInputError(
                f"{type(self).__name__}: EnvConfig.latency_weight={config.latency_weight} "
                "needs a latency model (latency=...)"
            )
        self._full_latency = float(latency.latency(self.sizes)) if latency is not None else 1.0
        return len(self.sizes)

    def counts(self, keep: np.ndarray) -> np.ndarray:
        """Kept channels per group at keep ratios ``keep`` (rounded, snapped if configured)."""
        counts = keep_counts(keep, self.sizes)
        if self.config.round_to == 1:
            return counts
        fm = self.problem.flops_model
        budget = self.config.target * fm.total
        if self.config.round_fallback:
            multiples = (self.config.round_to, self.config.round_fallback)
            return snap_counts_preferring(counts, self.sizes, multiples, fm, budget)
        return snap_counts(counts, self.sizes, self.config.round_to, fm, budget)

    def flops_ratio(self, keep: np.ndarray) -> float:
        """FLOPs of the network at keep ratios ``keep`` (rounded to channels) / original."""
        counts = self.counts(keep)
        return self.problem.flops_model(counts / self.sizes) / self.problem.flops_model.total

    def latency_ratio(self, keep: np.ndarray) -> float:
        """Latency-model latency at ``keep`` / at full width (``nan`` without a model)."""
        if self.latency is None:
            return float("nan")
        return float(self.latency.latency(self.counts(keep))) / self._full_latency

    def score(self, keep: np.ndarray) -> float:
        """The reward of a feasible policy: accuracy, minus the weighted latency ratio."""
        return self.score_parts(keep)[1]

    def score_parts(self, keep: np.ndarray) -> tuple[float, float]:
        """``(accuracy, reward)`` of a feasible policy (the reward of :meth:`score`)."""
        accuracy = float(self.problem.accuracy(self.counts(keep)))
        reward = accuracy
        if self.config.latency_weight > 0:
            reward -= self.config.latency_weight * self.latency_ratio(keep)
        return accuracy, reward

    def _finish(
        self,
        reward: float,
        success: bool,
        flops_ratio: float,
        keep: np.ndarray,
        accuracy: float = float("nan"),
    ) -> None:
        self.history.append(EpisodeRecord(reward, success, flops_ratio, keep.copy(), accuracy))

    def best(self) -> EpisodeRecord | None:
        """Return the feasible episode with the highest reward seen so far, if any."""
        feasible = [e for e in self.history if e.success]
        return max(feasible, key=lambda e: e.reward) if feasible else None


class PruningEnv(_PruningEpisode[dict[str, Any]]):
    """GNN-RL pruning episode over a :class:`~hpcnb.pruning.problem.PruningProblem`.

    Observation: the ``Dict`` of :meth:`HierarchicalGraph.observation`. Action:
    ``Box(-1, 1, (G,))``, mapped to per-group pruning fractions
    ``a = max_prune_per_step * (action + 1) / 2``.

    Args:
        problem: The pruning problem (groups, FLOPs model, accuracy oracle, graph).
        config: Episode settings.
        latency: Latency model of the reward's latency term (with ``config.latency_weight``).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium convention

    def _setup(self, g: int) -> None:
        problem, config = self.problem, self.config
        self.observation_space = problem.graph.observation_space()
        self.action_space = spaces.Box(-1.0, 1.0, (g,), np.float32)
        self.budget = config.target * problem.flops_model.total
        self.keep = np.ones(g)
        self.steps = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return self.problem.graph.observation(self.keep, self.steps / self.config.max_steps)

    def _start(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """No steps taken; the full-width observation."""
        self.steps = 0
        return self._obs(), {"flops_ratio": 1.0}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        """Prune every group by its action; end when the budget is met or steps run out."""
        act = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
        if act.shape != self.keep.shape:
            raise InvalidInputError(
                f"PruningEnv.step: action of shape {act.shape}, expected {self.keep.shape}"
            )
        prune = self.config.max_prune_per_step * (act + 1.0) / 2.0
        proposal = np.clip(self.keep * (1.0 - prune), self.config.min_keep, 1.0)
        if self.config.project:
            proposal = project_to_budget(self.problem, self.keep, proposal, self.config.target)
        self.keep = proposal
        self.steps += 1
        ratio = self.flops_ratio(self.keep)
        info: dict = {"flops_ratio": ratio, "keep": self.keep.copy()}
        if ratio <= self.config.target + 1e-12:
            accuracy, reward = self.score_parts(self.keep)
            info["reward"], info["accuracy"] = reward, accuracy
            self._finish(reward, True, ratio, self.keep, accuracy)
            return self._obs(), reward, True, False, info
        if self.steps >= self.config.max_steps:
            reward = float(self.config.failure_reward)
            self._finish(reward, False, ratio, self.keep)
            return self._obs(), reward, True, False, info
        return self._obs(), 0.0, False, False, info


class LayerwiseEnv(_PruningEpisode[np.ndarray]):
    """AMC-style episode: choose one group's keep ratio per step, in network order.

    State (7 values): step index / G, group size (log2 / 10), share of FLOPs that depend on
    the group, FLOPs removed so far, FLOPs still prunable after this group, the previous
    action, the budget. Action ``Box(-1, 1, (1,))`` -> keep ratio in ``[min_keep, 1]``,
    then clipped to the largest keep ratio that still lets the budget be met when every
    later group is cut to ``min_keep`` (AMC's constraint enforcement). With
    ``config.project`` an over-pruned final policy is moved back towards full width until it
    lands on the budget, as :class:`PruningEnv` does on its last step.

    Args:
        problem: The pruning problem.
        config: Uses ``target``, ``min_keep``, ``round_to`` and ``latency_weight``.
        latency: Latency model of the reward's latency term.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium convention

    def _setup(self, g: int) -> None:
        fm = self.problem.flops_model
        share = np.zeros(g)
        for t in range(len(fm.coef)):
            for grp in {int(fm.out_group[t]), int(fm.in_group[t])} - {-1}:
                share[grp] += fm.coef[t]
        self.share = share / fm.total
        self.observation_space = spaces.Box(-1.0, 2.0, (7,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.keep = np.ones(g)
        self.t = 0
        self.prev = 1.0

    def _state(self) -> np.ndarray:
        g = len(self.sizes)
        t = min(self.t, g - 1)
        rest = np.ones(g)
        rest[: t + 1] = self.keep[: t + 1]
        removed = 1.0 - self.flops_ratio(self.keep)
        return np.array(
            [
                t / g,
                np.log2(self.sizes[t] + 1) / 10.0,
                self.share[t],
                removed,
                float(self.share[t + 1 :].sum()),
                self.prev,
                self.config.target,
            ],
            dtype=np.float32,
        )

    def _start(self) -> tuple[np.ndarray, dict[str, Any]]:
        """On the first group, with no previous action; its state."""
        self.t = 0
        self.prev = 1.0
        return self._state(), {}

    def max_keep(self) -> float:
        """Largest keep ratio of the current group that keeps the budget reachable."""
        lo, hi = self.config.min_keep, 1.0
        trial = self.keep.copy()
        trial[self.t + 1 :] = self.config.min_keep
        trial[self.t] = hi
        if self.flops_ratio(trial) <= self.config.target:
            return hi
        trial[self.t] = lo
        if self.flops_ratio(trial) > self.config.target:
            return lo
        while hi - lo > 1e-3:
            mid = 0.5 * (lo + hi)
            trial[self.t] = mid
            if self.flops_ratio(trial) <= self.config.target:
                lo = mid
            else:
                hi = mid
        return lo

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Set the current group's keep ratio; reward the accuracy after the last group."""
        a = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        keep = self.config.min_keep + (1.0 - self.config.min_keep) * (a + 1.0) / 2.0
        keep = min(keep, self.max_keep())
        self.keep[self.t] = keep
        self.prev = keep
        self.t += 1
        if self.t < len(self.sizes):
            return self._state(), 0.0, False, False, {}
        if self.config.project:  # use up the budget: move back towards full width
            self.keep = project_to_budget(
                self.problem, np.ones(len(self.sizes)), self.keep, self.config.target
            )
        ratio = self.flops_ratio(self.keep)
        success = ratio <= self.config.target + 1e-9
        accuracy, reward = (
            self.score_parts(self.keep) if success else (float("nan"), self.config.failure_reward)
        )
        self._finish(float(reward), success, ratio, self.keep, accuracy)
        return self._state(), reward, True, False, {"flops_ratio": ratio, "keep": self.keep.copy()}
