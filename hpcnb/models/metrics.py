"""Classification metrics shared by the techniques that evaluate zoo models (top-1 accuracy).

Notebook 01 (supernets) and notebook 02 (pruning) both score classifiers on held-out
digits; they count correct top-1 predictions the same way, here.

Example:
    >>> import torch
    >>> from hpcnb.models.metrics import top1_accuracy
    >>> model = torch.nn.Linear(2, 2, bias=False)
    >>> with torch.no_grad():
    ...     _ = model.weight.copy_(torch.eye(2))
    >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]])
    >>> top1_accuracy(model, x, torch.tensor([0, 1, 1])), top1_accuracy(model, x, [0, 1, 0])
    (0.6666666666666666, 1.0)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hpcnb.errors import HpcnbError

__all__ = ["MetricError", "top1_accuracy", "top1_correct"]


class MetricError(HpcnbError, ValueError):
    """Bad evaluation data (no items, or inputs and labels of different lengths)."""


def _tensor(values: np.ndarray | torch.Tensor | list) -> torch.Tensor:
    return values if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))


@torch.no_grad()
def top1_correct(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor | list,
    batch_size: int = 512,
) -> np.ndarray:
    """Return, per item, whether the highest logit is the label (eval mode), as booleans.

    The per-item view of :func:`top1_accuracy` (its mean is the accuracy), for paired
    comparisons of two models on the same items.

    Args:
        model: A classifier returning logits of shape ``(batch, classes)``.
        x: Inputs, shape ``(n, ...)``.
        y: Integer labels, shape ``(n,)``.
        batch_size: Items per forward pass.

    Raises:
        MetricError: No items, ``x`` and ``y`` of different lengths, or ``batch_size`` < 1.
    """
    xt, yt = _tensor(x), _tensor(y).long()
    if xt.is_floating_point():
        xt = xt.float()
    if len(yt) == 0 or len(xt) != len(yt) or batch_size < 1:
        raise MetricError(
            f"top-1 correctness needs a non-empty evaluation set with one label per input and "
            f"batch_size >= 1; got {len(xt)} inputs, {len(yt)} labels, batch_size={batch_size}"
        )
    was_training = model.training
    model.eval()
    try:
        parts = [
            (model(xt[i : i + batch_size]).argmax(-1) == yt[i : i + batch_size]).numpy()
            for i in range(0, len(yt), batch_size)
        ]
    finally:
        model.train(was_training)
    return np.concatenate(parts).astype(bool)


@torch.no_grad()
def top1_accuracy(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor | list,
    batch_size: int = 512,
) -> float:
    """Return the fraction of items whose highest logit is the label (eval mode).

    The model is switched to eval mode for the evaluation and left in the mode it had.
    Floating-point inputs are cast to ``float32`` (integer inputs, e.g. token ids, are
    kept); labels to ``int64``. ``round(accuracy * len(y))`` is the number of items
    classified correctly (exactly: the count is an integer far below 2**52).

    Args:
        model: A classifier returning logits of shape ``(batch, classes)``.
        x: Inputs, shape ``(n, ...)`` (tensor or array).
        y: Integer labels, shape ``(n,)``.
        batch_size: Items per forward pass.

    Raises:
        MetricError: No items, ``x`` and ``y`` of different lengths, or ``batch_size`` < 1.
    """
    xt, yt = _tensor(x), _tensor(y).long()
    if xt.is_floating_point():
        xt = xt.float()
    if len(yt) == 0 or len(xt) != len(yt) or batch_size < 1:
        raise MetricError(
            f"top-1 accuracy needs a non-empty evaluation set with one label per input and "
            f"batch_size >= 1; got {len(xt)} inputs, {len(yt)} labels, batch_size={batch_size}"
        )
    was_training = model.training
    model.eval()
    try:
        correct = sum(
            int((model(xt[i : i + batch_size]).argmax(-1) == yt[i : i + batch_size]).sum())
            for i in range(0, len(yt), batch_size)
        )
    finally:
        model.train(was_training)
    return correct / len(yt)
