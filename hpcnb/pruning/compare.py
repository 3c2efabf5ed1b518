"""Side-by-side comparison of pruning methods at one FLOPs budget.

:func:`compare_methods` runs every method on one :class:`~hpcnb.pruning.task.ModelPruningTask`,
builds the physically pruned networks (``hpcnb.ir.extract``; Torch-Pruning's own result
for the peer), measures each one's FLOPs with a fresh ``hpcnb.ir.trace``, its parameter
count, its test accuracy before and after the *same* fine-tuning, and the CPU latency of
all of them and the original in one interleaved timing run. How the searches run is one
:class:`SearchConfig`, how every network is measured one :class:`EvaluationConfig`.

The methods are the entries of :data:`PRUNING_METHODS`, a
:class:`~hpcnb.plugins.Registry` of :class:`PruningMethod` (name -> how to prune at a
budget): the built-in ones are :data:`METHODS`, and a method of one's own is registered
there or named as ``"package.module:attr"``. The method ``"gnnrl_latency"`` is the
latency-aware GNN-RL search (a latency term in the reward, channel counts snapped to
multiples of ``round_to``).

Every evaluated network — the original and each method's pruned one alike — has its
BatchNorm statistics re-estimated on training batches
(:func:`~hpcnb.pruning.training.recalibrate_batchnorm`) before its accuracy is measured,
before and after fine-tuning; the accuracy with the inherited statistics is kept too
(``acc_inherited``) to show what the mismatch costs.

:func:`accuracy_gap` turns two outcomes into an accuracy difference with Newcombe's
interval on the shared test set (an :class:`~hpcnb.stats.Estimate`), and :func:`bar_table`
says which methods pass the same bar (FLOPs within a budget and accuracy drop within a
tolerance) as the headline.

Over several seeds (:func:`compare_over_seeds`: the searches' and the fine-tuning's seeds
change, the pretrained network stays), :func:`gap_over_seeds` gives the mean accuracy
difference of two methods with a two-level bootstrap interval: each resample draws seeds
with replacement and test items with replacement (the same items for both methods, so the
comparison is paired), which covers both the spread between seeds and the sampling of the
test set. With cross-validation (:func:`compare_over_folds`: one network pretrained per
fold, each fold's test items tested once), :func:`gap_over_folds` pools the items of all
folds, so every item of a data set counts. :func:`best_budget` and :func:`headline_budget`
pick the budget of a headline comparison from a :func:`sweep_table` by fixed rules.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import torch
from torch import nn

import hpcnb.pruning.agents as agents
from hpcnb import ir
from hpcnb.errors import InvalidInputError
from hpcnb.models.metrics import (
    paired_gap_interval,
    pooled_gap_interval,
    top1_accuracy,
    top1_correct,
)
from hpcnb.plugins import Registry
from hpcnb.pruning.env import EnvConfig
from hpcnb.pruning.peers import torch_pruning_at_budget
from hpcnb.pruning.task import ModelPruningTask
from hpcnb.pruning.training import (
    LatencyResult,
    TrainConfig,
    count_params,
    fine_tune,
    measure_latency,
    recalibrate_batchnorm,
    training_batches,
)
from hpcnb.records import INCONCLUSIVE, MET, evaluate_target
from hpcnb.stats import Estimate, difference_interval, wilson_interval

if TYPE_CHECKING:
    from hpcnb.data.embedded import ImageSplit
    from hpcnb.pruning.latency import LatencyModel

__all__ = [
    "DEFAULT_METHODS",
    "METHODS",
    "PRUNING_METHODS",
    "Comparison",
    "EvaluationConfig",
    "GapFunction",
    "MethodOutcome",
    "PrunedNetwork",
    "PruningMethod",
    "PruningRequest",
    "SearchConfig",
    "Stage",
    "accuracy_gap",
    "bar_table",
    "best_budget",
    "by_method",
    "compare_methods",
    "compare_over_folds",
    "compare_over_seeds",
    "count_passing",
    "gap_over_folds",
    "gap_over_seeds",
    "headline_budget",
    "outcomes_table",
    "score_pruned",
    "sweep_table",
]

Stage = Literal["before", "after"]
"""When an accuracy is taken: before or after the shared fine-tuning."""


@dataclass(frozen=True)
class SearchConfig:
    """How the search methods run (every budget and seed of a comparison alike).

    Attributes:
        ppo: GNN-RL agent settings.
        ddpg: AMC-style agent settings.
        random_samples: Candidates of the random search.
        latency_weight: Weight of the latency term of ``"gnnrl_latency"``'s reward.
        round_to: Channel multiple of ``"gnnrl_latency"`` (1: no snapping).
        round_fallback: The smaller multiple ``"gnnrl_latency"`` falls back to where
            multiples of ``round_to`` cannot keep the budget (0: none).
    """

    ppo: agents.PPOConfig = field(default_factory=agents.PPOConfig)
    ddpg: agents.DDPGConfig = field(default_factory=agents.DDPGConfig)
    random_samples: int = 100
    latency_weight: float = 0.5
    round_to: int = 8
    round_fallback: int = 0


@dataclass(frozen=True)
class EvaluationConfig:
    """How every network of a comparison is measured (all methods alike).

    Attributes:
        finetune: The fine-tuning schedule shared by every method.
        recalibrate: Re-estimate BatchNorm statistics of every evaluated network on
            training batches before each accuracy measurement.
        calibration_batch: Batch size of the recalibration passes (all training items
            are used once).
        latency_batch: Batch size of the latency measurement.
        latency_repeats: Timed repeats per model.
    """

    finetune: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=5, lr=1e-3))
    recalibrate: bool = True
    calibration_batch: int = 64
    latency_batch: int = 256
    latency_repeats: int = 30


@dataclass(frozen=True)
class PruningRequest:
    """What a pruning method is given: the network, the budget and the settings.

    Attributes:
        task: The pruning task (its model is the trained original).
        target: FLOPs budget fraction.
        example: Two test inputs (for tracing and the peer's dependency graph).
        search: The search settings.
        seed: Seed of the random search.
        latency_model: The latency model of a latency-aware method, if one is given.
    """

    task: ModelPruningTask
    target: float
    example: torch.Tensor
    search: SearchConfig
    seed: int = 0
    latency_model: LatencyModel | None = None


@dataclass(frozen=True)
class PrunedNetwork:
    """What a pruning method returns: the physically pruned network and how it was found.

    Attributes:
        model: The pruned network (not fine-tuned).
        seconds: Wall time of the search and pruning.
        keep: Per-group keep ratios (empty for a method without a policy, such as the peer).
        counts: Kept channels per group (empty for a method without a policy).
        search: The search's result (``None`` for a method without a policy).
    """

    model: nn.Module
    seconds: float
    keep: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()
    search: agents.PolicySearchResult | None = None

    @classmethod
    def from_search(
        cls, task: ModelPruningTask, result: agents.PolicySearchResult
    ) -> PrunedNetwork:
        """The network ``task.extract`` builds from a search's channel counts.

        Args:
            task: The pruning task that was searched.
            result: The search's policy.
        """
        return cls(
            model=task.extract(result.counts, ratios=False),
            seconds=result.seconds,
            keep=tuple(float(k) for k in result.keep),
            counts=tuple(int(c) for c in result.counts),
            search=result,
        )


@dataclass(frozen=True)
class PruningMethod:
    """An entry of the method table: how to prune a network at a FLOPs budget.

    Attributes:
        prune: Prunes ``request.task.model`` to ``request.target`` FLOPs.
        needs_latency_model: The method cannot run without ``request.latency_model``.
    """

    prune: Callable[[PruningRequest], PrunedNetwork]
    needs_latency_model: bool = False


def _env_config(request: PruningRequest) -> EnvConfig:
    return EnvConfig(target=request.target)


def _gnnrl(request: PruningRequest) -> PrunedNetwork:
    result = agents.gnnrl_search(request.task, _env_config(request), request.search.ppo)
    return PrunedNetwork.from_search(request.task, result)


def _gnnrl_latency(request: PruningRequest) -> PrunedNetwork:
    aware = dataclasses.replace(
        _env_config(request),
        round_to=request.search.round_to,
        round_fallback=request.search.round_fallback,
        latency_weight=request.search.latency_weight,
    )
    result = agents.gnnrl_search(
        request.task,
        aware,
        request.search.ppo,
        latency=request.latency_model,
        method="gnnrl_latency",
    )
    return PrunedNetwork.from_search(request.task, result)


def _uniform(request: PruningRequest) -> PrunedNetwork:
    return PrunedNetwork.from_search(
        request.task, agents.uniform_search(request.task, request.target)
    )


def _random(request: PruningRequest) -> PrunedNetwork:
    result = agents.random_search(
        request.task, request.target, samples=request.search.random_samples, seed=request.seed
    )
    return PrunedNetwork.from_search(request.task, result)


def _amc_ddpg(request: PruningRequest) -> PrunedNetwork:
    result = agents.amc_ddpg_search(request.task, _env_config(request), request.search.ddpg)
    return PrunedNetwork.from_search(request.task, result)


def _torch_pruning(request: PruningRequest) -> PrunedNetwork:
    start = time.perf_counter()
    peer = torch_pruning_at_budget(request.task.model, request.example, request.target)
    return PrunedNetwork(peer.model, time.perf_counter() - start)


def _check_method(obj: object) -> str | None:
    if isinstance(obj, PruningMethod):
        return None
    return f"expected a PruningMethod, got {type(obj).__name__}"


PRUNING_METHODS: Registry[PruningMethod] = Registry("pruning method", check=_check_method)
"""The method table: name -> :class:`PruningMethod`."""
for _name, _method in (
    ("gnnrl", PruningMethod(_gnnrl)),
    ("gnnrl_latency", PruningMethod(_gnnrl_latency, needs_latency_model=True)),
    ("uniform", PruningMethod(_uniform)),
    ("random", PruningMethod(_random)),
    ("amc_ddpg", PruningMethod(_amc_ddpg)),
    ("torch_pruning", PruningMethod(_torch_pruning)),
):
    PRUNING_METHODS.register(_name, _method)

METHODS = ("gnnrl", "gnnrl_latency", "uniform", "random", "amc_ddpg", "torch_pruning")
"""The built-in methods of :data:`PRUNING_METHODS`."""

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
        search: The search's result (its learning curve), for a method that searched.
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
    search: agents.PolicySearchResult | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare_methods` measured at one budget.

    Attributes:
        outcomes: One :class:`MethodOutcome` per method, the original first.
        searches: The :class:`~hpcnb.pruning.agents.PolicySearchResult` of each method
            that searched a policy, by method name.
    """

    outcomes: list[MethodOutcome]
    searches: dict[str, agents.PolicySearchResult]


def _flops(model: nn.Module, example: torch.Tensor) -> int:
    return ir.trace(model.eval(), example[:1]).total_flops()


def _resolve_methods(
    methods: Sequence[str], latency_model: LatencyModel | None
) -> dict[str, PruningMethod]:
    table = {name: PRUNING_METHODS.get(name) for name in methods}
    for name, method in table.items():
        if method.needs_latency_model and latency_model is None:
            raise InvalidInputError(f"compare_methods: {name!r} needs latency_model=...")
    return table


class _Evaluation:
    """Scores networks on one split the same way: recalibrate, score, fine-tune, score."""

    def __init__(self, split: ImageSplit, config: EvaluationConfig) -> None:
        self.split = split
        self.config = config

    def scored(self, model: nn.Module) -> tuple[nn.Module, np.ndarray]:
        """A recalibrated copy of ``model`` and its per-item test results."""
        ready = copy.deepcopy(model)
        if self.config.recalibrate:
            batches = training_batches(self.split.x_train, self.config.calibration_batch)
            recalibrate_batchnorm(ready, batches)
        return ready, top1_correct(ready, self.split.x_test, self.split.y_test)

    def items(self, model: nn.Module, *, tune: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per-item test results before and after fine-tuning (the same when not ``tune``)."""
        ready, before = self.scored(model)
        if not tune:
            return before, before
        split = self.split
        tuned = fine_tune(ready, split.x_train, split.y_train, self.config.finetune)
        return before, self.scored(tuned)[1]


def _outcome(
    name: str,
    model: nn.Module,
    pruned: PrunedNetwork | None,
    evaluation: _Evaluation,
    timing: tuple[np.ndarray, LatencyResult],
    *,
    target: float,
    base_flops: int,
    example: torch.Tensor,
    seed: int,
) -> MethodOutcome:
    """Measure one network (``pruned`` is ``None`` for the original)."""
    split = evaluation.split
    n_test = len(split.y_test)
    inherited = top1_accuracy(model, split.x_test, split.y_test)
    items_before, items_after = evaluation.items(model, tune=pruned is not None)
    before, after = int(items_before.sum()), int(items_after.sum())
    base_samples, latency = timing
    samples = tuple(float(r) for r in base_samples / np.asarray(latency.samples_s))
    return MethodOutcome(
        method=name,
        target=target,
        flops_ratio=_flops(model, example) / base_flops,
        params=count_params(model),
        acc_before=before / n_test,
        acc_after=after / n_test,
        latency_ms=1e3 * latency.median_s,
        speedup=float(np.median(samples)),
        search_seconds=0.0 if pruned is None else pruned.seconds,
        acc_inherited=inherited,
        n_test=n_test,
        correct_before=before,
        correct_after=after,
        keep=() if pruned is None else pruned.keep,
        counts=() if pruned is None else pruned.counts,
        search=None if pruned is None else pruned.search,
        speedup_samples=samples,
        items_before=items_before,
        items_after=items_after,
        model=model,
        seed=seed,
    )


def compare_methods(
    task: ModelPruningTask,
    split: ImageSplit,
    target: float,
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    search: SearchConfig | None = None,
    evaluation: EvaluationConfig | None = None,
    latency_model: LatencyModel | None = None,
    seed: int = 0,
) -> Comparison:
    """Prune ``task.model`` to ``target`` FLOPs with each method and measure the results.

    Args:
        task: The pruning task (its model is the trained original).
        split: The data split (train for fine-tuning and recalibration, test for scores).
        target: FLOPs budget fraction.
        methods: Names of :data:`PRUNING_METHODS` entries or ``"package.module:attr"``
            references to a :class:`PruningMethod` (default :data:`DEFAULT_METHODS`).
        search: How the searches run (default :class:`SearchConfig`).
        evaluation: How every network is measured (default :class:`EvaluationConfig`:
            5 epochs of fine-tuning, BatchNorm recalibration).
        latency_model: The latency model of ``"gnnrl_latency"`` (needed when that
            method is asked for).
        seed: Seed of the random search, kept on every outcome.

    Returns:
        The :class:`Comparison`: one :class:`MethodOutcome` per method plus the original
        (first), and each search method's :class:`~hpcnb.pruning.agents.PolicySearchResult`.

    Raises:
        hpcnb.plugins.PluginError: An unknown method name.
        InvalidInputError: A method that needs a latency model without one.
    """
    table = _resolve_methods(methods, latency_model)
    search = search or SearchConfig()
    evaluation = evaluation or EvaluationConfig()
    example = torch.as_tensor(np.asarray(split.x_test[:2])).float()
    base_flops = _flops(task.model, example)
    request = PruningRequest(task, target, example, search, seed, latency_model)
    pruned = {name: method.prune(request) for name, method in table.items()}
    models = {"original": task.model, **{m: p.model for m, p in pruned.items()}}
    x_train = np.asarray(split.x_train)
    batch = torch.as_tensor(np.resize(x_train, (evaluation.latency_batch, *x_train.shape[1:])))
    latency = measure_latency(models, batch.float(), repeats=evaluation.latency_repeats)
    base_samples = np.asarray(latency["original"].samples_s)
    scorer = _Evaluation(split, evaluation)
    outcomes = [
        _outcome(
            name,
            model,
            pruned.get(name),
            scorer,
            (base_samples, latency[name]),
            target=target,
            base_flops=base_flops,
            example=example,
            seed=seed,
        )
        for name, model in models.items()
    ]
    searches = {m: p.search for m, p in pruned.items() if p.search is not None}
    return Comparison(outcomes, searches)


def score_pruned(
    model: nn.Module,
    split: ImageSplit,
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
        split: The data split (train for recalibration, test for the score).
        recalibrate: Re-estimate BatchNorm statistics first.
        calibration_batch: Batch size of the recalibration passes.

    Returns:
        ``(the scored copy, correct test items, test items)``.
    """
    config = EvaluationConfig(recalibrate=recalibrate, calibration_batch=calibration_batch)
    ready, items = _Evaluation(split, config).scored(model)
    return ready, int(items.sum()), len(items)


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


def _correct(outcome: MethodOutcome, stage: Stage) -> int:
    if stage not in ("before", "after"):
        raise InvalidInputError(f"stage={stage!r}: expected 'before' or 'after'")
    if outcome.n_test < 1:
        raise InvalidInputError(f"outcome {outcome.method!r} carries no test counts (n_test=0)")
    return outcome.correct_before if stage == "before" else outcome.correct_after


def accuracy_gap(
    a: MethodOutcome,
    b: MethodOutcome,
    stage_a: Stage = "after",
    stage_b: Stage = "after",
) -> Estimate:
    """Accuracy of ``a`` minus that of ``b`` with Newcombe's 95 % interval.

    Both are scored on the same test items, for which Newcombe's (independent-samples)
    interval is conservative.

    Args:
        a: First outcome.
        b: Second outcome.
        stage_a: ``"before"`` or ``"after"`` fine-tuning for ``a``.
        stage_b: The same for ``b``.

    Returns:
        The difference with its interval and ``n`` the test items (shared by both).

    Raises:
        InvalidInputError: A bad stage, outcomes without counts, or different test sets.
    """
    ca, cb = _correct(a, stage_a), _correct(b, stage_b)
    if a.n_test != b.n_test:
        raise InvalidInputError(f"accuracy_gap: test sets differ ({a.n_test} vs {b.n_test} items)")
    gap = difference_interval(ca, a.n_test, cb, b.n_test)
    return dataclasses.replace(gap, n=a.n_test)


PASSES, FAILS = "passes", "fails"


def bar_table(
    outcomes: list[MethodOutcome],
    *,
    flops_max: float,
    max_drop: float,
    reference: str = "original",
    stage: Stage = "after",
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
        InvalidInputError: No outcome is the reference, or outcomes span several budgets.
    """
    by_method = {o.method: o for o in outcomes}
    if reference not in by_method:
        raise InvalidInputError(
            f"bar_table: no outcome named {reference!r} among {sorted(by_method)}"
        )
    if len({o.target for o in outcomes}) > 1:
        raise InvalidInputError("bar_table: outcomes of several budgets; pass those of one budget")
    ref = by_method[reference]
    rows = []
    for o in outcomes:
        if o.method == reference:
            continue
        drop = accuracy_gap(ref, o, "before", stage)
        low, high = drop.bounds
        state = evaluate_target(drop.value, f"<= {max_drop}", low, high)
        status = INCONCLUSIVE if state == INCONCLUSIVE else PASSES if state == MET else FAILS
        if o.flops_ratio > flops_max:
            status = FAILS
        rows.append(
            {
                "method": o.method,
                "flops_ratio": o.flops_ratio,
                "drop": drop.value,
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

    Args:
        table: A :func:`bar_table`.
        exclude: Methods not counted (the main method itself).

    Returns:
        ``(passing, inconclusive, names of the passing methods)``.
    """
    rest = table.drop(index=[m for m in exclude if m in table.index])
    passing = [str(m) for m in rest.index[rest.status == PASSES]]
    return len(passing), int((rest.status == INCONCLUSIVE).sum()), passing


def compare_over_seeds(
    task: ModelPruningTask,
    split: ImageSplit,
    target: float,
    seeds: Sequence[int],
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    search: SearchConfig | None = None,
    evaluation: EvaluationConfig | None = None,
    latency_model: LatencyModel | None = None,
) -> dict[int, list[MethodOutcome]]:
    """Run :func:`compare_methods` once per seed (searches and fine-tuning reseeded).

    The pretrained network and the data split stay the same; each seed replaces the seed
    of the PPO and DDPG agents, of the random search and of the fine-tuning's batch order.

    Args:
        task: The pruning task.
        split: The data split.
        target: FLOPs budget fraction.
        seeds: Seeds to run (at least one).
        methods: The methods (see :func:`compare_methods`).
        search: How the searches run (the agents' seeds are replaced).
        evaluation: How every network is measured (the fine-tuning's seed is replaced).
        latency_model: The latency model of ``"gnnrl_latency"``.

    Returns:
        ``{seed: outcomes}``.

    Raises:
        InvalidInputError: No seeds.
    """
    if not seeds:
        raise InvalidInputError("compare_over_seeds: no seeds given")
    search = search or SearchConfig()
    evaluation = evaluation or EvaluationConfig()
    runs = {}
    for seed in seeds:
        seeded_search, seeded_evaluation = _seeded(search, evaluation, int(seed))
        comparison = compare_methods(
            task,
            split,
            target,
            methods=methods,
            search=seeded_search,
            evaluation=seeded_evaluation,
            latency_model=latency_model,
            seed=seed,
        )
        runs[int(seed)] = comparison.outcomes
    return runs


def _seeded(
    search: SearchConfig, evaluation: EvaluationConfig, seed: int
) -> tuple[SearchConfig, EvaluationConfig]:
    """The settings with the agents' and the fine-tuning's seeds replaced by ``seed``."""
    return (
        dataclasses.replace(
            search,
            ppo=dataclasses.replace(search.ppo, seed=seed),
            ddpg=dataclasses.replace(search.ddpg, seed=seed),
        ),
        dataclasses.replace(
            evaluation, finetune=dataclasses.replace(evaluation.finetune, seed=seed)
        ),
    )


def compare_over_folds(
    folds: Sequence[tuple[ModelPruningTask, ImageSplit]],
    target: float,
    *,
    seed: int = 0,
    methods: Sequence[str] = DEFAULT_METHODS,
    search: SearchConfig | None = None,
    evaluation: EvaluationConfig | None = None,
    latency_model: LatencyModel | None = None,
) -> dict[int, list[MethodOutcome]]:
    """Run :func:`compare_methods` once per cross-validation fold.

    Each fold brings its own task (a network pretrained on that fold's training items,
    its reward scored on that fold's validation items) and its split, whose test items
    no other fold tests (:func:`hpcnb.data.kfold_splits`); fold ``f`` reseeds the agents,
    the random search and the fine-tuning with ``seed + f``. Pool the per-item results
    over the folds with :func:`gap_over_folds`.

    Args:
        folds: Per fold, ``(task, split)``.
        target: FLOPs budget fraction.
        seed: Seed of fold 0 (fold ``f`` uses ``seed + f``).
        methods: The methods (see :func:`compare_methods`).
        search: How the searches run (the agents' seeds are replaced).
        evaluation: How every network is measured (the fine-tuning's seed is replaced).
        latency_model: The latency model of ``"gnnrl_latency"`` (the folds share the
            architecture, so one table serves them all).

    Returns:
        ``{fold: outcomes}``.

    Raises:
        InvalidInputError: No folds.
    """
    if not folds:
        raise InvalidInputError("compare_over_folds: no folds given")
    search = search or SearchConfig()
    evaluation = evaluation or EvaluationConfig()
    runs = {}
    for f, (task, split) in enumerate(folds):
        seeded_search, seeded_evaluation = _seeded(search, evaluation, seed + f)
        comparison = compare_methods(
            task,
            split,
            target,
            methods=methods,
            search=seeded_search,
            evaluation=seeded_evaluation,
            latency_model=latency_model,
            seed=seed + f,
        )
        runs[f] = comparison.outcomes
    return runs


def _items(outcome: MethodOutcome, stage: Stage) -> np.ndarray:
    _correct(outcome, stage)
    items = outcome.items_before if stage == "before" else outcome.items_after
    if len(items) != outcome.n_test:
        raise InvalidInputError(f"outcome {outcome.method!r} carries no per-item results")
    return items.astype(np.float64)


def gap_over_seeds(
    a: Sequence[MethodOutcome],
    b: Sequence[MethodOutcome],
    stage_a: Stage = "after",
    stage_b: Stage = "after",
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
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
        The mean difference with its interval and ``n`` = seeds x test items.

    Raises:
        InvalidInputError: Different numbers of seeds or test items, or no per-item results.
    """
    if len(a) != len(b) or not a:
        raise InvalidInputError(
            f"gap_over_seeds: {len(a)} vs {len(b)} outcomes; expected equal, >= 1"
        )
    sizes = {o.n_test for o in (*a, *b)}
    if len(sizes) != 1:
        raise InvalidInputError(
            f"gap_over_seeds: test sets of {sorted(sizes)} items; seeds share one test set "
            "(folds with their own test items: gap_over_folds)"
        )
    return paired_gap_interval(
        np.stack([_items(x, stage_a) for x in a]),
        np.stack([_items(y, stage_b) for y in b]),
        resamples=resamples,
        seed=seed,
    )


def gap_over_folds(
    a: Sequence[MethodOutcome],
    b: Sequence[MethodOutcome],
    stage_a: Stage = "after",
    stage_b: Stage = "after",
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Mean accuracy of ``a`` minus ``b`` over the test items of all folds, paired.

    ``a[f]`` and ``b[f]`` come from fold ``f`` (:func:`compare_over_folds`) and are scored
    on that fold's test items; folds may differ in size. The value is the mean over all
    items of ``right_a - right_b``; the interval resamples the folds and, inside each
    drawn fold, its items, the same items for both methods
    (:func:`~hpcnb.models.metrics.pooled_gap_interval`).

    Args:
        a: One outcome per fold of the first method.
        b: The outcomes of the second method, same folds in the same order.
        stage_a: ``"before"`` or ``"after"`` fine-tuning for ``a``.
        stage_b: The same for ``b``.
        resamples: Bootstrap resamples.
        seed: Seed of the resampling.

    Returns:
        The mean difference with its interval and ``n`` = the pooled test items.

    Raises:
        InvalidInputError: Different numbers of folds, or no per-item results.
        MetricError: A fold whose two outcomes differ in test items.
    """
    if len(a) != len(b) or not a:
        raise InvalidInputError(
            f"gap_over_folds: {len(a)} vs {len(b)} outcomes; expected equal, >= 1"
        )
    return pooled_gap_interval(
        [_items(x, stage_a) for x in a],
        [_items(y, stage_b) for y in b],
        resamples=resamples,
        seed=seed,
    )


GapFunction = Callable[[Sequence[MethodOutcome], Sequence[MethodOutcome], Stage, Stage], Estimate]
"""How :func:`sweep_table` pairs two methods' outcomes (:func:`gap_over_seeds`,
:func:`gap_over_folds`)."""


def by_method(runs: dict[int, list[MethodOutcome]]) -> dict[str, list[MethodOutcome]]:
    """Regroup ``{seed: outcomes}`` as ``{method: outcomes in seed order}``."""
    out: dict[str, list[MethodOutcome]] = {}
    for seed in sorted(runs):
        for o in runs[seed]:
            out.setdefault(o.method, []).append(o)
    return out


def sweep_table(
    sweep: dict[float, dict[int, list[MethodOutcome]]],
    main: str,
    stage: Stage = "after",
    *,
    gap: GapFunction = gap_over_seeds,
) -> pd.DataFrame:
    """Summarise a budget sweep: per budget and method, accuracy and gap to ``main``.

    Args:
        sweep: ``{budget: {seed or fold: outcomes}}`` (:func:`compare_over_seeds` or
            :func:`compare_over_folds` per budget).
        main: The method the others are compared with (``main - other``).
        stage: ``"after"`` or ``"before"`` fine-tuning.
        gap: How two methods' outcomes are paired: :func:`gap_over_seeds` (one test set,
            several seeds) or :func:`gap_over_folds` (one test fold per run).

    Returns:
        One row per (budget, method other than the original): mean ``flops_ratio``, mean
        ``accuracy`` with the Wilson interval of all its test items pooled
        (``accuracy_low`` / ``accuracy_high``), and ``gap`` (main minus method) with
        ``gap_low`` / ``gap_high`` (``gap``), ``separated`` when the interval excludes 0.

    Raises:
        InvalidInputError: A budget without outcomes of ``main``.
    """
    rows = []
    for budget, runs in sweep.items():
        grouped = by_method(runs)
        if main not in grouped:
            raise InvalidInputError(f"sweep_table: no {main!r} outcomes at budget {budget}")
        for method, outs in grouped.items():
            if method == "original":
                continue
            diff = gap(grouped[main], outs, stage, stage)
            low, high = diff.bounds
            right = sum(_correct(o, stage) for o in outs)
            total = sum(o.n_test for o in outs)
            acc_low, acc_high = wilson_interval(right, total).bounds
            rows.append(
                {
                    "budget": budget,
                    "method": method,
                    "flops_ratio": float(np.mean([o.flops_ratio for o in outs])),
                    "accuracy": float(np.mean([_correct(o, stage) / o.n_test for o in outs])),
                    "accuracy_low": acc_low,
                    "accuracy_high": acc_high,
                    "gap": diff.value,
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


def best_budget(
    table: pd.DataFrame, main: str, versus: str = "uniform", *, max_budget: float = 0.3
) -> float:
    """The budget of a comparison chosen by a rule fixed before the results.

    Among the budgets of a :func:`sweep_table` at or below ``max_budget``, the one where
    the lower end of the interval of ``main`` minus ``versus`` is largest (where the
    sweep gives the strongest evidence for ``main``); ties go to the larger budget.

    Args:
        table: A :func:`sweep_table`.
        main: The main method (the table's ``main``).
        versus: The method whose gap decides.
        max_budget: The largest budget eligible.

    Raises:
        InvalidInputError: No budget at or below ``max_budget`` holds ``versus``.
    """
    rows = [
        (float(b), float(table.loc[(b, versus), "gap_low"]))
        for b in sorted({b for b, _ in table.index}, reverse=True)
        if b <= max_budget + 1e-12 and (b, versus) in table.index
    ]
    if not rows:
        raise InvalidInputError(
            f"best_budget: no budget <= {max_budget} with {versus!r} outcomes (main {main!r})"
        )
    return max(rows, key=lambda r: r[1])[0]
