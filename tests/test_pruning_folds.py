"""Cross-validated comparisons: per-fold outcomes pooled, the budget rules, the reward's parts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from hpcnb import models
from hpcnb.data import kfold_splits
from hpcnb.errors import HpcnbError
from hpcnb.models.metrics import pooled_gap_interval
from hpcnb.pruning import (
    EnvConfig,
    ModelPruningTask,
    PPOConfig,
    TrainConfig,
    gnnrl_search,
    train_classifier,
    uniform_search,
)
from hpcnb.pruning.agents import policy_item_rewards, policy_score
from hpcnb.pruning.compare import (
    EvaluationConfig,
    MethodOutcome,
    SearchConfig,
    best_budget,
    by_method,
    compare_over_folds,
    gap_over_folds,
    gap_over_seeds,
    sweep_table,
)


def _outcome(method: str, items: np.ndarray, fold: int = 0, target: float = 0.5) -> MethodOutcome:
    items = np.asarray(items, dtype=bool)
    n = len(items)
    return MethodOutcome(
        method=method,
        target=target,
        flops_ratio=target,
        params=1,
        acc_before=items.mean(),
        acc_after=items.mean(),
        latency_ms=1.0,
        speedup=1.0,
        search_seconds=0.0,
        n_test=n,
        correct_before=int(items.sum()),
        correct_after=int(items.sum()),
        items_before=items,
        items_after=items,
        seed=fold,
    )


def test_gap_over_folds_pools_ragged_folds_and_pairs_items() -> None:
    rng = np.random.default_rng(0)
    a_items = [rng.random(n) < 0.9 for n in (30, 29, 31)]
    b_items = [rng.random(n) < 0.8 for n in (30, 29, 31)]
    a = [_outcome("a", x, f) for f, x in enumerate(a_items)]
    b = [_outcome("b", x, f) for f, x in enumerate(b_items)]
    gap = gap_over_folds(a, b)
    pooled = np.concatenate(a_items).mean() - np.concatenate(b_items).mean()
    assert gap.value == pytest.approx(pooled)
    assert gap.n == 90
    reference = pooled_gap_interval(
        [x.astype(float) for x in a_items], [x.astype(float) for x in b_items]
    )
    assert gap.bounds == pytest.approx(reference.bounds)
    same = gap_over_folds(a, a)
    assert same.value == 0 and same.bounds == (0, 0)
    with pytest.raises(HpcnbError, match="outcomes"):
        gap_over_folds(a, b[:2])
    with pytest.raises(HpcnbError):  # seeds need equal test sets; folds need not
        gap_over_seeds(a, b)


def _sweep(gaps: dict[float, float]) -> dict[float, dict[int, list[MethodOutcome]]]:
    """Per budget, 3 folds of 200 items where main beats uniform on a share ``gap`` of them."""
    sweep = {}
    for budget, share in gaps.items():
        runs = {}
        for f in range(3):
            base = np.zeros(200, dtype=bool)
            base[:150] = True
            main = base.copy()
            main[150 : 150 + int(share * 200)] = True
            runs[f] = [
                _outcome("main", main, f, budget),
                _outcome("uniform", base, f, budget),
            ]
        sweep[budget] = runs
    return sweep


def test_sweep_table_with_fold_gaps_and_the_best_budget_rule() -> None:
    table = sweep_table(
        _sweep({0.5: 0.1, 0.3: 0.02, 0.2: 0.08, 0.1: 0.05}), "main", gap=gap_over_folds
    )
    assert isinstance(table, pd.DataFrame)
    assert table.loc[(0.2, "uniform"), "gap"] == pytest.approx(0.08)
    low, high = table.loc[(0.2, "uniform"), ["accuracy_low", "accuracy_high"]]
    assert low < 0.75 < high  # 450 of 600 pooled items right
    assert bool(table.loc[(0.2, "uniform"), "separated"])
    assert not bool(table.loc[(0.2, "main"), "separated"])
    # the best budget at or below 30 %: the largest lower bound, never the 50 % one
    assert best_budget(table, "main", max_budget=0.3) == 0.2
    assert best_budget(table, "main", max_budget=0.5) == 0.5
    tied = sweep_table(_sweep({0.3: 0.05, 0.2: 0.05}), "main", gap=gap_over_folds)
    assert best_budget(tied, "main") == 0.3  # ties go to the larger budget
    with pytest.raises(HpcnbError, match="no budget"):
        best_budget(table, "main", max_budget=0.05)


@pytest.fixture(scope="module")
def folds() -> list[tuple[ModelPruningTask, object]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 1, 8, 8)).astype(np.float32)
    y = (x.reshape(150, -1)[:, :32].sum(1) > 0).astype(np.int64)
    out = []
    for f, split in enumerate(kfold_splits(x, y, k=3, seed=0)):
        torch.manual_seed(f)
        net = models.resnet_cifar(depth=8, width=8, num_classes=2, in_channels=1)
        train_classifier(net, split.x_train, split.y_train, TrainConfig(epochs=1, seed=f))
        task = ModelPruningTask(
            net,
            torch.as_tensor(split.x_train[:2]),
            split.x_val,
            split.y_val,
            x_calib=split.x_train[:64],
            seed=f,
        )
        out.append((task, split))
    return out


def test_compare_over_folds_tests_every_item_once_with_each_folds_network(folds) -> None:
    runs = compare_over_folds(
        folds,
        0.5,
        seed=7,
        methods=("uniform", "random"),
        search=SearchConfig(random_samples=2),
        evaluation=EvaluationConfig(
            finetune=TrainConfig(epochs=1), latency_batch=4, latency_repeats=3
        ),
    )
    assert sorted(runs) == [0, 1, 2]
    grouped = by_method(runs)
    assert [o.seed for o in grouped["random"]] == [7, 8, 9]
    assert sum(o.n_test for o in grouped["original"]) == 150
    assert [o.n_test for o in grouped["uniform"]] == [len(s.y_test) for _, s in folds]
    gap = gap_over_folds(grouped["uniform"], grouped["random"], "before", "before")
    assert gap.n == 150 and gap.low <= gap.value <= gap.high
    with pytest.raises(HpcnbError, match="no folds"):
        compare_over_folds([], 0.5)


def test_search_records_each_episodes_accuracy_and_its_reward(folds) -> None:
    task, _ = folds[0]
    config = EnvConfig(target=0.5)
    result = gnnrl_search(
        task, config, PPOConfig(timesteps=32, n_steps=16, batch_size=16, hidden=8)
    )
    assert len(result.episode_accuracies) == len(result.episode_rewards) > 0
    for reward, accuracy in zip(result.episode_rewards, result.episode_accuracies, strict=True):
        if reward == config.failure_reward:
            assert np.isnan(accuracy)
        else:  # FLOPs-only: the reward is the accuracy
            assert reward == pytest.approx(accuracy)
    assert result.reward == pytest.approx(policy_score(task, config, result.keep)[1])
    uniform = uniform_search(task, 0.5)
    accuracy, reward = policy_score(task, config, uniform.keep)
    assert accuracy == reward == pytest.approx(uniform.val_accuracy)
    items = policy_item_rewards(task, config, uniform.keep)
    assert len(items) == len(task.y_val) and items.mean() == pytest.approx(reward)
    with pytest.raises(HpcnbError, match="above the budget"):
        policy_score(task, config, np.ones(len(task.group_sizes)))


def test_sweep_and_search_figures_draw_intervals_and_no_text_labels() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpcnb.pruning.agents import PolicySearchResult
    from hpcnb.pruning.plots import plot_budget_sweep, plot_flops_vs_latency, plot_search_progress

    table = sweep_table(_sweep({0.5: 0.1, 0.2: 0.05}), "main", gap=gap_over_folds)
    fig = plot_budget_sweep(table, "sweep", main="main")
    left, right = fig.axes
    assert len(left.containers) == 2  # one error-bar series per method
    assert len(right.containers) == 1  # uniform's gap to main
    assert right.get_legend_handles_labels()[1] == ["uniform"]
    lat = pd.DataFrame(
        {
            "model": ["a", "b"],
            "flops_ratio": [0.5, 0.5],
            "speedup": [1.5, 1.52],
            "speedup_low": [1.4, 1.45],
            "speedup_high": [1.6, 1.6],
        }
    )
    ax = plot_flops_vs_latency(lat).axes[0]
    assert not ax.texts  # no annotations that could overlap
    assert {"a", "b"} <= set(ax.get_legend_handles_labels()[1])
    result = PolicySearchResult(
        method="x",
        keep=np.ones(2),
        counts=np.ones(2, dtype=int),
        flops_ratio=0.5,
        val_accuracy=0.5,
        seconds=0.0,
        episode_rewards=(-1.0, 0.4, 0.5),
        episode_accuracies=(float("nan"), 0.4, 0.5),
    )
    fig = plot_search_progress({"agent": result}, {"uniform": (0.45, 0.45)}, window=2)
    acc_axis = fig.axes[1]
    assert len(acc_axis.lines) == 2 and len(acc_axis.lines[0].get_xdata()) == 2
    plt.close("all")


def test_item_rewards_carry_the_latency_term(folds) -> None:
    class ChannelSum:  # a latency model: time grows with the kept channels
        def latency(self, counts: np.ndarray) -> float:
            return float(np.sum(counts))

    task, _ = folds[0]
    config = EnvConfig(target=0.5, round_to=8, round_fallback=4, latency_weight=0.5)
    keep = uniform_search(task, 0.5).keep
    accuracy, reward = policy_score(task, config, keep, ChannelSum())
    items = policy_item_rewards(task, config, keep, ChannelSum())
    assert items.mean() == pytest.approx(reward) and reward < accuracy
    shift = set(np.round(items - np.round(items), 9))  # one constant below each 0 or 1
    assert len(shift) == 1
    with pytest.raises(HpcnbError, match="per-item"):
        policy_item_rewards(object(), config, keep)  # type: ignore[arg-type]
