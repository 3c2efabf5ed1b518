"""Tests of the noise-aware timing protocol, the ±10 % metric and predict_latency."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

import hpcnb.perfmodel.dataset as dataset_module
from hpcnb.errors import HpcnbError
from hpcnb.perfmodel import (
    GridConfig,
    LatencyPredictor,
    Measurement,
    NoisePolicy,
    OpCostModel,
    TimingConfig,
    collect_dataset,
    network_features,
    predict_latency,
    within_share,
)
from hpcnb.perfmodel.dataset import build_network, summarize
from hpcnb.perfmodel.evaluation import family_scores, random_split, score, share_interval
from hpcnb.perfmodel.opmodel import op_design_matrix, op_feature_names
from hpcnb.perfmodel.protocol import (
    PerfmodelError,
    ProtocolTiming,
    dispersion,
    measure_until_quiet,
    noise_floor,
)
from hpcnb.timing import Timing

QUIET = (0.1, 0.1, 0.1)
CLEAN = [1.00, 1.01, 0.99, 1.00, 1.02]
DISTURBED = [1.00, 2.70, 0.99, 3.10, 1.02]  # two injected outliers out of five


def test_dispersion_is_iqr_over_median() -> None:
    assert dispersion([2.0, 2.0, 2.0]) == 0.0
    assert dispersion([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0 / 3.0)
    assert dispersion(CLEAN) < 0.1 < dispersion(DISTURBED)
    with pytest.raises(PerfmodelError, match="at least one"):
        dispersion([])
    with pytest.raises(HpcnbError, match="positive"):
        dispersion([0.0, 0.0])


def test_disturbed_measurement_is_detected_and_remeasured() -> None:
    calls: list[int] = []

    def timer() -> list[float]:
        calls.append(1)
        return DISTURBED if len(calls) == 1 else CLEAN

    t = measure_until_quiet(timer, NoisePolicy(), load=lambda: QUIET, cores=2)
    assert len(calls) == 2 and t.attempts == 2
    assert t.samples == tuple(CLEAN) and not t.noisy
    assert t.history[0][0] > 0.1 >= t.history[1][0]
    assert t.history[1][2] == pytest.approx(1.00)  # each attempt's median is kept
    assert t.between_attempts == pytest.approx((1.02 - 1.00) / 1.01)
    assert np.isnan(
        measure_until_quiet(lambda: CLEAN, NoisePolicy(), load=lambda: QUIET).between_attempts
    )


def test_persistently_noisy_measurement_is_flagged_after_bounded_retries() -> None:
    calls: list[int] = []

    def timer() -> list[float]:
        calls.append(1)
        return DISTURBED

    t = measure_until_quiet(timer, NoisePolicy(retries=3), load=lambda: QUIET, cores=2)
    assert len(calls) == 4 and t.attempts == 4
    assert t.flags == ("dispersion",) and t.noisy
    once = measure_until_quiet(timer, NoisePolicy(retries=0), load=lambda: QUIET, cores=2)
    assert once.attempts == 1 and once.noisy


def test_load_above_core_count_triggers_a_remeasure() -> None:
    loads = iter([(5.0, 3.0, 2.0), (1.0, 2.0, 2.0)])
    t = measure_until_quiet(lambda: CLEAN, NoisePolicy(), load=lambda: next(loads), cores=2)
    assert t.attempts == 2 and not t.noisy and t.load[0] == 1.0
    busy = measure_until_quiet(
        lambda: CLEAN, NoisePolicy(retries=1), load=lambda: (3.0, 3.0, 3.0), cores=2
    )
    assert busy.attempts == 2 and busy.flags == ("load",)
    with pytest.raises(PerfmodelError, match="retries"):
        NoisePolicy(retries=-1)


def test_protocol_timing_round_trips_through_json() -> None:
    t = measure_until_quiet(
        lambda: DISTURBED,
        NoisePolicy(retries=1),
        load=lambda: QUIET,
        cores=2,
        threads=lambda: {"requested": 1, "clock": "cpu"},
    )
    again = ProtocolTiming.from_json(json.loads(json.dumps(t.to_json())))
    assert again == t
    assert noise_floor([t, again]) == pytest.approx(t.dispersion)
    with pytest.raises(PerfmodelError):
        ProtocolTiming.from_json({"samples": []})


class FakeTimer:
    """Stands in for time_inference / time_training: disturbed on chosen calls."""

    def __init__(self, disturbed_calls: set[int]) -> None:
        self.calls = 0
        self.disturbed_calls = disturbed_calls

    def __call__(self, *args: object) -> Timing:
        self.calls += 1
        return Timing.of(DISTURBED if self.calls in self.disturbed_calls else CLEAN)


def _tiny_grid() -> GridConfig:
    return GridConfig(
        families=("resnet",),
        widths=(0.25,),
        resolutions=(8,),
        batches=(2, 4),
        timing=TimingConfig(warmup=0, repeats=5),
    )


def test_dataset_keeps_samples_remeasures_and_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inference, training = FakeTimer({1}), FakeTimer(set())
    monkeypatch.setattr(dataset_module, "time_inference", inference)
    monkeypatch.setattr(dataset_module, "time_training", training)
    policy = NoisePolicy(max_load_per_core=1e6)  # this test injects noise, not load
    rows = collect_dataset(_tiny_grid(), cache_dir=tmp_path, policy=policy)
    # batch 2's inference was disturbed on its first attempt: measured again, clean now
    assert inference.calls == 3 and training.calls == 2
    assert rows[0].inference_timing.attempts == 2 and not rows[0].inference_timing.noisy
    assert rows[0].inference_s == pytest.approx(np.median(CLEAN))
    path = dataset_module.cache_file(tmp_path)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    entry = next(iter(json.loads(path.read_text())["timings"].values()))
    assert entry["inference"]["samples"] == CLEAN
    assert {"dispersion", "load", "threads", "flags", "cores"} <= set(entry["inference"])
    assert entry["inference"]["threads"]["requested"] == 1
    summary = summarize(rows)
    assert summary.timings == 4 and summary.remeasured == 1 and summary.noisy == 0
    # round trip: nothing is measured again and the timings come back equal
    again = collect_dataset(_tiny_grid(), cache_dir=tmp_path, policy=policy, remeasure="noisy")
    assert inference.calls == 3
    assert [(r.inference_timing, r.training_timing) for r in again] == [
        (r.inference_timing, r.training_timing) for r in rows
    ]
    collect_dataset(_tiny_grid(), cache_dir=tmp_path, policy=policy, remeasure="all")
    assert inference.calls == 5 and training.calls == 4
    with pytest.raises(PerfmodelError, match="remeasure"):
        collect_dataset(_tiny_grid(), cache_dir=tmp_path, remeasure="sometimes")  # type: ignore[arg-type]


def test_flagged_entries_are_remeasured_within_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inference, training = FakeTimer({1, 2, 3}), FakeTimer(set())
    monkeypatch.setattr(dataset_module, "time_inference", inference)
    monkeypatch.setattr(dataset_module, "time_training", training)
    policy = NoisePolicy(max_load_per_core=1e6, retries=2)
    rows = collect_dataset(_tiny_grid(), cache_dir=tmp_path, policy=policy)
    assert rows[0].inference_timing.flags == ("dispersion",)  # stayed noisy: flagged
    assert inference.calls == 4
    collect_dataset(_tiny_grid(), cache_dir=tmp_path, policy=policy, remeasure_budget_s=0.0)
    assert inference.calls == 4  # a zero budget re-measures nothing
    fixed = collect_dataset(_tiny_grid(), cache_dir=tmp_path, policy=policy, remeasure="noisy")
    assert inference.calls == 5 and not fixed[0].inference_timing.noisy
    # the re-measure keeps the earlier run's attempts in its history
    assert fixed[0].inference_timing.attempts == 4 and len(fixed[0].inference_timing.history) == 4
    # batch 2 was measured again (both modes): inference medians 1.02, 1.02, 1.02, 1.00
    # (spread 0.02 / 1.02), training 1.00, 1.00 (spread 0); the summary is their median
    assert fixed[0].inference_timing.between_attempts == pytest.approx(0.02 / 1.02)
    assert summarize(fixed).between_attempts == pytest.approx(0.01 / 1.02)


def test_unreadable_cache_is_measured_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inference = FakeTimer(set())
    monkeypatch.setattr(dataset_module, "time_inference", inference)
    monkeypatch.setattr(dataset_module, "time_training", FakeTimer(set()))
    path = dataset_module.cache_file(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{ not json")
    rows = collect_dataset(_tiny_grid(), cache_dir=tmp_path, remeasure="none")
    assert len(rows) == 2 and inference.calls >= 2
    assert json.loads(path.read_text())["version"] == dataset_module.CACHE_VERSION


def test_within_share_on_a_hand_made_table() -> None:
    measured = [10.0, 10.0, 10.0, 10.0, 20.0, 20.0, 20.0, 20.0]
    predicted = [10.5, 11.0, 12.0, 7.0, 19.0, 23.0, 20.0, 30.0]
    # relative errors: .05 .10 .20 .30 | .05 .15 .00 .50
    assert within_share(predicted, measured, 0.10) == pytest.approx(4 / 8)
    assert within_share(predicted, measured, 0.20) == pytest.approx(6 / 8)
    assert within_share(predicted, measured, 0.0) == pytest.approx(1 / 8)
    s = score(predicted, measured)
    assert (s.within_10, s.within_20, s.n) == (0.5, 0.75, 8)
    assert s.mape == pytest.approx(np.mean([0.05, 0.1, 0.2, 0.3, 0.05, 0.15, 0.0, 0.5]))
    per = family_scores(predicted, measured, ["a"] * 4 + ["b"] * 4)
    assert per["a"].within_10 == 0.5 and per["b"].within_20 == 0.75
    estimate = share_interval(predicted, measured, 0.10, seed=1)
    value, (low, high) = estimate.value, estimate.bounds
    assert value == 0.5 and 0.0 <= low <= value <= high <= 1.0 and estimate.n == 8
    with pytest.raises(PerfmodelError, match="tolerance"):
        share_interval(predicted, measured, -0.1)
    with pytest.raises(PerfmodelError, match="tolerance"):
        within_share(predicted, measured, -0.1)


def test_random_split_predicts_every_row_from_other_folds() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(1, 10, size=(20, 2))
    y = 0.5 + X @ np.array([0.2, 0.1])
    pred = random_split(OpCostModel, X, y, folds=4, seed=0)
    assert pred.shape == y.shape and np.allclose(pred, y, rtol=1e-6)
    with pytest.raises(PerfmodelError, match="folds"):
        random_split(OpCostModel, X, y, folds=1)


def _synthetic_rows() -> list[Measurement]:
    """Real features of three families, times from a known per-op cost list."""
    rows = []
    for family in ("resnet", "mobilenet_v2", "shufflenet"):
        for width in (0.25, 0.5):
            f = network_features(
                build_network(family, width),
                (3, 16, 16),
                f"{family}{width}",
                family,
                training=False,
            )
            for batch in (2, 8):
                row = Measurement(f, batch, 0.0, 0.0)
                x = op_design_matrix([row], "inference", 1 << 20)[0]
                t = 1e-4 + 2e-5 * x[:6].sum() + 1e-10 * x[6:12].sum() + 2e-10 * x[12]
                rows.append(Measurement(f, batch, float(t), float(t)))
    return rows


def test_predict_latency_monotone_in_flops_on_a_width_sweep() -> None:
    rows = _synthetic_rows()
    predictor = LatencyPredictor.fit(rows, threads=1, cache_bytes=1 << 20)
    assert len(op_feature_names("inference")) == predictor.model.n_features_in_
    sweep = []
    for width in (0.2, 0.35, 0.5, 0.75, 1.0):
        net = build_network("mobilenet_v2", width)
        flops = network_features(net, (3, 16, 16), training=False).forward_flops
        est = predict_latency(net, (3, 16, 16), 4, 1, predictor=predictor)
        assert est.low <= est.seconds <= est.high and est.confidence == 0.9
        sweep.append((flops, est.seconds))
    sweep.sort()
    seconds = [s for _, s in sweep]
    assert all(a <= b for a, b in itertools.pairwise(seconds))
    assert seconds[-1] > seconds[0]
    with pytest.raises(PerfmodelError, match="thread"):
        predict_latency(build_network("resnet", 0.25), (3, 16, 16), 4, 2, predictor=predictor)
    with pytest.raises(PerfmodelError, match="batch"):
        predict_latency(build_network("resnet", 0.25), (3, 16, 16), 0, 1, predictor=predictor)


def test_default_predictor_fits_on_a_given_small_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcnb.perfmodel.predict import default_predictor

    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    monkeypatch.setattr(dataset_module, "time_inference", FakeTimer(set()))
    monkeypatch.setattr(dataset_module, "time_training", FakeTimer(set()))
    grid = GridConfig(
        families=("resnet", "vgg"),
        widths=(0.25,),
        resolutions=(8,),
        batches=(2, 4),
        timing=TimingConfig(warmup=0, repeats=5),
    )
    predictor = default_predictor(1, "inference", grid, primitives=30)
    assert predictor.rows == 4 and predictor.threads == 1
    assert default_predictor(1, "inference", grid, primitives=30) is predictor  # memoised
    folder = tmp_path / "perfmodel"  # under the shared cache root
    assert list(folder.glob("networks-*.json")) and list(folder.glob("kernels-*.json"))
    with pytest.raises(PerfmodelError, match="threads"):
        default_predictor(2, "inference", grid)


def test_the_fastest_clean_attempt_is_kept() -> None:
    slower = [1.10, 1.11, 1.09, 1.10, 1.12]  # clean but shifted up, as under cache contention
    runs = iter([slower, CLEAN])
    loads = iter([(3.0, 3.0, 3.0), (3.0, 3.0, 3.0)])  # both under load: no early stop
    t = measure_until_quiet(
        lambda: next(runs), NoisePolicy(retries=1), load=lambda: next(loads), cores=2
    )
    assert t.attempts == 2 and t.samples == tuple(CLEAN) and t.flags == ("load",)
    assert t.between_attempts == pytest.approx(0.10 / 1.05)
