"""Training, fine-tuning, evaluation and CPU latency of the (pruned) classifiers.

Every pruning method in notebook 02 is compared after the *same* fine-tuning
(:func:`fine_tune` with one :class:`TrainConfig`), and the latency of the original and
the pruned model is measured in the same process with :func:`measure_latency`
(median over repeats after a warm-up, fixed thread count).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = [
    "LatencyResult",
    "TrainConfig",
    "accuracy",
    "count_params",
    "fine_tune",
    "measure_latency",
    "torch_threads",
    "train_classifier",
]


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(threads)``, restoring the old value.

    On a shared 2-core machine one intra-op thread is often ten times faster for the
    small tensors of this notebook than two threads fighting other processes.

    Args:
        threads: Intra-op thread count (>= 1).
    """
    if threads < 1:
        raise ValueError(f"torch_threads: threads={threads}, expected >= 1")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@dataclass(frozen=True)
class TrainConfig:
    """How a classifier is (re-)trained.

    Attributes:
        epochs: Passes over the training set.
        batch_size: Mini-batch size.
        lr: Peak learning rate of AdamW (cosine-annealed to zero).
        weight_decay: AdamW weight decay.
        seed: Seed of the batch order.
        threads: Torch intra-op threads while training.
    """

    epochs: int = 20
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 1e-4
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if self.epochs < 0:
            raise ValueError(f"TrainConfig.epochs={self.epochs}: expected >= 0")
        if self.batch_size < 1:
            raise ValueError(f"TrainConfig.batch_size={self.batch_size}: expected >= 1")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig.lr={self.lr}: expected > 0")


def _as_tensors(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor) -> tuple:
    xt = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    yt = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
    if xt.shape[0] != yt.shape[0]:
        raise ValueError(f"x has {xt.shape[0]} samples but y has {yt.shape[0]}: expected equal")
    return xt.float(), yt.long()


def train_classifier(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    config: TrainConfig = TrainConfig(),
) -> list[float]:
    """Train ``model`` in place with AdamW + cosine schedule and cross-entropy.

    Args:
        model: The classifier (logits out).
        x: Inputs, shape ``(n, ...)``.
        y: Integer labels, shape ``(n,)``.
        config: Epochs, batch size, learning rate, seed.

    Returns:
        The mean training loss of each epoch.
    """
    xt, yt = _as_tensors(x, y)
    if config.epochs == 0:
        return []
    generator = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = max(1, (len(yt) + config.batch_size - 1) // config.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.epochs * steps_per_epoch)
    losses: list[float] = []
    model.train()
    with torch_threads(config.threads):
        _run_epochs(model, xt, yt, config, opt, sched, generator, losses)
    model.eval()
    return losses


def _run_epochs(
    model: nn.Module,
    xt: torch.Tensor,
    yt: torch.Tensor,
    config: TrainConfig,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    generator: torch.Generator,
    losses: list[float],
) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(config.epochs):
        order = torch.randperm(len(yt), generator=generator)
        total = 0.0
        for start in range(0, len(yt), config.batch_size):
            idx = order[start : start + config.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        losses.append(total / len(yt))


def fine_tune(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    config: TrainConfig,
) -> nn.Module:
    """Return a fine-tuned deep copy of ``model`` (the argument is left untouched).

    Args:
        model: A (pruned) classifier.
        x: Training inputs.
        y: Training labels.
        config: The fine-tuning schedule, shared by all compared methods.
    """
    tuned = copy.deepcopy(model)
    train_classifier(tuned, x, y, config)
    return tuned


@torch.no_grad()
def accuracy(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    batch_size: int = 1024,
) -> float:
    """Return the top-1 accuracy of ``model`` on ``(x, y)`` in eval mode.

    Args:
        model: The classifier.
        x: Inputs.
        y: Labels.
        batch_size: Evaluation batch size.
    """
    xt, yt = _as_tensors(x, y)
    if len(yt) == 0:
        raise ValueError("accuracy: empty evaluation set")
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(yt), batch_size):
        pred = model(xt[start : start + batch_size]).argmax(dim=1)
        correct += int((pred == yt[start : start + batch_size]).sum())
    model.train(was_training)
    return correct / len(yt)


def count_params(model: nn.Module) -> int:
    """Return the number of parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class LatencyResult:
    """Latency of one model: median and all repeats, in seconds per batch."""

    median_s: float
    samples_s: tuple[float, ...]


@torch.no_grad()
def measure_latency(
    models: dict[str, nn.Module],
    example: torch.Tensor,
    repeats: int = 30,
    warmup: int = 5,
    threads: int = 1,
) -> dict[str, LatencyResult]:
    """Time the forward pass of several models on the same input, interleaved.

    Models are timed round-robin (one call of each per repeat) so that a burst of load
    on a shared machine hits all of them alike; the thread count is fixed for the
    duration and restored afterwards.

    Args:
        models: Name -> model (switched to eval mode).
        example: The input batch.
        repeats: Timed calls per model.
        warmup: Untimed calls per model first.
        threads: ``torch.set_num_threads`` during timing.

    Returns:
        Name -> :class:`LatencyResult`.
    """
    if repeats < 1:
        raise ValueError(f"measure_latency: repeats={repeats}, expected >= 1")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for model in models.values():
            model.eval()
            for _ in range(warmup):
                model(example)
        samples: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(repeats):
            for name, model in models.items():
                start = time.perf_counter()
                model(example)
                samples[name].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(old_threads)
    return {
        name: LatencyResult(median_s=statistics.median(s), samples_s=tuple(s))
        for name, s in samples.items()
    }
