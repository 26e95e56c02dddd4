"""Result sinks beyond the report's files: TensorBoard scalars and Hugging Face model cards,
rendered from the one `EvaluationReport` (`deploy.evaluation.summary`).

TensorBoard (`write_tensorboard`): for every policy with a training step, scalars at that step in
`DIR/<run>/` under the "Evaluation/" tags (TAGS): ML-Agents writes training to
`results/<run>/<behavior>/`, so `tensorboard --logdir results` shows both side by side. A new
evaluation into the same folder replaces the previous one's scalars (one value per step).

Model cards (`write_model_cards`): one README.md per evaluated run folder, with `model-index`
metadata (huggingface_hub's ModelCardData and EvalResult): task reinforcement-learning, the
environment as the dataset, `mean_reward` as "mean +/- std" and the IQM with its interval, of
the run's last checkpoint (highest step); the body lists every evaluated checkpoint. The
evaluation's section of the card sits between SECTION_START and SECTION_END, so writing a card
again replaces it. With a replay video of the last checkpoint (`deploy.evaluation.replays`), the
card folder gets it as `replay.mp4` and the section a player for it.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.evaluation.results import EvaluationResult
from deploy.evaluation.summary import EvaluationReport, PolicySummary, checkpoint_step
from envs.rollout import terminated_label

TAGS = {
    "Evaluation/Mean Return": "mean_return",
    "Evaluation/Mean Return CI Low": "ci_low",
    "Evaluation/Mean Return CI High": "ci_high",
    "Evaluation/IQM Return": "iqm",
    "Evaluation/IQM Return CI Low": "iqm_low",
    "Evaluation/IQM Return CI High": "iqm_high",
    "Evaluation/Median Return": "median",
    "Evaluation/Success Rate": "terminated_share",
    "Evaluation/Episode Length": "mean_length",
}
"""TensorBoard tag -> summary value (the mean's interval is its t interval, the IQM's the
stratified-bootstrap one; success: the share of episodes that terminated, for Huggy those that
reached the stick)."""
EVENTS_SUFFIX = ".huggy-evaluate"
"""The file-name suffix of the event files an evaluation writes (and replaces next time)."""


def run_name(summary: PolicySummary) -> str:
    """The run a policy belongs to.

    Args:
        summary: the policy's report row.

    Returns:
        Its results folder's run id, else its file's folder name, else its label.
    """
    if summary.run is not None:
        return summary.run
    return Path(summary.path).parent.name if summary.path else summary.label


def _values(summary: PolicySummary) -> dict[str, float | None]:
    iqm_low, iqm_high = summary.iqm_ci or (None, None)
    return {"mean_return": summary.mean_return, "ci_low": summary.ci_low,
            "ci_high": summary.ci_high, "iqm": summary.iqm, "iqm_low": iqm_low,
            "iqm_high": iqm_high, "median": summary.median,
            "terminated_share": summary.terminated_share, "mean_length": summary.mean_length}


def write_tensorboard(summaries: Sequence[PolicySummary], log_dir: str | Path
                      ) -> tuple[list[Path], list[str]]:
    """Scalars for every policy with a step and episodes, in `log_dir/<run>/`, replacing those an
    earlier evaluation wrote there (its event files, `*EVENTS_SUFFIX`; other files are left alone).

    Args:
        summaries: the report rows.
        log_dir: the TensorBoard folder (ML-Agents' `results`, to see both side by side).

    Returns:
        The folders written, and the labels skipped (no training step, or no episode).
    """
    by_run: dict[str, list[tuple[int, dict[str, float | None]]]] = {}
    skipped = []
    for summary in summaries:
        if summary.step is None or summary.mean_return is None:
            skipped.append(summary.label)
            continue
        values = _values(summary)
        by_run.setdefault(run_name(summary), []).append(
            (summary.step, {tag: values[name] for tag, name in TAGS.items()}))
    return write_scalars(by_run, log_dir, EVENTS_SUFFIX), skipped


def write_scalars(by_run: Mapping[str, Sequence[tuple[int, Mapping[str, float | None]]]],
                  log_dir: str | Path, suffix: str) -> list[Path]:
    """TensorBoard scalars at each training step, per run, in `log_dir/<run>/`, replacing the event
    files of an earlier call with the same `suffix` there (other event files are left alone).

    Args:
        by_run: {run: [(step, {tag: value}), ...]}; None values are left out.
        log_dir: the TensorBoard folder.
        suffix: the event files' suffix.

    Returns:
        The folders written.
    """
    from torch.utils.tensorboard import SummaryWriter  # tensorboard: the serve extra, when used

    folders = []
    for run, points in by_run.items():
        folder = Path(log_dir) / run
        for earlier in folder.glob(f"events.out.tfevents.*{suffix}"):
            earlier.unlink()
        writer = SummaryWriter(log_dir=str(folder), filename_suffix=suffix)
        try:
            for step, values in sorted(points, key=lambda point: point[0]):
                for tag, value in values.items():
                    if value is not None:
                        writer.add_scalar(tag, value, global_step=step)
        finally:
            writer.close()
        folders.append(folder)
    return folders


def _env_id(result: EvaluationResult) -> str:
    """The environment as a model card's dataset: the Unity build's file stem, else Huggy on
    the built-in stand-in."""
    if result.env.file_name:
        return Path(result.env.file_name).stem
    return "huggy-standin"


REPLAY_NAME = "replay.mp4"
REPLAY_TEXT = ("\nReplay of `{label}`'s median-return episode, played again from its seed:\n\n"
               f'<video src="{REPLAY_NAME}" controls autoplay loop muted width="480"></video>\n')
SECTION_START = "<!-- huggy evaluate: start -->"
SECTION_END = "<!-- huggy evaluate: end -->"


def model_card(result: EvaluationResult, run: str, points: Sequence[PolicySummary],
               date: datetime.date | None = None, replay: bool = False) -> Any:
    """The huggingface_hub ModelCard of one run: model-index results of its last checkpoint (highest
    step; the last given when none has a step) and a table of every checkpoint.

    Args:
        result: the evaluation's result.
        run: the run's name.
        points: the run's report rows.
        date: the evaluation's date; None: today.
        replay: add a video player of `replay.mp4` (beside the card) under the table.

    Returns:
        The card, its section between `SECTION_START` and `SECTION_END`.

    Raises:
        ValueError: no policy of the run finished an episode.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData  # the serve or hub extra

    done = [s for s in points if s.mean_return is not None]
    if not done:
        raise ValueError(f"run {run}: no policy with finished episodes to describe")
    final = max(done, key=checkpoint_step)
    env = _env_id(result)
    day = (date or datetime.date.today()).isoformat()
    seeds = seeds_text(result, final.label)
    std = final.std_return if final.std_return is not None else 0.0
    common: dict[str, Any] = {"task_type": "reinforcement-learning", "task_name": "reinforcement-learning",
              "dataset_type": env, "dataset_name": env}
    results = [EvalResult(**common, metric_type="mean_reward", metric_name="mean_reward",
                          metric_value=f"{final.mean_return:.2f} +/- {std:.2f}",
                          metric_args={"episodes": final.episodes, "seeds": seeds,
                                       "date": day})]
    if final.iqm is not None and final.iqm_ci is not None:
        results.append(EvalResult(
            **common, metric_type="iqm_reward", metric_name="IQM reward (95% CI)",
            metric_value=round(final.iqm, 4),
            metric_args={"ci_low": round(final.iqm_ci[0], 4),
                         "ci_high": round(final.iqm_ci[1], 4),
                         "bootstrap": "stratified by work item, percentile, "
                                      f"seed {result.config.seed}",
                         "episodes": final.episodes, "seeds": seeds, "date": day}))
    data = ModelCardData(library_name="ml-agents", model_name=run, eval_results=results,
                         tags=[env, "deep-reinforcement-learning", "reinforcement-learning",
                               "ML-Agents", "huggy-agent"])
    rows = "\n".join(
        f"| {s.label} | {'-' if s.step is None else s.step} | {s.episodes} | "
        f"{s.mean_return:.3f} +/- {s.std_return or 0.0:.3f} | "
        + (f"{s.iqm:.3f} [{s.iqm_ci[0]:.3f}, {s.iqm_ci[1]:.3f}]" if s.iqm_ci else "-")
        + f" | {100 * (s.terminated_share or 0.0):.1f}% |"
        for s in sorted(done, key=lambda s: -1 if s.step is None else s.step))
    body = (f"# {run}\n\nA Unity ML-Agents policy, evaluated with `huggy evaluate` on {env} on "
            f"{day}: {final.episodes} episodes of `{final.label}` with environment seeds {seeds}"
            f" ({'stochastic' if result.config.stochastic else 'deterministic'} actions).\n\n"
            "| policy | step | episodes | mean return +/- std | IQM [95% CI] | "
            f"{terminated_label(result.behaviors())} |\n"
            "|---|---|---|---|---|---|\n" + rows + "\n\nIntervals: stratified bootstrap over "
            "work items (percentile). Scores on the built-in stand-in are not Unity scores.\n"
            + (REPLAY_TEXT.format(label=final.label) if replay else ""))
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{SECTION_START}\n{body}{SECTION_END}\n")


def seeds_text(result: EvaluationResult, label: str) -> str:
    """The environment seeds of a policy's items.

    Args:
        result: the evaluation's result.
        label: the policy's label.

    Returns:
        "3..7", a list when not contiguous, or "-" without items.
    """
    seeds = sorted(item.seed for policy in result.policies if policy.spec.label == label
                   for item in policy.items)
    if not seeds:
        return "-"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}..{seeds[-1]}"
    return ", ".join(map(str, seeds))


