"""deploy.evaluation.statistics on synthetic samples: answers worked out by hand, and agreement
with scipy where scipy computes the same thing. Pure Python: no Ray, no stand-in."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from deploy.evaluation import statistics as st


def test_iqm_median_mean_by_hand() -> None:
    values = np.arange(8.0)  # IQM: drop 0, 1 and 6, 7; mean of 2..5
    assert st.iqm(values) == 3.5 and st.median(values) == 3.5 and st.mean(values) == 3.5
    outlier = np.array([1.0, 2, 3, 4, 5, 6, 7, 1000])
    assert st.iqm(outlier) == 4.5  # mean of 3, 4, 5, 6: the outlier is cut
    assert st.median(outlier) == 4.5 and st.mean(outlier) == 128.5
    rows = np.array([[0.0, 1, 2, 3], [10, 10, 10, 50]])  # row-wise: 4 values cut to the middle 2
    assert st.iqm(rows).tolist() == [1.5, 10.0]


def test_probability_of_improvement_by_hand_and_against_mann_whitney() -> None:
    assert st.probability_of_improvement([5, 6, 7], [1, 2]) == 1.0  # disjoint, X above
    assert st.probability_of_improvement([1, 2], [5, 6, 7]) == 0.0
    assert st.probability_of_improvement([1, 2, 3], [1, 2, 3]) == 0.5  # identical
    # (2>1) + (2=2)/2 + (3>1) + (3>2) = 3.5 of 4 pairs
    assert st.probability_of_improvement([2, 3], [1, 2]) == 0.875
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 6, 40) / 2, rng.integers(0, 7, 31) / 2  # many ties
    u = scipy_stats.mannwhitneyu(x, y).statistic
    assert st.probability_of_improvement(x, y) == pytest.approx(u / (40 * 31), abs=1e-12)
    assert st.probability_of_improvement(x, y) + st.probability_of_improvement(y, x) == \
        pytest.approx(1.0, abs=1e-12)


def test_stratified_bootstrap_keeps_each_item_whole() -> None:
    # Item 0 scores 0 on every episode, item 1 scores 10: every stratified resample keeps five
    # of each, so mean, median and IQM are exactly 5 in every resample. An unstratified
    # bootstrap would move the mean between 0 and 10.
    estimates = st.bootstrap_estimates([[0.0] * 5, [10.0] * 5], resamples=2000, seed=1)
    for name in ("mean", "median", "iqm"):
        assert (estimates[name].value, estimates[name].low, estimates[name].high) == (5, 5, 5)
    band = st.performance_profile_band([[0.0] * 5, [10.0] * 5], [-1, 5, 10], resamples=500)
    assert [part.tolist() for part in band] == [[1.0, 0.5, 0.0]] * 3


def test_bootstrap_of_two_points_by_hand() -> None:
    # One item {0, 1}: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles of any large set of resamples are 0 and 1.
    estimate = st.bootstrap_interval([[0.0, 1.0]], st.mean, resamples=4000, seed=3)
    assert (estimate.value, estimate.low, estimate.high) == (0.5, 0.0, 1.0)
    draws = st.bootstrap_distribution([[0.0, 1.0]], st.mean, resamples=40_000, seed=3)
    shares = [np.mean(draws == v) for v in (0.0, 0.5, 1.0)]
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.01)  # binomial sd 0.0025


def test_one_item_agrees_with_scipy_bootstrap_percentile() -> None:
    """With one item the stratified bootstrap is scipy's percentile bootstrap; with 20,000
    resamples each, the bounds' Monte Carlo sd is about 0.02 standard errors, so 0.15 is 7 sd."""
    returns = np.random.default_rng(7).normal(1.0, 0.45, 90)
    for name, metric in (("mean", st.mean), ("iqm", st.iqm)):
        ours = st.bootstrap_interval([returns], metric, resamples=20_000, seed=5)
        theirs = scipy_stats.bootstrap((returns,), lambda a, axis, m=metric: m(a),
                                       n_resamples=20_000, method="percentile", vectorized=True,
                                       axis=-1, random_state=11)
        std_error = theirs.standard_error
        assert ours.value == pytest.approx(float(metric(returns[None])[0]), abs=1e-12)
        assert abs(ours.low - theirs.confidence_interval.low) < 0.15 * std_error, name
        assert abs(ours.high - theirs.confidence_interval.high) < 0.15 * std_error, name
    assert st.iqm(returns) == pytest.approx(scipy_stats.trim_mean(returns, 0.25), abs=1e-12)


