"""Tests of notebook 02's evaluation path: BatchNorm recalibration, accuracy gaps, bars."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from hpcnb.data import digits
from hpcnb.models.metrics import top1_accuracy
from hpcnb.pruning import TrainConfig, recalibrate_batchnorm, train_classifier
from hpcnb.pruning.compare import MethodOutcome, accuracy_gap, bar_table, count_passing
from hpcnb.pruning.training import training_batches
from hpcnb.stats import difference_interval

torch.set_num_threads(1)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(32, 10),
    )


def test_recalibration_gives_the_data_statistics():
    bn = nn.BatchNorm1d(3, momentum=0.3)
    data = torch.randn(8, 16, 3, generator=torch.Generator().manual_seed(0)) * 2.0 + 5.0
    recalibrate_batchnorm(bn, list(data))
    torch.testing.assert_close(bn.running_mean, data.reshape(-1, 3).mean(0))
    torch.testing.assert_close(bn.running_var, data.var(dim=1, unbiased=True).mean(0))
    assert bn.momentum == 0.3
    assert not bn.training
    assert int(bn.num_batches_tracked) == 8


def test_recalibration_fixes_shifted_statistics():
    split = digits(0)
    model = _mlp()
    train_classifier(model, split.x_train, split.y_train, TrainConfig(epochs=5, seed=0))
    good = top1_accuracy(model, split.x_test, split.y_test)
    assert good > 0.85
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k}
    bn = model[2]
    # Statistics of another network: a large shift, as after pruning the layer below.
    bn.running_mean += 4.0 * bn.running_var.sqrt() + 1.0
    bn.running_var *= 30.0
    shifted = top1_accuracy(model, split.x_test, split.y_test)
    assert shifted < good - 0.3
    recalibrate_batchnorm(model, training_batches(split.x_train, 64))
    fixed = top1_accuracy(model, split.x_test, split.y_test)
    assert fixed >= good - 0.03
    assert not model.training
    assert bn.momentum == 0.1
    for key, value in weights.items():
        if "num_batches" not in key:
            torch.testing.assert_close(model.state_dict()[key], value)


def test_recalibration_keeps_dropout_off_and_accepts_pairs():
    split = digits(0)
    model = _mlp()
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    x = torch.as_tensor(split.x_train[:128]).float()
    y = torch.as_tensor(split.y_train[:128])
    recalibrate_batchnorm(a, [x[:64], x[64:]])
    torch.manual_seed(1)  # dropout would make the statistics depend on the RNG
    recalibrate_batchnorm(b, [(x[:64], y[:64]), (x[64:].numpy(), y[64:])])
    torch.testing.assert_close(a[2].running_mean, b[2].running_mean)
    torch.testing.assert_close(a[2].running_var, b[2].running_var)


def test_recalibration_errors_and_no_batchnorm():
    with pytest.raises(ValueError, match="no batches"):
        recalibrate_batchnorm(_mlp(), [])
    plain = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).train()
    assert recalibrate_batchnorm(plain, []) is plain
    assert not plain.training
    with pytest.raises(ValueError, match="batch_size"):
        training_batches(np.zeros((4, 1, 8, 8)), 0)
    assert [len(b) for b in training_batches(np.zeros((10, 3)), 4)] == [4, 4, 2]
    assert len(training_batches(np.zeros((10, 3)), 4, limit=1)) == 1


def _outcome(method: str, before: int, after: int, flops: float, n: int = 400) -> MethodOutcome:
    return MethodOutcome(
        method=method,
        target=0.5,
        flops_ratio=flops,
        params=1,
        acc_before=before / n,
        acc_after=after / n,
        latency_ms=1.0,
        speedup=1.0,
        search_seconds=0.0,
        n_test=n,
        correct_before=before,
        correct_after=after,
    )


def test_accuracy_gap_is_newcombe():
    a, b = _outcome("a", 380, 390, 0.5), _outcome("b", 300, 350, 0.5)
    gap = accuracy_gap(a, b, "before", "after")
    newcombe = difference_interval(380, 400, 350, 400)
    assert (gap.value, gap.interval) == (newcombe.value, newcombe.interval)
    assert gap.n == 400  # the test items both are scored on
    with pytest.raises(ValueError, match="stage"):
        accuracy_gap(a, b, "during")
    with pytest.raises(ValueError, match="differ"):
        accuracy_gap(a, _outcome("c", 10, 10, 0.5, n=20))


def test_bar_table_three_valued_and_count():
    outcomes = [
        _outcome("original", 380, 380, 1.0),
        _outcome("gnnrl", 0, 396, 0.5),  # a clear gain: passes a 0.01 drop bar
        _outcome("uniform", 0, 379, 0.5),  # within noise of the bar: inconclusive
        _outcome("random", 0, 300, 0.49),  # clearly worse: fails
        _outcome("torch_pruning", 0, 390, 0.6),  # accurate but over the FLOPs bound
    ]
    table = bar_table(outcomes, flops_max=0.52, max_drop=0.01)
    assert list(table.index) == ["gnnrl", "uniform", "random", "torch_pruning"]
    assert table.loc["gnnrl", "drop"] == pytest.approx(-0.04)
    assert table.status.to_dict() == {
        "gnnrl": "passes",
        "uniform": "inconclusive",
        "random": "fails",
        "torch_pruning": "fails",
    }
    assert count_passing(table) == (0, 1, [])
    assert count_passing(table, exclude=())[0] == 1
    with pytest.raises(ValueError, match="no outcome named"):
        bar_table(outcomes[1:], flops_max=0.52, max_drop=0.01)


def test_top1_accuracy_keeps_the_mode_and_refuses_bad_sets():
    from hpcnb.errors import HpcnbError
    from hpcnb.models.metrics import MetricError

    model = _mlp()
    model.train()
    x = np.random.default_rng(0).normal(size=(10, 64))  # float64 arrays are cast to float32
    y = model.eval()(torch.as_tensor(x).float()).argmax(-1).numpy()
    model.train()
    assert top1_accuracy(model, x, y, batch_size=3) == 1.0
    assert model.training
    with pytest.raises(MetricError, match="non-empty"):
        top1_accuracy(model, x[:0], y[:0])
    with pytest.raises(HpcnbError, match="10 inputs, 9 labels"):
        top1_accuracy(model, x, y[:9])
