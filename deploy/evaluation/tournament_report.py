"""A tournament's report, rated once (`build_tournament_report`) and rendered: the table on the
terminal, tournament.json, tournament.csv, ratings.png and win_rate.png, TensorBoard scalars
(`Evaluation/Elo` per training step) and Hugging Face model cards (the Elo and its interval in
`model-index`).

tournament.json holds what `to_json` returns.
"""

from __future__ import annotations

import csv
import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy.evaluation import ratings
from deploy.evaluation.rating_charts import ratings_figure, win_rate_figure
from deploy.evaluation.sinks import card_folder, save_card, write_scalars
from deploy.evaluation.tournament import Contender, TournamentResult
from huggy_agent.tables import format_table

JSON_NAME = "tournament.json"
CSV_NAME = "tournament.csv"
RATINGS_PNG = "ratings.png"
WIN_RATE_PNG = "win_rate.png"
EVENTS_SUFFIX = ".huggy-tournament"
"""The file-name suffix of the event files a tournament writes (and replaces next time)."""
SECTION_START = "<!-- huggy tournament: start -->"
SECTION_END = "<!-- huggy tournament: end -->"
CSV_FIELDS = ("label", "run", "step", "elo", "elo_ci_low", "elo_ci_high", "wins", "draws",
              "losses", "matches", "score", "path")


@dataclass(frozen=True)
class TournamentReport:
    """A finished tournament and its ratings, computed once."""

    result: TournamentResult
    ratings: ratings.Ratings | None
    """None when no match was played."""

    def contender(self, label: str) -> Contender:
        """A contender by label.

        Args:
            label: its label.

        Returns:
            The contender.
        """
        return next(c for c in self.result.contenders if c.label == label)


def build_tournament_report(result: TournamentResult, anchor: dict[str, float] | None = None
                            ) -> TournamentReport:
    """The ratings of every match played (`ratings.rate`, bootstrap seeded with the tournament's seed).

    Args:
        result: what the tournament played.
        anchor: `{label: elo}` to fix one policy's rating; None puts the mean at 1200.

    Returns:
        The report; its ratings None when no match was played.

    Raises:
        ValueError: a bad anchor.
    """
    if not result.matches:
        return TournamentReport(result, None)
    return TournamentReport(result, ratings.rate(result.matches, result.labels, anchor=anchor,
                                                 seed=result.config.seed))


def format_tournament_table(report: TournamentReport) -> str:
    """The table as printed.

    Args:
        report: the tournament's report.

    Returns:
        One line per policy, best first: Elo with its interval, record, score; then the best
            policy, the schedule's outcome and the run's figures.
    """
    result, found = report.result, report.ratings
    lines = []
    if found is None:
        lines.append("no match was played")
    else:
        rows = []
        for label, rating in found.policies.items():
            contender = report.contender(label)
            rows.append((label, "-" if contender.step is None else str(contender.step),
                         f"{rating.elo:.0f} [{rating.elo_ci[0]:.0f}, {rating.elo_ci[1]:.0f}]",
                         f"{rating.wins}-{rating.draws}-{rating.losses}", str(rating.matches),
                         f"{rating.score:.3f}"))
        lines += format_table(("policy", "step", "Elo [95% CI]", "W-D-L", "matches", "score"),
                              rows).splitlines()
        lines.append("")
        lines.append(best_line(found))
        lines.append(f"team 0 scored {found.team0_score:.3f} of its matches (0.5: fair sides)")
    selection = result.selection
    if selection.get("rule"):
        verdict = ("the leader clears every other policy" if selection["cleared"]
                   else "budget spent before the leader cleared every other policy")
        lines.append(f"selection ({selection['rule']}, confidence {selection['confidence']}): "
                     f"{selection['best']}; {verdict}; {selection['matches_spent']} of "
                     f"{selection['budget']} matches in {selection['rounds']} rounds")
    lines.append(f"matches: {len(result.matches)}   retries: {result.retries}   runners: "
                 f"{len(result.runners)}   wall time: {result.seconds:.1f} s"
                 + ("   INTERRUPTED" if result.interrupted else ""))
    return "\n".join(lines)


