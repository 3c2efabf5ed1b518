"""Side-by-side comparison of pruning methods at one FLOPs budget.

:func:`compare_methods` runs every search on one :class:`~hpcnb.pruning.task.ModelPruningTask`,
builds the physically pruned networks (``hpcnb.ir.extract``; Torch-Pruning's own result
for the peer), measures each one's FLOPs with a fresh ``hpcnb.ir.trace``, its parameter
count, its test accuracy before and after the *same* fine-tuning, and the CPU latency of
all of them and the original in one interleaved timing run.

Every evaluated network — the original and each method's pruned one alike — has its
BatchNorm statistics re-estimated on training batches
(:func:`~hpcnb.pruning.training.recalibrate_batchnorm`) before its accuracy is measured,
before and after fine-tuning; the accuracy with the inherited statistics is kept too
(``acc_inherited``) to show what the mismatch costs.

:func:`accuracy_gap` turns two outcomes into an accuracy difference with Newcombe's
interval on the shared test set, and :func:`bar_table` says which methods pass the same
bar (FLOPs within a budget and accuracy drop within a tolerance) as the headline.

Over several seeds (:func:`compare_over_seeds`: the searches' and the fine-tuning's seeds
change, the pretrained network stays), :func:`gap_over_seeds` gives the mean accuracy
difference of two methods with a two-level bootstrap interval: each resample draws seeds
with replacement and test items with replacement (the same items for both methods, so the
comparison is paired), which covers both the spread between seeds and the sampling of the
test set. The method ``"gnnrl_latency"`` is the latency-aware GNN-RL search (a latency
term in the reward, channel counts snapped to multiples of ``round_to``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import nn

import hpcnb.pruning.agents as agents
from hpcnb import ir
from hpcnb.models.metrics import paired_gap_interval, top1_accuracy, top1_correct
from hpcnb.pruning.env import EnvConfig
from hpcnb.pruning.peers import torch_pruning_at_budget
from hpcnb.pruning.task import ModelPruningTask
from hpcnb.pruning.training import (
    TrainConfig,
    count_params,
    fine_tune,
    measure_latency,
    recalibrate_batchnorm,
    training_batches,
)
from hpcnb.records import INCONCLUSIVE, MET, difference_interval, evaluate_target

__all__ = [
    "DEFAULT_METHODS",
    "METHODS",
    "MethodOutcome",
    "accuracy_gap",
    "bar_table",
    "by_method",
    "compare_methods",
    "compare_over_seeds",
    "count_passing",
    "gap_over_seeds",
    "headline_budget",
    "outcomes_table",
    "score_pruned",
    "sweep_table",
]

METHODS = ("gnnrl", "gnnrl_latency", "uniform", "random", "amc_ddpg", "torch_pruning")
"""Method names understood by :func:`compare_methods`."""

DEFAULT_METHODS = ("gnnrl", "uniform", "random", "amc_ddpg", "torch_pruning")
"""The methods :func:`compare_methods` runs unless told (no latency model needed)."""


@dataclass(frozen=True)
class MethodOutcome:
    """One method's pruned network at one budget.

    Attributes:
        method: Method name (or ``"original"``).
        target: FLOPs budget fraction.
        flops_ratio: FLOPs of the pruned network (fresh IR trace) / original.
        params: Parameter count.
        acc_before: Test accuracy before fine-tuning (BatchNorm recalibrated).
        acc_after: Test accuracy after the shared fine-tuning (BatchNorm recalibrated).
        latency_ms: Median forward latency of one batch, milliseconds.
        speedup: Median over timing rounds of original latency / this latency (each
            round times every model once, back to back, so a burst of load on a shared
            machine slows both sides of a ratio alike).
        search_seconds: Wall time of the search (0 for the original).
        acc_inherited: Test accuracy before fine-tuning with the BatchNorm statistics
            inherited from the original (no recalibration).
        n_test: Test items behind the accuracies.
        correct_before: Test items right before fine-tuning (recalibrated).
        correct_after: Test items right after fine-tuning (recalibrated).
        keep: Per-group keep ratios (empty for the original and the peer).
        speedup_samples: The per-round ratios whose median is ``speedup``.
        items_before: Per test item, right before fine-tuning (recalibrated).
        items_after: Per test item, right after fine-tuning (recalibrated).
        model: The pruned network as extracted (not fine-tuned), for further timing.
        seed: The seed of the searches and the fine-tuning.
        counts: Kept channels per group (empty for the original and the peer).
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
    acc_inherited: float = float("nan")
    n_test: int = 0
    correct_before: int = 0
    correct_after: int = 0
    keep: tuple[float, ...] = ()
    speedup_samples: tuple[float, ...] = field(default=(), repr=False)
    items_before: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), repr=False)
    items_after: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), repr=False)
    model: nn.Module | None = field(default=None, repr=False, compare=False)
    seed: int = 0
    counts: tuple[int, ...] = ()