def merge_card(existing: Any, ours: Any, start: str = SECTION_START, end: str = SECTION_END
               ) -> Any:
    """An existing card with our results and section.

    Args:
        existing: the card there (such as one from mlagents-push-to-hf, or our own from an earlier
            run).
        ours: our card.
        start: the marker our section starts with.
        end: the marker it ends with.

    Returns:
        `existing` with our model-index results (replacing its results of the same metric types,
            keeping the others) and our section (replaced where `existing` has one, else appended).
    """
    from huggingface_hub import ModelCard  # huggingface_hub: the serve or hub extra, when used

    data = existing.data
    ours_types = {result.metric_type for result in ours.data.eval_results or []}
    kept = [result for result in existing.data.eval_results or []
            if result.metric_type not in ours_types]
    data.eval_results = kept + list(ours.data.eval_results or [])
    data.model_name = ours.data.model_name
    section = ours.text.strip()
    text = existing.text
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{text}")


def card_folder(path: str | None, folder: str | None, source: str | None, run: str,
                fallback_dir: str | Path) -> Path:
    """Where a run's card goes.

    Args:
        path: the policy file, or None.
        folder: the results folder it came from, or None.
        source: its Hub source, or None for a local policy.
        run: the run's name.
        fallback_dir: where cards go otherwise.

    Returns:
        The results folder (or the policy file's folder) when that is a local, writable folder,
            else `fallback_dir/<run>/` (a policy from the Hub cache is never written into the
            cache).
    """
    local = None
    if source is None:
        local = Path(folder) if folder else Path(path or ".").parent
    return local if local is not None and os.access(local, os.W_OK) else Path(fallback_dir) / run