def best_line(found: ratings.Ratings) -> str:
    """The best policy, and how sure: P(best beats the runner-up) from the model.

    Args:
        found: the ratings.

    Returns:
        The line.
    """
    best = found.policies[found.best]
    text = f"best: {found.best} (Elo {best.elo:.0f} [{best.elo_ci[0]:.0f}, {best.elo_ci[1]:.0f}])"
    others = [label for label in found.policies if label != found.best]
    if others:
        pair = found.pair(found.best, others[0])
        text += (f"; P({found.best} beats {others[0]}) = {pair.model.value:.2f} "
                 f"[{pair.model.low:.2f}, {pair.model.high:.2f}] (Bradley-Terry, "
                 f"{found.confidence:.0%} bootstrap CI)")
    return text


def to_json(report: TournamentReport) -> dict[str, Any]:
    """Everything in the report as JSON-ready data.

    Args:
        report: the tournament's report.

    Returns:
        "ratings" {label: {"elo", "elo_ci", "wins", "draws", "losses", "matches"}}, "pairs",
            "best", "fit" (`ratings.Ratings.as_dict`), "selection" (the schedule's outcome),
            "matches" (every match with its index, seed, sides and result), "policies" (what each
            label is), "config", "env", "runners", "retries", "interrupted", "seconds".
    """
    result = report.result
    rated = {} if report.ratings is None else report.ratings.as_dict()
    return {
        **rated,
        "selection": result.selection,
        "matches": [{"index": m.index, "seed": m.seed, "team0": m.team0, "team1": m.team1,
                     "score": m.score, "reward0": m.reward0, "reward1": m.reward1,
                     "decisions": m.steps} for m in result.matches],
        "policies": [asdict(c) for c in result.contenders],
        "config": asdict(result.config),
        "env": asdict(result.env),
        "runners": [asdict(runner) for runner in result.runners],
        "retries": result.retries,
        "interrupted": result.interrupted,
        "seconds": result.seconds,
    }


