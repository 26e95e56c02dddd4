"""The evaluation report: per-policy statistics, comparisons, a printed table, CSV, JSON and charts.

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

Charts: learning_curve.png draws every run with two or more checkpoints as a learning curve
against training step (IQM as a line with its interval as a band, the mean with its t interval
as marks), and every other policy (a loose file, a step-less final export, a run's only
checkpoint) as its own labelled mark beside them; each with the share of episodes that
terminated under it (labelled "reached stick" for Huggy, whose episodes end at the stick).
Policies with nothing to draw are named in a note, never silently dropped.
probability_of_improvement.png is the matrix of P(row > column); performance_profile.png the share
of episodes above each return threshold, per policy, with a 95% band.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from deploy.evaluation import EnvSpec, EvaluationResult, PolicyResult
from deploy.evaluation import statistics as stats
from deploy.evaluation.statistics import t_quantile as t_quantile  # the report's t interval
from envs.rollout import terminated_label
from huggy_agent.tables import format_table as huggy_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CSV_NAME = "evaluation.csv"
JSON_NAME = "evaluation.json"
PNG_NAME = "learning_curve.png"
IMPROVEMENT_PNG_NAME = "probability_of_improvement.png"
PROFILE_PNG_NAME = "performance_profile.png"
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = stats.DEFAULT_RESAMPLES


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
        """The fields fixed by the seeds (not timing, retries or placement): equal across runs."""
        return (self.label, self.status, self.episodes, self.mean_return, self.std_return,
                self.ci_low, self.ci_high, self.mean_length, self.terminated_share, self.mean_ci,
                self.median, self.median_ci, self.iqm, self.iqm_ci)

    def statistic(self, name: str) -> float | None:
        """"mean", "median" or "iqm" of the returns."""
        return {"mean": self.mean_return, "median": self.median, "iqm": self.iqm}[name]


def checkpoint_step(summary: PolicySummary) -> int:
    """The summary's checkpoint step, -1 for a policy without one: a sort key that puts a run's
    checkpoints in training order."""
    return -1 if summary.step is None else summary.step


def returns_by_item(policy: PolicyResult) -> list[tuple[float, ...]]:
    """The policy's returns grouped by work item, items in index order (the bootstrap strata);
    items without episodes left out."""
    return [item.returns for item in policy.ordered_items() if item.returns]


def summarize(policy: PolicyResult, expected_episodes: int, seed: int = 0,
              resamples: int = BOOTSTRAP_RESAMPLES) -> PolicySummary:
    """The report row of one policy; `expected_episodes` tells complete from interrupted;
    `seed` and `resamples` drive the bootstrap."""
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
    """One summary per policy, in the order the policies were given; a policy is complete when
    it has every episode planned for it (`EvaluationResult.planned_episodes`)."""
    planned = result.planned_episodes or [result.config.episodes] * len(result.policies)
    return [summarize(policy, expected, seed=result.config.seed)
            for policy, expected in zip(result.policies, planned, strict=True)]


def ranking_statistic(result: EvaluationResult) -> str:
    """What ranks the policies: the selection's statistic, else the mean."""
    selection = result.config.selection
    return "mean" if selection is None else selection.statistic


def compare(result: EvaluationResult, resamples: int = BOOTSTRAP_RESAMPLES
            ) -> dict[str, dict[str, stats.Estimate]]:
    """P(X > Y) with its stratified-bootstrap interval for every ordered pair of policies with
    episodes, by label: `compare(...)[x][y]`. Each pair is resampled once (seeded with the
    evaluation's seed): P(Y > X) is 1 - P(X > Y), resample by resample."""
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


def best_policy(summaries: list[PolicySummary], statistic: str,
                comparisons: dict[str, dict[str, stats.Estimate]],
                among: list[str] | None = None) -> Best | None:
    """The policy with the highest `statistic` (among the labels `among` when given: those the
    selection kept), with its probability of improvement over the next best of all the others;
    None when no policy has episodes."""
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
    """The summaries that have `statistic`, with its value, highest first."""
    scored = [(s, value) for s in summaries if (value := s.statistic(statistic)) is not None]
    return sorted(scored, key=lambda pair: -pair[1])


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _with_interval(value: float | None, interval: tuple[float, float] | None) -> str:
    """"1.234 [1.100, 1.360]", or the value alone, or "-"."""
    if value is None:
        return "-"
    return _fmt(value) if interval is None else f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def best_text(best: Best | None) -> str:
    """The report's verdict: the best policy by its statistic, and P(best > runner-up)."""
    if best is None:
        return "best: - (no policy finished an episode)"
    text = f"best: {best.label} by {best.statistic} return ({best.value:.3f})"
    if best.runner_up is None or best.improvement is None:
        return text + "; the only policy with episodes"
    p = best.improvement
    return (text + f"; P({best.label} > {best.runner_up}) = {p.value:.2f} "
            f"[{p.low:.2f}, {p.high:.2f}] (probability of improvement over the runner-up, "
            f"{CONFIDENCE:.0%} CI)")


