"""Training loops: pretraining a base model, sandwich-rule supernet training, evaluation.

:func:`train_supernet` runs the fork-join step of :mod:`hpcnb.supernet.forkjoin` in one
process: each step draws ``subnets_per_step`` subnets from a sampler (the largest first
for the sandwich rule), trains them on the same batch from the same shared weights with
in-place distillation (the largest on labels, the others on its soft outputs), joins
their gradients by coverage-count average and takes one optimiser step.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import TqdmWarning

with warnings.catch_warnings():  # without ipywidgets tqdm.auto falls back to text bars
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

from hpcnb.errors import InvalidInputError
from hpcnb.models.metrics import top1_accuracy
from hpcnb.progress import show_progress
from hpcnb.torchcompat import safe_backward

from .forkjoin import fork_join_step
from .space import SubnetConfig

if TYPE_CHECKING:  # pragma: no cover
    from .samplers import Sampler
    from .supernet import Supernet

__all__ = [
    "SupernetTrainConfig",
    "TrainLog",
    "batches",
    "finetune_subnet",
    "make_optimizer",
    "recalibrate_norm",
    "selective_recall",
    "subnet_accuracy",
    "train_model",
    "train_supernet",
]


@dataclass(frozen=True)
class SupernetTrainConfig:
    """Settings of supernet training.

    Attributes:
        steps: Optimiser steps.
        batch_size: Examples per batch (the same batch for every subnet of a step).
        subnets_per_step: Subnets trained per step (``K`` of the fork-join).
        lr: Learning rate.
        optimizer: ``"adam"`` or ``"sgd"`` (momentum 0.9).
        distill: In-place distillation from the largest subnet.
        cosine: Anneal the learning rate to zero with a cosine schedule (fine-tuning a
            pretrained model at a constant rate undoes part of its training).
        seed: Seed of batches and subnet draws.
    """

    steps: int = 200
    batch_size: int = 64
    subnets_per_step: int = 4
    lr: float = 1e-3
    optimizer: str = "adam"
    distill: bool = True
    cosine: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.subnets_per_step < 1:
            raise InvalidInputError(
                f"SupernetTrainConfig: steps={self.steps} (>= 0), batch_size="
                f"{self.batch_size} (>= 1), subnets_per_step={self.subnets_per_step} (>= 1)"
            )
        if self.optimizer not in ("adam", "sgd"):
            raise InvalidInputError(f"optimizer={self.optimizer!r}: expected 'adam' or 'sgd'")


@dataclass
class TrainLog:
    """Losses recorded during training.

    Attributes:
        losses: Mean loss of the subnets of each step.
        max_losses: Loss of the first (largest) subnet of each step.
        configs: Subnets drawn at each step.
    """

    losses: list[float] = field(default_factory=list)
    max_losses: list[float] = field(default_factory=list)
    configs: list[list[SubnetConfig]] = field(default_factory=list)


def make_optimizer(params: Iterator[nn.Parameter], name: str, lr: float) -> torch.optim.Optimizer:
    """Return an Adam or SGD (momentum 0.9) optimiser.

    Args:
        params: Parameters to optimise.
        name: ``"adam"`` or ``"sgd"``.
        lr: Learning rate.

    Raises:
        InvalidInputError: Unknown optimiser name.
    """
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise InvalidInputError(f"optimizer={name!r}: expected 'adam' or 'sgd'")


def batches(n: int, batch_size: int, rng: np.random.Generator, steps: int) -> Iterator[np.ndarray]:
    """Yield ``steps`` index batches, reshuffling after every epoch.

    Args:
        n: Items to draw from (indices ``0 .. n - 1``).
        batch_size: Indices per batch.
        rng: Generator of the shuffles.
        steps: Batches to yield.
    """
    order = rng.permutation(n)
    pos = 0
    for _ in range(steps):
        if pos + batch_size > n:
            order, pos = rng.permutation(n), 0
        yield order[pos : pos + batch_size]
        pos += batch_size


def train_model(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 10,
    batch_size: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool | None = None,
) -> list[float]:
    """Pretrain a classifier with Adam and cross-entropy; return per-epoch mean losses.

    Args:
        model: The model to train in place.
        x: Training inputs.
        y: Integer labels.
        epochs: Passes over the data.
        batch_size: Batch size.
        lr: Learning rate (cosine-annealed to zero).
        seed: Shuffle seed.
        progress: Show a tqdm bar (``None``: :func:`~hpcnb.progress.show_progress`
            decides: on in an interactive frontend, off under papermill and in tests).
    """
    out = _adam_epochs(
        model,
        len(x),
        lambda idx: F.cross_entropy(model(x[idx]), y[idx]),
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        desc="pretrain",
        progress=progress,
    )
    model.eval()
    return out


def _adam_epochs(
    model: nn.Module,
    n: int,
    loss_of: Callable[[np.ndarray], torch.Tensor],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    desc: str,
    progress: bool | None,
    after_epoch: Callable[[], None] | None = None,
) -> list[float]:
    """Train ``model`` (train mode) with Adam and a cosine-annealed rate over ``n`` items.

    ``loss_of(idx)`` is the loss of one batch of item indices. Seeds torch and the batch
    order with ``seed``; calls ``after_epoch()`` after every epoch.

    Returns:
        The mean loss of each epoch.
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    steps_per_epoch = max(1, n // batch_size)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs * steps_per_epoch))
    out: list[float] = []
    for _ in tqdm(range(epochs), disable=not show_progress(progress), desc=desc):
        model.train()
        total = 0.0
        for idx in batches(n, batch_size, rng, steps_per_epoch):
            loss = loss_of(idx)
            opt.zero_grad()
            with safe_backward():
                loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach())
        out.append(total / steps_per_epoch)
        if after_epoch is not None:
            after_epoch()
    return out