def write_tournament_report(report: TournamentReport, out_dir: str | Path) -> dict[str, Path]:
    """Write tournament.json, tournament.csv, ratings.png and win_rate.png (the PNGs when matches
    were played).

    Args:
        report: the tournament's report.
        out_dir: where they go (created if needed).

    Returns:
        Their paths by kind ("json", "csv", "ratings_png", "win_rate_png").
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / JSON_NAME, "csv": out / CSV_NAME}
    paths["json"].write_text(json.dumps(to_json(report), indent=2, allow_nan=False))
    with open(paths["csv"], "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for label, rating in ({} if report.ratings is None else report.ratings.policies).items():
            contender = report.contender(label)
            writer.writerow({"label": label, "run": contender.run or "", "step": contender.step
                             if contender.step is not None else "", "elo": rating.elo,
                             "elo_ci_low": rating.elo_ci[0], "elo_ci_high": rating.elo_ci[1],
                             "wins": rating.wins, "draws": rating.draws,
                             "losses": rating.losses, "matches": rating.matches,
                             "score": rating.score,
                             "path": contender.path or contender.heuristic or ""})
    if report.ratings is not None:
        title = f"Tournament: {env_title(report)}"
        paths["ratings_png"] = out / RATINGS_PNG
        ratings_figure(report.ratings, checkpoints(report), title).savefig(
            paths["ratings_png"])
        paths["win_rate_png"] = out / WIN_RATE_PNG
        win_rate_figure(report.ratings, title).savefig(paths["win_rate_png"])
    return paths


def env_title(report: TournamentReport) -> str:
    """The scene as the figures name it.

    Args:
        report: the tournament's report.

    Returns:
        "stand-in SoccerTwos", or the build's file name.
    """
    name = report.result.env.file_name
    return "stand-in SoccerTwos" if name == "builtin:soccertwos" else Path(name).name


def checkpoints(report: TournamentReport) -> dict[str, tuple[str, int]]:
    """The contenders that are a run's checkpoints.

    Args:
        report: the tournament's report.

    Returns:
        {label: (run, training step)}.
    """
    return {c.label: (c.run, c.step) for c in report.result.contenders
            if c.run is not None and c.step is not None}


def write_tensorboard(report: TournamentReport, log_dir: str | Path) -> list[Path]:
    """`Evaluation/Elo` (with its interval) at each checkpoint's training step, in `log_dir/<run>/`,
    replacing an earlier tournament's scalars there.

    Args:
        report: the tournament's report.
        log_dir: the TensorBoard folder.

    Returns:
        The folders written; none when no match was played.
    """
    if report.ratings is None:
        return []
    return write_scalars(elo_scalars(report.ratings, checkpoints(report)), log_dir, EVENTS_SUFFIX)


def elo_scalars(rated: ratings.Ratings, steps: dict[str, tuple[str, int]]
                ) -> dict[str, list[tuple[int, dict[str, float | None]]]]:
    """The TensorBoard scalars of rated checkpoints: `Evaluation/Elo` and its interval's bounds.

    Args:
        rated: the ratings.
        steps: {label: (run, training step)} of the checkpoints to write; a label without a
            rating is left out.

    Returns:
        {run: [(step, {tag: value})]}, as `deploy.evaluation.sinks.write_scalars` takes them.
    """
    by_run: dict[str, list[tuple[int, dict[str, float | None]]]] = {}
    for label, (run, step) in steps.items():
        rating = rated.policies.get(label)
        if rating is not None:
            by_run.setdefault(run, []).append((step, {
                "Evaluation/Elo": rating.elo, "Evaluation/Elo CI Low": rating.elo_ci[0],
                "Evaluation/Elo CI High": rating.elo_ci[1]}))
    return by_run


def opponents(report: TournamentReport, label: str) -> list[str]:
    """The policies one played at least one match against.

    Args:
        report: the tournament's report.
        label: the policy.

    Returns:
        Their labels, in the contenders' order.
    """
    played = {m.team1 if m.team0 == label else m.team0 for m in report.result.matches
              if label in (m.team0, m.team1)}
    return [c.label for c in report.result.contenders if c.label in played]


def write_model_cards(report: TournamentReport, fallback_dir: str | Path,
                      date: datetime.date | None = None) -> list[Path]:
    """Write a model card for every run among the contenders' policy files.

    A run's card describes its last checkpoint (the highest step; a file without a step counts
    as before every step): in `model-index`, its Elo with the interval, its own matches and the
    opponents it played (`opponents`); in the text, the same sentence and a table of every
    checkpoint of the run. A card already there keeps the rest of its text and its other
    results (`deploy.evaluation.sinks.save_card`).

    Args:
        report: the rated tournament.
        fallback_dir: where a run's card goes when its folder is not a local, writable folder
            (`deploy.evaluation.sinks.card_folder`), as `fallback_dir/<run>/README.md`.
        date: the evaluation date the card states (default: today).

    Returns:
        The cards written, one per run; none when no match was played.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData  # the serve or hub extra

    if report.ratings is None:
        return []
    day = (date or datetime.date.today()).isoformat()
    env = env_title(report)
    runs: dict[str, list[Contender]] = {}
    for contender in report.result.contenders:
        if contender.path is not None:
            runs.setdefault(contender.run or Path(contender.path).parent.name, []).append(contender)
    written = []
    for run, members in runs.items():
        final = max(members, key=lambda c: -1 if c.step is None else c.step)
        rating = report.ratings.policies[final.label]
        played = opponents(report, final.label)
        result = EvalResult(
            task_type="reinforcement-learning", task_name="reinforcement-learning",
            dataset_type=env, dataset_name=env, metric_type="elo", metric_name="Elo (95% CI)",
            metric_value=round(rating.elo, 1),
            metric_args={"ci_low": round(rating.elo_ci[0], 1),
                         "ci_high": round(rating.elo_ci[1], 1), "matches": rating.matches,
                         "opponents": played,
                         "anchor": report.ratings.anchor or "mean 1200", "date": day})
        data = ModelCardData(library_name="ml-agents", model_name=run, eval_results=[result],
                             tags=["ML-Agents", "huggy-agent", "reinforcement-learning"])
        rows = "\n".join(
            f"| {c.label} | {'-' if c.step is None else c.step} | "
            f"{report.ratings.policies[c.label].elo:.0f} "
            f"[{report.ratings.policies[c.label].elo_ci[0]:.0f}, "
            f"{report.ratings.policies[c.label].elo_ci[1]:.0f}] | "
            f"{report.ratings.policies[c.label].matches} |" for c in members)
        body = (f"## Tournament\n\nRated with `huggy tournament` on {env} on {day}: "
                f"Bradley-Terry Elo of `{final.label}` over its {rating.matches} matches (of "
                f"{len(report.result.matches)} in the tournament) against {', '.join(played)}, "
                f"{report.ratings.confidence:.0%} bootstrap intervals (matches resampled within "
                "each pairing).\n\n"
                "| policy | step | Elo [95% CI] | matches |\n|---|---|---|---|\n" + rows + "\n")
        card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n{SECTION_START}\n{body}{SECTION_END}\n")
        path = card_folder(final.path, final.folder, final.source, run, fallback_dir) / "README.md"
        save_card(card, path, SECTION_START, SECTION_END)
        written.append(path)
    return written