def format_table(result: EvaluationResult, summaries: list[PolicySummary] | None = None,
                 best: Best | None = None) -> str:
    """The table as printed: one line per policy (mean with its t interval beside IQM with its
    bootstrap interval), then the best policy, retries, nodes and failures."""
    summaries = summaries if summaries is not None else summarize_all(result)
    if best is None:
        best = best_policy(summaries, ranking_statistic(result), compare(result),
                           _remaining(result))
    header = ("policy", "step", "episodes", "mean [95% t-CI]", "IQM [95% bootstrap CI]",
              "median", "std", "mean length", terminated_label(result.behaviors()), "agent-steps/s",
              "retries",
              "status")
    rows = []
    for s in summaries:
        t_ci = None if s.ci_low is None or s.ci_high is None else (s.ci_low, s.ci_high)
        share = "-" if s.terminated_share is None else f"{100 * s.terminated_share:.1f}%"
        rows.append((s.label, "-" if s.step is None else str(s.step), str(s.episodes),
                     _with_interval(s.mean_return, t_ci), _with_interval(s.iqm, s.iqm_ci),
                     _fmt(s.median), _fmt(s.std_return), _fmt(s.mean_length, 1), share,
                     _fmt(s.agent_steps_per_s, 0), str(s.retries), s.status))
    lines = huggy_table(header, rows).splitlines()  # text cells: every column left-aligned
    nodes = ", ".join(f"{node} ({count} episodes)"
                      for node, count in sorted(result.node_episodes().items()))
    lines.append("")
    lines.append(best_text(best))
    if result.selection is not None:
        lines.append(selection_text(result.selection))
    startup = ("" if result.startup_seconds is None
               else f" (first runner ready after {result.startup_seconds:.1f} s)")
    lines.append(f"retries: {result.retries}   runners started: {len(result.runners)}   "
                 f"wall time: {result.seconds:.1f} s{startup}"
                 + ("   INTERRUPTED" if result.interrupted else ""))
    lines.append(f"nodes: {nodes or '-'}")
    for s in summaries:
        if s.error:
            lines.append(f"failed: {s.label}: {s.error}")
    return "\n".join(lines)


def selection_text(selection: dict[str, Any]) -> str:
    """One line on the adaptive selection: its pick, spending and drops."""
    dropped = ", ".join(f"{label} after {episodes}" for label, episodes
                        in selection["dropped"].items()) or "none"
    verdict = ("one policy left" if len(selection["remaining"]) == 1
               else f"budget spent with {len(selection['remaining'])} policies left")
    return (f"selection ({selection['rule']}, confidence {selection['confidence']}): "
            f"{selection['best']}; {verdict}; {selection['episodes_spent']} of "
            f"{selection['budget']} episodes in {selection['rounds']} rounds; dropped: {dropped}")


def _remaining(result: EvaluationResult) -> list[str] | None:
    """The labels the selection kept (the best is chosen among them), else None (all)."""
    return None if result.selection is None else list(result.selection["remaining"])


def bootstrap_settings(result: EvaluationResult) -> dict[str, Any]:
    """How the intervals were drawn, as the JSON report states it."""
    return {"method": stats.BOOTSTRAP_METHOD, "resamples": BOOTSTRAP_RESAMPLES,
            "seed": result.config.seed, "confidence": CONFIDENCE, "strata": "work items"}


