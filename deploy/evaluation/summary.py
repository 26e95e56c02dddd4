"""The one evaluation report: every number the table, JSON, CSV, charts, TensorBoard and model
cards show, computed once from the finished evaluation (`build_report`), as typed objects.

Statistics use every finished episode of a policy, items taken in index order so the numbers do
not depend on which runner finished first (`deploy.evaluation.statistics`):

- mean with Student's t interval (`mean +- t(0.975, n-1) * std / sqrt(n)`, sample std, t from
  scipy): `ci_low`, `ci_high`;
- mean, median and interquartile mean (IQM), each with a 95% stratified-bootstrap percentile
  interval (strata: work items; `bootstrap` names method, resamples and seed, the seed being the
  evaluation's `--seed`);
- for every pair of policies the probability of improvement P(X > Y) with its interval, and the
  best policy by the ranking statistic (the mean unless `--select-by` says otherwise) with its
  probability of improvement over the runner-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from deploy.evaluation import statistics as stats
from deploy.evaluation.results import EvaluationResult, PolicyResult
from deploy.evaluation.selection import SelectionOutcome

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = stats.DEFAULT_RESAMPLES
Comparisons = dict[str, dict[str, stats.Estimate]]
"""P(X > Y) with its interval, by label: `comparisons[x][y]`."""


@dataclass(frozen=True)
class PolicySummary:
    """One row of the report. Numbers are None when there is nothing to compute them from."""

    label: str
    run: str | None
    step: int | None
    path: str | None
    fingerprint: str | None
    status: str
    """"ok", "failed" (with `error`) or "incomplete" (interrupted before every item finished)."""
    error: str | None
    episodes: int
    mean_return: float | None
    std_return: float | None
    ci_low: float | None
    ci_high: float | None
    mean_length: float | None
    terminated_share: float | None
    """Share of episodes (0..1) that the environment ended rather than the step limit: for
    Huggy, those that reached the stick."""
    agent_steps_per_s: float | None
    """Agent decisions per second of rollout (all steps / all rollout seconds): the rate of one
    runner, comparable whatever the number of runners."""
    retries: int
    nodes: tuple[str, ...]
    mean_ci: tuple[float, float] | None = None
    """Stratified-bootstrap interval of the mean (`ci_low`, `ci_high` are its t interval)."""
    median: float | None = None
    median_ci: tuple[float, float] | None = None
    iqm: float | None = None
    """Interquartile mean of the returns (`scipy.stats.trim_mean(returns, 0.25)`)."""
    iqm_ci: tuple[float, float] | None = None

    def numbers(self) -> tuple[Any, ...]:
        """The fields fixed by the seeds (not timing, retries or placement): equal across runs.

        Returns:
            Label, status, episodes, and every statistic with its intervals.
        """
        return (self.label, self.status, self.episodes, self.mean_return, self.std_return,
                self.ci_low, self.ci_high, self.mean_length, self.terminated_share, self.mean_ci,
                self.median, self.median_ci, self.iqm, self.iqm_ci)

    def statistic(self, name: str) -> float | None:
        """One statistic of the returns.

        Args:
            name: "mean", "median" or "iqm".

        Returns:
            Its value; None without episodes.
        """
        return {"mean": self.mean_return, "median": self.median, "iqm": self.iqm}[name]


def checkpoint_step(summary: PolicySummary) -> int:
    """A sort key that puts a run's checkpoints in training order.

    Args:
        summary: a report row.

    Returns:
        Its checkpoint step; -1 for a policy without one.
    """
    return -1 if summary.step is None else summary.step


def returns_by_item(policy: PolicyResult) -> list[tuple[float, ...]]:
    """A policy's returns grouped by work item (the bootstrap strata).

    Args:
        policy: the policy's results.

    Returns:
        Items in index order; items without episodes left out.
    """
    return [item.returns for item in policy.ordered_items() if item.returns]


def summarize(policy: PolicyResult, expected_episodes: int, seed: int = 0,
              resamples: int = BOOTSTRAP_RESAMPLES) -> PolicySummary:
    """The report row of one policy.

    Args:
        policy: the policy's results.
        expected_episodes: the episodes planned for it, which tell complete from interrupted.
        seed: seeds the bootstrap.
        resamples: the bootstrap's resamples.

    Returns:
        The row; its numbers None where there are no episodes (and the t interval and std for
            fewer than two).
    """
    items = policy.ordered_items()
    returns = [r for item in items for r in item.returns]
    lengths = [n for item in items for n in item.lengths]
    terminated = [ended for item in items for ended in item.terminated]
    n = len(returns)
    mean = std = mean_length = share = None
    robust: dict[str, stats.Estimate] = {}
    if n:
        mean = math.fsum(returns) / n
        mean_length = math.fsum(lengths) / n
        share = sum(terminated) / n
        robust = stats.bootstrap_estimates(returns_by_item(policy), confidence=CONFIDENCE,
                                           resamples=resamples, seed=seed)
    t_ci = stats.t_interval(returns, CONFIDENCE)
    if t_ci is not None:
        std = math.sqrt(math.fsum((r - t_ci.value) ** 2 for r in returns) / (n - 1))
    seconds = math.fsum(item.seconds for item in items)
    steps = sum(item.agent_steps for item in items)
    if policy.failed:
        status = "failed"
    elif n < expected_episodes:
        status = "incomplete"
    else:
        status = "ok"

    def interval(name: str) -> tuple[float, float] | None:
        return (robust[name].low, robust[name].high) if name in robust else None

    return PolicySummary(
        label=policy.spec.label, run=policy.spec.run, step=policy.spec.step,
        path=policy.spec.path or policy.spec.url, fingerprint=policy.fingerprint, status=status,
        error=policy.error, episodes=n, mean_return=mean, std_return=std,
        ci_low=None if t_ci is None else t_ci.low, ci_high=None if t_ci is None else t_ci.high,
        mean_length=mean_length, terminated_share=share,
        agent_steps_per_s=steps / seconds if seconds > 0 else None,
        retries=sum(item.attempts - 1 for item in items),
        nodes=tuple(sorted({item.node_id for item in items})),
        mean_ci=interval("mean"), median=robust["median"].value if robust else None,
        median_ci=interval("median"), iqm=robust["iqm"].value if robust else None,
        iqm_ci=interval("iqm"))


def summarize_all(result: EvaluationResult) -> list[PolicySummary]:
    """One summary per policy, in the order the policies were given; a policy is complete when it has
    every episode planned for it (`EvaluationResult.planned_episodes`).

    Args:
        result: the evaluation's result.

    Returns:
        The summaries.
    """
    planned = result.planned_episodes or [result.config.episodes] * len(result.policies)
    return [summarize(policy, expected, seed=result.config.seed)
            for policy, expected in zip(result.policies, planned, strict=True)]


def ranking_statistic(result: EvaluationResult) -> str:
    """What ranks the policies.

    Args:
        result: the evaluation's result.

    Returns:
        The selection's statistic, else "mean".
    """
    selection = result.config.selection
    return "mean" if selection is None else selection.statistic


def compare(result: EvaluationResult, resamples: int = BOOTSTRAP_RESAMPLES) -> Comparisons:
    """P(X > Y) with its stratified-bootstrap interval for every ordered pair of policies with
    episodes. Each pair is resampled once (seeded with the evaluation's seed): P(Y > X) is
    1 - P(X > Y), resample by resample.

    Args:
        result: the evaluation's result.
        resamples: the bootstrap's resamples.

    Returns:
        By label: `compare(...)[x][y]`.
    """
    done = [policy for policy in result.policies if returns_by_item(policy)]
    table: dict[str, dict[str, stats.Estimate]] = {policy.spec.label: {} for policy in done}
    for a, first in enumerate(done):
        for second in done[a + 1:]:
            forward = stats.improvement_interval(
                returns_by_item(first), returns_by_item(second), CONFIDENCE, resamples,
                seed=result.config.seed)
            table[first.spec.label][second.spec.label] = forward
            table[second.spec.label][first.spec.label] = stats.Estimate(
                1.0 - forward.value, 1.0 - forward.high, 1.0 - forward.low)
    return table


@dataclass(frozen=True)
class Best:
    """The best policy by `statistic`, and how sure: P(best > runner-up) with its interval
    (None when only one policy has episodes)."""

    label: str
    statistic: str
    value: float
    runner_up: str | None
    improvement: stats.Estimate | None


def best_policy(summaries: list[PolicySummary], statistic: str, comparisons: Comparisons,
                among: list[str] | None = None) -> Best | None:
    """The policy with the highest statistic, with its probability of improvement over the next best
    of all the others.

    Args:
        summaries: the report rows.
        statistic: "mean", "median" or "iqm".
        comparisons: every pair's P(X > Y) (`compare`).
        among: the labels the best may be taken from (those the selection kept); None for all.

    Returns:
        The best; None when no policy (among those) has episodes.
    """
    ranked = ranked_by(summaries, statistic)
    candidates = [(s, value) for s, value in ranked if among is None or s.label in among]
    if not candidates:
        return None
    top, top_value = candidates[0]
    others = [s for s, _ in ranked if s is not top]
    if not others:
        return Best(top.label, statistic, top_value, None, None)
    second = others[0].label
    return Best(top.label, statistic, top_value, second, comparisons[top.label][second])


def ranked_by(summaries: list[PolicySummary], statistic: str) -> list[tuple[PolicySummary, float]]:
    """The summaries that have a statistic, highest first.

    Args:
        summaries: the report rows.
        statistic: "mean", "median" or "iqm".

    Returns:
        (summary, value) pairs.
    """
    scored = [(s, value) for s in summaries if (value := s.statistic(statistic)) is not None]
    return sorted(scored, key=lambda pair: -pair[1])


def bootstrap_settings(result: EvaluationResult) -> dict[str, Any]:
    """How the intervals were drawn, as the JSON report states it.

    Args:
        result: the evaluation's result.

    Returns:
        Method, resamples, seed, confidence and strata.
    """
    return {"method": stats.BOOTSTRAP_METHOD, "resamples": BOOTSTRAP_RESAMPLES,
            "seed": result.config.seed, "confidence": CONFIDENCE, "strata": "work items"}


@dataclass(frozen=True)
class EvaluationReport:
    """A finished evaluation and everything decided from it, computed once (`build_report`):
    what every renderer (table, JSON, CSV, charts, TensorBoard, model cards) shows."""

    result: EvaluationResult
    summaries: list[PolicySummary]
    """One per policy, in the order the policies were given."""
    comparisons: Comparisons
    statistic: str
    """What ranks the policies: the selection's statistic, else the mean."""
    best: Best | None
    bootstrap: dict[str, Any]
    """How the intervals were drawn (`bootstrap_settings`)."""

    @property
    def selection(self) -> SelectionOutcome | None:
        return self.result.selection

    def ranked(self) -> list[tuple[PolicySummary, float]]:
        """The summaries that have the ranking statistic, highest first.

        Returns:
            (summary, value) pairs.
        """
        return ranked_by(self.summaries, self.statistic)


def build_report(result: EvaluationResult, resamples: int = BOOTSTRAP_RESAMPLES
                 ) -> EvaluationReport:
    """Summaries, every pairwise comparison and the best policy of an evaluation, once.

    Args:
        result: the evaluation's result.
        resamples: the bootstrap's resamples.

    Returns:
        The report.
    """
    summaries = summarize_all(result)
    comparisons = compare(result, resamples)
    statistic = ranking_statistic(result)
    among = None if result.selection is None else list(result.selection.remaining)
    return EvaluationReport(result, summaries, comparisons, statistic,
                            best_policy(summaries, statistic, comparisons, among),
                            bootstrap_settings(result))
