"""All-reduce micro-benchmark and DDP training runs with ``torch.distributed`` (gloo).

One launch starts ``world_size`` processes on localhost (``torch.multiprocessing`` with the
``spawn`` method) that

1. time ``dist.all_reduce`` of float32 tensors of several sizes (median after warm-up, the
   slowest rank counts), from which ``α`` and ``β`` are fitted
   (:func:`hpcnb.perfmodel.allreduce.fit_alpha_beta`);
2. time data-parallel training steps (forward, backward, SGD step) of a model with
   ``DistributedDataParallel``: first on rank 0 alone (a one-process DDP group), then on
   all ranks together. Plain (non-DDP) steps alternate with DDP steps round by round, so
   both see the same background load; every round's durations are kept (for all ranks
   together, the slowest rank's duration of that round), so that the report carries
   samples and per-round prediction errors (:meth:`DistributedReport.error_samples`).

The model is built by a *model factory* named by a ``"package.module:function"`` reference
(:func:`hpcnb.plugins.load`) plus keyword arguments, so that the spawned processes can
build it themselves; the factory may live in any importable module, the package's own
:func:`small_convnet` is the default. Every process pins its torch thread pool
(``threads``) so that ranks do not fight over cores.

Example:
    Any importable callable returning a module is a factory, here a linear classifier of
    12 input features:

    >>> config = DistributedConfig(
    ...     builder="torch.nn:Linear",
    ...     builder_kwargs={"in_features": 12, "out_features": 10},
    ...     input_shape=(12,),
    ... )
    >>> resolve_builder(config.builder)(**config.builder_kwargs)
    Linear(in_features=12, out_features=10, bias=True)
"""

from __future__ import annotations

import functools
import json
import math
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcnb.errors import HpcnbError
from hpcnb.perfmodel.allreduce import AlphaBeta, fit_alpha_beta, overlapped_step
from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.plugins import PluginError, load
from hpcnb.timing import pinned_threads

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed import ProcessGroup

__all__ = [
    "DistributedConfig",
    "DistributedReport",
    "DistributedRunError",
    "resolve_builder",
    "run_distributed_benchmark",
    "small_convnet",
]


class DistributedRunError(HpcnbError, RuntimeError):
    """A distributed launch failed: a rank died, or the launch exceeded its timeout."""


@dataclass(frozen=True)
class DistributedConfig:
    """What the distributed launch measures.

    Attributes:
        world_size: Number of processes (ranks) on localhost.
        message_bytes: All-reduce message sizes to time, bytes (multiples of 4).
        repeats: Timed repetitions per measurement (median taken).
        warmup: Untimed repetitions before timing.
        builder: Model factory building the DDP model, a ``"package.module:function"``
            reference (:func:`hpcnb.plugins.load`); called with ``builder_kwargs``.
        builder_kwargs: Keyword arguments of the builder.
        input_shape: Shape of one sample, e.g. ``(3, 32, 32)``.
        num_classes: Classes of the random labels.
        local_batch: Samples per rank per step.
        threads: torch threads per process.
        timeout_s: Give up (and kill the processes) after this many seconds.
        seed: Seed of model weights and data.

    Raises:
        PerfmodelError: A setting out of range (the builder is resolved at launch).
    """

    world_size: int = 2
    message_bytes: tuple[int, ...] = (4, 4096, 65536, 1 << 20, 4 << 20)
    repeats: int = 7
    warmup: int = 2
    builder: str = "hpcnb.perfmodel.distributed:small_convnet"
    builder_kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] = (3, 32, 32)
    num_classes: int = 10
    local_batch: int = 32
    threads: int = 1
    timeout_s: float = 120.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise PerfmodelError(f"world_size={self.world_size}: need at least 2 ranks")
        if len(self.message_bytes) < 2 or any(b < 4 or b % 4 for b in self.message_bytes):
            raise PerfmodelError(
                f"message_bytes={self.message_bytes}: need >= 2 sizes, each a multiple of 4"
            )
        if self.repeats < 1 or self.warmup < 0 or self.threads < 1:
            raise PerfmodelError("repeats and threads must be >= 1, warmup >= 0")
        if self.local_batch < 1 or self.timeout_s <= 0:
            raise PerfmodelError(
                f"local_batch={self.local_batch}, timeout_s={self.timeout_s}: need >= 1, > 0"
            )


