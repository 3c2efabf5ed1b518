"""Tests of ConvMeter features, timing harness, estimators, data set cache and scaling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import hpcnb.perfmodel.dataset as dataset_module
from hpcnb.perfmodel import (
    Cluster,
    ConvMeter,
    GridConfig,
    Measurement,
    NetworkFeatures,
    TimingConfig,
    collect_dataset,
    leave_one_family_out,
    mape,
    network_features,
    runtime_vs_nodes,
)
from hpcnb.perfmodel.dataset import FAMILIES, build_network
from hpcnb.perfmodel.estimator import FlopsOnly, Roofline, design_matrix, feature_names
from hpcnb.perfmodel.features import training_flops
from hpcnb.perfmodel.multinode import TrainingCost
from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.stats import (
    Estimate,
    StatisticsError,
    absolute_percentage_errors,
    bootstrap_rows,
    mape_interval,
)


def _small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, bias=False),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    )


def test_features_by_hand() -> None:
    f = network_features(_small_net(), (2, 5, 5), name="small", family="toy")
    # dense conv: 2 * (4 out ch * 25 px) * (2 in ch * 9) per sample
    assert f.conv_flops == 2 * 4 * 25 * 2 * 9
    # depthwise: one input channel per output channel
    assert f.grouped_conv_flops == 2 * 4 * 25 * 9
    assert f.linear_flops == 2 * 4 * 3
    assert f.params == 2 * 4 * 9 + 4 * 9 + 4 * 3 + 3
    # conv, relu, conv, pool, linear launch kernels; flatten is a view
    assert f.kernels == 5
    assert f.gemm_kernels == 3
    assert len(f.gemm_node_bytes) == 3 and len(f.other_node_bytes) == 2
    # training: dense conv fwd + weight grad (its input needs no grad), depthwise and
    # linear fwd + input grad + weight grad
    dense, dw, lin = 3600, 1800, 24
    assert f.train_flops == pytest.approx(2 * dense + 3 * dw + 3 * lin)
    assert f.train_grouped_flops == pytest.approx(3 * dw)
    assert f.activation_bytes > 0 and f.memory_bytes > f.activation_bytes
    again = NetworkFeatures.from_json(f.to_json())
    assert again == f


def test_training_flops_fix_grouped_weight_gradient() -> None:
    conv = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
    x = torch.randn(2, 8, 6, 6, requires_grad=False)
    net = nn.Sequential(nn.Conv2d(8, 8, 1, bias=False), conv, nn.Flatten(), nn.Linear(288, 2))
    total, grouped = training_flops(net, x)
    fwd = 2 * 2 * 8 * 36 * 9  # depthwise forward at batch 2
    assert grouped == 3 * fwd  # forward, input gradient, weight gradient
    with FlopCounterMode(display=False) as stock:
        nn.functional.cross_entropy(net(x), torch.zeros(2, dtype=torch.long)).backward()
    # torch's stock formula counts the depthwise weight gradient as a dense conv
    assert stock.get_total_flops() - total == 8 * fwd - fwd


def test_timing_config_and_median() -> None:
    with pytest.raises(PerfmodelError, match="clock"):
        TimingConfig(clock="sundial")
    with pytest.raises(PerfmodelError, match="one thread"):
        TimingConfig(threads=2, clock="cpu")
    calls = []
    timing = TimingConfig(warmup=2, repeats=3).measure(lambda: calls.append(1))
    assert len(calls) == 5 and timing.repeats == 3
    assert timing.minimum <= timing.median <= timing.maximum


def test_build_network_every_family() -> None:
    for family in FAMILIES:
        net = build_network(family, 0.25).eval()
        with torch.no_grad():
            assert net(torch.randn(2, 3, 16, 16)).shape == (2, 10), family
    with pytest.raises(PerfmodelError, match="family"):
        build_network("alexnet")


def _rows(n_per_family: int = 6) -> list[Measurement]:
    rng = np.random.default_rng(0)
    rows = []
    for fam in ("a", "b", "c"):
        for i in range(n_per_family):
            f = NetworkFeatures(
                name=f"{fam}{i}",
                family=fam,
                input_shape=(3, 8, 8),
                params=int(rng.integers(1e3, 1e5)),
                conv_flops=float(rng.uniform(1e5, 1e7)),
                grouped_conv_flops=float(rng.uniform(0, 1e5)),
                linear_flops=float(rng.uniform(0, 1e4)),
                other_flops=1e3,
                activation_bytes=1e4,
                memory_bytes=float(rng.uniform(1e4, 1e6)),
                train_flops=float(rng.uniform(3e5, 3e7)),
                train_grouped_flops=0.0,
                counts={"conv": int(rng.integers(3, 30)), "activation": int(rng.integers(3, 30))},
                gemm_node_bytes=(1e4, 5e5),
                other_node_bytes=(2e4,),
            )
            rows.append(Measurement(f, int(rng.choice([2, 8, 32])), 1.0, 1.0))
    return rows


def test_convmeter_api_and_exact_recovery() -> None:
    rows = _rows()
    X = design_matrix(rows, "inference", cache_bytes=1e6)
    assert X.shape == (len(rows), len(feature_names("inference")))
    theta = np.array([2e-5, 5e-6, 1e-11, 1e-10, 2e-10, 1e-10, 3e-10])
    y = 1e-3 + X @ theta
    model = ConvMeter("inference")
    assert model.fit(X, y) is model
    pred = model.predict(X)
    assert pred.shape == (len(rows),)
    assert mape(pred, y) < 1e-6
    assert model.intercept_ == pytest.approx(1e-3, rel=1e-4)
    assert np.all(model.coef_ >= 0)
    assert model.formula().startswith("T = ")
    with pytest.raises(PerfmodelError, match="expected"):
        model.predict(X[:, :3])
    with pytest.raises(PerfmodelError, match="mode"):
        ConvMeter("sleeping").fit(X, y)
    Xt = design_matrix(rows, "training", cache_bytes=1e6)
    assert Xt.shape == X.shape
    assert not np.allclose(Xt[:, 2], X[:, 2])  # training uses the measured training FLOPs


def test_baselines_and_leave_one_family_out() -> None:
    rows = _rows()
    flops = FlopsOnly.flops_column(rows, "inference")
    y = 2e-3 + 1e-9 * flops[:, 0]
    ev = leave_one_family_out(FlopsOnly, flops, y, [r.family for r in rows])
    assert set(ev.per_family) == {"a", "b", "c"}
    assert ev.mape < 1e-6
    with pytest.raises(PerfmodelError, match="two families"):
        leave_one_family_out(FlopsOnly, flops, y, ["a"] * len(rows))
    roof = Roofline(peak_flops=1e9, bandwidth=1e8).predict_rows(rows[:1])
    f, b = rows[0].features, rows[0].batch
    expect = max(b * f.forward_flops / 1e9, (b * f.memory_bytes + 4 * f.params) / 1e8)
    assert roof[0] == pytest.approx(expect)


def test_dataset_cache_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grid = GridConfig(
        families=("resnet",),
        widths=(0.25,),
        resolutions=(8,),
        batches=(2,),
        timing=TimingConfig(warmup=0, repeats=1),
    )
    rows = collect_dataset(grid, cache_dir=tmp_path)
    assert len(rows) == grid.size == 1
    assert rows[0].inference_s > 0 and rows[0].training_s > 0
    assert rows[0].features.family == "resnet"
    cache = list((tmp_path / "perfmodel").glob("*.json"))
    assert len(cache) == 1

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(dataset_module, "time_inference", boom)
    monkeypatch.setattr(dataset_module, "network_features", boom)
    again = collect_dataset(grid, cache_dir=tmp_path, remeasure="none")
    assert again[0].inference_s == rows[0].inference_s
    with pytest.raises(PerfmodelError, match="batches"):
        GridConfig(batches=(1,))


def test_runtime_vs_nodes_by_hand() -> None:
    cost = TrainingCost(train_flops_per_sample=1e9, gradient_bytes=1e8)
    plat = Cluster(node_flops=1e12, step_overhead_s=0.0, link_gbps=8.0, latency_s=0.0)
    curve = runtime_vs_nodes(cost, 64, plat, nodes=[1, 2, 4])
    assert curve[1] == pytest.approx(64 * 1e-3)
    # p=2: 32 samples of compute + ring 2(p-1)/p * 1e8 bytes at 1 GB/s
    assert curve[2] == pytest.approx(32e-3 + 0.1)
    assert curve[4] == pytest.approx(16e-3 + 1.5 * 0.1)
    overlapped = runtime_vs_nodes(cost, 64, Cluster(link_gbps=8.0, overlap=1.0), nodes=[2])
    assert overlapped[2] == pytest.approx(max(1e-3 + 32e-3, 0.1 + 2 * 5e-6))
    with pytest.raises(PerfmodelError, match="outside"):
        runtime_vs_nodes(cost, 4, plat, nodes=[8])
    net_curve = runtime_vs_nodes(_small_net(), 8, plat, nodes=[1, 2], input_shape=(2, 5, 5))
    assert net_curve[2] > 0


def test_mape_interval_seeded_bootstrap_of_the_mean() -> None:
    measured = np.array([1.0, 2.0, 4.0, 5.0, 10.0, 8.0])
    predicted = np.array([1.1, 1.8, 4.4, 5.0, 9.0, 10.0])
    ape = absolute_percentage_errors(predicted, measured)
    assert ape == pytest.approx([0.1, 0.1, 0.1, 0.0, 0.1, 0.25])
    estimate = mape_interval(predicted, measured, seed=3)
    value, (low, high) = estimate.value, estimate.bounds
    assert isinstance(estimate, Estimate) and estimate.n == 6
    assert value == pytest.approx(mape(predicted, measured))
    assert ape.min() <= low <= value <= high <= ape.max()
    assert mape_interval(predicted, measured, seed=3) == estimate  # reproducible
    assert mape_interval(predicted, measured, seed=4) != estimate
    # the same bootstrap by hand: rows drawn with replacement from default_rng(seed)
    rng = np.random.default_rng(3)
    means = [ape[rng.choice(np.arange(6), size=6)].mean() for _ in range(2000)]
    assert (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    # equal errors: a zero-width interval
    equal = mape_interval([2.0, 4.0], [1.0, 2.0])
    assert (equal.value, *equal.bounds) == pytest.approx((1.0, 1.0, 1.0))


def test_mape_interval_groups_mean_of_group_mapes() -> None:
    measured = np.ones(5)
    predicted = np.array([1.1, 1.3, 1.5, 1.5, 1.5])  # group a: 0.1, 0.3; group b: 0.5 x3
    groups = ["a", "a", "b", "b", "b"]
    estimate = mape_interval(predicted, measured, groups=groups, seed=0)
    value, (low, high) = estimate.value, estimate.bounds
    assert value == pytest.approx((0.2 + 0.5) / 2)  # each group counts once
    # resampling stays within groups: b always 0.5, a's mean in [0.1, 0.3]
    assert 0.3 <= low <= value <= high <= 0.4
    with pytest.raises(StatisticsError, match="labels"):
        mape_interval(predicted, measured, groups=["a"])
    with pytest.raises(StatisticsError, match="positive"):
        mape_interval([1.0], [0.0])


def test_bootstrap_rows_any_statistic() -> None:
    x = np.arange(1.0, 11.0)
    estimate = bootstrap_rows(lambda idx: float(x[idx].max()), x.size, seed=1)
    low, high = estimate.bounds
    assert estimate.value == 10.0 and low <= 10.0 <= high == 10.0 and estimate.n == 10
    with pytest.raises(StatisticsError, match="confidence"):
        bootstrap_rows(lambda idx: 0.0, 3, confidence=1.5)


def test_cache_file_named_after_shared_machine_key(tmp_path: Path) -> None:
    from hpcnb.paths import machine_key

    path = dataset_module.cache_file(tmp_path)
    assert path.parent == tmp_path / "perfmodel"
    assert path.name.startswith("timings-") and path.suffix == ".json"
    assert path == dataset_module.cache_file(tmp_path)  # stable within a machine
    # A file of the former naming (<host>-<digest>.json) is never the one read.
    assert "|" in machine_key() and "|" not in path.name