def to_json(result: EvaluationResult, summaries: list[PolicySummary] | None = None,
            comparisons: dict[str, dict[str, stats.Estimate]] | None = None) -> dict[str, Any]:
    """Everything in the report as JSON-ready data: the episode estimator (`envs.rollout`'s
    ESTIMATOR and ESTIMATOR_DESCRIPTION), config, summaries with their items (every episode with
    its slot and per-slot index, seed, node and runner), the robust statistics of each policy
    ("mean", "median", "iqm", each with "<name>_ci", "bootstrap", "probability_of_improvement"
    over every other policy), the best policy, the selection, runners, node episode counts and
    retries."""
    from envs.rollout import ESTIMATOR, ESTIMATOR_DESCRIPTION

    summaries = summaries if summaries is not None else summarize_all(result)
    comparisons = comparisons if comparisons is not None else compare(result)
    bootstrap = bootstrap_settings(result)
    policies = []
    for summary, policy in zip(summaries, result.policies, strict=True):
        entry = asdict(summary)
        entry["nodes"] = list(summary.nodes)
        entry["mean"] = summary.mean_return
        for name in ("mean_ci", "median_ci", "iqm_ci"):
            entry[name] = None if entry[name] is None else list(entry[name])
        entry["source"] = policy.spec.source
        entry["revision"] = policy.spec.revision
        entry["bootstrap"] = bootstrap
        entry["probability_of_improvement"] = {
            other: {"p": estimate.value, "ci": estimate.as_list()}
            for other, estimate in comparisons.get(summary.label, {}).items()}
        entry["items"] = [asdict(item) for item in policy.ordered_items()]
        policies.append(entry)
    best = best_policy(summaries, ranking_statistic(result), comparisons, _remaining(result))
    return {
        "estimator": {"name": ESTIMATOR, "description": ESTIMATOR_DESCRIPTION},
        "config": asdict(result.config),
        "env": asdict(result.env),
        "policies": policies,
        "best": None if best is None else {
            "label": best.label, "statistic": best.statistic, "value": best.value,
            "runner_up": best.runner_up,
            "probability_of_improvement": None if best.improvement is None else {
                "p": best.improvement.value, "ci": best.improvement.as_list()}},
        "selection": result.selection,
        "nodes": result.node_episodes(),
        "runners": [asdict(runner) for runner in result.runners],
        "retries": result.retries,
        "interrupted": result.interrupted,
        "seconds": result.seconds,
        "startup_seconds": result.startup_seconds,
    }


CSV_FIELDS = ("label", "run", "step", "status", "episodes", "mean_return", "std_return", "ci_low",
              "ci_high", "mean_ci_low", "mean_ci_high", "median", "median_ci_low",
              "median_ci_high", "iqm", "iqm_ci_low", "iqm_ci_high", "mean_length",
              "terminated_share", "agent_steps_per_s", "retries", "nodes", "fingerprint", "path",
              "error")