@dataclass(frozen=True)
class DistributedReport:
    """Measurements of one distributed launch.

    Attributes:
        world_size: Ranks used.
        message_bytes: Sizes timed.
        allreduce_s: Median all-reduce seconds per size (slowest rank).
        fit: ``α``, ``β`` fitted to the all-reduce times.
        gradient_bytes: Bytes of the model's gradients (float32).
        buffer_bytes: Bytes of the model's buffers (BatchNorm statistics), which DDP
            broadcasts from rank 0 before every forward pass.
        compute_alone_s: Median plain (non-DDP) training step of rank 0 running alone.
        compute_together_s: Median plain training step while every rank runs one at once
            (no communication; the slowest rank of each round counts): compute under
            co-location.
        step_1proc_s: Median training step, one-process DDP.
        step_nproc_s: Median training step, ``world_size``-process DDP (slowest rank of
            each round).
        compute_alone_samples: Every timed round of ``compute_alone_s``.
        compute_together_samples: Every timed round of ``compute_together_s``.
        step_1proc_samples: Every timed round of ``step_1proc_s`` (interleaved with
            ``compute_alone_samples``, round by round).
        step_nproc_samples: Every timed round of ``step_nproc_s`` (interleaved with
            ``compute_together_samples``).
    """

    world_size: int
    message_bytes: tuple[int, ...]
    allreduce_s: tuple[float, ...]
    fit: AlphaBeta
    gradient_bytes: int
    buffer_bytes: int
    compute_alone_s: float
    compute_together_s: float
    step_1proc_s: float
    step_nproc_s: float
    compute_alone_samples: tuple[float, ...] = ()
    compute_together_samples: tuple[float, ...] = ()
    step_1proc_samples: tuple[float, ...] = ()
    step_nproc_samples: tuple[float, ...] = ()

    def communication_s(self, processes: int) -> float:
        """Modelled communication of one DDP step on ``processes`` ranks (0 for one).

        The ring all-reduce of the gradients plus a binomial-tree broadcast of the buffers
        (``⌈log2 p⌉ (α + n β)``), both in the fitted α–β model.
        """
        if processes == 1:
            return 0.0
        comm = float(self.fit.time(processes, self.gradient_bytes))
        if self.buffer_bytes:
            levels = math.ceil(math.log2(processes))
            comm += levels * (self.fit.alpha + self.buffer_bytes * self.fit.beta)
        return comm

    def predicted_step(self, processes: int, overlap: float = 0.0, colocated: bool = True) -> float:
        """Predict a DDP training step: compute plus modelled communication.

        Communication is the ring all-reduce of the gradients plus a binomial-tree broadcast
        of the buffers (``⌈log2 p⌉ (α + n β)``), both in the fitted α–β model.

        Args:
            processes: 1 or ``world_size``.
            overlap: Overlap factor ω of compute and all-reduce.
            colocated: For ``world_size`` processes, take the compute time measured with all
                ranks computing at once (they share this machine); else the solo time.

        Raises:
            PerfmodelError: ``processes`` is neither 1 nor ``world_size``.
        """
        if processes == 1:
            return self.compute_alone_s
        if processes != self.world_size:
            raise PerfmodelError(f"processes={processes}: measured only 1 and {self.world_size}")
        compute = self.compute_together_s if colocated else self.compute_alone_s
        return float(overlapped_step(compute, self.communication_s(processes), overlap))

    def prediction_error(
        self, processes: int, overlap: float = 0.0, colocated: bool = True
    ) -> float:
        """Relative error of :meth:`predicted_step` against the measured DDP step.

        Args:
            processes: 1 or ``world_size``.
            overlap: Overlap factor ω of compute and all-reduce.
            colocated: Predict ``world_size`` processes from the co-located compute time
                (else the solo time).

        Raises:
            PerfmodelError: ``processes`` is neither 1 nor ``world_size``.
        """
        measured = self.step_1proc_s if processes == 1 else self.step_nproc_s
        return abs(self.predicted_step(processes, overlap, colocated) - measured) / measured

    def error_samples(self, processes: int, overlap: float = 0.0) -> tuple[float, ...]:
        """Per-round relative errors of the predicted DDP step.

        Round *i* predicts its DDP step from the plain compute step timed right before it
        in the same round (for ``world_size`` ranks: with all ranks computing at once) plus
        the modelled communication, and compares it with that round's measured DDP step.
        Record them with ``record(key, samples=...)``: the value is their median.

        Args:
            processes: 1 or ``world_size``.
            overlap: Overlap factor ω of compute and all-reduce.

        Raises:
            PerfmodelError: ``processes`` is neither 1 nor ``world_size``, or the report has
                no per-round samples.
        """
        if processes not in (1, self.world_size):
            raise PerfmodelError(f"processes={processes}: measured only 1 and {self.world_size}")
        if processes == 1:
            compute, measured = self.compute_alone_samples, self.step_1proc_samples
        else:
            compute, measured = self.compute_together_samples, self.step_nproc_samples
        if not measured or len(compute) != len(measured):
            raise PerfmodelError("this report holds no per-round samples")
        comm = self.communication_s(processes)
        return tuple(
            abs(float(overlapped_step(c, comm, overlap)) - m) / m
            for c, m in zip(compute, measured, strict=True)
        )


