"""Cross-validation splits and the pooled paired interval over folds."""

from __future__ import annotations

import numpy as np
import pytest

from hpcnb.data import digits_folds, kfold_splits
from hpcnb.errors import InvalidInputError
from hpcnb.models.metrics import MetricError, pooled_gap_interval


def test_kfold_covers_every_item_once_and_keeps_test_out_of_training() -> None:
    x = np.arange(103, dtype=np.float32)
    y = np.arange(103)
    folds = kfold_splits(x, y, 5, seed=3, val_fraction=0.2)
    tested = np.concatenate([f.y_test for f in folds])
    assert sorted(tested.tolist()) == list(range(103))
    for f in folds:
        seen = set(f.y_train.tolist()) | set(f.y_val.tolist())
        assert not seen & set(f.y_test.tolist())
        assert len(seen) + len(f.y_test) == 103
        assert abs(len(f.y_val) - 0.2 * (103 - len(f.y_test))) <= 1
    assert max(len(f.y_test) for f in folds) - min(len(f.y_test) for f in folds) <= 1


def test_digits_folds_cover_all_1797_digits() -> None:
    folds = digits_folds(5, seed=0)
    assert sum(len(f.y_test) for f in folds) == 1797
    assert folds[0].x_test.shape[1:] == (1, 8, 8)


@pytest.mark.parametrize(
    ("k", "val"), [(1, 0.1), (200, 0.1), (3, 1.0), (3, -0.1)], ids=["k1", "kbig", "val1", "valneg"]
)
def test_kfold_rejects_bad_settings(k: int, val: float) -> None:
    with pytest.raises(InvalidInputError, match="kfold_splits"):
        kfold_splits(np.zeros(10), np.zeros(10), k, val_fraction=val)


def test_kfold_rejects_length_mismatch() -> None:
    with pytest.raises(InvalidInputError, match="9 labels"):
        kfold_splits(np.zeros(10), np.zeros(9), 2)


def test_pooled_gap_is_the_pooled_mean_and_narrows_with_items() -> None:
    rng = np.random.default_rng(0)
    small = [rng.random(40) < 0.9 for _ in range(3)]
    small_b = [rng.random(40) < 0.8 for _ in range(3)]
    gap = pooled_gap_interval(small, small_b)
    pooled = np.concatenate(small).mean() - np.concatenate(small_b).mean()
    assert gap.value == pytest.approx(pooled)
    assert gap.n == 120 and gap.low <= gap.value <= gap.high
    big = [rng.random(4000) < 0.9 for _ in range(3)]
    big_b = [rng.random(4000) < 0.8 for _ in range(3)]
    wide = pooled_gap_interval(big, big_b)
    assert wide.high - wide.low < gap.high - gap.low
    assert wide.low > 0.05  # a 10-point gap over 12,000 items is resolved


def test_pooled_gap_accepts_ragged_folds_and_rejects_mismatch() -> None:
    a = [np.ones(3), np.zeros(2)]
    assert pooled_gap_interval(a, [np.zeros(3), np.zeros(2)]).value == pytest.approx(0.6)
    with pytest.raises(MetricError, match="fold 1"):
        pooled_gap_interval(a, [np.ones(3), np.ones(3)])
    with pytest.raises(MetricError, match="folds"):
        pooled_gap_interval(a, a[:1])
