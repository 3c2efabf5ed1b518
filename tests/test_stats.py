"""The statistics behind records: the Estimate type and the interval functions."""

import math

import numpy as np
import pytest

from hpcnb.stats import (
    Estimate,
    StatisticsError,
    difference_interval,
    mape_interval,
    mean_interval,
    median_interval,
    median_interval_coverage,
    wilson_interval,
)


def test_estimate_checks_itself_and_prints_its_interval():
    est = Estimate(1.5, 1.2, 1.9, 9)
    assert est.interval == (1.2, 1.9) == est.bounds and str(est) == "1.5 [1.2, 1.9] (n=9)"
    assert Estimate(2.0).interval is None and str(Estimate(2.0)) == "2"
    for bad in [
        dict(value=math.nan),
        dict(value=1.0, low=0.5),
        dict(value=1.0, low=2.0, high=1.0),
        dict(value=1.0, n=0),
    ]:
        with pytest.raises(StatisticsError):
            Estimate(**bad)
    with pytest.raises(StatisticsError, match="no interval"):
        _ = Estimate(1.0).bounds


def test_mape_interval_is_the_mean_of_absolute_percentage_errors():
    predicted, measured = np.array([1.1, 0.8, 2.0, 3.3]), np.array([1.0, 1.0, 2.0, 3.0])
    est = mape_interval(predicted, measured, resamples=500)
    assert est.value == pytest.approx((0.1 + 0.2 + 0 + 0.1) / 4) and est.n == 4
    assert est.low <= est.value <= est.high
    grouped = mape_interval(predicted, measured, groups=["a", "a", "b", "b"], resamples=500)
    assert grouped.value == pytest.approx(((0.1 + 0.2) / 2 + 0.05) / 2)
    with pytest.raises(StatisticsError, match="positive"):
        mape_interval([1.0], [0.0])


def test_median_interval_is_the_exact_order_statistic_interval():
    samples = [1.0, 1.4, 1.1, 1.3, 1.2, 1.25, 1.15]
    assert median_interval(samples) == Estimate(1.2, 1.0, 1.4, 7)  # k = 1, 1 - 2/128
    twelve = [float(i) for i in range(12, 0, -1)]
    assert median_interval(twelve) == Estimate(6.5, 3.0, 10.0, 12)  # k = 3, 1 - 2 P(B <= 2)
    assert median_interval([3.0]) == Estimate(3.0, None, None, 1)


@pytest.mark.parametrize(
    ("n", "k", "coverage"),
    [
        (2, 1, 0.5),
        (3, 1, 0.75),
        (5, 1, 0.9375),
        (6, 1, 0.96875),
        (9, 2, 1 - 2 * 10 / 512),
        (20, 6, 1 - 2 * sum(math.comb(20, j) for j in range(6)) / 2**20),
    ],
)
def test_median_interval_coverage_is_binomial(n, k, coverage):
    got_k, got = median_interval_coverage(n)
    assert got_k == k and got == pytest.approx(coverage, abs=1e-12)
    if got >= 0.95:  # the next rank in would fall below 95 %
        nxt = 1 - 2 * sum(math.comb(n, j) for j in range(k + 1)) / 2**n
        assert nxt < 0.95


def test_median_interval_covers_the_median_as_often_as_it_says():
    import numpy as np

    rng = np.random.default_rng(1)
    for n in (5, 7, 15):
        _, coverage = median_interval_coverage(n)
        data = rng.exponential(1.0, size=(4000, n))  # skewed: median log 2
        hits = 0
        for row in data:
            low, high = median_interval(row).bounds
            hits += low <= math.log(2) <= high
        assert abs(hits / 4000 - coverage) < 0.02


def test_median_interval_narrows_with_more_samples():
    rng = __import__("numpy").random.default_rng(0)
    small = rng.normal(1.0, 0.1, 8)
    large = rng.normal(1.0, 0.1, 800)
    lo_s, hi_s = median_interval(small).bounds
    lo_l, hi_l = median_interval(large).bounds
    assert hi_l - lo_l < (hi_s - lo_s) / 3


@pytest.mark.parametrize("bad", [[], [1.0, math.nan]])
def test_median_interval_rejects_bad_samples(bad):
    with pytest.raises(StatisticsError):
        median_interval(bad)


def test_wilson_interval_matches_a_hand_computed_value():
    # 8 of 10, z = 1.959964: centre 0.7212, half-width 0.2114 (Wilson 1927 formula)
    est = wilson_interval(8, 10)
    assert (est.value, est.n) == (0.8, 10)
    assert est.low == pytest.approx(0.4902, abs=1e-4) and est.high == pytest.approx(
        0.9433, abs=1e-4
    )
    assert wilson_interval(0, 5).low == 0.0 and wilson_interval(5, 5).high == 1.0
    with pytest.raises(StatisticsError):
        wilson_interval(6, 5)


def test_difference_interval_holds_the_difference_and_is_wider_than_either():
    est = difference_interval(90, 100, 80, 100)
    assert est.value == pytest.approx(0.1) and est.low < est.value < est.high and est.n == 200
    la, ha = wilson_interval(90, 100).bounds
    assert est.high - est.low > ha - la


def test_mean_interval_plain_and_grouped():
    est = mean_interval([0.1, 0.1, 0.1, 0.0, 0.1, 0.25], seed=3)
    assert est.value == pytest.approx(0.65 / 6) and 0.0 <= est.low <= est.value <= est.high <= 0.25
    assert mean_interval([0.1, 0.1, 0.1, 0.0, 0.1, 0.25], seed=3) == est and est.n == 6
    est = mean_interval([0.1, 0.3, 0.5, 0.5, 0.5], groups=list("aabbb"))
    assert est.value == pytest.approx(0.35) and 0.3 <= est.low <= est.value <= est.high <= 0.4
    with pytest.raises(StatisticsError):
        mean_interval([])
    with pytest.raises(StatisticsError, match="labels"):
        mean_interval([1.0, 2.0], groups=["a"])
