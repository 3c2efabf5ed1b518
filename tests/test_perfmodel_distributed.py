"""The gloo all-reduce micro-benchmark and DDP check (2 processes on localhost)."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch import nn

from hpcnb.perfmodel.allreduce import AlphaBeta
from hpcnb.perfmodel.distributed import (
    DistributedConfig,
    DistributedReport,
    resolve_builder,
    run_distributed_benchmark,
    small_convnet,
)
from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.plugins import PluginError

FACTORIES = "perfmodel_user_factories"  # a module outside the package, written per test
FACTORY_SOURCE = """
from torch import nn

from hpcnb.perfmodel.distributed import small_convnet

NOT_CALLABLE = 3


def convnet(width=16, num_classes=10, in_channels=3):
    return small_convnet(width=width, num_classes=num_classes, in_channels=in_channels)


def linear(features=4, num_classes=3):
    return nn.Sequential(nn.Flatten(), nn.Linear(features, num_classes))
"""


@pytest.fixture
def user_factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The module name of a factory module in ``tmp_path``, put on ``sys.path``.

    Spawned ranks receive the parent's ``sys.path``, so they import it too.
    """
    (tmp_path / f"{FACTORIES}.py").write_text(FACTORY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(FACTORIES, None)
    yield FACTORIES
    sys.modules.pop(FACTORIES, None)


@pytest.mark.slow
def test_two_process_benchmark_and_ddp(user_factories: str) -> None:
    config = DistributedConfig(
        builder=f"{user_factories}:convnet",
        message_bytes=(4, 65536, 1 << 20),
        repeats=3,
        warmup=1,
        local_batch=8,
        input_shape=(3, 16, 16),
        builder_kwargs={"width": 8},
        timeout_s=90.0,
    )
    report = run_distributed_benchmark(config)
    assert report.world_size == 2
    assert len(report.allreduce_s) == 3 and min(report.allreduce_s) > 0
    assert report.fit.alpha >= 0 and report.fit.beta >= 0
    assert report.fit.alpha + report.fit.beta > 0
    # gradients of small_convnet(width=8): three conv stages, no bias, BN and classifier
    assert report.gradient_bytes == 4 * (
        3 * 8 * 9 + 8 * 16 * 9 + 16 * 32 * 9 + 2 * (8 + 16 + 32) + 32 * 10 + 10
    )
    assert report.step_1proc_s > 0 and report.step_nproc_s > 0
    # the prediction adds modelled communication to the measured compute
    assert report.predicted_step(2) >= report.compute_together_s
    assert math.isfinite(report.prediction_error(2))
    # every timed round is kept; the medians are their medians
    assert len(report.step_nproc_samples) == len(report.compute_together_samples) == 3
    assert len(report.step_1proc_samples) == len(report.compute_alone_samples) == 3
    assert report.step_nproc_s == statistics.median(report.step_nproc_samples)
    errors = report.error_samples(2)
    assert len(errors) == 3 and all(math.isfinite(e) and e >= 0 for e in errors)
    comm = report.communication_s(2)
    c, m = report.compute_together_samples[0], report.step_nproc_samples[0]
    assert errors[0] == pytest.approx(abs(c + comm - m) / m)
    assert report.error_samples(1)[0] == pytest.approx(
        abs(report.compute_alone_samples[0] - report.step_1proc_samples[0])
        / report.step_1proc_samples[0]
    )
    with pytest.raises(PerfmodelError, match="processes"):
        report.error_samples(3)


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="world_size"):
        run_distributed_benchmark(DistributedConfig(world_size=1))
    with pytest.raises(ValueError, match="multiple of 4"):
        run_distributed_benchmark(DistributedConfig(message_bytes=(3, 8)))
    with pytest.raises(PluginError, match=r"DistributedConfig\.builder: model factory 'nowhere'"):
        run_distributed_benchmark(DistributedConfig(builder="nowhere"))


def test_builder_is_a_model_factory_reference(user_factories: str) -> None:
    assert resolve_builder(DistributedConfig().builder) is small_convnet
    model = resolve_builder(f"{user_factories}:linear")(features=6)
    assert isinstance(model, nn.Module) and model[1].in_features == 6
    failures = {
        f"{user_factories}:missing": "has no attribute 'missing'",
        f"{user_factories}:NOT_CALLABLE": "is a int, not a callable",
        "perfmodel_no_such_module:convnet": "cannot import 'perfmodel_no_such_module'",
        "not a reference": "expected 'package.module:attr'",
    }
    for reference, message in failures.items():
        with pytest.raises(PluginError, match=r"^DistributedConfig\.builder: ") as caught:
            resolve_builder(reference)
        assert message in str(caught.value), reference


def test_error_samples_by_hand() -> None:
    report = DistributedReport(
        world_size=2,
        message_bytes=(4, 8),
        allreduce_s=(1e-5, 2e-5),
        fit=AlphaBeta(alpha=1e-3, beta=0.0),
        gradient_bytes=400,
        buffer_bytes=0,
        compute_alone_s=0.010,
        compute_together_s=0.012,
        step_1proc_s=0.011,
        step_nproc_s=0.015,
        compute_alone_samples=(0.010, 0.010),
        compute_together_samples=(0.012, 0.013),
        step_1proc_samples=(0.011, 0.010),
        step_nproc_samples=(0.015, 0.016),
    )
    # ring on 2 ranks: 2 (p - 1) alpha = 2 ms of communication
    assert report.communication_s(2) == pytest.approx(2e-3)
    assert report.error_samples(2) == pytest.approx((1e-3 / 0.015, 1e-3 / 0.016))
    assert report.error_samples(1) == pytest.approx((1e-3 / 0.011, 0.0))
    assert report.predicted_step(2) == pytest.approx(0.014)
    bare = DistributedReport(**{**report.__dict__, "step_nproc_samples": ()})
    with pytest.raises(PerfmodelError, match="no per-round samples"):
        bare.error_samples(2)


def test_configuration_is_checked_when_made() -> None:
    with pytest.raises(ValueError, match="warmup"):
        DistributedConfig(repeats=0)
    with pytest.raises(ValueError, match="local_batch"):
        DistributedConfig(local_batch=0)
