"""The evaluation report: per-policy statistics, a printed table, CSV, JSON and a learning curve.

Statistics use every finished episode of a policy, items taken in index order so the numbers do
not depend on which runner finished first. The 95% interval is Student's t interval of the mean
(`mean +- t(0.975, n-1) * std / sqrt(n)`, sample std with n-1).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy.evaluate import EvaluationResult, PolicyResult
from huggy_agent.tables import format_table as huggy_table

CSV_NAME = "evaluation.csv"
JSON_NAME = "evaluation.json"
PNG_NAME = "learning_curve.png"


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t distribution with `df` degrees of freedom (0.5 < p < 1).

    The CDF is integrated numerically (Simpson's rule on the density, accurate to ~1e-9 here) and
    inverted by bisection; scipy is not a dependency.
    """
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must be in (0.5, 1), got {p!r}")
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))

    def cdf(t: float, intervals: int = 2000) -> float:
        h = t / intervals
        total = density(0.0) + density(t)
        total += sum((4 if k % 2 else 2) * density(k * h) for k in range(1, intervals))
        return 0.5 + total * h / 3

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, high * 2
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return (low + high) / 2


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
    """Everything in the report as JSON-ready data: config, summaries with their items (every
    episode, seed, node and runner), runners, node episode counts, retries."""
    summaries = summaries if summaries is not None else summarize_all(result)
    policies = []
    for summary, policy in zip(summaries, result.policies, strict=True):
        entry = asdict(summary)
        entry["nodes"] = list(summary.nodes)
        entry["items"] = [asdict(item) for item in policy.ordered_items()]
        policies.append(entry)
    return {
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


def _error_bars(points: list[PolicySummary]) -> list[list[float]]:
    """Distances from each mean down and up to its interval (0 where there is no interval)."""
    return [[0.0 if s.ci_low is None else s.mean_return - s.ci_low for s in points],
            [0.0 if s.ci_high is None else s.ci_high - s.mean_return for s in points]]


def plot_learning_curve(summaries: list[PolicySummary], path: Path) -> None:
    """Mean return with its 95% interval against training step, one line per run; policies of
    unknown step are drawn against their label instead when no policy has a step."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    done = [s for s in summaries if s.mean_return is not None]
    figure = Figure(figsize=(8, 5), dpi=100)
    axes = figure.add_subplot()
    with_step = [s for s in done if s.step is not None]
    if with_step:
        runs: dict[str, list[PolicySummary]] = {}
        for s in with_step:
            runs.setdefault(s.run or "files", []).append(s)
        for run, points in runs.items():
            points.sort(key=lambda s: s.step)
            steps = [s.step for s in points]
            means = [s.mean_return for s in points]
            errors = _error_bars(points)
            axes.errorbar(steps, means, yerr=errors, marker="o", capsize=4, label=run)
        axes.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # no "+2e6" offset
        axes.set_xlabel("training step")
        axes.legend()
    else:
        labels = [s.label for s in done]
        axes.errorbar(range(len(done)), [s.mean_return for s in done], yerr=_error_bars(done),
                      fmt="o", capsize=4)
        axes.set_xticks(range(len(done)), labels, rotation=20, ha="right")
        axes.set_xlabel("policy")
    if not done:
        axes.text(0.5, 0.5, "no finished episodes", ha="center", va="center",
                  transform=axes.transAxes)
    axes.set_ylabel("mean episode return (95% CI)")
    axes.set_title("Huggy evaluation")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)


def write_report(result: EvaluationResult, out_dir: str | Path) -> dict[str, Path]:
    """Write evaluation.csv, evaluation.json and learning_curve.png into `out_dir` (created if
    needed); returns their paths by kind ("csv", "json", "png")."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize_all(result)
    paths = {"csv": out / CSV_NAME, "json": out / JSON_NAME, "png": out / PNG_NAME}
    write_csv(summaries, paths["csv"])
    paths["json"].write_text(json.dumps(to_json(result, summaries), indent=2, allow_nan=False))
    plot_learning_curve(summaries, paths["png"])
    return paths