@pytest.mark.statistics
def test_improvement_interval_agrees_with_scipy_two_sample_bootstrap() -> None:
    rng = np.random.default_rng(9)
    x, y = rng.normal(1.0, 0.5, 60), rng.normal(0.8, 0.5, 50)
    ours = st.improvement_interval([x], [y], resamples=10_000, seed=2)

    def improvement(a: np.ndarray, b: np.ndarray) -> float:
        return scipy_stats.mannwhitneyu(a, b).statistic / (a.size * b.size)

    theirs = scipy_stats.bootstrap((x, y), improvement, n_resamples=2_000, method="percentile",
                                   paired=False, vectorized=False, random_state=3)
    assert ours.value == pytest.approx(improvement(x, y), abs=1e-12)
    # P's standard error is about 0.055; the 2.5% quantile of 2,000 resamples has a Monte Carlo
    # sd of about 0.0035: 0.02 is 6 of them.
    assert ours.low == pytest.approx(theirs.confidence_interval.low, abs=0.02)
    assert ours.high == pytest.approx(theirs.confidence_interval.high, abs=0.02)
    assert ours.low < ours.value < ours.high


def test_improvement_interval_with_ties_matches_rank_reference_on_same_resamples() -> None:
    """The counting form of U equals the rank form (scipy's rankdata) resample by resample."""
    x_strata = [[1.0, 2.0, 2.0, 3.0], [0.0, 2.0, 5.0]]
    y_strata = [[2.0, 2.0, 1.0], [3.0, 0.5]]
    ours = st.improvement_interval(x_strata, y_strata, resamples=1000, seed=8)
    rng = np.random.default_rng(8)
    xs, ys = np.concatenate(x_strata), np.concatenate(y_strata)
    x_index = np.concatenate([rng.integers(0, 4, (1000, 4)), rng.integers(0, 3, (1000, 3)) + 4], 1)
    y_index = np.concatenate([rng.integers(0, 3, (1000, 3)), rng.integers(0, 2, (1000, 2)) + 3], 1)
    reference = [scipy_stats.mannwhitneyu(xs[a], ys[b]).statistic / 35
                 for a, b in zip(x_index, y_index, strict=True)]
    low, high = np.quantile(reference, [0.025, 0.975])
    assert (ours.low, ours.high) == pytest.approx((low, high), abs=1e-12)


def test_seeded_and_reproducible() -> None:
    strata = [np.random.default_rng(k).normal(0, 1, 18).tolist() for k in range(4)]
    first = st.bootstrap_estimates(strata, seed=21)
    assert st.bootstrap_estimates(strata, seed=21) == first
    assert st.bootstrap_estimates(strata, seed=22)["mean"] != first["mean"]
    assert first["mean"].low < first["mean"].value < first["mean"].high


def test_t_interval_by_hand() -> None:
    # mean 2, s = 1, n = 4: half-width t(0.975, 3) * 1 / 2 = 3.182446 / 2
    a = 1.5 ** 0.5  # s^2 = (a^2 + a^2) / 3 = 1
    estimate = st.t_interval([2 - a, 2.0, 2.0, 2 + a])
    assert estimate is not None and estimate.value == pytest.approx(2.0)
    assert estimate.high - estimate.value == pytest.approx(3.182446 / 2, abs=1e-6)
    assert st.t_interval([1.0]) is None


def test_performance_profile_by_hand() -> None:
    profile = st.performance_profile([0.0, 1.0, 2.0, 3.0], [-1.0, 0.0, 1.5, 3.0])
    assert profile.tolist() == [1.0, 0.75, 0.5, 0.0]  # strictly above tau


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match=r"expected one or more work items, each with at least "
                                         r"one episode, got item sizes \[2, 0\]"):
        st.bootstrap_estimates([[1.0, 2.0], []])
    with pytest.raises(ValueError, match="expected finite returns, got"):
        st.bootstrap_estimates([[1.0, float("nan")]])
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 1.5"):
        st.bootstrap_estimates([[1.0]], confidence=1.5)
    with pytest.raises(ValueError, match="resamples must be an integer >= 1, got 0"):
        st.improvement_interval([[1.0]], [[2.0]], resamples=0)
    with pytest.raises(ValueError, match="expected episodes in both samples, got 2 and 0"):
        st.probability_of_improvement([1.0, 2.0], [])
