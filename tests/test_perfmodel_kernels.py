"""Kernel-level prediction: the fusion rule, per-kernel forests, adaptive sampling, sums."""

from __future__ import annotations

import numpy as np
import pytest

from hpcnb.perfmodel.kernels import (
    KernelPredictor,
    adaptive_fit,
    fit_dispatch,
    fusion_rule,
    network_seconds,
    time_fusion,
)
from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.perfmodel.roundrobin import RoundRobinPolicy, measure_round_robin

FEATURES = ("size", "cin", "cout", "kernel")


def _work(x: np.ndarray) -> np.ndarray:
    """FLOPs and bytes of a configuration (the derived features)."""
    size, cin, cout, k = x.T
    return np.column_stack([2 * size**2 * cin * cout * k**2, 4 * size**2 * (cin + cout)])


def _cost(x: np.ndarray) -> np.ndarray:
    """A synthetic convolution: compute-bound term, memory term, fixed overhead."""
    size, cin, cout, k = x.T
    flops = 2 * size**2 * cin * cout * k**2
    bytes_ = 4 * size**2 * (cin + cout)
    return 5e-6 + flops / 5e10 + bytes_ / 1e10


def _sample(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.column_stack(
        [
            rng.integers(4, 65, n),
            rng.integers(3, 257, n),
            rng.integers(3, 257, n),
            rng.choice([1, 3, 5], n),
        ]
    ).astype(float)


def _near(rng: np.random.Generator, row: np.ndarray, n: int) -> np.ndarray:
    out = np.repeat(row[None], n, axis=0)
    out[:, :3] = np.clip(out[:, :3] * rng.uniform(0.85, 1.15, (n, 3)), 3, None).round()
    return out


def test_fusion_rule_on_two_synthetic_timings() -> None:
    assert fusion_rule(2e-3, 1e-3, 2.3e-3)  # saves 0.7 of the cheaper one
    assert not fusion_rule(2e-3, 1e-3, 2.7e-3)  # saves 0.3: two kernels
    with pytest.raises(PerfmodelError, match="threshold"):
        fusion_rule(1.0, 1.0, 1.0, threshold=0)

    now = [0.0]

    def op(cost: float):
        def run() -> None:
            now[0] += cost

        return run

    def timer(kernels):
        policy = RoundRobinPolicy(min_sample_seconds=1e-3)
        return measure_round_robin(
            kernels,
            op(1e-4),
            policy,
            clock=lambda: now[0],
            load=lambda: (0.0, 0.0, 0.0),
            pause=lambda s: None,
        ).seconds

    fused = time_fusion(("conv", op(2e-3)), ("relu", op(1e-3)), op(2.2e-3), timer)
    apart = time_fusion(("conv", op(2e-3)), ("add", op(1e-3)), op(3e-3), timer)
    assert fused.fused and fused.saving == pytest.approx(0.8)
    assert not apart.fused and apart.saving == pytest.approx(0.0, abs=1e-9)


def test_forest_recovers_a_known_cost_function_within_5_percent() -> None:
    rng = np.random.default_rng(1)
    fit = adaptive_fit(
        KernelPredictor(FEATURES, trees=100, derived=_work),
        _sample,
        _near,
        _cost,
        initial=1500,
        rounds=2,
        seed=0,
    )
    assert len(fit.x) > 1500  # resampling added points where the forest was wrong
    assert fit.errors[-1] <= fit.errors[0] + 0.01
    held_out = _sample(rng, 400)
    errors = np.abs(fit.predictor.predict(held_out) / _cost(held_out) - 1)
    assert float(np.mean(errors)) < 0.05, float(np.mean(errors))


def test_network_time_is_the_sum_of_its_kernels_plus_dispatch() -> None:
    rng = np.random.default_rng(2)
    predictor = KernelPredictor(FEATURES, trees=50).fit(_sample(rng, 300), _cost(_sample(rng, 300)))
    layers = _sample(rng, 6)
    per_kernel = predictor.predict(layers)
    assert network_seconds(per_kernel) == pytest.approx(float(per_kernel.sum()))
    assert network_seconds(per_kernel, 1e-5) == pytest.approx(float(per_kernel.sum()) + 6e-5)
    with pytest.raises(PerfmodelError, match="dispatch"):
        network_seconds(per_kernel, -1.0)
    # the dispatch constant is recovered from networks whose true time adds 20 us per kernel
    sums = np.array([1e-3, 2e-3, 5e-3, 4e-4])
    counts = np.array([10, 20, 40, 8])
    assert fit_dispatch(sums, counts, sums + 2e-5 * counts) == pytest.approx(2e-5)
    assert fit_dispatch(sums, counts, sums * 0.9) == 0.0  # never negative


def test_predictor_refuses_bad_input() -> None:
    predictor = KernelPredictor(FEATURES)
    with pytest.raises(PerfmodelError, match="fit it first"):
        predictor.predict(np.ones((1, 4)))
    with pytest.raises(PerfmodelError, match="positive"):
        predictor.fit(np.zeros((3, 4)), np.ones(3))
    with pytest.raises(PerfmodelError, match="one positive time"):
        predictor.fit(np.ones((3, 4)), np.ones(2))
    with pytest.raises(PerfmodelError, match="initial"):
        adaptive_fit(predictor, _sample, _near, _cost, initial=1)
