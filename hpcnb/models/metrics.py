"""Classification metrics shared by the techniques that evaluate zoo models (top-1, gaps).

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

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from hpcnb.errors import HpcnbError
from hpcnb.stats import Estimate

__all__ = [
    "MetricError",
    "paired_gap_interval",
    "pooled_gap_interval",
    "top1_accuracy",
    "top1_correct",
]


class MetricError(HpcnbError, ValueError):
    """Bad evaluation data (no items, or inputs and labels of different lengths)."""


def _tensor(values: Labels) -> torch.Tensor:
    return values if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))


Inputs = np.ndarray | torch.Tensor
"""Model inputs, shape ``(n, ...)``, as a tensor or an array."""
Labels = np.ndarray | torch.Tensor | list
"""Integer class labels, shape ``(n,)``."""


@torch.no_grad()
def top1_correct(model: nn.Module, x: Inputs, y: Labels, batch_size: int = 512) -> np.ndarray:
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
            f"top-1 accuracy needs a non-empty evaluation set with one label per input and "
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


def top1_accuracy(model: nn.Module, x: Inputs, y: Labels, batch_size: int = 512) -> float:
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
    correct = top1_correct(model, x, y, batch_size)
    return int(correct.sum()) / len(correct)


def paired_gap_interval(
    a: np.ndarray,
    b: np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Mean of ``a - b`` over seeds and items, with a two-level bootstrap interval.

    ``a`` and ``b`` are ``(seeds, items)`` arrays of per-item scores (1 right, 0 wrong) of
    two models, row ``s`` of both from the same seed and column ``i`` the same test item.
    Each resample draws the seeds with replacement and, independently, the items with
    replacement (the same items for both models: a paired comparison); the interval is
    the central ``confidence`` range of the resampled means, so it covers the spread
    between seeds and the sampling of the test set. With one seed only the items are
    resampled.

    Args:
        a: Per-item scores of the first model, shape ``(seeds, items)`` (or ``(items,)``).
        b: The same for the second model.
        confidence: Coverage of the interval, in (0, 1).
        resamples: Bootstrap resamples.
        seed: Seed of the resampling.

    Returns:
        The mean difference with its interval and ``n`` = seeds x items.

    Raises:
        MetricError: Shapes differ, no items, or a bad confidence.

    Example:
        >>> import numpy as np
        >>> a = np.array([[1, 1, 0, 1], [1, 1, 1, 1]])
        >>> str(paired_gap_interval(a, a))
        '0 [0, 0] (n=8)'
    """
    da, db = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if da.shape != db.shape or da.size == 0 or not 0 < confidence < 1 or resamples < 1:
        raise MetricError(
            f"paired_gap_interval: shapes {da.shape} and {db.shape}, confidence {confidence}, "
            f"resamples {resamples}: need equal non-empty shapes, 0 < confidence < 1"
        )
    diff = da - db
    n_seeds, n_items = diff.shape
    value = float(diff.mean())
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for r in range(resamples):
        rows = rng.integers(0, n_seeds, n_seeds) if n_seeds > 1 else np.zeros(1, np.int64)
        cols = rng.integers(0, n_items, n_items)
        stats[r] = diff[np.ix_(rows, cols)].mean()
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return Estimate(value, float(min(low, value)), float(max(high, value)), int(diff.size))


def pooled_gap_interval(
    a: Sequence[np.ndarray],
    b: Sequence[np.ndarray],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Mean of ``a - b`` over items pooled from several folds, with a paired bootstrap.

    ``a[f]`` and ``b[f]`` are the per-item scores (1 right, 0 wrong) of two models on the
    test items of fold ``f`` (cross-validation: every item in one fold, folds of any
    size). The value is the mean over all items. Each resample draws the folds with
    replacement and, inside every drawn fold, its items with replacement (the same items
    for both models: paired), so the interval covers the spread between the folds' runs
    and the sampling of the items. With one fold only the items are resampled.

    Args:
        a: Per fold, the first model's per-item scores.
        b: Per fold, the second model's, the same items in the same order.
        confidence: Coverage of the interval, in (0, 1).
        resamples: Bootstrap resamples.
        seed: Seed of the resampling.

    Returns:
        The mean difference with its interval and ``n`` the pooled items.

    Raises:
        MetricError: The fold counts or a fold's items differ, no items, or a bad confidence.

    Example:
        >>> import numpy as np
        >>> a = [np.array([1, 1, 0]), np.array([1, 0])]
        >>> str(pooled_gap_interval(a, a))
        '0 [0, 0] (n=5)'
    """
    if len(a) != len(b) or not a or not 0 < confidence < 1 or resamples < 1:
        raise MetricError(
            f"pooled_gap_interval: {len(a)} and {len(b)} folds, confidence {confidence}: need "
            "the same number of folds (>= 1) and 0 < confidence < 1"
        )
    diffs = []
    for f, (fa, fb) in enumerate(zip(a, b, strict=True)):
        da, db = np.asarray(fa, float).ravel(), np.asarray(fb, float).ravel()
        if da.shape != db.shape or da.size == 0:
            raise MetricError(
                f"pooled_gap_interval: fold {f} has {da.size} and {db.size} items; need equal, >= 1"
            )
        diffs.append(da - db)
    sums = np.array([d.sum() for d in diffs])
    sizes = np.array([d.size for d in diffs])
    value = float(sums.sum() / sizes.sum())
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    n_folds = len(diffs)
    for r in range(resamples):
        rows = rng.integers(0, n_folds, n_folds) if n_folds > 1 else np.zeros(1, np.int64)
        total = sum(diffs[f][rng.integers(0, sizes[f], sizes[f])].sum() for f in rows)
        stats[r] = total / sizes[rows].sum()
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return Estimate(value, float(min(low, value)), float(max(high, value)), int(sizes.sum()))
