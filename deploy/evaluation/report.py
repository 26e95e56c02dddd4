"""The evaluation report as text and files: the printed table, evaluation.json, evaluation.csv,
and the three PNGs (`deploy.evaluation.charts`), all rendered from one `EvaluationReport`
(`deploy.evaluation.summary`), whose numbers are computed once.

Charts: learning_curve.png draws every run with two or more checkpoints as a learning curve
against training step (IQM as a line with its interval as a band, the mean with its t interval
as marks), and every other policy (a loose file, a step-less final export, a run's only
checkpoint) as its own labelled mark beside them; each with the share of episodes that
terminated under it (labelled "reached stick" for Huggy, whose episodes end at the stick).
After `--select-best`, the pick carries a star and the dropped policies hollow marks. Policies
with nothing to draw are named in a note, never silently dropped.
probability_of_improvement.png is the matrix of P(row > column); performance_profile.png the share
of episodes above each return threshold, per policy, with a 95% band.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from deploy.evaluation.charts import (
    env_name,
    improvement_figure,
    plot_learning_curve,
    profile_figure,
)
from deploy.evaluation.summary import (
    CONFIDENCE,
    Best,
    EvaluationReport,
    PolicySummary,
)
from envs.rollout import ESTIMATOR, ESTIMATOR_DESCRIPTION, terminated_label
from huggy_agent.tables import format_table as huggy_table

CSV_NAME = "evaluation.csv"
JSON_NAME = "evaluation.json"
PNG_NAME = "learning_curve.png"
IMPROVEMENT_PNG_NAME = "probability_of_improvement.png"
PROFILE_PNG_NAME = "performance_profile.png"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _with_interval(value: float | None, interval: tuple[float, float] | None) -> str:
    """"1.234 [1.100, 1.360]", or the value alone, or "-"."""
    if value is None:
        return "-"
    return _fmt(value) if interval is None else f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def best_text(best: Best | None) -> str:
    """The report's verdict.

    Args:
        best: the best policy, or None.

    Returns:
        The best policy by its statistic, and P(best > runner-up) with its interval; or a line
            saying that no policy, or only one, has episodes.
    """
    if best is None:
        return "best: - (no policy finished an episode)"
    text = f"best: {best.label} by {best.statistic} return ({best.value:.3f})"
    if best.runner_up is None or best.improvement is None:
        return text + "; the only policy with episodes"
    p = best.improvement
    return (text + f"; P({best.label} > {best.runner_up}) = {p.value:.2f} "
            f"[{p.low:.2f}, {p.high:.2f}] (probability of improvement over the runner-up, "
            f"{CONFIDENCE:.0%} CI)")


def format_table(report: EvaluationReport) -> str:
    """The table as printed.

    Args:
        report: the evaluation's report.

    Returns:
        One line per policy (mean with its t interval beside IQM with its bootstrap interval),
            then the best policy, the selection, retries, runners, wall time, nodes and failures.
    """
    result, summaries = report.result, report.summaries
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
    lines.append(best_text(report.best))
    if result.selection is not None:
        lines.append(result.selection.text())
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


def to_json(report: EvaluationReport) -> dict[str, Any]:
    """Everything in the report as JSON-ready data.

    Args:
        report: the evaluation's report.

    Returns:
        The episode estimator (`envs.rollout`'s ESTIMATOR and ESTIMATOR_DESCRIPTION), config,
            summaries with their items (every episode with its slot and per-slot index, seed, node
            and runner), the robust statistics of each policy ("mean", "median", "iqm", each with
            "<name>_ci", "bootstrap", "probability_of_improvement" over every other policy), the
            best policy, the selection, runners, node episode counts and retries.
    """
    result, comparisons = report.result, report.comparisons
    policies = []
    for summary, policy in zip(report.summaries, result.policies, strict=True):
        entry = asdict(summary)
        entry["nodes"] = list(summary.nodes)
        entry["mean"] = summary.mean_return
        for name in ("mean_ci", "median_ci", "iqm_ci"):
            entry[name] = None if entry[name] is None else list(entry[name])
        entry["source"] = policy.spec.source
        entry["revision"] = policy.spec.revision
        entry["bootstrap"] = report.bootstrap
        entry["probability_of_improvement"] = {
            other: {"p": estimate.value, "ci": estimate.as_list()}
            for other, estimate in comparisons.get(summary.label, {}).items()}
        entry["items"] = [item.record() for item in policy.ordered_items()]
        policies.append(entry)
    best = report.best
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
        "selection": None if result.selection is None else asdict(result.selection),
        "nodes": result.node_episodes(),
        "runners": [asdict(runner) for runner in result.runners],
        "retries": result.retries,
        "interrupted": result.interrupted,
        "seconds": result.seconds,
        "startup_seconds": result.startup_seconds,
    }


CSV_FIELDS = ("label", "run", "step", "status", "episodes", "mean_return", "std_return",
              "mean_t_ci_low", "mean_t_ci_high", "mean_boot_ci_low", "mean_boot_ci_high",
              "median", "median_boot_ci_low", "median_boot_ci_high", "iqm", "iqm_boot_ci_low",
              "iqm_boot_ci_high", "mean_length", "terminated_share", "agent_steps_per_s",
              "retries", "nodes", "fingerprint", "path", "error")


def write_csv(summaries: list[PolicySummary], path: Path) -> None:
    """Write one row per policy: empty cells where a number is None; nodes joined with spaces; the
    mean's Student t interval as `mean_t_ci_low`, `mean_t_ci_high`, the stratified-bootstrap
    intervals as `<mean|median|iqm>_boot_ci_low`, `..._high`.

    Args:
        summaries: the report rows.
        path: the CSV file.
    """
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for summary in summaries:
            row = {name: getattr(summary, name) for name in CSV_FIELDS
                   if hasattr(summary, name)}
            row["mean_t_ci_low"], row["mean_t_ci_high"] = summary.ci_low, summary.ci_high
            for name in ("mean", "median", "iqm"):
                interval = getattr(summary, f"{name}_ci")
                row[f"{name}_boot_ci_low"], row[f"{name}_boot_ci_high"] = interval or (None, None)
            row["nodes"] = " ".join(summary.nodes)
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def write_report(report: EvaluationReport, out_dir: str | Path) -> dict[str, Path]:
    """Write evaluation.csv, evaluation.json, learning_curve.png, probability_of_improvement.png and
    performance_profile.png.

    Args:
        report: the evaluation's report.
        out_dir: where they go (created if needed).

    Returns:
        Their paths by kind ("csv", "json", "png", "improvement_png", "profile_png").
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result, summaries = report.result, report.summaries
    paths = {"csv": out / CSV_NAME, "json": out / JSON_NAME, "png": out / PNG_NAME,
             "improvement_png": out / IMPROVEMENT_PNG_NAME, "profile_png": out / PROFILE_PNG_NAME}
    write_csv(summaries, paths["csv"])
    paths["json"].write_text(json.dumps(to_json(report), indent=2, allow_nan=False))
    env = env_name(result.env)
    plot_learning_curve(summaries, paths["png"], env, terminated_label(result.behaviors()),
                        report.selection)
    improvement_figure([s.label for s, _ in report.ranked()], report.comparisons, env).savefig(
        paths["improvement_png"])
    profile_figure(result, env).savefig(paths["profile_png"])
    return paths
