"""Tests of the per-op-kind model, the boosted reference and pruned variants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcnb.perfmodel import Measurement, OpCostModel, TimingConfig, network_features
from hpcnb.perfmodel.dataset import build_network, pruned_variant, time_network
from hpcnb.perfmodel.features import OP_GROUPS
from hpcnb.perfmodel.opmodel import BoostedReference, op_design_matrix, op_feature_names
from hpcnb.perfmodel.protocol import NoisePolicy, PerfmodelError


def _rows() -> list[Measurement]:
    rows = []
    for family, width in (("resnet", 0.25), ("mobilenet_v2", 0.25)):
        f = network_features(build_network(family, width), (3, 8, 8), family, family)
        rows += [Measurement(f, b, 1e-3 * b, 3e-3 * b) for b in (2, 4, 8)]
    return rows


def test_op_features_count_launches_per_group_and_training_terms() -> None:
    rows = _rows()
    f = rows[0].features
    assert set(f.group_costs) == set(OP_GROUPS)
    assert sum(v[0] for v in f.group_costs.values()) == f.kernels
    assert f.group_costs["grouped"][0] == 0  # ResNet has no grouped convolution
    assert rows[3].features.group_costs["grouped"][0] > 0  # MobileNetV2 has depthwise ones
    X = op_design_matrix(rows, "inference", cache_bytes=1 << 20)
    Xt = op_design_matrix(rows, "training", cache_bytes=1 << 20)
    assert X.shape == (6, len(op_feature_names("inference")))
    assert Xt.shape == (6, X.shape[1] + 2)
    launches = X[:, : len(OP_GROUPS)]
    assert np.all(launches[0] == launches[1])  # launches do not grow with the batch
    assert np.all(X[1, len(OP_GROUPS) :] >= X[0, len(OP_GROUPS) :])  # per-batch terms grow
    with pytest.raises(PerfmodelError, match="mode"):
        op_design_matrix(rows, "sleeping")


def test_peak_floor_bounds_the_dense_flop_price() -> None:
    rows = _rows()
    X = op_design_matrix(rows, "inference", cache_bytes=1 << 20)
    y = np.array([r.inference_s for r in rows])
    k = op_feature_names("inference").index("flops_dense")
    floored = OpCostModel("inference", peak_flops=1e9).fit(X, y)
    assert floored.coef_[k] >= 1e-9 and np.all(floored.coef_ >= 0)
    assert "flops_dense" in floored.formula()
    with pytest.raises(PerfmodelError, match="peak"):
        OpCostModel("inference", peak_flops=-1.0).fit(X, y)
    with pytest.raises(PerfmodelError, match="columns"):
        OpCostModel("inference", peak_flops=1e9).fit(X[:, :3], y)


def test_boosted_reference_fits_log_times() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(1, 100, size=(40, 3))
    y = 1e-3 * X[:, 0] + 1e-4 * X[:, 1]
    model = BoostedReference(n_estimators=200, seed=0).fit(X, y)
    assert np.median(np.abs(model.predict(X) - y) / y) < 0.1
    with pytest.raises(PerfmodelError, match="positive"):
        BoostedReference().fit(X, -y)


def test_pruned_variant_is_smaller_and_runs() -> None:
    torch.manual_seed(0)
    parent = build_network("mobilenet_v2", 0.25)
    small = pruned_variant(parent, (3, 16, 16), 0.5)
    plan = pruned_variant(parent, (3, 16, 16), lambda n: np.linspace(0.3, 1.0, n))
    count = sum(p.numel() for p in parent.parameters())
    assert sum(p.numel() for p in small.parameters()) < count
    assert sum(p.numel() for p in plan.parameters()) < count
    assert small(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    t = time_network(
        small, (3, 16, 16), 2, TimingConfig(warmup=0, repeats=3), NoisePolicy(retries=0)
    )
    assert len(t.samples) == 3 and t.attempts == 1 and t.dispersion >= 0
    with pytest.raises(PerfmodelError, match="ratios"):
        pruned_variant(parent, (3, 16, 16), 1.5)
    with pytest.raises(PerfmodelError, match="groups"):
        pruned_variant(parent, (3, 16, 16), [0.5])