def _flops(model: nn.Module, example: torch.Tensor) -> int:
    return ir.trace(model.eval(), example[:1]).total_flops()


def compare_methods(
    task: ModelPruningTask,
    split: object,
    target: float,
    *,
    methods: tuple[str, ...] = DEFAULT_METHODS,
    ppo: agents.PPOConfig | None = None,
    ddpg: agents.DDPGConfig | None = None,
    random_samples: int = 100,
    finetune: TrainConfig | None = None,
    latency_batch: int = 256,
    latency_repeats: int = 30,
    seed: int = 0,
    recalibrate: bool = True,
    calibration_batch: int = 64,
    latency_model: object | None = None,
    latency_weight: float = 0.5,
    round_to: int = 8,
) -> tuple[list[MethodOutcome], dict[str, agents.PolicySearchResult]]:
    """Prune ``task.model`` to ``target`` FLOPs with each method and measure the results.

    Args:
        task: The pruning task (its model is the trained original).
        split: A :class:`hpcnb.data.DigitsSplit` (train for fine-tuning, test for scores).
        target: FLOPs budget fraction.
        methods: Subset of :data:`METHODS` (default :data:`DEFAULT_METHODS`).
        ppo: GNN-RL agent settings (default :class:`~hpcnb.pruning.agents.PPOConfig`).
        ddpg: AMC-style agent settings (default :class:`~hpcnb.pruning.agents.DDPGConfig`).
        random_samples: Candidates of the random search.
        finetune: The fine-tuning schedule shared by every method (default 5 epochs).
        latency_batch: Batch size of the latency measurement.
        latency_repeats: Timed repeats per model.
        seed: Seed of the random search.
        recalibrate: Re-estimate BatchNorm statistics of every evaluated network on
            training batches before each accuracy measurement (all methods alike).
        calibration_batch: Batch size of the recalibration passes (all training items
            are used once).
        latency_model: A :class:`~hpcnb.pruning.latency.LatencyModel` for
            ``"gnnrl_latency"`` (needed when that method is asked for).
        latency_weight: Weight of the latency term of ``"gnnrl_latency"``'s reward.
        round_to: Channel multiple of ``"gnnrl_latency"`` (1: no snapping).

    Returns:
        ``(outcomes, searches)``: one :class:`MethodOutcome` per method plus the original
        (first), and the :class:`~hpcnb.pruning.agents.PolicySearchResult` of each search method.
    """
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"compare_methods: unknown methods {sorted(unknown)}; known: {METHODS}")
    if "gnnrl_latency" in methods and latency_model is None:
        raise ValueError("compare_methods: 'gnnrl_latency' needs latency_model=...")
    ppo = ppo or agents.PPOConfig()
    ddpg = ddpg or agents.DDPGConfig()
    finetune = finetune or TrainConfig(epochs=5, lr=1e-3)
    env_config = EnvConfig(target=target)
    x_test, y_test = split.x_test, split.y_test  # type: ignore[attr-defined]
    x_train, y_train = split.x_train, split.y_train  # type: ignore[attr-defined]
    example = torch.as_tensor(np.asarray(x_test[:2])).float()
    base_flops = _flops(task.model, example)
    searches: dict[str, agents.PolicySearchResult] = {}
    pruned: dict[str, tuple[nn.Module, float, tuple[float, ...], tuple[int, ...]]] = {}
    for method in methods:
        if method == "torch_pruning":
            start = time.perf_counter()
            peer = torch_pruning_at_budget(task.model, example, target)
            pruned[method] = (peer.model, time.perf_counter() - start, (), ())
            continue
        if method == "gnnrl":
            result = agents.gnnrl_search(task, env_config, ppo)
        elif method == "gnnrl_latency":
            aware = dataclasses.replace(
                env_config, round_to=round_to, latency_weight=latency_weight
            )
            result = agents.gnnrl_search(
                task, aware, ppo, latency=latency_model, method="gnnrl_latency"
            )  # type: ignore[arg-type]
        elif method == "uniform":
            result = agents.uniform_search(task, target)
        elif method == "random":
            result = agents.random_search(task, target, samples=random_samples, seed=seed)
        else:
            result = agents.amc_ddpg_search(task, env_config, ddpg)
        searches[method] = result
        model = task.extract(result.counts, ratios=False)
        pruned[method] = (
            model,
            result.seconds,
            tuple(float(k) for k in result.keep),
            tuple(int(c) for c in result.counts),
        )
    models = {"original": task.model, **{m: v[0] for m, v in pruned.items()}}
    batch = torch.as_tensor(
        np.resize(np.asarray(x_train), (latency_batch, *np.asarray(x_train).shape[1:]))
    )
    latency = measure_latency(models, batch.float(), repeats=latency_repeats)
    n_test = len(y_test)

    def evaluated(model: nn.Module) -> tuple[nn.Module, np.ndarray]:
        ready = copy.deepcopy(model)
        if recalibrate:
            recalibrate_batchnorm(ready, training_batches(x_train, calibration_batch))
        return ready, top1_correct(ready, x_test, y_test)

    base_samples = np.asarray(latency["original"].samples_s)
    outcomes = []
    for name, model in models.items():
        inherited = top1_accuracy(model, x_test, y_test)
        ready, items_before = evaluated(model)
        items_after = (
            items_before
            if name == "original"
            else evaluated(fine_tune(ready, x_train, y_train, finetune))[1]
        )
        before, after = int(items_before.sum()), int(items_after.sum())
        samples = tuple(float(r) for r in base_samples / np.asarray(latency[name].samples_s))
        outcomes.append(
            MethodOutcome(
                method=name,
                target=target,
                flops_ratio=_flops(model, example) / base_flops,
                params=count_params(model),
                acc_before=before / n_test,
                acc_after=after / n_test,
                latency_ms=1e3 * latency[name].median_s,
                speedup=float(np.median(samples)),
                search_seconds=0.0 if name == "original" else pruned[name][1],
                acc_inherited=inherited,
                n_test=n_test,
                correct_before=before,
                correct_after=after,
                keep=() if name == "original" else pruned[name][2],
                counts=() if name == "original" else pruned[name][3],
                speedup_samples=samples,
                items_before=items_before,
                items_after=items_after,
                model=model,
                seed=seed,
            )
        )
    return outcomes, searches


