"""The evaluation report: per-policy statistics, a printed table, CSV, JSON and a learning curve.

Statistics use every finished episode of a policy, items taken in index order so the numbers do
not depend on which runner finished first. The 95% interval is Student's t interval of the mean
(`mean +- t(0.975, n-1) * std / sqrt(n)`, sample std with n-1; t from scipy).

The chart (learning_curve.png) draws every run with two or more checkpoints as a learning curve
against training step, and every other policy (a loose file, a step-less final export, a run's
only checkpoint) as its own labelled mark beside them; each with the share reaching the stick
under it. Policies with nothing to draw are named in a note, never silently dropped.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.evaluation import EnvSpec, EvaluationResult, PolicyResult
from huggy_agent.tables import format_table as huggy_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CSV_NAME = "evaluation.csv"
JSON_NAME = "evaluation.json"
PNG_NAME = "learning_curve.png"


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t distribution with `df` degrees of freedom (0 < p < 1, df an
    integer >= 1), from `scipy.stats.t.ppf`."""
    from scipy.stats import t as student_t

    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    return float(student_t.ppf(p, df))


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
    reached_stick: float | None
    """Share of episodes that ended at the stick (0..1)."""
    agent_steps_per_s: float | None
    """Agent decisions per second of rollout (all steps / all rollout seconds): the rate of one
    runner, comparable whatever the number of runners."""
    retries: int
    nodes: tuple[str, ...]

    def numbers(self) -> tuple[Any, ...]:
        """The fields fixed by the seeds (not timing, retries or placement): equal across runs."""
        return (self.label, self.status, self.episodes, self.mean_return, self.std_return,
                self.ci_low, self.ci_high, self.mean_length, self.reached_stick)


def summarize(policy: PolicyResult, expected_episodes: int) -> PolicySummary:
    """The report row of one policy; `expected_episodes` tells complete from interrupted."""
    items = policy.ordered_items()
    returns = [r for item in items for r in item.returns]
    lengths = [n for item in items for n in item.lengths]
    reached = [ok for item in items for ok in item.reached_stick]
    n = len(returns)
    mean = std = low = high = mean_length = share = None
    if n:
        mean = math.fsum(returns) / n
        mean_length = math.fsum(lengths) / n
        share = sum(reached) / n
    if n > 1:
        std = math.sqrt(math.fsum((r - mean) ** 2 for r in returns) / (n - 1))
        half = t_quantile(0.975, n - 1) * std / math.sqrt(n)
        low, high = mean - half, mean + half
    seconds = math.fsum(item.seconds for item in items)
    steps = sum(item.agent_steps for item in items)
    if policy.failed:
        status = "failed"
    elif n < expected_episodes:
        status = "incomplete"
    else:
        status = "ok"
    return PolicySummary(
        label=policy.spec.label, run=policy.spec.run, step=policy.spec.step,
        path=policy.spec.path or policy.spec.url, fingerprint=policy.fingerprint, status=status,
        error=policy.error, episodes=n, mean_return=mean, std_return=std, ci_low=low,
        ci_high=high, mean_length=mean_length, reached_stick=share,
        agent_steps_per_s=steps / seconds if seconds > 0 else None,
        retries=sum(item.attempts - 1 for item in items),
        nodes=tuple(sorted({item.node_id for item in items})))


def summarize_all(result: EvaluationResult) -> list[PolicySummary]:
    """One summary per policy, in the order the policies were given."""
    return [summarize(policy, result.config.episodes) for policy in result.policies]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(result: EvaluationResult, summaries: list[PolicySummary] | None = None) -> str:
    """The table as printed: one line per policy, then retries, nodes and failures."""
    summaries = summaries if summaries is not None else summarize_all(result)
    header = ("policy", "step", "episodes", "mean return", "std", "95% CI", "mean length",
              "reached stick", "agent-steps/s", "retries", "status")
    rows = []
    for s in summaries:
        ci = "-" if s.ci_low is None else f"[{s.ci_low:.3f}, {s.ci_high:.3f}]"
        reached = "-" if s.reached_stick is None else f"{100 * s.reached_stick:.1f}%"
        rows.append((s.label, "-" if s.step is None else str(s.step), str(s.episodes),
                     _fmt(s.mean_return), _fmt(s.std_return), ci, _fmt(s.mean_length, 1), reached,
                     _fmt(s.agent_steps_per_s, 0), str(s.retries), s.status))
    lines = huggy_table(header, rows).splitlines()  # text cells: every column left-aligned
    nodes = ", ".join(f"{node} ({count} episodes)"
                      for node, count in sorted(result.node_episodes().items()))
    lines.append("")
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


