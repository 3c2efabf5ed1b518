"""The gloo all-reduce micro-benchmark and DDP check (2 processes on localhost)."""

from __future__ import annotations

import math

import pytest

from hpcnb.perfmodel import DistributedConfig, run_distributed_benchmark


@pytest.mark.slow
def test_two_process_benchmark_and_ddp() -> None:
    config = DistributedConfig(
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


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="world_size"):
        run_distributed_benchmark(DistributedConfig(world_size=1))
    with pytest.raises(ValueError, match="multiple of 4"):
        run_distributed_benchmark(DistributedConfig(message_bytes=(3, 8)))
    with pytest.raises(ValueError, match="builder"):
        run_distributed_benchmark(DistributedConfig(builder="nowhere"))