def score_pruned(
    model: nn.Module,
    split: object,
    *,
    recalibrate: bool = True,
    calibration_batch: int = 64,
) -> tuple[nn.Module, int, int]:
    """Score a (pruned) network on the test split the way :func:`compare_methods` does.

    A deep copy of ``model`` gets its BatchNorm statistics re-estimated on all training
    inputs (:func:`~hpcnb.pruning.training.recalibrate_batchnorm`, unless
    ``recalibrate`` is false) and is scored on the test split.

    Args:
        model: The network (not modified).
        split: A :class:`hpcnb.data.DigitsSplit`.
        recalibrate: Re-estimate BatchNorm statistics first.
        calibration_batch: Batch size of the recalibration passes.

    Returns:
        ``(the scored copy, correct test items, test items)``.
    """
    x_test, y_test = split.x_test, split.y_test  # type: ignore[attr-defined]
    ready = copy.deepcopy(model)
    if recalibrate:
        recalibrate_batchnorm(ready, training_batches(split.x_train, calibration_batch))  # type: ignore[attr-defined]
    n_test = len(y_test)
    return ready, round(top1_accuracy(ready, x_test, y_test) * n_test), n_test


def outcomes_table(outcomes: list[MethodOutcome]) -> pd.DataFrame:
    """Return the outcomes as a table (one row per method and budget).

    Keep ratios, timing samples and the raw counts are left out.
    """
    hidden = {
        "keep",
        "speedup_samples",
        "n_test",
        "correct_before",
        "correct_after",
        "items_before",
        "items_after",
        "model",
        "counts",
    }
    rows = [{k: v for k, v in o.__dict__.items() if k not in hidden} for o in outcomes]
    return pd.DataFrame(rows).set_index(["target", "method"])


