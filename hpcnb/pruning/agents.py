"""Search methods at a FLOPs budget: GNN-RL (PPO), AMC-style DDPG, random, uniform.

Every method returns a :class:`PolicySearchResult` with per-group keep ratios that meet the
budget on the problem's FLOPs model, the accuracy of the pruned network before
fine-tuning on the held-out split, and the search time. The RL searches return the best
feasible policy met during training (as the paper's code keeps the best episode) or the
deterministic final policy, whichever scores higher on the held-out split.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from stable_baselines3 import DDPG, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.noise import NormalActionNoise

from hpcnb.errors import InvalidInputError, InvalidStateError
from hpcnb.pruning.encoder import GNNFeaturesExtractor
from hpcnb.pruning.env import EnvConfig, LayerwiseEnv, PruningEnv, _PruningEpisode
from hpcnb.pruning.problem import PruningProblem, keep_counts, uniform_ratios
from hpcnb.timing import pinned_threads

if TYPE_CHECKING:
    from hpcnb.pruning.latency import LatencyModel

__all__ = [
    "AgentConfig",
    "DDPGConfig",
    "PPOConfig",
    "PolicySearchResult",
    "amc_ddpg_search",
    "gnnrl_search",
    "learning_curve",
    "policy_item_rewards",
    "policy_score",
    "random_search",
    "uniform_search",
]


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """What every stable-baselines3 agent run is given (the fields common to both agents).

    Attributes:
        timesteps: Environment steps of training.
        learning_rate: Adam learning rate.
        seed: Seed of the agent and the environment.
        threads: Torch intra-op threads during the search.
    """

    timesteps: int = 1024
    learning_rate: float = 1e-3
    seed: int = 0
    threads: int = 1


@dataclass(frozen=True, kw_only=True)
class PPOConfig(AgentConfig):
    """PPO and GNN settings of the GNN-RL agent (keyword arguments only).

    Attributes:
        timesteps: Environment steps of training.
        n_steps: Rollout length per update.
        batch_size: PPO minibatch size.
        n_epochs: PPO epochs per update.
        learning_rate: Adam learning rate.
        hidden: GNN width.
        stage2_layers: Stage-2 message-passing layers.
        ent_coef: Entropy bonus.
        seed: Seed of the agent and the environment.
        threads: Torch intra-op threads during the search.
    """

    n_steps: int = 128
    batch_size: int = 64
    n_epochs: int = 5
    hidden: int = 32
    stage2_layers: int = 3
    ent_coef: float = 0.0


@dataclass(frozen=True, kw_only=True)
class DDPGConfig(AgentConfig):
    """Settings of the AMC-style DDPG agent, one episode = one pass over the groups.

    Keyword arguments only.

    Attributes:
        timesteps: Environment steps (``episodes * G``).
        learning_starts: Random-action steps before learning.
        noise: Std of the Gaussian exploration noise on the action in ``[-1, 1]``.
        learning_rate: Adam learning rate of actor and critic.
        seed: Seed.
        threads: Torch intra-op threads during the search.
    """

    timesteps: int = 600
    learning_starts: int = 100
    noise: float = 0.5


@dataclass(frozen=True)
class PolicySearchResult:
    """Outcome of one search at a FLOPs budget.

    Attributes:
        method: Short method name.
        keep: ``(G,)`` keep ratios.
        counts: ``(G,)`` kept channels per group.
        flops_ratio: FLOPs kept (FLOPs model) / original.
        val_accuracy: Accuracy on the held-out split before fine-tuning.
        seconds: Wall time of the search.
        episode_rewards: Reward of each training episode (RL methods; empty otherwise).
        episode_accuracies: Held-out accuracy of each training episode's final policy,
            ``nan`` where the episode missed the budget (RL methods; empty otherwise).
        reward: The reward of the returned policy (the search's score of ``counts``).
    """

    method: str
    keep: np.ndarray
    counts: np.ndarray
    flops_ratio: float
    val_accuracy: float
    seconds: float
    episode_rewards: tuple[float, ...] = field(default=(), repr=False)
    episode_accuracies: tuple[float, ...] = field(default=(), repr=False)
    reward: float = float("nan")


def _result(
    problem: PruningProblem,
    method: str,
    keep: np.ndarray,
    seconds: float,
    rewards: Sequence[float] = (),
    counts: np.ndarray | None = None,
    *,
    accuracies: Sequence[float] = (),
    reward: float | None = None,
) -> PolicySearchResult:
    sizes = np.asarray(problem.group_sizes)
    counts = keep_counts(keep, sizes) if counts is None else np.asarray(counts, dtype=np.int64)
    accuracy = float(problem.accuracy(counts))
    return PolicySearchResult(
        method=method,
        keep=np.asarray(keep, dtype=np.float64),
        counts=counts,
        flops_ratio=problem.flops_model(counts / sizes) / problem.flops_model.total,
        val_accuracy=accuracy,
        seconds=seconds,
        episode_rewards=tuple(float(r) for r in rewards),
        episode_accuracies=tuple(float(a) for a in accuracies),
        reward=accuracy if reward is None else float(reward),
    )


def policy_score(
    problem: PruningProblem,
    env_config: EnvConfig,
    keep: np.ndarray,
    latency: LatencyModel | None = None,
) -> tuple[float, float]:
    """``(accuracy, reward)`` a search with ``env_config`` gives to the keep ratios ``keep``.

    Scores any policy (uniform ratios, say) the way the agent's episodes are scored:
    channel counts snapped as configured, accuracy from the problem's oracle (BatchNorm
    recalibrated when the task has calibration inputs), minus the weighted latency ratio.

    Args:
        problem: The pruning problem.
        env_config: The search's episode settings (``round_to``, ``latency_weight``).
        keep: Per-group keep ratios.
        latency: The latency model of a latency-aware reward.

    Raises:
        InvalidInputError: The snapped policy misses the FLOPs budget.
    """
    env, keep = _feasible(problem, env_config, keep, latency, "policy_score")
    return env.score_parts(keep)


def _feasible(
    problem: PruningProblem,
    env_config: EnvConfig,
    keep: np.ndarray,
    latency: LatencyModel | None,
    caller: str,
) -> tuple[PruningEnv, np.ndarray]:
    """The episode that scores ``keep``, once the snapped policy is checked to fit the budget."""
    env = PruningEnv(problem, env_config, latency)
    keep = np.asarray(keep, dtype=np.float64)
    ratio = env.flops_ratio(keep)
    if ratio > env_config.target + 1e-9:
        raise InvalidInputError(
            f"{caller}: the policy keeps {ratio:.4f} of the FLOPs, above the budget "
            f"{env_config.target}"
        )
    return env, keep


def policy_item_rewards(
    problem: PruningProblem,
    env_config: EnvConfig,
    keep: np.ndarray,
    latency: LatencyModel | None = None,
) -> np.ndarray:
    """Per held-out item, the reward :func:`policy_score` averages over the items.

    Item ``i`` scores 1 where the pruned network is right and 0 where it is wrong, minus
    the weighted latency ratio (the same for every item), so the mean is the policy's
    reward and two policies' items can be compared pairwise
    (:func:`~hpcnb.models.metrics.pooled_gap_interval`).

    Args:
        problem: The pruning problem; it must score items one by one (``correct``, as
            :class:`~hpcnb.pruning.task.ModelPruningTask` does).
        env_config: The search's episode settings (``round_to``, ``latency_weight``).
        keep: Per-group keep ratios.
        latency: The latency model of a latency-aware reward.

    Raises:
        InvalidInputError: The problem gives no per-item results, or the snapped policy
            misses the FLOPs budget.
    """
    correct = getattr(problem, "correct", None)
    if not callable(correct):
        raise InvalidInputError(
            f"policy_item_rewards: {type(problem).__name__} gives no per-item results "
            "(a correct(counts) method)"
        )
    env, keep = _feasible(problem, env_config, keep, latency, "policy_item_rewards")
    items = np.asarray(correct(env.counts(keep)), dtype=np.float64)  # one evaluation
    if env_config.latency_weight > 0:
        items -= env_config.latency_weight * env.latency_ratio(keep)
    return items


def uniform_search(problem: PruningProblem, target: float) -> PolicySearchResult:
    """Return the same keep ratio for every group, as large as the budget allows.

    Args:
        problem: The pruning problem.
        target: FLOPs budget fraction.
    """
    start = time.perf_counter()
    keep = uniform_ratios(problem, target)
    return _result(problem, "uniform", keep, time.perf_counter() - start)


def random_search(
    problem: PruningProblem, target: float, samples: int = 100, seed: int = 0, min_keep: float = 0.1
) -> PolicySearchResult:
    """Sample random keep-ratio directions, scale each onto the budget, keep the best.

    A sample draws ``r ~ U(min_keep, 1)`` per group and uses ``1 - s (1 - r)`` with the
    smallest ``s`` in ``[0, 1]`` that meets the budget (directions that cannot meet it are
    redrawn, at most ``10 * samples`` draws).

    Args:
        problem: The pruning problem.
        target: FLOPs budget fraction.
        samples: Evaluated candidates.
        seed: RNG seed.
        min_keep: Smallest keep ratio.
    """
    if samples < 1:
        raise InvalidInputError(f"random_search: samples={samples}, expected >= 1")
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    env = PruningEnv(problem, EnvConfig(target=target, min_keep=min_keep))
    best: tuple[float, np.ndarray] | None = None
    evaluated = 0
    for _ in range(10 * samples):
        if evaluated >= samples:
            break
        r = rng.uniform(min_keep, 1.0, len(problem.group_sizes))
        if env.flops_ratio(r) > target:
            continue
        lo, hi = 0.0, 1.0
        while hi - lo > 1e-4:
            mid = 0.5 * (lo + hi)
            if env.flops_ratio(1.0 - mid * (1.0 - r)) <= target:
                hi = mid
            else:
                lo = mid
        keep = 1.0 - hi * (1.0 - r)
        acc = float(problem.accuracy(keep_counts(keep, env.sizes)))
        evaluated += 1
        if best is None or acc > best[0]:
            best = (acc, keep)
    if best is None:
        raise InvalidStateError(f"random_search: no sample met the FLOPs budget {target}")
    return _result(problem, "random", best[1], time.perf_counter() - start)


class _EpisodeLog(BaseCallback):
    """Collects the terminal reward of each finished episode."""

    def __init__(self) -> None:
        super().__init__()
        self.rewards: list[float] = []

    def _on_step(self) -> bool:
        for done, reward in zip(self.locals["dones"], self.locals["rewards"], strict=True):
            if done:
                self.rewards.append(float(reward))
        return True


def _best_of(
    problem: PruningProblem, env: _PruningEpisode, final_keep: np.ndarray | None
) -> np.ndarray:
    best = env.best()
    candidates = [e.keep for e in ([best] if best is not None else [])]
    if final_keep is not None:
        candidates.append(final_keep)
    if not candidates:
        raise InvalidStateError("search found no policy that meets the FLOPs budget; train longer")
    scores = [env.score(k) for k in candidates]
    return candidates[int(np.argmax(scores))]


def _rollout(
    model: PPO | DDPG, env: PruningEnv | LayerwiseEnv, deterministic: bool = True
) -> np.ndarray | None:
    obs, _ = env.reset()
    for _ in range(10_000):
        action, _ = model.predict(obs, deterministic=deterministic)
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return (
                info["keep"] if info.get("flops_ratio", 2.0) <= env.config.target + 1e-9 else None
            )
    return None


def _train_agent(
    method: str,
    problem: PruningProblem,
    env_type: type[PruningEnv] | type[LayerwiseEnv],
    env_config: EnvConfig,
    config: AgentConfig,
    agent_type: type[PPO] | type[DDPG],
    policy: str,
    latency: LatencyModel | None = None,
    **agent_kwargs: Any,
) -> PolicySearchResult:
    """Train an SB3 agent on a fresh episode, pick its best policy and time the whole search.

    The agent is undiscounted (the reward comes at the end of an episode), seeded with
    ``config.seed`` and trained on the CPU with ``config.threads`` torch threads. The best
    policy is the one with the highest reward (accuracy, minus the latency term when the
    episode has one); its counts are the episode's (snapped when ``env_config.round_to``).
    """
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    env = env_type(problem, env_config, latency)
    env.reset(seed=config.seed)
    model = agent_type(
        policy, env, gamma=1.0, seed=config.seed, device="cpu", verbose=0, **agent_kwargs
    )
    log = _EpisodeLog()
    with pinned_threads(config.threads, numba=False, blas=False):
        model.learn(total_timesteps=config.timesteps, callback=log)
        keep = _best_of(problem, env, _rollout(model, env))
    counts = env.counts(keep)
    episodes = env.history[: len(log.rewards)]  # the final rollout is not a training episode
    return _result(
        problem,
        method,
        keep,
        time.perf_counter() - start,
        log.rewards,
        counts,
        accuracies=[e.accuracy for e in episodes],
        reward=env.score(keep),
    )


def gnnrl_search(
    problem: PruningProblem,
    env_config: EnvConfig,
    config: PPOConfig = PPOConfig(),
    *,
    latency: LatencyModel | None = None,
    method: str = "gnnrl",
) -> PolicySearchResult:
    """Train the GNN-RL agent (PPO + multi-stage GNN extractor) and return its policy.

    Args:
        problem: The pruning problem.
        env_config: Budget and episode settings (``round_to`` and ``latency_weight`` make
            the search latency-aware).
        config: PPO and GNN settings.
        latency: Latency model of the reward (needed when ``env_config.latency_weight``).
        method: Name the result carries.
    """
    return _train_agent(
        method,
        problem,
        PruningEnv,
        env_config,
        config,
        PPO,
        "MultiInputPolicy",
        latency,
        n_steps=config.n_steps,
        batch_size=config.batch_size,
        n_epochs=config.n_epochs,
        learning_rate=config.learning_rate,
        ent_coef=config.ent_coef,
        policy_kwargs={
            "features_extractor_class": GNNFeaturesExtractor,
            "features_extractor_kwargs": {
                "hidden": config.hidden,
                "stage2_layers": config.stage2_layers,
            },
            "net_arch": {"pi": [64], "vf": [64]},
        },
    )


def amc_ddpg_search(
    problem: PruningProblem, env_config: EnvConfig, config: DDPGConfig = DDPGConfig()
) -> PolicySearchResult:
    """Train the AMC-style layer-by-layer DDPG agent (SB3) and return its policy.

    Args:
        problem: The pruning problem.
        env_config: Uses ``target`` and ``min_keep``.
        config: DDPG settings.
    """
    return _train_agent(
        "amc_ddpg",
        problem,
        LayerwiseEnv,
        env_config,
        config,
        DDPG,
        "MlpPolicy",
        learning_rate=config.learning_rate,
        learning_starts=config.learning_starts,
        action_noise=NormalActionNoise(np.zeros(1), np.full(1, config.noise)),
        policy_kwargs={"net_arch": [64, 64]},
    )


def learning_curve(rewards: Sequence[float] | np.ndarray, window: int = 20) -> np.ndarray:
    """Return the running mean of episode rewards over ``window`` episodes.

    Args:
        rewards: Reward per episode in training order.
        window: Averaging window (shrinks at the start).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return r
    csum = np.cumsum(np.insert(r, 0, 0.0))
    idx = np.arange(1, r.size + 1)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)
