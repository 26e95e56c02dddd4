"""The evaluation's figures (matplotlib, imported where drawn): the learning curve, the
probability-of-improvement matrix and the performance profiles. They draw what the report
computed (`deploy.evaluation.summary`); only the profiles' bands are drawn here (a bootstrap
per threshold, for the picture alone)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from deploy.evaluation import statistics as stats
from deploy.evaluation.plan import EnvSpec
from deploy.evaluation.results import EvaluationResult
from deploy.evaluation.selection import SelectionOutcome
from deploy.evaluation.summary import (
    CONFIDENCE,
    Comparisons,
    PolicySummary,
    checkpoint_step,
    returns_by_item,
)
from huggy_agent.discovery import unique_labels

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CHART_LABEL_CHARS = 32
"""Policy labels longer than this are cut to their end in the chart ("…/run/Huggy.onnx")."""


def env_name(env: EnvSpec) -> str:
    """The environment as the chart title names it.

    Args:
        env: the evaluation's environment.

    Returns:
        The Unity build's file name, else "built-in stand-in".
    """
    return Path(env.file_name).name if env.file_name else "built-in stand-in"


def chart_label(label: str, limit: int = CHART_LABEL_CHARS) -> str:
    """A policy label short enough for a chart.

    Args:
        label: the label.
        limit: the most characters.

    Returns:
        `label` itself when it has at most `limit` characters, else "…" and its end (`limit`
            characters at most), cut at a "/" when that keeps most of it: "…/run/Huggy.onnx".
    """
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
    """Split the finished policies into learning curves and single policies (see `ChartGroups`).

    Args:
        summaries: the report rows.

    Returns:
        The runs with two or more checkpoints of known step, each sorted by step, and every other
            finished policy.
    """
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


PICKED_LABEL = "picked by --select-best"
DROPPED_LABEL = "dropped early by --select-best (hollow)"


def _mark_pick(axes: Axes, x: float, y: float) -> None:
    """A gold star on the mean of the policy `--select-best` picked."""
    axes.plot([x], [y], marker="*", markersize=16, color="gold", markeredgecolor="black",
              linestyle="none", zorder=5)


def _note_drop(axes: Axes, x: float, summary: PolicySummary, episodes: int,
               align: str = "center") -> None:
    """"dropped after N episodes" above the interval of a policy `--select-best` dropped (a
    dropped policy is rarely the highest, so there is room above it), aligned `align` with the
    mark ("left" keeps the first point of a curve's note inside the axes)."""
    high = summary.ci_high if summary.ci_high is not None else summary.mean_return
    axes.annotate(f"dropped after\n{episodes} episodes", (x, high), xytext=(0, 4),
                  textcoords="offset points", ha=align, va="bottom", fontsize=7)


def _selection_legend(figure: Figure, picked: bool, dropped: bool) -> None:
    """A legend under the chart for the marks of `--select-best` that were drawn."""
    from matplotlib.lines import Line2D

    handles = []
    if picked:
        handles.append(Line2D([], [], marker="*", markersize=12, color="gold",
                              markeredgecolor="black", linestyle="none", label=PICKED_LABEL))
    if dropped:
        handles.append(Line2D([], [], marker="o", color="0.3", markerfacecolor="white",
                              linestyle="none", label=DROPPED_LABEL))
    if handles:
        figure.legend(handles=handles, loc="outside lower center", ncols=len(handles),
                      fontsize=8, frameon=False)


def learning_curve_figure(summaries: list[PolicySummary], env: str,
                          terminated: str = "terminated",
                          selection: SelectionOutcome | None = None) -> Figure:
    """The chart, titled "Evaluation: <env>".

    Top row: mean return with its 95% interval; bottom row: share of episodes that terminated
    (rows share their y scale). Left column ("curves"): one line per run with two or more
    checkpoints, against training step, legend by run. Right column ("policies"): every other
    policy, a run of one checkpoint among them, as a point with its interval (an error-bar
    mark, labelled with the policy's `chart_label`) beside its IQM and interval, and one bar;
    the x tick labels are those labels, broken onto two lines at a "/" or "@" and rotated when
    they would not fit. A column is left out when it has nothing to draw; policies that are not
    "ok" are named in a note at the bottom.

    Args:
        summaries: the report's rows (`deploy.evaluation.summary.summarize_all`).
        env: the environment as the title names it (`env_name`).
        terminated: the bottom row's axis label ("reached stick" for Huggy:
            `envs.rollout.terminated_label`).
        selection: the outcome of `--select-best`, if it ran: the policy it picked gets a gold
            star on its mean, each policy it dropped a hollow mark and "dropped after N
            episodes", and a legend under the chart says what the two marks mean.

    Returns:
        The figure; its axes carry the labels "curves", "curves reached", "policies" and
            "policies reached" (those drawn).
    """
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
    picked = None if selection is None else selection.best
    dropped = {} if selection is None else selection.dropped
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
            for place, s in enumerate(points):
                assert s.step is not None and s.mean_return is not None  # a curve's points
                if s.label in dropped:
                    top.plot([s.step], [s.mean_return], marker="o", markersize=6,
                             markerfacecolor="white", markeredgecolor=color, linestyle="none",
                             zorder=4)
                    align = ("left" if place == 0 else "right" if place == len(points) - 1
                             else "center")
                    _note_drop(top, s.step, s, dropped[s.label], align)
                if s.label == picked:
                    _mark_pick(top, s.step, s.mean_return)
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
        labels = _short_labels([s.label for s in singles])
        colors = [f"C{(len(groups.runs) + k) % 10}" for k in range(len(singles))]
        for k, (s, label) in enumerate(zip(singles, labels, strict=True)):
            top.errorbar([k - 0.12], [s.mean_return], yerr=_error_bars([s]), fmt="o", capsize=5,
                         color=colors[k], label=label,
                         markerfacecolor="white" if s.label in dropped else colors[k])
            if s.label in dropped:
                _note_drop(top, k - 0.12, s, dropped[s.label])
            if s.label == picked and s.mean_return is not None:
                _mark_pick(top, k - 0.12, s.mean_return)
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
    drawn = {s.label for s in groups.singles} | {s.label for points in groups.runs.values()
                                                  for s in points}
    _selection_legend(figure, picked in drawn, bool(drawn & set(dropped)))
    return figure


def plot_learning_curve(summaries: list[PolicySummary], path: Path, env: str,
                        terminated: str = "terminated",
                        selection: SelectionOutcome | None = None) -> None:
    """Save `learning_curve_figure(summaries, env, terminated, selection)` as a PNG.

    Args:
        summaries: the report rows.
        path: the PNG file.
        env: the environment's name in the title.
        terminated: what the terminated share is called ("reached stick" for Huggy).
        selection: the adaptive selection's outcome, or None.
    """
    learning_curve_figure(summaries, env, terminated, selection).savefig(path)


def improvement_figure(labels: list[str], comparisons: Comparisons,
                       env: str) -> Figure:
    """The matrix of P(row > column), each cell with its interval when there are at most 8 policies;
    blue where the row is better.

    Args:
        labels: the policies, best first.
        comparisons: every pair's P(X > Y) (`summary.compare`).
        env: the environment's name in the title.

    Returns:
        The figure.
    """
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
    """`chart_label` of each, made unique (`unique_labels`) where cutting made two alike."""
    return unique_labels([chart_label(label) for label in labels])


PROFILE_POINTS = 101
"""Thresholds tau a performance profile is drawn at (evenly over the returns seen)."""


def profile_figure(result: EvaluationResult, env: str) -> Figure:
    """Performance profiles: for each policy with episodes, the share of its episodes whose return is
    above tau, against tau, with a stratified-bootstrap band.

    Args:
        result: the evaluation's result.
        env: the environment's name in the title.

    Returns:
        The figure (a note instead when no policy finished an episode).
    """
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