def _correct(outcome: MethodOutcome, stage: str) -> int:
    if stage not in ("before", "after"):
        raise ValueError(f"stage={stage!r}: expected 'before' or 'after'")
    if outcome.n_test < 1:
        raise ValueError(f"outcome {outcome.method!r} carries no test counts (n_test=0)")
    return outcome.correct_before if stage == "before" else outcome.correct_after


def accuracy_gap(
    a: MethodOutcome,
    b: MethodOutcome,
    stage_a: str = "after",
    stage_b: str = "after",
) -> tuple[float, float, float, int]:
    """Accuracy of ``a`` minus that of ``b`` with Newcombe's 95 % interval.

    Both are scored on the same test items, for which Newcombe's (independent-samples)
    interval is conservative.

    Args:
        a: First outcome.
        b: Second outcome.
        stage_a: ``"before"`` or ``"after"`` fine-tuning for ``a``.
        stage_b: The same for ``b``.

    Returns:
        ``(difference, low, high, n)`` with ``n`` the test items.

    Raises:
        ValueError: A bad stage, outcomes without counts, or different test sets.
    """
    ca, cb = _correct(a, stage_a), _correct(b, stage_b)
    if a.n_test != b.n_test:
        raise ValueError(f"accuracy_gap: test sets differ ({a.n_test} vs {b.n_test} items)")
    diff, low, high = difference_interval(ca, a.n_test, cb, b.n_test)
    return diff, low, high, a.n_test


PASSES, FAILS = "passes", "fails"


def bar_table(
    outcomes: list[MethodOutcome],
    *,
    flops_max: float,
    max_drop: float,
    reference: str = "original",
    stage: str = "after",
) -> pd.DataFrame:
    """Which methods pass one bar: FLOPs within ``flops_max`` and a small accuracy drop.

    The drop is the reference's accuracy minus the method's (at ``stage``), with
    Newcombe's interval; a method *passes* when its FLOPs are within the bound and the
    whole interval of its drop is at most ``max_drop``, *fails* when the FLOPs exceed
    the bound or no point of the interval meets it, and is *inconclusive* otherwise —
    the same three-valued rule as a record's target (:func:`hpcnb.records.evaluate_target`).

    Args:
        outcomes: The outcomes of one network at one budget (with the reference).
        flops_max: Largest FLOPs ratio that passes.
        max_drop: Largest accuracy drop that passes (0 = no loss allowed).
        reference: Method whose accuracy the drop is measured from.
        stage: ``"after"`` or ``"before"`` fine-tuning for the compared methods.

    Returns:
        One row per method but the reference: ``flops_ratio``, ``drop``, ``drop_low``,
        ``drop_high``, ``status`` (``"passes"``, ``"fails"`` or ``"inconclusive"``).

    Raises:
        ValueError: No outcome is the reference, or outcomes span several budgets.
    """
    by_method = {o.method: o for o in outcomes}
    if reference not in by_method:
        raise ValueError(f"bar_table: no outcome named {reference!r} among {sorted(by_method)}")
    if len({o.target for o in outcomes}) > 1:
        raise ValueError("bar_table: outcomes of several budgets; pass those of one budget")
    ref = by_method[reference]
    rows = []
    for o in outcomes:
        if o.method == reference:
            continue
        drop, low, high, _ = accuracy_gap(ref, o, "before", stage)
        state = evaluate_target(drop, f"<= {max_drop}", low, high)
        status = INCONCLUSIVE if state == INCONCLUSIVE else PASSES if state == MET else FAILS
        if o.flops_ratio > flops_max:
            status = FAILS
        rows.append(
            {
                "method": o.method,
                "flops_ratio": o.flops_ratio,
                "drop": drop,
                "drop_low": low,
                "drop_high": high,
                "status": status,
            }
        )
    return pd.DataFrame(rows).set_index("method")


