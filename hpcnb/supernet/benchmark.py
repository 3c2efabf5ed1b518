"""Side-by-side measurement of a subnet against its full model on the CPU.

:func:`compare_models` measures, in one run and with the same thread count, each
model's FLOPs (from the IR), accuracy on held-out data, latency (batch of one) and
throughput (a large batch), as medians over repeats after a warm-up, and derives the
ratios the OSF paper reports: FLOPs reduction, throughput gain and latency reduction.
The two models are timed in interleaved rounds so that load from other processes on a
shared machine hits both alike; each round times every model with
:func:`hpcnb.timing.median_time` under :func:`hpcnb.timing.pinned_threads`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import nn

from hpcnb.errors import InvalidInputError
from hpcnb.models.metrics import top1_accuracy
from hpcnb.stats import Estimate, difference_interval
from hpcnb.timing import median_time, pinned_threads

__all__ = ["ModelComparison", "ModelMeasurement", "compare_models"]


@dataclass(frozen=True)
class ModelMeasurement:
    """One model's numbers.

    Attributes:
        flops: FLOPs of one example (multiply-add = 2).
        params: Trainable parameters.
        accuracy: Top-1 accuracy on the held-out set.
        latency_s: Median seconds for a batch of one.
        throughput: Median examples per second at the throughput batch size.
        correct: Held-out items classified correctly.
        total: Held-out items (``accuracy = correct / total``).
        latency_rounds: Median latency of each interleaved round (seconds).
        throughput_rounds: Median throughput of each interleaved round (examples/s).
    """

    flops: float
    params: int
    accuracy: float
    latency_s: float
    throughput: float
    correct: int = 0
    total: int = 0
    latency_rounds: tuple[float, ...] = ()
    throughput_rounds: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelComparison:
    """A subnet against the full model, measured in the same run.

    Attributes:
        full: The full model's numbers.
        subnet: The subnet's numbers.
        threads: Torch threads used for timing.
    """

    full: ModelMeasurement
    subnet: ModelMeasurement
    threads: int

    @property
    def flops_reduction(self) -> float:
        """``1 - subnet FLOPs / full FLOPs``."""
        return 1.0 - self.subnet.flops / self.full.flops

    @property
    def accuracy_drop(self) -> float:
        """``full accuracy - subnet accuracy`` (absolute; negative means the subnet is better)."""
        return self.full.accuracy - self.subnet.accuracy

    @property
    def throughput_gain(self) -> float:
        """``subnet throughput / full throughput``."""
        return self.subnet.throughput / self.full.throughput

    @property
    def latency_reduction(self) -> float:
        """``1 - subnet latency / full latency``."""
        return 1.0 - self.subnet.latency_s / self.full.latency_s

    @property
    def throughput_gain_samples(self) -> tuple[float, ...]:
        """Per interleaved round, ``subnet throughput / full throughput``."""
        return tuple(
            s / f
            for s, f in zip(self.subnet.throughput_rounds, self.full.throughput_rounds, strict=True)
        )

    @property
    def latency_reduction_samples(self) -> tuple[float, ...]:
        """Per interleaved round, ``1 - subnet latency / full latency``."""
        return tuple(
            1.0 - s / f
            for s, f in zip(self.subnet.latency_rounds, self.full.latency_rounds, strict=True)
        )

    def accuracy_drop_interval(self, confidence: float = 0.95) -> Estimate:
        """The accuracy drop with Newcombe's interval over the test items.

        The two models are scored on the same items, so the interval (which assumes
        independent samples) is conservative; ``n`` is the items of both models.

        Args:
            confidence: Coverage of the interval.
        """
        return difference_interval(
            self.full.correct,
            self.full.total,
            self.subnet.correct,
            self.subnet.total,
            confidence=confidence,
        )

    def table(self) -> list[dict[str, float | str]]:
        """Rows for a pandas table: one per model."""
        rows: list[dict[str, float | str]] = []
        for name, m in (("full", self.full), ("subnet", self.subnet)):
            rows.append(
                {
                    "model": name,
                    "MFLOPs": m.flops / 1e6,
                    "params": m.params,
                    "accuracy": m.accuracy,
                    "latency_ms": m.latency_s * 1e3,
                    "throughput_per_s": m.throughput,
                }
            )
        return rows


def compare_models(
    full: nn.Module,
    subnet: nn.Module,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    flops: tuple[float, float],
    *,
    batch_size: int = 256,
    repeats: int = 30,
    rounds: int = 3,
    threads: int = 1,
) -> ModelComparison:
    """Measure a full model and a subnet side by side.

    Args:
        full: The full model.
        subnet: The subnet.
        x_test: Held-out inputs (also the timing inputs).
        y_test: Held-out labels.
        flops: ``(full FLOPs, subnet FLOPs)`` per example.
        batch_size: Batch of the throughput measurement.
        repeats: Timed calls per round.
        rounds: Interleaved rounds (full, subnet, full, subnet, ...); each round gives one
            sample of the latency and throughput ratios.
        threads: Torch threads during timing (restored afterwards).

    Raises:
        InvalidInputError: Empty test set or non-positive sizes.
    """
    if len(x_test) == 0 or batch_size < 1 or repeats < 1 or rounds < 1:
        raise InvalidInputError(
            f"compare_models: need a test set, batch_size={batch_size}, repeats={repeats}, "
            f"rounds={rounds} all >= 1"
        )
    with pinned_threads(threads, numba=False, blas=False):
        models = {"full": full.eval(), "subnet": subnet.eval()}
        one = x_test[:1]
        big = x_test[:batch_size]
        if len(big) < batch_size:
            reps = -(-batch_size // len(big))
            big = big.repeat(reps, *([1] * (big.dim() - 1)))[:batch_size]
        lat: dict[str, list[tuple[float, ...]]] = {k: [] for k in models}
        thr: dict[str, list[tuple[float, ...]]] = {k: [] for k in models}
        with torch.inference_mode():
            for _ in range(rounds):
                for name, m in models.items():
                    lat[name].append(
                        median_time(partial(m, one), repeats=repeats, warmup=3).samples
                    )
                    thr[name].append(
                        median_time(partial(m, big), repeats=max(3, repeats // 4), warmup=3).samples
                    )
        meas = {}
        for (name, m), f in zip(models.items(), flops, strict=True):
            correct = round(top1_accuracy(m, x_test, y_test) * len(y_test))
            meas[name] = ModelMeasurement(
                flops=float(f),
                params=sum(p.numel() for p in m.parameters()),
                accuracy=correct / len(y_test),
                latency_s=float(np.median(np.concatenate(lat[name]))),
                throughput=float(batch_size / np.median(np.concatenate(thr[name]))),
                correct=correct,
                total=len(y_test),
                latency_rounds=tuple(float(np.median(r)) for r in lat[name]),
                throughput_rounds=tuple(float(batch_size / np.median(r)) for r in thr[name]),
            )
    return ModelComparison(meas["full"], meas["subnet"], threads)
