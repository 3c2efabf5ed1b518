"""The field's accuracy metric: share of predictions within ±10 % / ±20 %, beside MAPE.

Latency predictors for DNNs (nn-Meter, MobiSys'21; LitePred, NSDI'24) report the share of
predictions whose relative error is within ±10 % (and ±20 %) rather than a mean error: a mean
is pulled by a few bad rows, a share says how often a prediction can be trusted. This module
computes both, for held-out families (:func:`hpcnb.perfmodel.estimator.leave_one_family_out`)
and for a random split (:func:`random_split`: k-fold cross-validation over rows), per family
(:func:`family_scores`), and with bootstrap intervals over rows (:func:`share_interval`, an
:class:`hpcnb.stats.Estimate`; the MAPE's is :func:`hpcnb.stats.mape_interval`).

Example:
    >>> within_share([1.05, 1.15, 0.7, 1.0], [1.0, 1.0, 1.0, 1.0], 0.10)
    0.5
    >>> s = score([1.05, 1.15, 0.7, 1.0], [1.0, 1.0, 1.0, 1.0])
    >>> s.within_10, s.within_20, round(s.mape, 4)
    (0.5, 0.75, 0.125)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator

from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.stats import Estimate, absolute_percentage_errors, bootstrap_rows

__all__ = ["Scores", "family_scores", "random_split", "score", "share_interval", "within_share"]


def within_share(predicted: ArrayLike, measured: ArrayLike, tolerance: float) -> float:
    """Share of rows whose relative error ``|p - m| / m`` is at most ``tolerance``.

    Args:
        predicted: Predicted values.
        measured: Measured values (finite, positive).
        tolerance: Relative tolerance (0.10 = ±10 %).

    Raises:
        PerfmodelError: A negative tolerance.
        StatisticsError: Mismatched lengths or a measured value that is not finite and
            positive (:func:`hpcnb.stats.absolute_percentage_errors`).
    """
    if not tolerance >= 0:
        raise PerfmodelError(f"within_share: tolerance={tolerance}, expected >= 0")
    ape = absolute_percentage_errors(predicted, measured)
    return float(np.mean(ape <= tolerance + 1e-12))


@dataclass(frozen=True)
class Scores:
    """Accuracy of a set of predictions.

    Attributes:
        mape: Mean absolute percentage error (fraction).
        within_10: Share of rows within ±10 %.
        within_20: Share of rows within ±20 %.
        n: Rows.
    """

    mape: float
    within_10: float
    within_20: float
    n: int


def score(predicted: ArrayLike, measured: ArrayLike) -> Scores:
    """MAPE and the ±10 % / ±20 % shares of ``predicted`` against ``measured``.

    Args:
        predicted: Predicted values.
        measured: Measured values (finite, positive).

    Raises:
        StatisticsError: Mismatched lengths or a measured value that is not finite and
            positive.
    """
    ape = absolute_percentage_errors(predicted, measured)
    return Scores(
        mape=float(ape.mean()),
        within_10=float(np.mean(ape <= 0.10 + 1e-12)),
        within_20=float(np.mean(ape <= 0.20 + 1e-12)),
        n=int(ape.size),
    )


def family_scores(
    predicted: ArrayLike, measured: ArrayLike, families: Sequence[str]
) -> dict[str, Scores]:
    """:func:`score` of each family's rows, in order of first appearance.

    Args:
        predicted: Predicted values.
        measured: Measured values (finite, positive).
        families: Family of each row.

    Raises:
        PerfmodelError: ``families`` does not label every row.
    """
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    fam = np.asarray(families, dtype=object)
    if not (p.shape == m.shape == fam.shape):
        raise PerfmodelError(f"{p.size} predictions, {m.size} measured, {fam.size} families")
    return {f: score(p[fam == f], m[fam == f]) for f in dict.fromkeys(fam.tolist())}


def share_interval(
    predicted: ArrayLike,
    measured: ArrayLike,
    tolerance: float,
    *,
    seed: int = 0,
    resamples: int = 2000,
) -> Estimate:
    """:func:`within_share` with a seeded bootstrap interval over rows.

    Args:
        predicted: Predicted values.
        measured: Measured values (finite, positive).
        tolerance: Relative tolerance (0.10 = ±10 %).
        seed: Seed of the resampling generator.
        resamples: Bootstrap resamples.

    Returns:
        The share as an :class:`~hpcnb.stats.Estimate` with its 95 % interval and ``n`` rows
        (:func:`hpcnb.stats.bootstrap_rows`).

    Raises:
        PerfmodelError: A negative tolerance.
        StatisticsError: Mismatched lengths or a measured value that is not finite and
            positive.

    Example:
        >>> e = share_interval([1.05, 1.15, 0.7, 1.0], [1.0, 1.0, 1.0, 1.0], 0.10, resamples=200)
        >>> e.value, e.n
        (0.5, 4)
    """
    if not tolerance >= 0:
        raise PerfmodelError(f"share_interval: tolerance={tolerance}, expected >= 0")
    ape = absolute_percentage_errors(predicted, measured)
    hit = (ape <= tolerance + 1e-12).astype(float)
    return bootstrap_rows(
        lambda idx: float(hit[idx].mean()), hit.size, seed=seed, resamples=resamples
    )


def random_split(
    make: Callable[[], BaseEstimator],
    X: ArrayLike,
    y: ArrayLike,
    *,
    folds: int = 5,
    seed: int = 0,
) -> np.ndarray:
    """Held-out predictions of every row by k-fold cross-validation over shuffled rows.

    Each row is predicted by a model fitted on the other ``folds - 1`` folds: unlike
    leave-one-family-out, the model has seen the row's family (other widths, resolutions
    and batches of it).

    Args:
        make: Returns a fresh unfitted estimator.
        X: Features ``(n, k)``.
        y: Measured seconds ``(n,)``.
        folds: Number of folds (2..n).
        seed: Seed of the shuffle.

    Raises:
        PerfmodelError: Fewer than two folds, more folds than rows, or mismatched lengths.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(X) != len(y):
        raise PerfmodelError(f"X has {len(X)} rows, y {len(y)}")
    if not 2 <= folds <= len(y):
        raise PerfmodelError(f"random_split: folds={folds}, expected 2..{len(y)} (rows)")
    order = np.random.default_rng(seed).permutation(len(y))
    pred = np.empty_like(y)
    for part in np.array_split(order, folds):
        train = np.setdiff1d(order, part)
        pred[part] = make().fit(X[train], y[train]).predict(X[part])
    return pred
