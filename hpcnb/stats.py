"""Statistics of the records: the one estimate type and the intervals behind it.

An :class:`Estimate` is a value with its interval and the number of observations behind it.
Every function here that estimates something returns one, and :func:`hpcnb.records.record`
takes it as its value (``record(key, median_interval(samples))``).

- :func:`median_interval`: the exact distribution-free order-statistic interval of a median
  (:func:`median_interval_coverage` tells its coverage; 95 % from 6 samples on);
- :func:`bootstrap_rows` and :func:`mean_interval`: a seeded percentile bootstrap over rows,
  optionally stratified by group;
- :func:`mape_interval`: mean absolute percentage error with that bootstrap;
- :func:`wilson_interval` and :func:`difference_interval`: a proportion and the difference
  of two proportions (Wilson; Newcombe's hybrid method).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

from hpcnb.errors import HpcnbError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike

__all__ = [
    "MAX_SAMPLES",
    "NOMINAL_COVERAGE",
    "Estimate",
    "StatisticsError",
    "absolute_percentage_errors",
    "bootstrap_rows",
    "difference_interval",
    "mape_interval",
    "mean_interval",
    "median_interval",
    "median_interval_coverage",
    "wilson_interval",
]

NOMINAL_COVERAGE = 0.95
MAX_SAMPLES = 100_000


class StatisticsError(HpcnbError, ValueError):
    """Inputs a statistic cannot use: no values, non-finite ones, bad sizes or confidence."""


@dataclass(frozen=True)
class Estimate:
    """A value with its interval and the number of observations behind it.

    Attributes:
        value: The estimate.
        low: Lower end of its interval (``None`` when there is none).
        high: Upper end of its interval (``None`` when there is none).
        n: Observations behind it (items, rows, seeds, rounds), or ``None`` when unknown.
        coverage: Coverage of the interval when it is not the nominal 95 %.

    Example:
        >>> e = Estimate(1.2, 1.1, 1.4, 7)
        >>> e.interval, str(e)
        ((1.1, 1.4), '1.2 [1.1, 1.4] (n=7)')
    """

    value: float
    low: float | None = None
    high: float | None = None
    n: int | None = None
    coverage: float | None = None

    def __post_init__(self) -> None:
        if (self.low is None) != (self.high is None):
            raise StatisticsError(f"Estimate {self.value}: give both ends of the interval or none")
        if not math.isfinite(self.value):
            raise StatisticsError(f"Estimate: the value {self.value} is not finite")
        if self.low is not None and self.high is not None and not self.low <= self.high:
            raise StatisticsError(f"Estimate {self.value}: low {self.low} > high {self.high}")
        if self.n is not None and (isinstance(self.n, bool) or self.n < 1):
            raise StatisticsError(
                f"Estimate {self.value}: n must be a positive int, got {self.n!r}"
            )

    @property
    def interval(self) -> tuple[float, float] | None:
        """``(low, high)``, or ``None`` without an interval."""
        if self.low is None or self.high is None:
            return None
        return (self.low, self.high)

    @property
    def bounds(self) -> tuple[float, float]:
        """``(low, high)``; raises :class:`StatisticsError` without an interval."""
        if self.low is None or self.high is None:
            raise StatisticsError(f"Estimate {self.value} has no interval")
        return (self.low, self.high)

    def __str__(self) -> str:
        text = f"{self.value:.4g}"
        if self.low is not None and self.high is not None:
            text += f" [{self.low:.4g}, {self.high:.4g}]"
        if self.n is not None:
            text += f" (n={self.n})"
        return text


def median_interval_coverage(n: int, confidence: float = NOMINAL_COVERAGE) -> tuple[int, float]:
    """Rank ``k`` and coverage of the exact order-statistic interval of a median.

    ``[x_(k), x_(n+1-k)]`` (sorted samples, 1-based) holds the population median with
    probability ``1 - 2 P(Bin(n, 1/2) <= k - 1)`` for any continuous distribution. The
    largest ``k`` whose coverage reaches ``confidence`` is chosen; when even ``k = 1``
    (``[min, max]``) falls short, ``k = 1`` and its smaller coverage are returned.

    Args:
        n: Number of samples (>= 2).
        confidence: The coverage wanted, in (0, 1).

    Returns:
        ``(k, coverage)``.

    Raises:
        StatisticsError: ``n < 2`` or a bad confidence.

    Example:
        >>> median_interval_coverage(5)
        (1, 0.9375)
        >>> median_interval_coverage(7)
        (1, 0.984375)
        >>> median_interval_coverage(15)[0]
        4
    """
    if n < 2:
        raise StatisticsError(f"an interval of a median needs at least 2 samples, got {n}")
    if not 0 < confidence < 1:
        raise StatisticsError(f"confidence {confidence} is not in (0, 1)")
    cdf = 0.0  # P(Bin(n, 1/2) <= k - 1), exact in binary floating point for these sizes
    best_k, best_cov = 1, 1 - 2 * 0.5**n
    term = 0.5**n  # C(n, j) / 2^n, updated incrementally
    for k in range(1, n // 2 + 1):
        cdf += term  # adds j = k - 1
        term = term * (n - (k - 1)) / k
        cov = 1 - 2 * cdf
        if cov >= confidence - 1e-12:
            best_k, best_cov = k, cov
        else:
            break
    return best_k, best_cov


def median_interval(
    samples: Sequence[float],
    *,
    confidence: float = NOMINAL_COVERAGE,
) -> Estimate:
    """Median of ``samples`` and the exact order-statistic interval of that median.

    The interval is ``[x_(k), x_(n+1-k)]`` of the sorted samples with ``k`` from
    :func:`median_interval_coverage`: distribution-free and deterministic. Its coverage
    reaches 95 % only from 6 samples on; with fewer it is ``[min, max]``, whose smaller
    coverage :func:`median_interval_coverage` tells.

    Args:
        samples: At least one finite number (at most 100,000).
        confidence: Coverage wanted, in (0, 1).

    Returns:
        The :class:`Estimate` of the median with ``n`` samples; one sample has no interval.

    Raises:
        StatisticsError: No samples, too many, a non-finite one, or a bad confidence.
    """
    import numpy as np

    data = np.asarray([float(s) for s in samples], dtype=float)
    if data.size == 0:
        raise StatisticsError("samples: need at least one value")
    if data.size > MAX_SAMPLES:
        raise StatisticsError(f"samples: {data.size} values, more than the limit {MAX_SAMPLES}")
    if not np.all(np.isfinite(data)):
        raise StatisticsError("samples: every value must be finite")
    if not 0 < confidence < 1:
        raise StatisticsError(f"confidence {confidence} is not in (0, 1)")
    median = float(np.median(data))
    if data.size == 1:
        return Estimate(median, None, None, 1)
    k, _ = median_interval_coverage(int(data.size), confidence)
    ordered = np.sort(data)
    return Estimate(median, float(ordered[k - 1]), float(ordered[data.size - k]), int(data.size))


def bootstrap_rows(
    statistic: Callable[[np.ndarray], float],
    n_rows: int,
    *,
    groups: Sequence[object] | None = None,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """A statistic of rows with a percentile-bootstrap interval over the rows.

    ``statistic(idx)`` computes the statistic from the rows ``idx`` (an integer index
    array). The value is ``statistic(arange(n_rows))``; each of ``resamples`` resamples
    draws ``n_rows`` rows with replacement from ``numpy.random.default_rng(seed)`` —
    within each group when ``groups`` is given (a stratified bootstrap that keeps every
    group's size) — and the interval is the ``(1 ∓ confidence) / 2`` quantiles of the
    resampled statistics, widened if needed to hold the value. The same inputs and seed
    give the same interval. Rows are treated as independent.

    Args:
        statistic: Maps an index array of rows to a finite number.
        n_rows: Number of rows (>= 1).
        groups: Optional group label of each row (resampling stays within a group).
        confidence: Coverage of the interval, in (0, 1).
        resamples: Number of bootstrap resamples (>= 1).
        seed: Seed of the resampling generator.

    Returns:
        The :class:`Estimate` with ``n = n_rows``.

    Raises:
        StatisticsError: Bad sizes, confidence or resample count (a ``ValueError``).
    """
    import numpy as np

    if n_rows < 1 or resamples < 1 or not 0 < confidence < 1:
        raise StatisticsError(
            f"n_rows={n_rows}, resamples={resamples}, confidence={confidence}: need n_rows >= 1, "
            "resamples >= 1 and 0 < confidence < 1"
        )
    everything = np.arange(n_rows)
    value = float(statistic(everything))
    if groups is None:
        strata = [everything]
    else:
        labels = np.asarray(groups, dtype=object)
        if labels.shape != (n_rows,):
            raise StatisticsError(f"groups has {labels.size} labels for {n_rows} rows")
        strata = [everything[labels == g] for g in dict.fromkeys(labels.tolist())]
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for i in range(resamples):
        idx = np.concatenate([rng.choice(rows, size=rows.size) for rows in strata])
        stats[i] = statistic(idx)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return Estimate(value, float(min(low, value)), float(max(high, value)), n_rows)


def mean_interval(
    values: Sequence[float],
    *,
    groups: Sequence[object] | None = None,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Mean of ``values`` with a seeded bootstrap interval (see :func:`bootstrap_rows`).

    With ``groups`` the value is the mean of the groups' means (each group counts once,
    e.g. one model of a collection or one kernel family) and rows are resampled within
    their group.

    Args:
        values: Finite numbers, one per row (per-row errors, per-kernel scores...).
        groups: Optional group label of each row.
        confidence: Coverage of the interval.
        resamples: Bootstrap resamples.
        seed: Seed of the resampling generator.

    Returns:
        The :class:`Estimate` of the mean with ``n`` rows.

    Raises:
        StatisticsError: No values, a non-finite one, or labels that do not match the rows.
    """
    import numpy as np

    data = np.asarray(values, dtype=float)
    if data.ndim != 1 or data.size == 0 or not np.all(np.isfinite(data)):
        raise StatisticsError("mean_interval: need a non-empty 1-D array of finite values")
    if groups is None:

        def statistic(idx: np.ndarray) -> float:
            return float(data[idx].mean())

    else:
        labels = np.asarray(groups, dtype=object)
        if labels.shape != data.shape:
            raise StatisticsError(f"groups has {labels.size} labels for {data.size} rows")
        names = list(dict.fromkeys(labels.tolist()))

        def statistic(idx: np.ndarray) -> float:
            sub, lab = data[idx], labels[idx]
            return float(np.mean([sub[lab == g].mean() for g in names]))

    return bootstrap_rows(
        statistic, data.size, groups=groups, confidence=confidence, resamples=resamples, seed=seed
    )


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> Estimate:
    """Wilson score interval of a binomial proportion (an accuracy on ``n`` items).

    Args:
        successes: Items right (0 ≤ successes ≤ n).
        n: Items in total (> 0).
        confidence: Coverage of the interval.

    Returns:
        The :class:`Estimate` of the proportion ``successes / n`` with ``n`` items.

    Raises:
        StatisticsError: The counts are inconsistent.
    """
    if n <= 0 or not 0 <= successes <= n:
        raise StatisticsError(
            f"Wilson interval needs 0 <= successes <= n and n > 0, got {successes}/{n}"
        )
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Estimate(p, low, high, n)


def difference_interval(
    successes_a: int, n_a: int, successes_b: int, n_b: int, *, confidence: float = 0.95
) -> Estimate:
    """Difference of two accuracies ``a - b`` with Newcombe's hybrid Wilson interval.

    Newcombe (1998), method 10: the interval combines the two Wilson intervals. It
    assumes independent samples; for two models scored on the same test items it is
    conservative (wider than a paired interval).

    Args:
        successes_a: Items right of the first model.
        n_a: Items scored of the first model.
        successes_b: Items right of the second model.
        n_b: Items scored of the second model.
        confidence: Coverage of the interval.

    Returns:
        The :class:`Estimate` of the difference with ``n = n_a + n_b``.
    """
    pa, pb = successes_a / n_a if n_a else 0.0, successes_b / n_b if n_b else 0.0
    wa = wilson_interval(successes_a, n_a, confidence=confidence)
    wb = wilson_interval(successes_b, n_b, confidence=confidence)
    la, ua, lb, ub = wa.bounds + wb.bounds
    diff = pa - pb
    low = diff - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    high = diff + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    return Estimate(diff, low, high, n_a + n_b)


def absolute_percentage_errors(predicted: ArrayLike, measured: ArrayLike) -> np.ndarray:
    """Per-row absolute percentage errors ``|p - m| / m``, as fractions.

    Args:
        predicted: Predicted values.
        measured: Measured values (finite and positive), as many as ``predicted``.

    Raises:
        StatisticsError: Mismatched lengths, no rows, or a measured value that is not
            finite and positive.
    """
    import numpy as np

    p = np.asarray(predicted, dtype=float).ravel()
    m = np.asarray(measured, dtype=float).ravel()
    if p.shape != m.shape or p.size == 0:
        raise StatisticsError(f"predicted has {p.size} values, measured {m.size}; need equal, > 0")
    if np.any(~np.isfinite(m)) or np.any(m <= 0):
        raise StatisticsError("measured values must be finite and positive")
    return np.abs(p - m) / m


def mape_interval(
    predicted: ArrayLike,
    measured: ArrayLike,
    *,
    groups: Sequence[object] | None = None,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Mean absolute percentage error with a seeded bootstrap interval.

    Without ``groups`` the value is the mean of the per-row errors and rows are resampled
    with replacement. With ``groups`` the value is the mean of the groups' MAPEs (each group
    counts once, e.g. one model of a trace collection) and rows are resampled within their
    group (:func:`mean_interval`).

    Args:
        predicted: Predicted values.
        measured: Measured values (finite, positive).
        groups: Optional group label of each row.
        confidence: Coverage of the interval.
        resamples: Bootstrap resamples.
        seed: Seed of the resampling generator.

    Returns:
        The :class:`Estimate` of the MAPE (a fraction) with ``n`` rows.

    Example:
        >>> round(mape_interval([1.1, 0.9, 1.0], [1.0, 1.0, 1.0], resamples=200).value, 4)
        0.0667
    """
    ape = absolute_percentage_errors(predicted, measured)
    return mean_interval(
        ape.tolist(), groups=groups, confidence=confidence, resamples=resamples, seed=seed
    )
