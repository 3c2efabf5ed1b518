"""Tests of the kernel-level predictor: ATen capture, sampled kernels, forests, network sums."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from hpcnb.perfmodel.aten import kernel_features, network_kernels, replay
from hpcnb.perfmodel.dataset import GridConfig
from hpcnb.perfmodel.kernelmodel import (
    DispatchFit,
    KernelModel,
    NetworkKernelPredictor,
    fit_kernel_model,
    held_out_dispatch,
)
from hpcnb.perfmodel.kernelset import (
    KernelProfile,
    KernelSample,
    Primitive,
    SamplingRanges,
    kernel_calls,
    neighbours,
    profile_kernels,
    sample_primitives,
)
from hpcnb.perfmodel.netset import collect_networks, noise_ceiling, time_models
from hpcnb.perfmodel.predict import KernelLatencyPredictor, predict_latency
from hpcnb.perfmodel.protocol import PerfmodelError, steady_allocator
from hpcnb.perfmodel.roundrobin import RoundRobinPolicy
from hpcnb.perfmodel.timing import TimingConfig

FAST = RoundRobinPolicy(rounds=3, samples=1, min_sample_seconds=1e-4, max_reruns=1)


def _net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


def test_capture_sees_forward_and_backward_kernels() -> None:
    inference = [c.op for c in network_kernels(_net(), (3, 8, 8), 4)]
    training = [c.op for c in network_kernels(_net(), (3, 8, 8), 4, "training")]
    assert "aten.convolution.default" in inference
    assert "aten.convolution_backward.default" not in inference
    assert "aten.convolution_backward.default" in training
    assert "aten.addmm.default" in inference and len(training) > len(inference)
    with pytest.raises(PerfmodelError, match="mode"):
        network_kernels(_net(), (3, 8, 8), 4, "serving")


def test_conv_features_forward_and_backward_agree() -> None:
    conv = nn.Sequential(nn.Conv2d(6, 12, 3, stride=2, groups=3), nn.Flatten())
    calls = network_kernels(conv, (6, 10, 10), 5, "training")
    fwd = next(c for c in calls if c.op == "aten.convolution.default")
    bwd = next(c for c in calls if c.op == "aten.convolution_backward.default")
    family, f = kernel_features(fwd)
    assert family == "conv" and f == (5.0, 6.0, 10.0, 10.0, 12.0, 9.0, 2.0, 3.0, 1.0)
    family, b = kernel_features(bwd)
    # weight and bias gradients (the input of a first layer needs none)
    assert family == "conv" and b[:8] == f[:8] and b[8] == 2.0
    gemm = next(
        c for c in network_kernels(nn.Linear(7, 3), (7,), 4) if c.op == "aten.addmm.default"
    )
    assert kernel_features(gemm) == ("gemm", (4.0, 7.0, 3.0))


def test_replay_runs_the_operator_on_the_recorded_layouts() -> None:
    call = next(c for c in network_kernels(_net(), (3, 8, 8), 2) if "convolution" in c.op)
    out = replay(call)()
    assert tuple(out.shape) == call.outputs[0].shape


def test_sampled_primitives_stay_in_their_ranges() -> None:
    ranges = SamplingRanges(batch=(1, 8), size=(2, 16), channels=(3, 32), max_flops=1e8)
    prims = sample_primitives(np.random.default_rng(1), 50, ranges)
    assert len(prims) == 50 and {p.kind for p in prims} >= {"conv"}
    for p in prims:
        assert 1 <= p.batch <= 8 and p.size <= 16
        if p.kind == "conv":
            assert p.c_in <= 32 and (p.c_out == p.c_in or not p.depthwise)
    conv = next(p for p in prims if p.kind == "conv")
    near = neighbours(np.random.default_rng(2), conv, 4, ranges)
    assert near and all(q.kind == "conv" and q.kernel == conv.kernel for q in near)


def test_batch_norm_in_training_and_eval_mode_are_told_apart() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten())
    (train,) = [c for c in network_kernels(net, (3, 8, 8), 4, "training") if "batch_norm." in c.op]
    (infer,) = [c for c in network_kernels(net, (3, 8, 8), 4) if "batch_norm." in c.op]
    (_, t), (_, i) = kernel_features(train), kernel_features(infer)
    assert (t[0], t[2], t[3]) == (i[0], i[2], i[3])  # the same input, channels and window
    assert t[4] != i[4]  # but the training flag differs


def test_training_primitive_runs_backward_and_the_optimizer() -> None:
    p = Primitive("conv", 2, 4, 8, 6, kernel=3)
    ops = [c.op for c in kernel_calls(p, "training")]
    assert "aten.convolution_backward.default" in ops
    assert "aten.native_batch_norm_backward.default" in ops
    first = Primitive("conv", 2, 4, 8, 6, kernel=3, input_grad=False)
    bwd = next(c for c in kernel_calls(first, "training") if "backward" in c.op and "conv" in c.op)
    assert kernel_features(bwd)[1][8] == 1.0  # a first layer: the weight gradient only


def test_profile_cache_round_trip_records_its_protocol(tmp_path) -> None:
    prims = [
        Primitive("conv", 2, 4, 8, 6, kernel=3),
        Primitive("pool", 2, 4, 4, 6, 2, 2, variant="max"),
    ]
    first = profile_kernels(prims, "inference", policy=FAST, cache=tmp_path)
    assert first.samples and first.seconds_spent > 0
    assert first.protocol["policy"]["rounds"] == 3 and first.protocol["threads"] == 1
    assert all(len(s.rounds) == 3 and s.seconds == min(s.rounds) for s in first.samples)
    again = profile_kernels(prims, "inference", policy=FAST, cache=tmp_path)
    assert again.seconds_spent < first.seconds_spent
    assert sorted(s.seconds for s in again.samples) == sorted(s.seconds for s in first.samples)
    assert len(list(tmp_path.glob("kernels-*.json"))) == 1


def _synthetic_profile(rng: np.random.Generator, n: int = 200) -> KernelProfile:
    samples = []
    for _ in range(n):
        b, c, h, k = (
            rng.integers(1, 16),
            rng.integers(3, 64),
            rng.integers(4, 32),
            rng.integers(3, 64),
        )
        feats = (float(b), float(c), float(h), float(h), float(k), 9.0, 1.0, 1.0, 1.0)
        t = 1e-6 + 2 * b * k * h * h * c * 9 / 5e10
        samples.append(KernelSample("aten.convolution.default", "conv", feats, t, (t,), 0))
    for n_el in rng.integers(1_000, 1_000_000, 60):
        samples.append(
            KernelSample(
                "aten.relu.default", "generic", (n_el, n_el, 9.0, 1.0, 1.0), 1e-9 * n_el, (), 0
            )
        )
    return KernelProfile("inference", samples, [], {})


def test_kernel_model_recovers_a_synthetic_conv_cost_and_falls_back_outside() -> None:
    model = KernelModel(trees=100).fit([_synthetic_profile(np.random.default_rng(0))])
    calls = network_kernels(
        nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.ReLU()), (16, 16, 16), 8
    )
    pred = model.predict_calls(calls)
    truth = 1e-6 + 2 * 8 * 32 * 16 * 16 * 16 * 9 / 5e10
    assert abs(pred[0] / truth - 1) < 0.05
    assert model.coverage(calls[:1]) == 1.0
    huge = network_kernels(nn.Conv2d(16, 512, 3, padding=1, bias=False), (16, 16, 16), 8)
    assert model.coverage(huge) == 0.0  # 512 output channels: outside every sample
    assert model.predict_calls(huge)[0] > 0


def test_network_sum_equals_kernel_predictions_added() -> None:
    model = KernelModel(trees=50).fit([_synthetic_profile(np.random.default_rng(1))])
    calls = network_kernels(_net(), (3, 8, 8), 4)
    net = NetworkKernelPredictor(model, dispatch=2e-6)
    assert net.seconds(calls) == pytest.approx(model.predict_calls(calls).sum() + 2e-6 * len(calls))
    with pytest.raises(PerfmodelError, match="no kernels"):
        net.kernel_sum([])


def test_held_out_dispatch_uses_other_families_only() -> None:
    model = KernelModel(trees=50).fit([_synthetic_profile(np.random.default_rng(2))])
    net = NetworkKernelPredictor(model)
    calls = [network_kernels(_net(), (3, 8, 8), b) for b in (2, 4, 2, 4)]
    sums = np.array([net.kernel_sum(c) for c in calls])
    n = np.array([len(c) for c in calls])
    measured = sums + np.array([1e-5, 1e-5, 3e-5, 3e-5]) * n  # family b pays 3x the dispatch
    held = held_out_dispatch(net, calls, measured, ["a", "a", "b", "b"])
    assert held[0] == pytest.approx(sums[0] + 3e-5 * n[0], rel=1e-6)  # a predicted from b
    assert held[2] == pytest.approx(sums[2] + 1e-5 * n[2], rel=1e-6)
    with pytest.raises(PerfmodelError, match="families"):
        held_out_dispatch(net, calls, measured, ["a"] * 4)


def test_noise_ceiling_compares_each_round_with_the_others() -> None:
    ape = noise_ceiling([(1.0, 1.1), (2.0,)])  # a timing of one round tells nothing
    assert ape == pytest.approx([0.1, 1 - 1 / 1.1])
    with pytest.raises(PerfmodelError, match="positive"):
        noise_ceiling([(1.0, 0.0)])


def test_networks_and_kernels_end_to_end(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    assert steady_allocator()["allocator"] in ("glibc", "default")
    grid = GridConfig(
        families=("resnet", "vgg"),
        widths=(0.25,),
        resolutions=(8,),
        batches=(2,),
        timing=TimingConfig(repeats=1),
    )
    nets = collect_networks(grid, policy=FAST)
    assert len(nets.rows) == 2 and nets.protocol["policy"]["rounds"] == 3
    assert all(len(v) == 3 for v in nets.rounds.values())
    assert nets.ceiling("inference").shape == (6,)
    prims = sample_primitives(
        np.random.default_rng(0), 40, SamplingRanges(batch=(1, 4), size=(4, 8), channels=(3, 16))
    )
    fit = fit_kernel_model(prims, ("inference",), rounds=1, max_new=4, trees=30, policy=FAST)
    assert fit.model.predictors and len(fit.errors) >= 1
    predictor = KernelLatencyPredictor.fit(fit.model, nets, mode="inference")
    net = _net().train()
    est = predict_latency(net, (3, 8, 8), 2, 1, predictor=predictor)
    assert est.low <= est.seconds <= est.high and net.training  # the caller's mode is kept
    with pytest.raises(PerfmodelError, match="thread"):
        predict_latency(net, (3, 8, 8), 2, 2, predictor=predictor)


def test_dispatch_fit_recovers_a_per_call_cost() -> None:
    X = np.array([[1e-3, 100], [2e-3, 50], [5e-4, 300], [4e-3, 20]], dtype=float)
    y = X[:, 0] + 7e-6 * X[:, 1]
    fit = DispatchFit().fit(X, y)
    assert fit.dispatch == pytest.approx(7e-6, rel=1e-9)
    assert fit.predict(X) == pytest.approx(y)


def test_time_models_keeps_the_minimum_of_round_medians() -> None:
    models = {"small": nn.Conv2d(3, 4, 3), "large": nn.Conv2d(3, 64, 3)}
    result = time_models(models, (3, 16, 16), 2, policy=FAST)
    assert set(result.seconds) == {"small", "large"}
    for name in models:
        assert result.seconds[name] == min(result.round_medians(name))
        assert len(result.round_medians(name)) == 3
    assert steady_allocator() == steady_allocator()  # applied once, then unchanged