def small_convnet(width: int = 16, num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """Build a small ConvNet (3 conv–BN–ReLU stages, global pooling, a classifier).

    Args:
        width: Channels of the first stage (doubled at each stage).
        num_classes: Output classes.
        in_channels: Input channels.
    """
    from torch import nn

    layers: list[nn.Module] = []
    c_in = in_channels
    for i in range(3):
        c_out = width * 2**i
        layers += [
            nn.Conv2d(c_in, c_out, 3, padding=1, stride=1 if i == 0 else 2, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        ]
        c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


def resolve_builder(reference: str) -> Callable[..., nn.Module]:
    """Return the model factory named by ``reference`` (:attr:`DistributedConfig.builder`).

    Args:
        reference: ``"package.module:function"``, imported by :func:`hpcnb.plugins.load`.

    Raises:
        PluginError: The reference is malformed, does not import, or names something that
            is not callable; the message says it came from ``DistributedConfig.builder``.
    """
    try:
        factory: Callable[..., nn.Module] = load(reference, what="model factory")
    except PluginError as exc:
        raise PluginError(f"DistributedConfig.builder: {exc}") from None
    if not callable(factory):
        raise PluginError(
            f"DistributedConfig.builder: model factory {reference!r} is a "
            f"{type(factory).__name__}, not a callable returning a torch module"
        )
    return factory


def _median_max(fn: Callable[[], object], repeats: int, warmup: int) -> float:
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    med = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med.item())


def _worker(rank: int, config: DistributedConfig, port: int, out: str) -> None:
    # Each rank pins its torch and BLAS pools so that ranks do not fight over the cores.
    with pinned_threads(config.threads, numba=False):
        _measure(rank, config, port, out)


def _measure(rank: int, config: DistributedConfig, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=config.world_size,
    )
    try:
        allreduce = []
        for nbytes in config.message_bytes:
            buf = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
            allreduce.append(
                _median_max(functools.partial(dist.all_reduce, buf), config.repeats, config.warmup)
            )
        solo = dist.new_group([0])
        build = resolve_builder(config.builder)
        torch.manual_seed(config.seed)
        x = torch.randn(config.local_batch, *config.input_shape)
        y = torch.randint(0, config.num_classes, (config.local_batch,))
        loss_fn = nn.CrossEntropyLoss()

        def make_step(group: ProcessGroup | None, ddp: bool) -> Callable[[], None]:
            torch.manual_seed(config.seed)
            model = build(**config.builder_kwargs)
            if ddp:
                model = DistributedDataParallel(model, process_group=group)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()

            return step

        def interleaved(group: ProcessGroup | None, sync: bool) -> list[list[float]]:
            # Alternate plain and DDP steps so that both see the same background load.
            steps = (make_step(group, False), make_step(group, True))
            times: list[list[float]] = [[], []]
            for i in range(config.warmup + config.repeats):
                for kind, step in enumerate(steps):
                    if sync:
                        dist.barrier()
                    start = time.perf_counter()
                    step()
                    if i >= config.warmup:
                        times[kind].append(time.perf_counter() - start)
            return times

        # Rank 0 alone: plain training (the compute model's input) and one-process DDP.
        alone, step_1 = interleaved(solo, sync=False) if rank == 0 else ([], [])
        dist.barrier()
        # All ranks at once: plain steps (compute under co-location) and DDP steps; each
        # round counts with its slowest rank.
        both = torch.tensor(interleaved(None, sync=True), dtype=torch.float64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        together, step_n = both.tolist()
        if rank == 0:
            model = build(**config.builder_kwargs)
            grad_bytes = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
            payload = {
                "allreduce_s": allreduce,
                "gradient_bytes": int(grad_bytes),
                "buffer_bytes": int(sum(b.numel() * b.element_size() for b in model.buffers())),
                "compute_alone_s": alone,
                "compute_together_s": together,
                "step_1proc_s": step_1,
                "step_nproc_s": step_n,
            }
            Path(out).write_text(json.dumps(payload))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_distributed_benchmark(config: DistributedConfig | None = None) -> DistributedReport:
    """Launch the ranks, time all-reduce and DDP steps, and fit ``α``, ``β``.

    Args:
        config: What to measure (defaults: 2 ranks, a small ConvNet on 32×32 inputs).

    Raises:
        PluginError: The builder cannot be resolved (the other settings are checked when a
            :class:`DistributedConfig` is made).
        DistributedRunError: A rank failed or the launch exceeded ``timeout_s``.
    """
    import torch.multiprocessing as mp

    config = config or DistributedConfig()
    resolve_builder(config.builder)
    with tempfile.TemporaryDirectory(prefix="hpcnb_dist_") as tmp:
        out = str(Path(tmp) / "result.json")
        ctx = mp.start_processes(
            _worker,
            args=(config, _free_port(), out),
            nprocs=config.world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + config.timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise DistributedRunError(
                        f"distributed benchmark exceeded timeout_s={config.timeout_s}"
                    )
        except mp.ProcessExitedException as exc:
            # A rank that dies while shutting down after rank 0 wrote the result is harmless.
            if not Path(out).is_file():
                raise DistributedRunError(f"distributed benchmark: a rank failed ({exc})") from exc
        finally:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.terminate()
        if not Path(out).is_file():
            raise DistributedRunError("distributed benchmark finished without a result from rank 0")
        data = json.loads(Path(out).read_text())
    sizes = tuple(int(b) for b in config.message_bytes)
    times = tuple(float(t) for t in data["allreduce_s"])
    fit = fit_alpha_beta(np.full(len(sizes), config.world_size), sizes, times)
    rounds = {
        name: tuple(float(t) for t in data[name])
        for name in ("compute_alone_s", "compute_together_s", "step_1proc_s", "step_nproc_s")
    }
    return DistributedReport(
        world_size=config.world_size,
        message_bytes=sizes,
        allreduce_s=times,
        fit=fit,
        gradient_bytes=int(data["gradient_bytes"]),
        buffer_bytes=int(data["buffer_bytes"]),
        compute_alone_s=statistics.median(rounds["compute_alone_s"]),
        compute_together_s=statistics.median(rounds["compute_together_s"]),
        step_1proc_s=statistics.median(rounds["step_1proc_s"]),
        step_nproc_s=statistics.median(rounds["step_nproc_s"]),
        compute_alone_samples=rounds["compute_alone_s"],
        compute_together_samples=rounds["compute_together_s"],
        step_1proc_samples=rounds["step_1proc_s"],
        step_nproc_samples=rounds["step_nproc_s"],
    )
