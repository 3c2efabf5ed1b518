"""The search reward on BatchNorm-recalibrated subnets (ModelPruningTask with x_calib)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcnb import models
from hpcnb.data import digits
from hpcnb.errors import InvalidInputError
from hpcnb.models.metrics import top1_accuracy
from hpcnb.pruning import ModelPruningTask, TrainConfig, train_classifier, uniform_search
from hpcnb.pruning.training import recalibrate_batchnorm, training_batches


@pytest.fixture(scope="module")
def trained() -> tuple:
    torch.manual_seed(0)
    split = digits(0)
    net = models.resnet_cifar(depth=8, width=16, num_classes=10, in_channels=1)
    train_classifier(net, split.x_train, split.y_train, TrainConfig(epochs=4, lr=3e-3, seed=0))
    return net, split


def test_calibrated_reward_equals_the_recalibrated_extracted_network(trained: tuple) -> None:
    net, split = trained
    example = torch.as_tensor(split.x_train[:2])
    before = {k: v.clone() for k, v in net.state_dict().items()}
    task = ModelPruningTask(net, example, split.x_val, split.y_val, x_calib=split.x_train)
    counts = uniform_search(task, 0.4).counts
    extracted = task.extract(counts, ratios=False)
    recalibrate_batchnorm(extracted, training_batches(split.x_train, 64))
    assert task.accuracy(counts) == pytest.approx(
        top1_accuracy(extracted, split.x_val, split.y_val), abs=1e-6
    )
    # the original network and its statistics are untouched
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_recalibrated_uniform_policy_is_above_chance_where_stale_statistics_are_not(
    trained: tuple,
) -> None:
    net, split = trained
    example = torch.as_tensor(split.x_train[:2])
    stale = ModelPruningTask(net, example, split.x_val, split.y_val)
    fresh = ModelPruningTask(net, example, split.x_val, split.y_val, x_calib=split.x_train)
    counts = uniform_search(fresh, 0.5).counts
    chance = float(np.bincount(split.y_val).max() / len(split.y_val))
    assert fresh.accuracy(counts) > chance + 0.2
    assert fresh.accuracy(counts) > stale.accuracy(counts)


def test_calibration_inputs_are_checked(trained: tuple) -> None:
    net, split = trained
    example = torch.as_tensor(split.x_train[:2])
    with pytest.raises(InvalidInputError, match="x_calib"):
        ModelPruningTask(net, example, split.x_val, split.y_val, x_calib=np.zeros((3, 1, 4, 4)))
    with pytest.raises(InvalidInputError, match="calibration_batch"):
        ModelPruningTask(
            net, example, split.x_val, split.y_val, x_calib=split.x_train, calibration_batch=0
        )


def test_snapping_to_16_keeps_the_budget_and_falls_back_to_8() -> None:
    from hpcnb.pruning.problem import FlopsModel, snap_counts_preferring

    rng = np.random.default_rng(1)
    sizes = np.array([16, 32, 64, 64])
    fm = FlopsModel(
        constant=100.0,
        coef=np.array([400.0, 900.0, 1600.0, 800.0]),
        out_group=np.array([0, 1, 2, 3]),
        in_group=np.array([-1, 0, 1, 2]),
        num_groups=4,
    )
    used = set()
    for _ in range(300):
        counts = np.maximum(1, (rng.uniform(0.05, 1.0, 4) * sizes).astype(int))
        budget = fm(counts / sizes) * rng.uniform(1.0, 1.1)
        snapped = snap_counts_preferring(counts, sizes, (16, 8), fm, budget)
        assert fm(snapped / sizes) <= budget + 1e-9
        wide = sizes > 16
        if (snapped[wide] % 16 == 0).all() and (snapped[~wide] % 8 == 0).all():
            used.add(16)  # the 16-channel group cannot take 16 below its size: it takes 8
        elif (snapped % 8 == 0).all():
            used.add(8)
        else:
            assert (snapped == counts).all()  # neither multiple keeps the budget: unsnapped
    assert used == {16, 8}
    # A narrow group is snapped to the fallback, a wide one to 16, in the same policy.
    counts = np.array([11, 22, 45, 45])
    snapped = snap_counts_preferring(counts, sizes, (16, 8), fm, 2 * fm(counts / sizes))
    assert snapped.tolist() == [8, 16, 48, 48]


def test_env_config_checks_the_fallback() -> None:
    from hpcnb.pruning import EnvConfig

    assert EnvConfig(round_to=16, round_fallback=8).round_fallback == 8
    with pytest.raises(InvalidInputError, match="round_fallback"):
        EnvConfig(round_to=8, round_fallback=16)
