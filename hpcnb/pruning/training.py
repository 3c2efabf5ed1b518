"""Training, fine-tuning, evaluation and CPU latency of the (pruned) classifiers.

Every pruning method in notebook 02 is compared after the *same* fine-tuning
(:func:`fine_tune` with one :class:`TrainConfig`), and the latency of the original and
the pruned model is measured in the same process with :func:`measure_latency`
(median over repeats after a warm-up, fixed thread count).

Pruning removes channels that the next layers' BatchNorm statistics were computed with,
so a pruned network evaluated with its inherited running statistics can sit near chance
although its weights are fine. :func:`recalibrate_batchnorm` re-estimates those statistics
on training batches (no weight changes); notebook 02 applies it to every evaluated model,
whichever method pruned it, before measuring accuracy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hpcnb.errors import InvalidInputError
from hpcnb.timing import interleaved, pinned_threads
from hpcnb.torchcompat import safe_backward

__all__ = [
    "LatencyResult",
    "TrainConfig",
    "count_params",
    "fine_tune",
    "measure_latency",
    "recalibrate_batchnorm",
    "train_classifier",
    "training_batches",
]


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
            raise InvalidInputError(f"TrainConfig.epochs={self.epochs}: expected >= 0")
        if self.batch_size < 1:
            raise InvalidInputError(f"TrainConfig.batch_size={self.batch_size}: expected >= 1")
        if not self.lr > 0:
            raise InvalidInputError(f"TrainConfig.lr={self.lr}: expected > 0")


def _as_tensors(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor) -> tuple:
    xt = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    yt = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
    if xt.shape[0] != yt.shape[0]:
        raise InvalidInputError(
            f"x has {xt.shape[0]} samples but y has {yt.shape[0]}: expected equal"
        )
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
    with pinned_threads(config.threads, numba=False, blas=False):
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
            with safe_backward():
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


def training_batches(
    x: np.ndarray | torch.Tensor, batch_size: int = 64, *, limit: int | None = None
) -> list[torch.Tensor]:
    """Split inputs into consecutive batches (for :func:`recalibrate_batchnorm`).

    Args:
        x: Inputs, shape ``(n, ...)``.
        batch_size: Items per batch (the last batch may be smaller).
        limit: Keep at most this many batches (default: all).

    Raises:
        InvalidInputError: ``batch_size`` < 1, ``limit`` < 1 or ``x`` empty.
    """
    if batch_size < 1:
        raise InvalidInputError(f"training_batches: batch_size={batch_size}, expected >= 1")
    if limit is not None and limit < 1:
        raise InvalidInputError(f"training_batches: limit={limit}, expected >= 1 or None")
    xt = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).float()
    if xt.shape[0] == 0:
        raise InvalidInputError("training_batches: no inputs")
    batches = list(torch.split(xt, batch_size))
    return batches if limit is None else batches[:limit]


@torch.no_grad()
def recalibrate_batchnorm(
    model: nn.Module,
    batches: Iterable[torch.Tensor | np.ndarray | tuple | list],
    *,
    threads: int = 1,
) -> nn.Module:
    """Re-estimate the running statistics of every BatchNorm layer of ``model`` in place.

    Each BatchNorm layer that tracks running statistics has them reset and its momentum
    set to ``None`` (a cumulative average over all batches, not an exponential one); the
    batches are passed forward under ``torch.no_grad()`` with only the BatchNorm layers
    in train mode (dropout and other layers stay in eval mode); then the momenta are
    restored and the model is left in eval mode. Weights and biases are not touched.
    With equal-size batches the running mean becomes the mean of the batch means,
    i.e. the mean over all items.

    Args:
        model: The (pruned) network.
        batches: Input batches (tensors, arrays, or ``(x, y)`` pairs whose first element
            is used), typically :func:`training_batches` of the training inputs.
        threads: Torch intra-op threads during the passes.

    Returns:
        ``model`` (recalibrated, in eval mode).

    Raises:
        InvalidInputError: The model has BatchNorm layers but ``batches`` is empty.
    """
    norms = [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    model.eval()
    if not norms:
        return model
    inputs = []
    for batch in batches:
        xb = batch[0] if isinstance(batch, tuple | list) else batch
        inputs.append(torch.as_tensor(np.asarray(xb) if not isinstance(xb, torch.Tensor) else xb))
    if not inputs:
        raise InvalidInputError("recalibrate_batchnorm: no batches given; expected at least one")
    momenta = [m.momentum for m in norms]
    try:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
            m.train()
        with pinned_threads(threads, numba=False, blas=False):
            for xb in inputs:
                model(xb.float())
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
        model.eval()
    return model


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

    Models are timed round-robin (:func:`hpcnb.timing.interleaved`: one call of each per
    repeat, untimed warm-up rounds first) so that a burst of load
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
        raise InvalidInputError(f"measure_latency: repeats={repeats}, expected >= 1")
    for model in models.values():
        model.eval()
    calls = {name: (lambda model=model: model(example)) for name, model in models.items()}
    with pinned_threads(threads, numba=False, blas=False):
        timings = interleaved(calls, repeats=repeats, warmup=warmup)
    return {
        name: LatencyResult(median_s=t.median, samples_s=t.samples) for name, t in timings.items()
    }
