"""Robust statistics of episode returns, as pure functions: no Ray, no files.

A policy's episodes come grouped by work item (`strata`: one sequence of returns per item).
Intervals are stratified-bootstrap percentile intervals: each resample draws, within every item,
as many episodes as the item has, with replacement, so every resample keeps the per-slot quotas
of the evaluation (rliable's `StratifiedBootstrap`). Resamples are drawn as one index matrix
(chunked to bound memory) from `numpy.random.default_rng(seed)`, so equal inputs and seed give
equal intervals on every machine.

- mean, median, interquartile mean (IQM: `scipy.stats.trim_mean(x, 0.25)`, the mean of the
  middle half);
- Student's t interval of the mean;
- probability of improvement P(X > Y) = U / (n_x n_y), U the Mann-Whitney statistic of X
  (ties count one half), with a stratified bootstrap interval resampling X and Y independently;
- performance profiles: the share of episodes scoring above each threshold tau.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

BOOTSTRAP_METHOD = "percentile"
"""How intervals are read from the resampled statistics: their alpha/2 and 1 - alpha/2
quantiles."""
DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
CHUNK_ELEMENTS = 1 << 21
"""Most resampled values held at once (16 MiB of float64); resamples are drawn in chunks of
`CHUNK_ELEMENTS // episodes` rows, a number fixed by the input, so results do not depend on it
beyond that."""

Metric = Callable[[np.ndarray], np.ndarray]
"""A statistic over the last axis of a 2-D array: one value per row."""
Strata = Sequence[Sequence[float]]
"""Episode returns grouped by work item."""


def mean(values: np.ndarray) -> np.ndarray:
    """The mean over the last axis.

    Args:
        values: returns, one row per sample.

    Returns:
        One mean per row.
    """
    return np.mean(values, axis=-1)


def median(values: np.ndarray) -> np.ndarray:
    """The median over the last axis (the mean of the middle two for an even count).

    Args:
        values: returns, one row per sample.

    Returns:
        One median per row.
    """
    return np.median(values, axis=-1)


def iqm(values: np.ndarray) -> np.ndarray:
    """The interquartile mean over the last axis: `scipy.stats.trim_mean(values, 0.25)`, which cuts
    `int(0.25 * n)` values from each end and averages the rest.

    Args:
        values: returns, one row per sample.

    Returns:
        One IQM per row.
    """
    from scipy.stats import trim_mean

    return np.asarray(trim_mean(values, 0.25, axis=-1))


METRICS: dict[str, Metric] = {"mean": mean, "median": median, "iqm": iqm}
"""The statistics the report and `--select-by` know, by name."""


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval [low, high]."""

    value: float
    low: float
    high: float

    def as_list(self) -> list[float]:
        """The interval as the JSON report writes it.

        Returns:
            [low, high].
        """
        return [self.low, self.high]


def _flatten(strata: Strata, name: str = "strata") -> tuple[np.ndarray, list[int]]:
    """All returns as one float64 array, and each item's size. Raises ValueError for no
    episodes, an empty item or a value that is not finite."""
    sizes = [len(stratum) for stratum in strata]
    if not sizes or 0 in sizes:
        raise ValueError(f"{name}: expected one or more work items, each with at least one "
                         f"episode, got item sizes {sizes}")
    values = np.concatenate([np.asarray(stratum, dtype=np.float64) for stratum in strata])
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name}: expected finite returns, got {values[~np.isfinite(values)][:3]}")
    return values, sizes