def count_passing(
    table: pd.DataFrame, exclude: tuple[str, ...] = ("gnnrl",)
) -> tuple[int, int, list[str]]:
    """Count the rows of a :func:`bar_table` that pass, leaving out ``exclude``.

    Returns:
        ``(passing, inconclusive, names of the passing methods)``.
    """
    rest = table.drop(index=[m for m in exclude if m in table.index])
    passing = [str(m) for m in rest.index[rest.status == PASSES]]
    return len(passing), int((rest.status == INCONCLUSIVE).sum()), passing


def compare_over_seeds(
    task: ModelPruningTask,
    split: object,
    target: float,
    seeds: Sequence[int],
    *,
    ppo: agents.PPOConfig | None = None,
    ddpg: agents.DDPGConfig | None = None,
    finetune: TrainConfig | None = None,
    **options: object,
) -> dict[int, list[MethodOutcome]]:
    """Run :func:`compare_methods` once per seed (searches and fine-tuning reseeded).

    The pretrained network and the data split stay the same; each seed replaces the seed
    of the PPO and DDPG agents, of the random search and of the fine-tuning's batch order.

    Args:
        task: The pruning task.
        split: The data split.
        target: FLOPs budget fraction.
        seeds: Seeds to run (at least one).
        ppo: GNN-RL agent settings (its seed is replaced).
        ddpg: AMC-style agent settings (its seed is replaced).
        finetune: The shared fine-tuning (its seed is replaced).
        **options: Further keyword arguments of :func:`compare_methods`.

    Returns:
        ``{seed: outcomes}``.
    """
    if not seeds:
        raise ValueError("compare_over_seeds: no seeds given")
    ppo = ppo or agents.PPOConfig()
    ddpg = ddpg or agents.DDPGConfig()
    finetune = finetune or TrainConfig(epochs=5, lr=1e-3)
    runs = {}
    for seed in seeds:
        outs, _ = compare_methods(
            task,
            split,
            target,
            ppo=dataclasses.replace(ppo, seed=seed),
            ddpg=dataclasses.replace(ddpg, seed=seed),
            finetune=dataclasses.replace(finetune, seed=seed),
            seed=seed,
            **options,  # type: ignore[arg-type]
        )
        runs[int(seed)] = outs
    return runs


def _items(outcome: MethodOutcome, stage: str) -> np.ndarray:
    _correct(outcome, stage)
    items = outcome.items_before if stage == "before" else outcome.items_after
    if len(items) != outcome.n_test:
        raise ValueError(f"outcome {outcome.method!r} carries no per-item results")
    return items.astype(np.float64)