def write_csv(summaries: list[PolicySummary], path: Path) -> None:
    """One row per policy; empty cells where a number is None; nodes joined with spaces;
    bootstrap intervals as `<name>_ci_low`, `<name>_ci_high` (`ci_low`, `ci_high`: t)."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for summary in summaries:
            row = {name: getattr(summary, name) for name in CSV_FIELDS
                   if hasattr(summary, name)}
            for name in ("mean_ci", "median_ci", "iqm_ci"):
                interval = getattr(summary, name)
                row[f"{name}_low"], row[f"{name}_high"] = interval or (None, None)
            row["nodes"] = " ".join(summary.nodes)
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


CHART_LABEL_CHARS = 32
"""Policy labels longer than this are cut to their end in the chart ("…/run/Huggy.onnx")."""


def env_name(env: EnvSpec) -> str:
    """The environment as the chart title names it: the Unity build's file name, else
    "built-in stand-in"."""
    return Path(env.file_name).name if env.file_name else "built-in stand-in"


def chart_label(label: str, limit: int = CHART_LABEL_CHARS) -> str:
    """`label` itself when it has at most `limit` characters, else "…" and its end (`limit`
    characters at most), cut at a "/" when that keeps most of it: "…/run/Huggy.onnx"."""
    if len(label) <= limit:
        return label
    tail = label[-(limit - 1):]
    cut = tail.find("/")
    return "…" + (tail[cut:] if 0 < cut <= limit // 3 else tail)


@dataclass(frozen=True)
class ChartGroups:
    """How the chart draws each policy with finished episodes: `runs` (run name to its points by
    step) for every run with at least two checkpoints of known step, `singles` for every other
    policy, in report order. Policies without a finished episode are in neither."""

    runs: dict[str, list[PolicySummary]]
    singles: list[PolicySummary]


def chart_groups(summaries: list[PolicySummary]) -> ChartGroups:
    """Split the finished policies into learning curves and single policies (see ChartGroups)."""
    done = [s for s in summaries if s.mean_return is not None]
    by_run: dict[str, list[PolicySummary]] = {}
    for s in done:
        if s.run is not None and s.step is not None:
            by_run.setdefault(s.run, []).append(s)
    runs = {run: sorted(points, key=checkpoint_step)
            for run, points in by_run.items() if len(points) >= 2}
    singles = [s for s in done if s.run not in runs or s.step is None]
    return ChartGroups(runs, singles)


def _error_bars(points: list[PolicySummary]) -> list[list[float]]:
    """Distances from each mean down and up to its interval (0 where there is no interval)."""
    return [[0.0 if s.ci_low is None or s.mean_return is None else s.mean_return - s.ci_low
             for s in points],
            [0.0 if s.ci_high is None or s.mean_return is None else s.ci_high - s.mean_return
             for s in points]]


def _unique_chart_labels(summaries: list[PolicySummary]) -> list[str]:
    """`chart_label` of each, with " #k" added where cutting made two alike."""
    seen: dict[str, int] = {}
    labels = []
    for s in summaries:
        label = chart_label(s.label)
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return labels


def _tick_text(label: str) -> str:
    """`label` on two lines, broken after its last "/" or before its last "@" (never inside a
    URL's "scheme://"), when it is longer than 16 characters and has one; as it is otherwise."""
    start = label.find("://") + 3 if "://" in label else 0
    cut = max(label.rfind("/", start) + 1, label.rfind("@", start))
    return f"{label[:cut]}\n{label[cut:]}" if len(label) > 16 and start < cut < len(label) else label


def _note(summaries: list[PolicySummary]) -> str:
    """The chart's note: one "status: label (N episodes)" per policy that is not "ok", with
    "(not drawn)" instead of the count when it has no finished episode; "" when all are ok."""
    entries = [f"{s.status}: {chart_label(s.label)}"
               + (f" ({s.episodes} episodes)" if s.episodes else " (not drawn)")
               for s in summaries if s.status != "ok"]
    return "; ".join(entries)


def learning_curve_figure(summaries: list[PolicySummary], env: str,
                          terminated: str = "terminated") -> Figure:
    """The chart, titled "Evaluation: <env>". Top row: mean return with its 95% interval; bottom
    row: share of episodes that terminated, the axis labelled `terminated` ("reached stick" for
    Huggy: `envs.rollout.terminated_label`) (rows share their y scale). Left column
    ("curves"): one line per run with two or more checkpoints, against training step, legend by
    run. Right column ("policies"): one error-bar mark (labelled with the policy's `chart_label`)
    and one bar per other policy, side by side; the x tick labels are those labels, broken onto
    two lines at a "/" or "@" and rotated when they would not fit. A column is left out when it
    has nothing to draw; policies that are not "ok" are named in a note at the bottom. The axes
    carry the labels "curves", "curves reached", "policies" and "policies reached"."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter, StrMethodFormatter

    groups = chart_groups(summaries)
    widths = {}
    if groups.runs:
        widths["curves"] = 6.5
    if groups.singles:
        widths["policies"] = max(3.0, 1.2 * len(groups.singles) + 0.8)
    width = max(5.5, sum(widths.values()) + 1.0)
    note = _note(summaries)
    if note:
        note = textwrap.fill(note, width=int(width / 0.075))
    height = 6.0 + (0.2 * (note.count("\n") + 1) if note else 0.0)
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    figure.suptitle(f"Evaluation: {env}")
    if note:
        figure.supxlabel(note, fontsize=8, color="tab:red")
    if not widths:
        axes = figure.add_subplot(label="empty")
        axes.set_axis_off()
        axes.text(0.5, 0.5, "no finished episodes", ha="center", va="center",
                  transform=axes.transAxes)
        return figure
    grid = figure.subplots(2, len(widths), sharex="col", sharey="row", squeeze=False,
                           gridspec_kw={"height_ratios": [2, 1],
                                        "width_ratios": list(widths.values())})
    columns = dict(zip(widths, grid.T, strict=True))
    if "curves" in columns:
        top, bottom = columns["curves"]
        top.set_label("curves")
        bottom.set_label("curves reached")
        for k, (run, points) in enumerate(groups.runs.items()):
            steps = [s.step for s in points]
            color = f"C{k % 10}"
            bands = [(s.step, s.iqm, s.iqm_ci) for s in points if s.iqm_ci is not None]
            if bands:
                band_steps, iqms, intervals = zip(*bands, strict=True)
                top.fill_between(band_steps, [low for low, _ in intervals],
                                 [high for _, high in intervals], color=color, alpha=0.2,
                                 linewidth=0)
                top.plot(band_steps, iqms, color=color, linewidth=2)
            top.errorbar(steps, [s.mean_return for s in points], yerr=_error_bars(points),
                         marker="o", markersize=4, capsize=3, color=color, linestyle="--",
                         linewidth=1, alpha=0.8, label=chart_label(run))
            bottom.plot(steps, [s.terminated_share for s in points], marker="o", color=color)
        top.set_title("learning curves: IQM (line, 95% bootstrap band),\nmean (dashed, 95% t-CI)",
                      fontsize=9)
        top.legend(title="run", fontsize=8, title_fontsize=8)
        bottom.xaxis.set_major_locator(MaxNLocator(nbins=5))
        bottom.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # no "+2e6" offset
        bottom.set_xlabel("training step")
    if "policies" in columns:
        top, bottom = columns["policies"]
        top.set_label("policies")
        bottom.set_label("policies reached")
        singles = groups.singles
        labels = _unique_chart_labels(singles)
        colors = [f"C{(len(groups.runs) + k) % 10}" for k in range(len(singles))]
        for k, (s, label) in enumerate(zip(singles, labels, strict=True)):
            top.errorbar([k - 0.12], [s.mean_return], yerr=_error_bars([s]), fmt="o", capsize=5,
                         color=colors[k], label=label)
            if s.iqm_ci is not None:
                top.vlines([k + 0.12], s.iqm_ci[0], s.iqm_ci[1], color=colors[k], linewidth=2.5,
                           alpha=0.6)
                top.plot([k + 0.12], [s.iqm], marker="D", color=colors[k])
        bars = bottom.bar(range(len(singles)), [s.terminated_share for s in singles], width=0.5,
                          color=colors, alpha=0.8)
        bottom.bar_label(bars, labels=[f"{s.terminated_share:.0%}" for s in singles], fontsize=8)
        ticks = [_tick_text(label) for label in labels]
        # Rotate when the labels would not fit side by side (about 0.08 inch per character).
        per_policy = (widths["policies"] - 0.8) / len(singles)
        rotate = max(len(line) for tick in ticks for line in tick.split("\n")) * 0.08 > per_policy
        bottom.set_xticks(range(len(singles)), ticks, rotation=30 if rotate else 0,
                          ha="right" if rotate else "center", rotation_mode="anchor")
        bottom.set_xlim(-0.6, len(singles) - 0.4)
        top.set_title("single policies: mean (o, 95% t-CI),\nIQM (diamond, 95% bootstrap CI)",
                      fontsize=9)
        bottom.set_xlabel("policy")
    grid[0, 0].set_ylabel("return")
    grid[1, 0].set_ylabel(terminated)
    grid[1, 0].set_ylim(-0.04, 1.15)  # markers at 0% whole, room for the bars' labels
    grid[1, 0].set_yticks([0.0, 0.5, 1.0])
    grid[1, 0].yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    for axes in grid.flat:
        axes.grid(alpha=0.3)
    return figure


def plot_learning_curve(summaries: list[PolicySummary], path: Path, env: str,
                        terminated: str = "terminated") -> None:
    """Save `learning_curve_figure(summaries, env, terminated)` as a PNG at `path`."""
    learning_curve_figure(summaries, env, terminated).savefig(path)


def improvement_figure(labels: list[str], comparisons: dict[str, dict[str, stats.Estimate]],
                       env: str) -> Figure:
    """The matrix of P(row > column) over the policies `labels` (best first), each cell with
    its 95% interval when there are at most 8 policies; blue where the row is better."""
    from matplotlib.figure import Figure

    n = len(labels)
    size = max(4.5, 1.1 * n + 2.5)
    figure = Figure(figsize=(size + 1.0, size), dpi=100, layout="constrained")
    axes = figure.add_subplot(label="improvement")
    matrix = np.full((n, n), np.nan)
    for i, row in enumerate(labels):
        for j, column in enumerate(labels):
            if i != j and column in comparisons.get(row, {}):
                matrix[i, j] = comparisons[row][column].value
    image = axes.imshow(matrix, cmap="RdBu", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=axes, label="P(row > column)", shrink=0.8)
    for i, row in enumerate(labels):
        for j, column in enumerate(labels):
            if np.isnan(matrix[i, j]):
                continue
            estimate = comparisons[row][column]
            text = f"{estimate.value:.2f}"
            if n <= 8:
                text += f"\n[{estimate.low:.2f}, {estimate.high:.2f}]"
            axes.text(j, i, text, ha="center", va="center", fontsize=8 if n <= 8 else 6,
                      color="white" if abs(estimate.value - 0.5) > 0.3 else "black")
    shown = _short_labels(labels)
    axes.set_xticks(range(n), shown, rotation=30, ha="right", rotation_mode="anchor",
                    fontsize=8)
    axes.set_yticks(range(n), shown, fontsize=8)
    axes.set_xlabel("Y (column)")
    axes.set_ylabel("X (row)")
    axes.set_title(f"Probability of improvement P(X > Y), {CONFIDENCE:.0%} CI: {env}",
                   fontsize=10)
    return figure


def _short_labels(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    shown = []
    for label in labels:
        short = chart_label(label)
        seen[short] = seen.get(short, 0) + 1
        shown.append(short if seen[short] == 1 else f"{short} #{seen[short]}")
    return shown


PROFILE_POINTS = 101
"""Thresholds tau a performance profile is drawn at (evenly over the returns seen)."""


def profile_figure(result: EvaluationResult, env: str) -> Figure:
    """Performance profiles: for each policy with episodes, the share of its episodes whose
    return is above tau, against tau, with a 95% stratified-bootstrap band (2,000 resamples)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    done = [policy for policy in result.policies if returns_by_item(policy)]
    figure = Figure(figsize=(7.5, 5.0), dpi=100, layout="constrained")
    axes = figure.add_subplot(label="profiles")
    if not done:
        axes.set_axis_off()
        axes.text(0.5, 0.5, "no finished episodes", ha="center", va="center",
                  transform=axes.transAxes)
        return figure
    everything = np.concatenate([np.concatenate(returns_by_item(p)) for p in done])
    low, high = float(everything.min()), float(everything.max())
    margin = 0.02 * (high - low) or 0.5
    taus = np.linspace(low - margin, high + margin, PROFILE_POINTS)
    for k, (policy, label) in enumerate(zip(done, _short_labels([p.spec.label for p in done]),
                                            strict=True)):
        profile, band_low, band_high = stats.performance_profile_band(
            returns_by_item(policy), taus, CONFIDENCE, resamples=2_000, seed=result.config.seed)
        color = f"C{k % 10}"
        axes.fill_between(taus, band_low, band_high, color=color, alpha=0.15, linewidth=0)
        axes.plot(taus, profile, color=color, label=label, linestyle="-" if k < 10 else "--")
    axes.set_xlabel("return threshold tau")
    axes.set_ylabel("episodes with return > tau")
    axes.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    axes.set_ylim(-0.02, 1.02)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, title="policy", title_fontsize=8,
                loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes.set_title(f"Performance profiles (95% bootstrap band): {env}", fontsize=10)
    return figure


def write_report(result: EvaluationResult, out_dir: str | Path) -> dict[str, Path]:
    """Write evaluation.csv, evaluation.json, learning_curve.png, probability_of_improvement.png
    and performance_profile.png into `out_dir` (created if needed); returns their paths by kind
    ("csv", "json", "png", "improvement_png", "profile_png")."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize_all(result)
    comparisons = compare(result)
    paths = {"csv": out / CSV_NAME, "json": out / JSON_NAME, "png": out / PNG_NAME,
             "improvement_png": out / IMPROVEMENT_PNG_NAME, "profile_png": out / PROFILE_PNG_NAME}
    write_csv(summaries, paths["csv"])
    paths["json"].write_text(json.dumps(to_json(result, summaries, comparisons), indent=2,
                                        allow_nan=False))
    env = env_name(result.env)
    plot_learning_curve(summaries, paths["png"], env, terminated_label(result.behaviors()))
    statistic = ranking_statistic(result)
    ranked = ranked_by(summaries, statistic)
    improvement_figure([s.label for s, _ in ranked], comparisons, env).savefig(
        paths["improvement_png"])
    profile_figure(result, env).savefig(paths["profile_png"])
    return paths
