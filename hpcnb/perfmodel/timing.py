"""What perfmodel times: one inference pass, one training step, and the roofline's rates.

Every measurement goes through :mod:`hpcnb.timing`: thread pools pinned to
:attr:`TimingConfig.threads` (:func:`hpcnb.timing.pinned_threads`), untimed warm-up
iterations, then timed repetitions whose median counts (:func:`hpcnb.timing.median_time`).
Two clocks are offered:

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

Example:
    >>> config = TimingConfig(warmup=1, repeats=3)
    >>> timing = config.measure(lambda: sum(range(1000)))
    >>> timing.repeats, timing.minimum <= timing.median <= timing.maximum
    (3, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.timing import Clock, Timing, median_time, pinned_threads

__all__ = [
    "TimingConfig",
    "memory_bandwidth",
    "peak_flops",
    "time_inference",
    "time_training",
    "training_step",
]


@dataclass(frozen=True)
class TimingConfig:
    """How to time one configuration.

    Attributes:
        threads: Threads of torch's intra-op pool and the BLAS pools during timing.
        warmup: Untimed iterations first.
        repeats: Timed iterations (median reported).
        clock: ``"wall"`` (elapsed) or ``"cpu"`` (process CPU time; one thread only).

    Raises:
        PerfmodelError: An unknown clock, the CPU clock with several threads, or a count
            out of range.
    """

    threads: int = 1
    warmup: int = 2
    repeats: int = 5
    clock: Clock = "cpu"

    def __post_init__(self) -> None:
        if self.clock not in ("wall", "cpu"):
            raise PerfmodelError(f"TimingConfig.clock={self.clock!r}: expected 'wall' or 'cpu'")
        if self.clock == "cpu" and self.threads != 1:
            raise PerfmodelError(
                f"TimingConfig(clock='cpu', threads={self.threads}): the CPU clock measures "
                "runtime only with one thread; use clock='wall'"
            )
        if self.threads < 1 or self.warmup < 0 or self.repeats < 1:
            raise PerfmodelError(
                f"TimingConfig(threads={self.threads}, warmup={self.warmup}, "
                f"repeats={self.repeats}): need threads >= 1, warmup >= 0, repeats >= 1"
            )

    def measure(self, fn: Callable[[], object]) -> Timing:
        """Time ``fn`` with this configuration's threads, warm-up, repeats and clock.

        Args:
            fn: The operation (called ``warmup + repeats`` times).

        Returns:
            Every timed repetition (:class:`hpcnb.timing.Timing`); its median is the result.
        """
        # numba's pool stays as it is: nothing perfmodel times runs numba code.
        with pinned_threads(self.threads, numba=False):
            return median_time(fn, repeats=self.repeats, warmup=self.warmup, clock=self.clock)


def time_inference(model: nn.Module, x: torch.Tensor, config: TimingConfig) -> Timing:
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

    return config.measure(forward)


def time_training(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TimingConfig
) -> Timing:
    """Median seconds of one training step (forward, backward, SGD step) in train mode.

    Args:
        model: The network (put in train mode; its weights change).
        x: Input batch.
        y: Integer class labels, one per sample.
        config: Timing settings.
    """
    return config.measure(training_step(model, x, y))


def training_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One training step of ``model`` as a callable: zero_grad, forward, loss, backward, SGD.

    Args:
        model: The network (put in train mode; its weights change at every call).
        x: Input batch.
        y: Integer class labels, one per sample.
    """
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return step


def peak_flops(config: TimingConfig, n: int = 768) -> float:
    """Measured float32 matrix-product rate, FLOP/s (``2 n³`` per product).

    Args:
        config: Thread count and repetitions.
        n: Matrix order.
    """
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    out = torch.empty(n, n)
    timing = config.measure(lambda: torch.mm(a, b, out=out))
    return 2.0 * n**3 / timing.minimum


def memory_bandwidth(config: TimingConfig, megabytes: int = 64) -> float:
    """Measured copy bandwidth, bytes/s (a copy reads and writes each byte once).

    Args:
        config: Thread count and repetitions.
        megabytes: Size of the copied buffer (well above the last-level cache).
    """
    src = torch.ones(megabytes * (1 << 20) // 4)
    dst = torch.empty_like(src)
    timing = config.measure(lambda: dst.copy_(src))
    return 2.0 * src.numel() * 4 / timing.minimum
