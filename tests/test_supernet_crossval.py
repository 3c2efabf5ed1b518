"""Tests of the cross-validated subnet pipeline (hpcnb.supernet.crossval), on tiny settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hpcnb.data import kfold_splits
from hpcnb.errors import HpcnbError
from hpcnb.supernet import SupernetTrainConfig
from hpcnb.supernet.crossval import (
    CrossValidation,
    SubnetPipelineConfig,
    cross_validate_subnet,
    form_and_search,
)

N_ITEMS = 45


def _build() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _data() -> tuple[np.ndarray, np.ndarray]:
    """Items whose first feature is their own index, so a test can tell them apart."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N_ITEMS, 1, 2, 3)).astype(np.float32)
    x[:, 0, 0, 0] = np.arange(N_ITEMS)
    y = (x[:, 0, 1].sum(1) > 0).astype(np.int64) + (x[:, 0, 0, 1] > 1)
    return x, y


def _config(seeds: tuple[int, ...] = (0, 1)) -> SubnetPipelineConfig:
    return SubnetPipelineConfig(
        pretrain_epochs=2,
        train=SupernetTrainConfig(steps=3, batch_size=8, subnets_per_step=3),
        population=4,
        generations=1,
        finetune_epochs=1,
        finetune_seeds=seeds,
    )


def test_folds_test_every_item_once_and_carry_per_item_scores() -> None:
    x, y = _data()
    splits = kfold_splits(x, y, k=3, seed=0)
    ids = np.concatenate([s.x_test[:, 0, 0, 0] for s in splits]).astype(int)
    assert sorted(ids) == list(range(N_ITEMS))  # every item a test item of exactly one fold
    cv = cross_validate_subnet(_build, splits, _config())
    assert isinstance(cv, CrossValidation) and len(cv.folds) == 3
    assert cv.n_items == N_ITEMS
    for fold, split in zip(cv.folds, splits, strict=True):
        n = len(split.y_test)
        assert fold.full_correct.shape == (n,) and fold.untuned_correct.shape == (n,)
        assert fold.tuned_correct.shape == (2, n)  # one row per fine-tuning seed
        assert set(np.unique(fold.tuned_correct)) <= {0, 1}
        assert fold.subnet_items.shape == (n,)
        assert fold.chosen.cost <= 0.5 * fold.full_flops
        assert sorted(fold.subnets) == [0, 1]
    drop = cv.drop(resamples=200)
    pooled_full = np.concatenate([f.full_correct for f in cv.folds]).mean()
    pooled_sub = np.concatenate([f.subnet_items for f in cv.folds]).mean()
    assert drop.n == N_ITEMS
    assert drop.value == pytest.approx(pooled_full - pooled_sub)
    assert drop.low <= drop.value <= drop.high
    assert cv.drop_before_finetune(resamples=200).n == N_ITEMS
    assert [row["test items"] for row in cv.table()] == [len(s.y_test) for s in splits]


def test_reusing_fold_0_stages_gives_the_same_result() -> None:
    x, y = _data()
    splits = kfold_splits(x, y, k=3, seed=1)[:2]
    config = _config(seeds=(0,))
    fresh = cross_validate_subnet(_build, splits, config)
    formed = form_and_search(_build, splits[0], config)
    reused = cross_validate_subnet(_build, splits, config, first=formed)
    assert reused.folds[0].formed is formed
    for a, b in zip(fresh.folds, reused.folds, strict=True):
        assert a.chosen.config == b.chosen.config
        np.testing.assert_array_equal(a.tuned_correct, b.tuned_correct)
        np.testing.assert_array_equal(a.full_correct, b.full_correct)
        for p, q in zip(a.subnets[0].parameters(), b.subnets[0].parameters(), strict=True):
            assert torch.equal(p, q)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(HpcnbError, match="flops_budget"):
        SubnetPipelineConfig(flops_budget=0.0)
    with pytest.raises(HpcnbError, match="finetune_seeds"):
        SubnetPipelineConfig(finetune_seeds=())
    with pytest.raises(HpcnbError, match="at least one split"):
        cross_validate_subnet(_build, [], _config())