@torch.no_grad()
def recalibrate_norm(module: nn.Module, x: torch.Tensor, batch_size: int = 256) -> bool:
    """Re-estimate batch-norm running statistics of a subnet on ``x``.

    Args:
        module: The subnet (left in eval mode).
        x: Calibration inputs.
        batch_size: Inputs per forward pass.

    Returns:
        Whether the module has batch-norm layers (otherwise nothing is done).
    """
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return False
    saved = [(m, m.momentum) for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the calibration batches
    module.train()
    for lo in range(0, len(x), batch_size):
        module(x[lo : lo + batch_size])
    for m, mom in saved:
        m.momentum = mom
    module.eval()
    return True


def subnet_accuracy(
    supernet: Supernet,
    config: SubnetConfig,
    x: torch.Tensor,
    y: torch.Tensor,
    calib_x: torch.Tensor | None = None,
) -> float:
    """Accuracy of a subnet with the current shared weights (BN recalibrated on ``calib_x``).

    Args:
        supernet: The supernet.
        config: The subnet.
        x: Evaluation inputs.
        y: Evaluation labels.
        calib_x: Inputs to re-estimate batch-norm statistics on first (none: keep them).
    """
    module = supernet.bind(config).pull()
    if calib_x is not None:
        recalibrate_norm(module, calib_x)
    return top1_accuracy(module, x, y)


def train_supernet(
    supernet: Supernet,
    sampler: Sampler,
    x: torch.Tensor,
    y: torch.Tensor,
    config: SupernetTrainConfig,
    *,
    progress: bool | None = None,
) -> TrainLog:
    """Train a supernet with the sandwich rule and in-place distillation, in one process.

    Args:
        supernet: The supernet to train (its shared weights change in place).
        sampler: Draws the subnets of each step.
        x: Training inputs.
        y: Labels.
        config: Training settings.
        progress: Show a tqdm bar (``None``: :func:`~hpcnb.progress.show_progress`
            decides: on in an interactive frontend, off under papermill and in tests).

    Returns:
        The losses and the subnets drawn.
    """
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    opt = make_optimizer(supernet.model.parameters(), config.optimizer, config.lr)
    sched = (
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, config.steps))
        if config.cosine
        else None
    )
    log = TrainLog()
    steps = batches(len(x), config.batch_size, rng, config.steps)
    bar = tqdm(steps, total=config.steps, disable=not show_progress(progress))
    for step, idx in enumerate(bar):
        configs = sampler.draw(rng, config.subnets_per_step)
        losses = fork_join_step(supernet, configs, x[idx], y[idx], opt, distill=config.distill)
        log.losses.append(float(np.mean(losses)))
        log.max_losses.append(losses[0])
        log.configs.append(configs)
        if sched is not None:
            sched.step()
        sampler.update(supernet, step)
    supernet.model.eval()
    return log


