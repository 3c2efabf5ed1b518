"""Tests of the fair-comparison and latency-aware parts of hpcnb.pruning (issue 20).

BatchNorm recalibration after pruning, channel snapping under a FLOPs budget, the
latency-aware reward, the per-layer latency table and its cache, and the two-level
bootstrap over seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcnb import models
from hpcnb.data import digits
from hpcnb.models.metrics import top1_accuracy, top1_correct
from hpcnb.pruning import (
    EnvConfig,
    FlopsModel,
    ModelPruningTask,
    PruningEnv,
    TrainConfig,
    recalibrate_batchnorm,
    train_classifier,
    uniform_search,
)
from hpcnb.pruning.compare import MethodOutcome, gap_over_seeds
from hpcnb.pruning.latency import LatencyModel, LayerLatencyTable, latency_table_by_size
from hpcnb.pruning.problem import keep_counts, snap_counts
from hpcnb.pruning.training import training_batches

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def split():
    return digits(0)


@pytest.fixture(scope="module")
def task(split):
    torch.manual_seed(0)
    model = models.resnet_cifar(depth=8, width=16, in_channels=1)
    train_classifier(model, split.x_train, split.y_train, TrainConfig(epochs=4))
    return ModelPruningTask(
        model.eval(), torch.as_tensor(split.x_train[:2]), split.x_val, split.y_val
    )


def test_recalibration_restores_uniformly_pruned_accuracy(task, split):
    counts = uniform_search(task, 0.3).counts
    pruned = task.extract(counts, ratios=False)
    inherited = top1_accuracy(pruned, split.x_test, split.y_test)
    recalibrate_batchnorm(pruned, training_batches(split.x_train, 64))
    restored = top1_accuracy(pruned, split.x_test, split.y_test)
    assert restored > 0.3, (inherited, restored)  # chance is 0.1
    assert restored >= inherited


def test_top1_correct_matches_accuracy(task, split):
    items = top1_correct(task.model, split.x_test, split.y_test)
    assert items.dtype == bool and items.shape == (len(split.y_test),)
    assert items.mean() == pytest.approx(top1_accuracy(task.model, split.x_test, split.y_test))


def test_snapping_keeps_the_flops_budget(task):
    rng = np.random.default_rng(0)
    fm, sizes = task.flops_model, task.group_sizes
    checked = unsnapped = 0
    for _ in range(300):
        target = rng.uniform(0.1, 0.9)
        counts = keep_counts(rng.uniform(0.05, 1.0, len(sizes)), sizes)
        budget = target * fm.total
        snapped = snap_counts(counts, sizes, 8, fm, budget)
        small = sizes <= 8
        assert np.all((snapped >= 1) & (snapped <= sizes))
        if fm(counts / sizes) <= budget:
            checked += 1
            assert fm(snapped / sizes) <= budget + 1e-9
            if fm(np.where(small, counts, 8) / sizes) <= budget:  # multiples of 8 can fit
                assert np.all((snapped % 8 == 0) | small | (snapped == sizes))
            else:
                unsnapped += 1
                assert np.array_equal(snapped, counts)
    assert checked > 20
    assert snap_counts(np.array([5, 13]), np.array([16, 32]), 1).tolist() == [5, 13]
    with pytest.raises(ValueError):
        snap_counts(np.array([5]), np.array([16]), 0)


def test_env_with_snapping_ends_within_budget(task):
    env = PruningEnv(task, EnvConfig(target=0.4, round_to=8))
    rng = np.random.default_rng(1)
    for _ in range(5):
        env.reset(seed=0)
        done, info = False, {}
        while not done:
            _, reward, done, _, info = env.step(rng.uniform(-1, 1, env.action_space.shape))
        if reward >= 0:
            counts = env.counts(info["keep"])
            assert info["flops_ratio"] <= 0.4 + 1e-9
            assert np.all((counts % 8 == 0) | (counts == task.group_sizes))


class _TwoGroups:
    """Two groups with equal FLOPs and equal accuracy: only latency can tell them apart."""

    def __init__(self, graph) -> None:
        self.group_ids = ["a", "b"]
        self.group_sizes = np.array([16, 16])
        self.flops_model = FlopsModel(
            0.0, np.array([100.0, 100.0]), np.array([0, 1]), np.array([-1, -1]), 2
        )
        self.graph = graph

    def accuracy(self, counts: np.ndarray) -> float:
        return 0.9


class _SlowFirstGroup:
    """Channels of group ``a`` cost three times those of group ``b``."""

    def latency(self, counts: np.ndarray) -> float:
        return 1e-3 * (3.0 * counts[0] + counts[1]) / 16


def test_latency_reward_prefers_the_faster_configuration(task):
    problem = _TwoGroups(task.graph)
    model = _SlowFirstGroup()
    assert isinstance(model, LatencyModel)
    config = EnvConfig(target=0.75, latency_weight=0.5)
    env = PruningEnv(problem, config, latency=model)
    cut_a, cut_b = np.array([0.5, 1.0]), np.array([1.0, 0.5])
    assert env.flops_ratio(cut_a) == pytest.approx(env.flops_ratio(cut_b))
    assert env.latency_ratio(cut_a) < env.latency_ratio(cut_b)
    assert env.score(cut_a) > env.score(cut_b)
    flops_only = PruningEnv(problem, EnvConfig(target=0.75))
    assert flops_only.score(cut_a) == flops_only.score(cut_b)
    with pytest.raises(ValueError, match="latency model"):
        PruningEnv(problem, config)


def test_layer_latency_table_is_cached_and_interpolates(task, tmp_path, monkeypatch):
    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    table = LayerLatencyTable.measure(task, (1, 8, 8), batch=1, threads=1, repeats=2)
    convs = [m for m in task.model.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    assert len(table.layers) == len(convs) and not table.cached
    assert table.key["threads"] == 1 and table.key["input_shape"] == [1, 8, 8]
    assert len(table.full_samples) == 6 and table.noise >= 0  # 3 x repeats for the full net
    full = table.latency(task.group_sizes)
    assert np.isfinite(full) and full > 0
    for layer in table.layers:  # interpolation returns the grid's own values at its points
        i, j = len(layer.in_grid) // 2, len(layer.out_grid) // 2
        value = layer.at(layer.in_grid[i], layer.out_grid[j])
        assert value == pytest.approx(layer.seconds[i, j])
    again = LayerLatencyTable.measure(task, (1, 8, 8), batch=1, threads=1, repeats=2)
    assert again.cached and again.latency(task.group_sizes) == pytest.approx(full)
    files = list((tmp_path / "pruning_latency").glob("table_*.json"))
    assert len(files) == 1


def test_latency_table_by_size_shapes(task):
    small = task.extract(uniform_search(task, 0.5).counts, ratios=False)
    df = latency_table_by_size(
        {"original": task.model, "half": small}, 1, sizes=(8, 16), batches=(1, 2), repeats=3
    )
    assert len(df) == 2 * 2 * 2
    base = df[df.model == "original"]
    assert (base.speedup == 1.0).all()
    assert (df.speedup_low <= df.speedup).all() and (df.speedup <= df.speedup_high).all()


def _outcome(items: np.ndarray, seed: int) -> MethodOutcome:
    n = len(items)
    return MethodOutcome(
        method="m",
        target=0.5,
        flops_ratio=0.5,
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
        seed=seed,
    )


def test_gap_over_seeds_pairs_items_and_seeds():
    rng = np.random.default_rng(0)
    base = [rng.random(300) < 0.8 for _ in range(3)]
    a = [_outcome(b, s) for s, b in enumerate(base)]
    same = gap_over_seeds(a, a)
    assert (same.value, same.interval, same.n) == (0.0, (0.0, 0.0), 900)
    better = [_outcome(b | (rng.random(300) < 0.5), s) for s, b in enumerate(base)]
    gap = gap_over_seeds(better, a)
    low, high = gap.bounds
    assert low > 0 and low <= gap.value <= high
    with pytest.raises(ValueError):
        gap_over_seeds(a, a[:2])


def test_predicted_latency_asks_perfmodel_once_per_policy(task, monkeypatch):
    import hpcnb.perfmodel as perfmodel
    from hpcnb.pruning.latency import PredictedLatency

    calls = []

    class Estimate(tuple):
        seconds = property(lambda self: self[0])

    def fake(model, input_shape, batch, threads):
        calls.append((input_shape, batch, threads))
        params = sum(p.numel() for p in model.parameters())
        return Estimate((1e-9 * params, 0.0, 1.0))

    monkeypatch.setattr(perfmodel, "predict_latency", fake, raising=False)
    model = PredictedLatency(task, (1, 8, 8), batch=1, threads=2)
    full = model.latency(task.group_sizes)
    half = model.latency(np.maximum(task.group_sizes // 2, 1))
    assert half < full and model.latency(task.group_sizes) == full
    assert calls == [((1, 8, 8), 1, 2)] * 2  # memoised
