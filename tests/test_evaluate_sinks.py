"""TensorBoard scalars and Hugging Face model cards from an evaluation, read back with
tensorboard's EventAccumulator and huggingface_hub's ModelCard. Pure Python: no Ray, no
stand-in; the evaluations are built by hand."""

from __future__ import annotations

import numpy as np
import pytest

from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec
from deploy.evaluation.results import EvaluationResult, ItemResult, PolicyResult
from deploy.evaluation.sinks import TAGS, write_model_cards, write_tensorboard
from deploy.evaluation.summary import build_report, summarize_all


def _item(policy: int, index: int, returns: list[float]) -> ItemResult:
    n = len(returns)
    return ItemResult(policy_index=policy, index=index, seed=7 + index, returns=tuple(returns),
                      lengths=(30,) * n, terminated=tuple(r > 1.0 for r in returns),
                      slots=tuple(range(n)), episode_indices=(0,) * n, agent_steps=30 * n,
                      seconds=0.1, node_id="n", runner="r")


def _run_result(tmp_path, steps=(500_000, 1_000_000, 2_000_000)) -> EvaluationResult:
    """Checkpoints of run `ppo` in tmp_path/ppo, each 36 episodes in two items, better with
    step, and one loose file without a step."""
    rng = np.random.default_rng(5)
    folder = tmp_path / "ppo"
    folder.mkdir()
    policies = []
    for k, step in enumerate(steps):
        spec = PolicySpec(f"ppo@{step}", path=str(folder / f"Huggy-{step}.pt"), run="ppo",
                          step=step, folder=str(folder))
        returns = rng.normal(0.5 * (k + 1), 0.4, 36).tolist()
        policies.append(PolicyResult(spec, items=[_item(k, 0, returns[:18]),
                                                  _item(k, 1, returns[18:])]))
    loose = PolicySpec("other/Huggy.onnx", path=str(tmp_path / "other" / "Huggy.onnx"))
    policies.append(PolicyResult(loose, items=[_item(len(steps), 0, [1.0] * 18)]))
    return EvaluationResult(policies, EvalConfig(episodes=36, seed=7), EnvSpec())


def test_tensorboard_scalars_read_back_per_step(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = _run_result(tmp_path)
    summaries = summarize_all(result)
    folders, skipped = write_tensorboard(summaries, tmp_path / "results")
    assert folders == [tmp_path / "results" / "ppo"] and skipped == ["other/Huggy.onnx"]
    events = EventAccumulator(str(folders[0]))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(TAGS)
    for tag, field in (("Evaluation/Mean Return", "mean_return"), ("Evaluation/IQM Return", "iqm"),
                       ("Evaluation/Success Rate", "terminated_share")):
        points = events.Scalars(tag)
        assert [p.step for p in points] == [500_000, 1_000_000, 2_000_000]
        expected = [getattr(s, field) for s in summaries[:3]]
        assert [p.value for p in points] == pytest.approx(expected, rel=1e-6)  # stored as float32
    lows = [p.value for p in events.Scalars("Evaluation/IQM Return CI Low")]
    assert lows == pytest.approx([s.iqm_ci[0] for s in summaries[:3]], rel=1e-6)
    # The episodes themselves: the mean of the last checkpoint's 36 returns.
    returns = [r for item in result.policies[2].items for r in item.returns]
    assert events.Scalars("Evaluation/Mean Return")[-1].value == pytest.approx(np.mean(returns),
                                                                               rel=1e-6)


def test_model_card_round_trips_through_huggingface_hub(tmp_path) -> None:
    from huggingface_hub import ModelCard

    result = _run_result(tmp_path)
    summaries = summarize_all(result)
    cards = write_model_cards(build_report(result), tmp_path / "out")
    assert cards == [tmp_path / "ppo" / "README.md", tmp_path / "out" / "other" / "README.md"]
    card = ModelCard.load(cards[0])
    assert card.data.model_name == "ppo" and card.data.library_name == "ml-agents"
    by_type = {r.metric_type: r for r in card.data.eval_results}
    final = summaries[2]  # the highest step
    returns = np.array([r for item in result.policies[2].items for r in item.returns])
    mean_reward = by_type["mean_reward"]
    assert mean_reward.task_type == "reinforcement-learning"
    assert mean_reward.dataset_type == mean_reward.dataset_name == "huggy-standin"
    assert mean_reward.metric_value == f"{returns.mean():.2f} +/- {returns.std(ddof=1):.2f}"
    assert mean_reward.metric_args["episodes"] == 36
    assert mean_reward.metric_args["seeds"] == "7..8"
    iqm = by_type["iqm_reward"]
    assert iqm.metric_value == pytest.approx(final.iqm, abs=1e-4)
    assert [iqm.metric_args["ci_low"], iqm.metric_args["ci_high"]] == pytest.approx(
        list(final.iqm_ci), abs=1e-4)
    assert "| ppo@500000 | 500000 | 36 |" in card.text
    # A card already there keeps its own text; our results and section replace the old ones.
    cards[0].write_text("---\nlicense: apache-2.0\nlibrary_name: ml-agents\n---\n# My Huggy\n")
    write_model_cards(build_report(result), tmp_path / "out")
    write_model_cards(build_report(result), tmp_path / "out")
    again = ModelCard.load(cards[0])
    assert again.data.license == "apache-2.0" and again.text.startswith("# My Huggy")
    assert again.text.count("huggy evaluate: start") == 1
    assert len(again.data.eval_results) == 2


def test_model_card_written_again_keeps_one_evaluation_section(tmp_path) -> None:
    """A card this project wrote (no card there before) is replaced, not appended to: three
    runs leave one section, the last run's."""
    from huggingface_hub import ModelCard

    first = _run_result(tmp_path)
    (card_path, _) = write_model_cards(build_report(first), tmp_path / "out")
    for seed in (8, 9):
        (tmp_path / f"again{seed}").mkdir()
        again = _run_result(tmp_path / f"again{seed}")
        again.config = EvalConfig(episodes=36, seed=seed)
        for policy in again.policies:  # the card goes to the first run's folder again
            policy.spec = PolicySpec(policy.spec.label, path=policy.spec.path, run="ppo",
                                     step=policy.spec.step, folder=str(tmp_path / "ppo"))
        write_model_cards(build_report(again), tmp_path / "out")
    text = card_path.read_text()
    assert text.count("<!-- huggy evaluate: start -->") == 1
    assert text.count("<!-- huggy evaluate: end -->") == 1
    assert text.count("# ppo\n") == 1 and "bootstrap over work items" in text
    card = ModelCard.load(card_path)
    assert {r.metric_type for r in card.data.eval_results} == {"mean_reward", "iqm_reward"}


def test_tensorboard_written_twice_has_one_value_per_step(tmp_path) -> None:
    """A second evaluation into the same folder replaces the first one's scalars; event files
    that are not the evaluation's stay."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    other = SummaryWriter(log_dir=str(tmp_path / "results" / "ppo"))
    other.add_scalar("Training/Reward", 1.0, global_step=5)
    other.close()
    result = _run_result(tmp_path)
    write_tensorboard(summarize_all(result), tmp_path / "results")
    (folder,), _ = write_tensorboard(summarize_all(result), tmp_path / "results")
    events = EventAccumulator(str(folder))
    events.Reload()
    assert [p.step for p in events.Scalars("Evaluation/Mean Return")] == [
        500_000, 1_000_000, 2_000_000]
    assert [p.value for p in events.Scalars("Training/Reward")] == [1.0]