def _check(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an integer >= 1, got {resamples!r}")


def _index_chunks(sizes: Sequence[int], resamples: int, rng: np.random.Generator
                  ) -> Iterator[np.ndarray]:
    """Index matrices (rows, sum(sizes)) into the flattened sample, `resamples` rows in all:
    columns of item j index only item j's episodes, drawn uniformly with replacement."""
    total = sum(sizes)
    offsets = np.cumsum([0, *sizes[:-1]])
    rows_per_chunk = max(1, CHUNK_ELEMENTS // total)
    done = 0
    while done < resamples:
        rows = min(rows_per_chunk, resamples - done)
        yield np.concatenate([rng.integers(0, size, (rows, size)) + offset
                              for size, offset in zip(sizes, offsets, strict=True)], axis=1)
        done += rows


def bootstrap_distribution(strata: Strata, metric: Metric, resamples: int = DEFAULT_RESAMPLES,
                           seed: int = 0) -> np.ndarray:
    """A metric of stratified resamples of the episodes.

    Args:
        strata: returns grouped by work item.
        metric: the statistic.
        resamples: how many resamples, >= 1.
        seed: seeds the resampling.

    Returns:
        (resamples,) the metric of each resample.

    Raises:
        ValueError: no episodes, an empty item, a return that is not finite, or `resamples` < 1.
    """
    _check(0.5, resamples)
    values, sizes = _flatten(strata)
    rng = np.random.default_rng(seed)
    return np.concatenate([metric(values[index])
                           for index in _index_chunks(sizes, resamples, rng)])


def percentile_interval(distribution: np.ndarray, confidence: float) -> tuple[float, float]:
    """The percentile interval of a bootstrap distribution.

    Args:
        distribution: the resampled statistics.
        confidence: the interval's coverage, in (0, 1).

    Returns:
        The (1 - confidence)/2 and (1 + confidence)/2 quantiles.
    """
    low, high = np.quantile(distribution, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def bootstrap_estimates(strata: Strata, metrics: Mapping[str, Metric] | None = None,
                        confidence: float = DEFAULT_CONFIDENCE,
                        resamples: int = DEFAULT_RESAMPLES, seed: int = 0
                        ) -> dict[str, Estimate]:
    """Metrics of all episodes, each with its stratified-bootstrap percentile interval; every metric
    is read from the same resamples.

    Args:
        strata: returns grouped by work item.
        metrics: {name: statistic}; None: mean, median and IQM.
        confidence: the intervals' coverage, in (0, 1).
        resamples: how many resamples, >= 1.
        seed: seeds the resampling.

    Returns:
        {name: estimate}.

    Raises:
        ValueError: no episodes, an empty item, a return that is not finite, a confidence outside
            (0, 1), or `resamples` < 1.
    """
    _check(confidence, resamples)
    metrics = METRICS if metrics is None else metrics
    values, sizes = _flatten(strata)
    rng = np.random.default_rng(seed)
    draws: dict[str, list[np.ndarray]] = {name: [] for name in metrics}
    for index in _index_chunks(sizes, resamples, rng):
        resampled = values[index]
        for name, metric in metrics.items():
            draws[name].append(metric(resampled))
    estimates = {}
    for name, metric in metrics.items():
        low, high = percentile_interval(np.concatenate(draws[name]), confidence)
        estimates[name] = Estimate(float(metric(values[None, :])[0]), low, high)
    return estimates


def bootstrap_interval(strata: Strata, metric: Metric, confidence: float = DEFAULT_CONFIDENCE,
                       resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Estimate:
    """One metric of all episodes with its stratified-bootstrap percentile interval.

    Args:
        strata: returns grouped by work item.
        metric: the statistic.
        confidence: the interval's coverage, in (0, 1).
        resamples: how many resamples, >= 1.
        seed: seeds the resampling.

    Returns:
        The estimate.

    Raises:
        ValueError: as `bootstrap_estimates` raises.
    """
    return bootstrap_estimates(strata, {"metric": metric}, confidence, resamples, seed)["metric"]


def t_quantile(p: float, df: int) -> float:
    """A quantile of Student's t distribution (`scipy.stats.t.ppf`).

    Args:
        p: the probability, in (0, 1).
        df: the degrees of freedom, an integer >= 1.

    Returns:
        The p-quantile.

    Raises:
        ValueError: `p` outside (0, 1), or `df` not an integer >= 1.
    """
    from scipy.stats import t as student_t

    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    return float(student_t.ppf(p, df))


def t_interval(returns: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
               ) -> Estimate | None:
    """The mean with Student's t interval, `mean +- t((1 + confidence)/2, n-1) * s / sqrt(n)` (sample
    std with n-1).

    Args:
        returns: the returns.
        confidence: the interval's coverage, in (0, 1).

    Returns:
        The estimate; None for fewer than two returns.

    Raises:
        ValueError: (1 + confidence) / 2 outside (0, 1).
    """
    n = len(returns)
    if n < 2:
        return None
    center = math.fsum(returns) / n
    std = math.sqrt(math.fsum((r - center) ** 2 for r in returns) / (n - 1))
    half = t_quantile((1 + confidence) / 2, n - 1) * std / math.sqrt(n)
    return Estimate(center, center - half, center + half)


def probability_of_improvement(x: ArrayLike, y: ArrayLike) -> float:
    """P(X > Y): the share of pairs (x_i, y_j) with x_i > y_j, ties counting one half; that is the
    Mann-Whitney U statistic of `x` divided by n_x n_y.

    Args:
        x: X's returns.
        y: Y's returns.

    Returns:
        The probability, in [0, 1].

    Raises:
        ValueError: either sample is empty.
    """
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.size == 0 or ys.size == 0:
        raise ValueError(f"expected episodes in both samples, got {xs.size} and {ys.size}")
    return float(_improvement_rows(xs[None, :], ys[None, :])[0])


def _improvement_rows(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """P(X > Y) of each row pair, from average ranks in the pooled row: U = R_x - n_x(n_x+1)/2."""
    from scipy.stats import rankdata

    n_x, n_y = xs.shape[1], ys.shape[1]
    ranks = rankdata(np.concatenate([xs, ys], axis=1), axis=1)
    u = ranks[:, :n_x].sum(axis=1) - n_x * (n_x + 1) / 2
    return u / (n_x * n_y)


def _draw_counts(groups: np.ndarray, index: np.ndarray, distinct: int) -> np.ndarray:
    """How often each distinct value was drawn in each resample row: (rows, distinct)."""
    rows = index.shape[0]
    flat = (np.arange(rows)[:, None] * distinct + groups[index]).ravel()
    return np.bincount(flat, minlength=rows * distinct).reshape(rows, distinct)


def improvement_interval(x_strata: Strata, y_strata: Strata,
                         confidence: float = DEFAULT_CONFIDENCE,
                         resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Estimate:
    """P(X > Y) with a stratified-bootstrap percentile interval: X's and Y's episodes are resampled
    independently, each within its own items.

    Each resample's U is counted without sorting it: with the pooled distinct values in order
    and c_x, c_y how often a resample drew each, U = sum_v c_x(v) (c_y(below v) + c_y(v) / 2).

    Args:
        x_strata: X's returns grouped by work item.
        y_strata: Y's returns grouped by work item.
        confidence: the interval's coverage, in (0, 1).
        resamples: how many resamples, >= 1.
        seed: seeds the resampling.

    Returns:
        The estimate.

    Raises:
        ValueError: no episodes, an empty item or a return that is not finite on either side, a
            confidence outside (0, 1), or `resamples` < 1.
    """
    _check(confidence, resamples)
    xs, x_sizes = _flatten(x_strata, "x")
    ys, y_sizes = _flatten(y_strata, "y")
    distinct, groups = np.unique(np.concatenate([xs, ys]), return_inverse=True)
    x_groups, y_groups = groups[:xs.size], groups[xs.size:]
    rng = np.random.default_rng(seed)
    rows = max(1, CHUNK_ELEMENTS // (xs.size + ys.size + distinct.size))
    draws = []
    done = 0
    while done < resamples:
        count = min(rows, resamples - done)
        x_counts = _draw_counts(x_groups, next(_index_chunks(x_sizes, count, rng)), distinct.size)
        y_counts = _draw_counts(y_groups, next(_index_chunks(y_sizes, count, rng)), distinct.size)
        below = np.cumsum(y_counts, axis=1) - y_counts
        draws.append((x_counts * (below + 0.5 * y_counts)).sum(axis=1) / (xs.size * ys.size))
        done += count
    low, high = percentile_interval(np.concatenate(draws), confidence)
    return Estimate(probability_of_improvement(xs, ys), low, high)


def performance_profile(returns: ArrayLike, taus: ArrayLike) -> np.ndarray:
    """The share of episodes whose return is above each threshold (strictly).

    Args:
        returns: the returns.
        taus: the thresholds.

    Returns:
        One share per tau.

    Raises:
        ValueError: no episodes.
    """
    values = np.asarray(returns, dtype=np.float64)
    if values.size == 0:
        raise ValueError("expected at least one episode for a performance profile")
    return np.mean(values[:, None] > np.asarray(taus, dtype=np.float64)[None, :], axis=0)


def performance_profile_band(strata: Strata, taus: ArrayLike,
                             confidence: float = DEFAULT_CONFIDENCE,
                             resamples: int = 2_000, seed: int = 0
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The performance profile with a pointwise stratified-bootstrap percentile band.

    Args:
        strata: returns grouped by work item.
        taus: the thresholds.
        confidence: the band's coverage, in (0, 1).
        resamples: how many resamples, >= 1.
        seed: seeds the resampling.

    Returns:
        (profile, low, high), each one value per tau.

    Raises:
        ValueError: no episodes, an empty item, a return that is not finite, a confidence outside
            (0, 1), or `resamples` < 1.
    """
    _check(confidence, resamples)
    values, sizes = _flatten(strata)
    above = (values[:, None] > np.asarray(taus, dtype=np.float64)[None, :]).astype(np.float64)
    rng = np.random.default_rng(seed)
    shares = []
    for index in _index_chunks(sizes, resamples, rng):
        # Resampled share above tau = (how often each episode was drawn) @ above / n.
        rows = index.shape[0]
        flat = (np.arange(rows)[:, None] * values.size + index).ravel()
        counts = np.bincount(flat, minlength=rows * values.size).reshape(rows, values.size)
        shares.append(counts @ above / values.size)
    draws = np.concatenate(shares)
    low, high = np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2], axis=0)
    return above.mean(axis=0), low, high