def save_card(card: Any, path: Path, start: str = SECTION_START, end: str = SECTION_END
              ) -> None:
    """Write a card, merged into the card already there (`merge_card`).

    Args:
        card: the card.
        path: its README.md (the folder is made if missing).
        start: the marker our section starts with.
        end: the marker it ends with.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        card = merge_card(type(card).load(path), card, start, end)
    card.save(path)


@dataclass(frozen=True)
class CardPlan:
    """One run's model card: where it goes, the run's evaluated checkpoints, and the one its
    model-index results describe (`final`: highest step)."""

    run: str
    folder: Path
    points: tuple[PolicySummary, ...]
    final: PolicySummary


def plan_model_cards(report: EvaluationReport, fallback_dir: str | Path) -> list[CardPlan]:
    """The cards `write_model_cards` writes: one per run with finished episodes.

    Args:
        report: the evaluation's report.
        fallback_dir: where cards go whose run has no local, writable folder (`card_folder`).

    Returns:
        One plan per run.
    """
    folders: dict[str, tuple[Path, list[PolicySummary]]] = {}
    for summary, policy in zip(report.summaries, report.result.policies, strict=True):
        if summary.mean_return is None:
            continue
        spec = policy.spec
        name = run_name(summary) if spec.source is None or summary.run \
            else summary.label.split("/")[0]
        folder = card_folder(spec.path, spec.folder, spec.source, name, fallback_dir)
        folders.setdefault(name, (folder, []))[1].append(summary)
    return [CardPlan(run, folder, tuple(points), max(points, key=checkpoint_step))
            for run, (folder, points) in folders.items()]


def write_model_cards(report: EvaluationReport, fallback_dir: str | Path,
                      replays: Mapping[str, Path] | None = None) -> list[Path]:
    """Write the cards `plan_model_cards` plans. A card already there keeps its text and metadata;
    its results and our section are replaced (`merge_card`).

    Args:
        report: the evaluation's report.
        fallback_dir: where cards go whose run has no local, writable folder.
        replays: {policy label: MP4}; a video of a card's final checkpoint is copied beside the
            card as `replay.mp4` (the file the Hub's RL model pages and the Deep RL course
            leaderboard show) and the card's section embeds it.

    Returns:
        The cards written.
    """
    written = []
    for plan in plan_model_cards(report, fallback_dir):
        video = (replays or {}).get(plan.final.label)
        if video is not None:
            plan.folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(video, plan.folder / REPLAY_NAME)
        path = plan.folder / "README.md"
        save_card(model_card(report.result, plan.run, plan.points, replay=video is not None),
                  path)
        written.append(path)
    return written
