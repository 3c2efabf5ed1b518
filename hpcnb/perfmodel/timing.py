"""Timing harness for inference and training steps, and the roofline micro-benchmarks.

Every measurement pins the torch thread pool to a fixed count, runs untimed warm-up
iterations, then reports the *median* of timed repetitions. Two clocks are offered:

* ``"wall"``: :func:`time.perf_counter`, elapsed time;
* ``"cpu"``: :func:`time.process_time`, CPU seconds used by this process. With one torch
  thread the work runs on the calling thread, so on an otherwise idle core the two agree;
  on a *shared* machine the CPU clock does not count the time the process waits while other
  users' processes hold the core, which makes it the far more repeatable measure there.
  With several threads it sums their CPU time and is not a runtime; use ``"wall"``.

What is timed:

* inference: one forward pass under ``torch.no_grad()`` in ``eval()`` mode;
* training: one step = ``zero_grad`` + forward + cross-entropy loss + backward +
  ``SGD(momentum=0.9).step()`` in ``train()`` mode.

The roofline baseline needs the machine's peak arithmetic rate and memory bandwidth;
:func:`peak_flops` times a large float32 matrix product and :func:`memory_bandwidth` a
large tensor copy, both with the same thread count.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "StepTiming",
    "TimingConfig",
    "fixed_threads",
    "median_seconds",
    "memory_bandwidth",
    "peak_flops",
    "time_inference",
    "time_training",
]


@dataclass(frozen=True)
class TimingConfig:
    """How to time one configuration.

    Attributes:
        threads: torch intra-op threads during timing.
        warmup: Untimed iterations first.
        repeats: Timed iterations (median reported).
        clock: ``"wall"`` (elapsed) or ``"cpu"`` (process CPU time; one thread only).
    """

    threads: int = 1
    warmup: int = 2
    repeats: int = 5
    clock: str = "cpu"

    def __post_init__(self) -> None:
        if self.clock not in ("wall", "cpu"):
            raise ValueError(f"TimingConfig.clock={self.clock!r}: expected 'wall' or 'cpu'")
        if self.clock == "cpu" and self.threads != 1:
            raise ValueError(
                f"TimingConfig(clock='cpu', threads={self.threads}): the CPU clock measures "
                "runtime only with one thread; use clock='wall'"
            )
        if self.threads < 1 or self.warmup < 0 or self.repeats < 1:
            raise ValueError(
                f"TimingConfig(threads={self.threads}, warmup={self.warmup}, "
                f"repeats={self.repeats}): need threads >= 1, warmup >= 0, repeats >= 1"
            )


@dataclass(frozen=True)
class StepTiming:
    """Median and spread of one timed operation.

    Attributes:
        median: Median seconds.
        minimum: Fastest repetition, seconds.
        maximum: Slowest repetition, seconds.
        repeats: Number of timed repetitions.
    """

    median: float
    minimum: float
    maximum: float
    repeats: int


@contextmanager
def fixed_threads(threads: int) -> Iterator[None]:
    """Pin torch's intra-op thread pool to ``threads`` inside the block, then restore it.

    Raises:
        ValueError: ``threads`` below 1.
    """
    if threads < 1:
        raise ValueError(f"threads={threads}: expected >= 1")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def median_seconds(fn: Callable[[], object], config: TimingConfig) -> StepTiming:
    """Time ``fn`` with warm-up and return the median of the repetitions.

    Args:
        fn: The operation (called ``warmup + repeats`` times).
        config: Thread count, warm-up and repeats.
    """
    clock = time.process_time if config.clock == "cpu" else time.perf_counter
    with fixed_threads(config.threads):
        for _ in range(config.warmup):
            fn()
        samples = []
        for _ in range(config.repeats):
            start = clock()
            fn()
            samples.append(clock() - start)
    return StepTiming(statistics.median(samples), min(samples), max(samples), len(samples))


def time_inference(model: nn.Module, x: torch.Tensor, config: TimingConfig) -> StepTiming:
    """Median seconds of one forward pass under ``no_grad`` in eval mode.

    Args:
        model: The network (put in eval mode).
        x: Input batch.
        config: Timing settings.
    """
    model.eval()

    def forward() -> None:
        with torch.no_grad():
            model(x)

    return median_seconds(forward, config)


def time_training(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TimingConfig
) -> StepTiming:
    """Median seconds of one training step (forward, backward, SGD step) in train mode.

    Args:
        model: The network (put in train mode; its weights change).
        x: Input batch.
        y: Integer class labels, one per sample.
        config: Timing settings.
    """
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return median_seconds(step, config)


def peak_flops(config: TimingConfig, n: int = 768) -> float:
    """Measured float32 matrix-product rate, FLOP/s (``2 n³`` per product).

    Args:
        config: Thread count and repetitions.
        n: Matrix order.
    """
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    out = torch.empty(n, n)
    timing = median_seconds(lambda: torch.mm(a, b, out=out), config)
    return 2.0 * n**3 / timing.minimum


def memory_bandwidth(config: TimingConfig, megabytes: int = 64) -> float:
    """Measured copy bandwidth, bytes/s (a copy reads and writes each byte once).

    Args:
        config: Thread count and repetitions.
        megabytes: Size of the copied buffer (well above the last-level cache).
    """
    src = torch.ones(megabytes * (1 << 20) // 4)
    dst = torch.empty_like(src)
    timing = median_seconds(lambda: dst.copy_(src), config)
    return 2.0 * src.numel() * 4 / timing.minimum