def finetune_subnet(
    subnet: nn.Module,
    teacher: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 5,
    batch_size: int = 64,
    lr: float = 5e-4,
    alpha: float = 0.5,
    temperature: float = 2.0,
    x_val: torch.Tensor | None = None,
    y_val: torch.Tensor | None = None,
    seed: int = 0,
    progress: bool | None = None,
) -> list[float]:
    """Fine-tune an extracted subnet briefly with knowledge distillation plus labels.

    The loss is ``alpha * T**2 * KL(teacher/T || subnet/T) + (1 - alpha) * CE(subnet, y)``
    with Adam and a cosine-annealed learning rate. Only the subnet's weights change (its
    architecture, hence its FLOPs, stay the same); the teacher is run in eval mode
    without gradients. When a validation split is given, the weights of the epoch with
    the best validation accuracy are kept (the state before fine-tuning counts as epoch
    0), so fine-tuning never worsens the validation accuracy.

    Args:
        subnet: The extracted subnet, trained in place (left in eval mode).
        teacher: The full pretrained model.
        x: Training inputs (never the held-out test split).
        y: Training labels.
        epochs: Passes over ``x`` (0 leaves the subnet unchanged).
        batch_size: Batch size.
        lr: Peak learning rate.
        alpha: Weight of the distillation term in ``[0, 1]``.
        temperature: Softmax temperature of the distillation term (``> 0``).
        x_val: Optional validation inputs for best-epoch selection.
        y_val: Validation labels (with ``x_val``).
        seed: Shuffle seed.
        progress: Show a tqdm bar (``None``: :func:`~hpcnb.progress.show_progress`
            decides: on in an interactive frontend, off under papermill and in tests).

    Returns:
        The mean training loss of each epoch.

    Raises:
        InvalidInputError: Bad sizes, ``alpha`` or ``temperature``, or only one of ``x_val``
            and ``y_val``.
    """
    if epochs < 0 or batch_size < 1 or len(x) == 0 or len(x) != len(y):
        raise InvalidInputError(
            f"finetune_subnet: epochs={epochs} (>= 0), batch_size={batch_size} (>= 1), "
            f"len(x)={len(x)} == len(y)={len(y)} > 0 expected"
        )
    if not 0.0 <= alpha <= 1.0 or temperature <= 0:
        raise InvalidInputError(
            f"finetune_subnet: alpha={alpha} must lie in [0, 1], temperature={temperature} > 0"
        )
    if (x_val is None) != (y_val is None):
        raise InvalidInputError("finetune_subnet: give both x_val and y_val, or neither")
    teacher.eval()
    best_acc = (
        top1_accuracy(subnet, x_val, y_val) if x_val is not None and y_val is not None else None
    )
    best_state = copy.deepcopy(subnet.state_dict()) if best_acc is not None else None

    def loss_of(idx: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            soft = F.log_softmax(teacher(x[idx]) / temperature, dim=-1)
        logits = subnet(x[idx])
        kd = F.kl_div(
            F.log_softmax(logits / temperature, dim=-1),
            soft,
            log_target=True,
            reduction="batchmean",
        )
        return alpha * temperature**2 * kd + (1 - alpha) * F.cross_entropy(logits, y[idx])

    def keep_best() -> None:
        nonlocal best_acc, best_state
        if best_acc is not None and x_val is not None and y_val is not None:
            acc = top1_accuracy(subnet, x_val, y_val)
            if acc >= best_acc:
                best_acc, best_state = acc, copy.deepcopy(subnet.state_dict())

    out = _adam_epochs(
        subnet,
        len(x),
        loss_of,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        desc="fine-tune",
        progress=progress,
        after_epoch=keep_best,
    )
    if best_state is not None:
        subnet.load_state_dict(best_state)
    subnet.eval()
    return out


def selective_recall(
    n: int,
    *,
    length: int = 16,
    features: int = 8,
    classes: int = 4,
    noise: float = 0.1,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic sequence task for state-space models: recall the marked token.

    Each sequence has ``length`` steps of ``features`` features. At every step features
    ``1 .. classes`` hold a one-hot token drawn at random; feature 0 marks one random step
    with a 1. The label is the token at the marked step, so a causal model that reads
    the sequence to the end must select and keep it (content-dependent selection, what
    a selective SSM is for). Gaussian noise of scale ``noise`` is added everywhere.

    Args:
        n: Number of sequences.
        length: Steps per sequence.
        features: Features per step (``>= classes + 1``).
        classes: Number of token classes (chance accuracy ``1 / classes``).
        noise: Noise scale.
        seed: Random seed.

    Returns:
        ``x`` of shape ``(n, 1, length, features)`` (rows are steps, as the zoo's Mamba
        reads images row by row) and labels ``y`` of shape ``(n,)``.

    Raises:
        InvalidInputError: ``features`` too small or sizes below 1.
    """
    if features < classes + 1 or n < 1 or length < 1 or classes < 2:
        raise InvalidInputError(
            f"selective_recall: need features >= classes + 1 (got {features}, {classes}), "
            f"n={n} >= 1, length={length} >= 1, classes >= 2"
        )
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(classes, (n, length), generator=gen)
    marker = torch.randint(length, (n,), generator=gen)
    x = noise * torch.randn(n, length, features, generator=gen)
    x[..., 1 : classes + 1] += F.one_hot(tokens, classes).float()
    x[torch.arange(n), marker, 0] += 1.0
    y = tokens[torch.arange(n), marker]
    return x[:, None].contiguous(), y