def to_json(result: EvaluationResult, summaries: list[PolicySummary] | None = None
            ) -> dict[str, Any]:
    """Everything in the report as JSON-ready data: the episode estimator (`envs.rollout`'s
    ESTIMATOR and ESTIMATOR_DESCRIPTION), config, summaries with their items (every episode with
    its slot and per-slot index, seed, node and runner), runners, node episode counts, retries."""
    from envs.rollout import ESTIMATOR, ESTIMATOR_DESCRIPTION

    summaries = summaries if summaries is not None else summarize_all(result)
    policies = []
    for summary, policy in zip(summaries, result.policies, strict=True):
        entry = asdict(summary)
        entry["nodes"] = list(summary.nodes)
        entry["items"] = [asdict(item) for item in policy.ordered_items()]
        policies.append(entry)
    return {
        "estimator": {"name": ESTIMATOR, "description": ESTIMATOR_DESCRIPTION},
        "config": asdict(result.config),
        "env": asdict(result.env),
        "policies": policies,
        "nodes": result.node_episodes(),
        "runners": [asdict(runner) for runner in result.runners],
        "retries": result.retries,
        "interrupted": result.interrupted,
        "seconds": result.seconds,
        "startup_seconds": result.startup_seconds,
    }


CSV_FIELDS = ("label", "run", "step", "status", "episodes", "mean_return", "std_return", "ci_low",
              "ci_high", "mean_length", "reached_stick", "agent_steps_per_s", "retries", "nodes",
              "fingerprint", "path", "error")


def write_csv(summaries: list[PolicySummary], path: Path) -> None:
    """One row per policy; empty cells where a number is None; nodes joined with spaces."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for summary in summaries:
            row = {name: getattr(summary, name) for name in CSV_FIELDS}
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
    runs = {run: sorted(points, key=lambda s: s.step)
            for run, points in by_run.items() if len(points) >= 2}
    singles = [s for s in done if s.run not in runs or s.step is None]
    return ChartGroups(runs, singles)


def _error_bars(points: list[PolicySummary]) -> list[list[float]]:
    """Distances from each mean down and up to its interval (0 where there is no interval)."""
    return [[0.0 if s.ci_low is None else s.mean_return - s.ci_low for s in points],
            [0.0 if s.ci_high is None else s.ci_high - s.mean_return for s in points]]


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


def learning_curve_figure(summaries: list[PolicySummary], env: str) -> Figure:
    """The chart, titled "Evaluation: <env>". Top row: mean return with its 95% interval; bottom
    row: share of episodes that reached the stick (rows share their y scale). Left column
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
            top.errorbar(steps, [s.mean_return for s in points], yerr=_error_bars(points),
                         marker="o", capsize=3, color=f"C{k % 10}", label=chart_label(run))
            bottom.plot(steps, [s.reached_stick for s in points], marker="o", color=f"C{k % 10}")
        top.set_title("learning curves", fontsize=10)
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
            top.errorbar([k], [s.mean_return], yerr=_error_bars([s]), fmt="o", capsize=5,
                         color=colors[k], label=label)
        bars = bottom.bar(range(len(singles)), [s.reached_stick for s in singles], width=0.5,
                          color=colors, alpha=0.8)
        bottom.bar_label(bars, labels=[f"{s.reached_stick:.0%}" for s in singles], fontsize=8)
        ticks = [_tick_text(label) for label in labels]
        # Rotate when the labels would not fit side by side (about 0.08 inch per character).
        per_policy = (widths["policies"] - 0.8) / len(singles)
        rotate = max(len(line) for tick in ticks for line in tick.split("\n")) * 0.08 > per_policy
        bottom.set_xticks(range(len(singles)), ticks, rotation=30 if rotate else 0,
                          ha="right" if rotate else "center", rotation_mode="anchor")
        bottom.set_xlim(-0.6, len(singles) - 0.4)
        top.set_title("single policies", fontsize=10)
        bottom.set_xlabel("policy")
    grid[0, 0].set_ylabel("mean return (95% CI)")
    grid[1, 0].set_ylabel("reached stick")
    grid[1, 0].set_ylim(-0.04, 1.15)  # markers at 0% whole, room for the bars' labels
    grid[1, 0].set_yticks([0.0, 0.5, 1.0])
    grid[1, 0].yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    for axes in grid.flat:
        axes.grid(alpha=0.3)
    return figure


def plot_learning_curve(summaries: list[PolicySummary], path: Path, env: str) -> None:
    """Save `learning_curve_figure(summaries, env)` as a PNG at `path`."""
    learning_curve_figure(summaries, env).savefig(path)


def write_report(result: EvaluationResult, out_dir: str | Path) -> dict[str, Path]:
    """Write evaluation.csv, evaluation.json and learning_curve.png into `out_dir` (created if
    needed); returns their paths by kind ("csv", "json", "png")."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize_all(result)
    paths = {"csv": out / CSV_NAME, "json": out / JSON_NAME, "png": out / PNG_NAME}
    write_csv(summaries, paths["csv"])
    paths["json"].write_text(json.dumps(to_json(result, summaries), indent=2, allow_nan=False))
    plot_learning_curve(summaries, paths["png"], env_name(result.env))
    return paths
