"""Side-by-side comparison of pruning methods at one FLOPs budget.

:func:`compare_methods` runs every search on one :class:`~hpcnb.pruning.task.ModelPruningTask`,
builds the physically pruned networks (``hpcnb.ir.extract``; Torch-Pruning's own result
for the peer), measures each one's FLOPs with a fresh ``hpcnb.ir.trace``, its parameter
count, its test accuracy before and after the *same* fine-tuning, and the CPU latency of
all of them and the original in one interleaved timing run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from hpcnb import ir
from hpcnb.pruning.agents import (
    DDPGConfig,
    PPOConfig,
    SearchResult,
    amc_ddpg_search,
    gnnrl_search,
    random_search,
    uniform_search,
)
from hpcnb.pruning.env import EnvConfig
from hpcnb.pruning.peers import torch_pruning_at_budget
from hpcnb.pruning.task import ModelPruningTask
from hpcnb.pruning.training import (
    TrainConfig,
    accuracy,
    count_params,
    fine_tune,
    measure_latency,
)

__all__ = ["METHODS", "MethodOutcome", "compare_methods", "outcomes_table"]

METHODS = ("gnnrl", "uniform", "random", "amc_ddpg", "torch_pruning")
"""Method names understood by :func:`compare_methods`."""


@dataclass(frozen=True)
class MethodOutcome:
    """One method's pruned network at one budget.

    Attributes:
        method: Method name (or ``"original"``).
        target: FLOPs budget fraction.
        flops_ratio: FLOPs of the pruned network (fresh IR trace) / original.
        params: Parameter count.
        acc_before: Test accuracy before fine-tuning.
        acc_after: Test accuracy after the shared fine-tuning.
        latency_ms: Median forward latency of one batch, milliseconds.
        speedup: Median over timing rounds of original latency / this latency (each
            round times every model once, back to back, so a burst of load on a shared
            machine slows both sides of a ratio alike).
        search_seconds: Wall time of the search (0 for the original).
        keep: Per-group keep ratios (empty for the original and the peer).
    """

    method: str
    target: float
    flops_ratio: float
    params: int
    acc_before: float
    acc_after: float
    latency_ms: float
    speedup: float
    search_seconds: float
    keep: tuple[float, ...] = ()


def _flops(model: nn.Module, example: torch.Tensor) -> int:
    return ir.trace(model.eval(), example[:1]).total_flops()


def compare_methods(
    task: ModelPruningTask,
    split: object,
    target: float,
    *,
    methods: tuple[str, ...] = METHODS,
    ppo: PPOConfig | None = None,
    ddpg: DDPGConfig | None = None,
    random_samples: int = 100,
    finetune: TrainConfig | None = None,
    latency_batch: int = 256,
    latency_repeats: int = 30,
    seed: int = 0,
) -> tuple[list[MethodOutcome], dict[str, SearchResult]]:
    """Prune ``task.model`` to ``target`` FLOPs with each method and measure the results.

    Args:
        task: The pruning task (its model is the trained original).
        split: A :class:`hpcnb.data.DigitsSplit` (train for fine-tuning, test for scores).
        target: FLOPs budget fraction.
        methods: Subset of :data:`METHODS`.
        ppo: GNN-RL agent settings (default :class:`PPOConfig`).
        ddpg: AMC-style agent settings (default :class:`DDPGConfig`).
        random_samples: Candidates of the random search.
        finetune: The fine-tuning schedule shared by every method (default 5 epochs).
        latency_batch: Batch size of the latency measurement.
        latency_repeats: Timed repeats per model.
        seed: Seed of the random search.

    Returns:
        ``(outcomes, searches)``: one :class:`MethodOutcome` per method plus the original
        (first), and the :class:`SearchResult` of each search method.
    """
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"compare_methods: unknown methods {sorted(unknown)}; known: {METHODS}")
    ppo = ppo or PPOConfig()
    ddpg = ddpg or DDPGConfig()
    finetune = finetune or TrainConfig(epochs=5, lr=1e-3)
    env_config = EnvConfig(target=target)
    x_test, y_test = split.x_test, split.y_test  # type: ignore[attr-defined]
    x_train, y_train = split.x_train, split.y_train  # type: ignore[attr-defined]
    example = torch.as_tensor(np.asarray(x_test[:2])).float()
    base_flops = _flops(task.model, example)
    searches: dict[str, SearchResult] = {}
    pruned: dict[str, tuple[nn.Module, float, tuple[float, ...]]] = {}
    for method in methods:
        if method == "torch_pruning":
            start = time.perf_counter()
            peer = torch_pruning_at_budget(task.model, example, target)
            pruned[method] = (peer.model, time.perf_counter() - start, ())
            continue
        if method == "gnnrl":
            result = gnnrl_search(task, env_config, ppo)
        elif method == "uniform":
            result = uniform_search(task, target)
        elif method == "random":
            result = random_search(task, target, samples=random_samples, seed=seed)
        else:
            result = amc_ddpg_search(task, env_config, ddpg)
        searches[method] = result
        model = task.extract(result.counts, ratios=False)
        pruned[method] = (model, result.seconds, tuple(float(k) for k in result.keep))
    models = {"original": task.model, **{m: v[0] for m, v in pruned.items()}}
    batch = torch.as_tensor(
        np.resize(np.asarray(x_train), (latency_batch, *np.asarray(x_train).shape[1:]))
    )
    latency = measure_latency(models, batch.float(), repeats=latency_repeats)
    outcomes = []
    for name, model in models.items():
        before = accuracy(model, x_test, y_test)
        after = (
            before
            if name == "original"
            else accuracy(fine_tune(model, x_train, y_train, finetune), x_test, y_test)
        )
        outcomes.append(
            MethodOutcome(
                method=name,
                target=target,
                flops_ratio=_flops(model, example) / base_flops,
                params=count_params(model),
                acc_before=before,
                acc_after=after,
                latency_ms=1e3 * latency[name].median_s,
                speedup=float(
                    np.median(
                        np.asarray(latency["original"].samples_s)
                        / np.asarray(latency[name].samples_s)
                    )
                ),
                search_seconds=0.0 if name == "original" else pruned[name][1],
                keep=() if name == "original" else pruned[name][2],
            )
        )
    return outcomes, searches


def outcomes_table(outcomes: list[MethodOutcome]) -> pd.DataFrame:
    """Return the outcomes as a table (one row per method and budget, no keep ratios)."""
    rows = [{k: v for k, v in o.__dict__.items() if k != "keep"} for o in outcomes]
    return pd.DataFrame(rows).set_index(["target", "method"])