def gap_over_seeds(
    a: Sequence[MethodOutcome],
    b: Sequence[MethodOutcome],
    stage_a: str = "after",
    stage_b: str = "after",
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float, int]:
    """Mean accuracy of ``a`` minus ``b`` over seeds, with a two-level bootstrap interval.

    ``a[i]`` and ``b[i]`` come from the same seed and are scored on the same test items.
    The value is the mean over seeds and items of ``right_a - right_b``; each of
    ``resamples`` resamples draws the seeds with replacement and, independently, the test
    items with replacement (shared by both methods: a paired comparison), and the
    interval is the 2.5 and 97.5 percentiles of the resampled means. With one seed only
    the items are resampled.

    Args:
        a: One outcome per seed of the first method.
        b: The outcomes of the second method, same seeds in the same order.
        stage_a: ``"before"`` or ``"after"`` fine-tuning for ``a``.
        stage_b: The same for ``b``.
        resamples: Bootstrap resamples.
        seed: Seed of the resampling.

    Returns:
        ``(difference, low, high, n)`` with ``n`` = seeds x test items.

    Raises:
        ValueError: Different numbers of seeds or test items, or no per-item results.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"gap_over_seeds: {len(a)} vs {len(b)} outcomes; expected equal, >= 1")
    return paired_gap_interval(
        np.stack([_items(x, stage_a) for x in a]),
        np.stack([_items(y, stage_b) for y in b]),
        resamples=resamples,
        seed=seed,
    )


def by_method(runs: dict[int, list[MethodOutcome]]) -> dict[str, list[MethodOutcome]]:
    """Regroup ``{seed: outcomes}`` as ``{method: outcomes in seed order}``."""
    out: dict[str, list[MethodOutcome]] = {}
    for seed in sorted(runs):
        for o in runs[seed]:
            out.setdefault(o.method, []).append(o)
    return out


def sweep_table(
    sweep: dict[float, dict[int, list[MethodOutcome]]], main: str, stage: str = "after"
) -> pd.DataFrame:
    """Summarise a budget sweep over seeds: per budget and method, accuracy and gap to ``main``.

    Args:
        sweep: ``{budget: {seed: outcomes}}`` (:func:`compare_over_seeds` per budget).
        main: The method the others are compared with (``main - other``).
        stage: ``"after"`` or ``"before"`` fine-tuning.

    Returns:
        One row per (budget, method other than the original): mean ``flops_ratio``, mean
        ``accuracy``, and ``gap`` (main minus method) with ``gap_low`` / ``gap_high``
        (:func:`gap_over_seeds`), ``separated`` when the interval excludes 0.
    """
    rows = []
    for budget, runs in sweep.items():
        grouped = by_method(runs)
        if main not in grouped:
            raise ValueError(f"sweep_table: no {main!r} outcomes at budget {budget}")
        for method, outs in grouped.items():
            if method == "original":
                continue
            gap, low, high, _ = gap_over_seeds(grouped[main], outs, stage, stage)
            rows.append(
                {
                    "budget": budget,
                    "method": method,
                    "flops_ratio": float(np.mean([o.flops_ratio for o in outs])),
                    "accuracy": float(np.mean([_correct(o, stage) / o.n_test for o in outs])),
                    "gap": gap,
                    "gap_low": low,
                    "gap_high": high,
                    "separated": method != main and (low > 0 or high < 0),
                }
            )
    return pd.DataFrame(rows).set_index(["budget", "method"])


def headline_budget(table: pd.DataFrame, main: str, versus: str = "uniform") -> float:
    """The budget of the headline comparison, by a rule fixed before the results.

    The largest budget of a :func:`sweep_table` at which the interval of ``main`` minus
    ``versus`` excludes zero (the methods can be told apart there); if there is none, the
    smallest budget (where pruning is hardest and differences are largest).

    Args:
        table: A :func:`sweep_table`.
        main: The main method.
        versus: The method whose gap decides.
    """
    budgets = sorted({b for b, _ in table.index}, reverse=True)
    for budget in budgets:
        if (budget, versus) in table.index and bool(table.loc[(budget, versus), "separated"]):
            return float(budget)
    return float(budgets[-1])
