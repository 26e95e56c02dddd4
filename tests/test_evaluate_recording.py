"""What an evaluation keeps: replay videos of each policy's median episode (`--video`, and the
model cards' `replay.mp4`) and Minari datasets of every counted episode (`--dataset`).

References: the median is worked out by hand from the report's returns; a replay must score
exactly the return and length the evaluation recorded for that episode (same machine, same
device, one torch thread: the runner's own arithmetic); a dataset's episodes must add up to the
report's returns, in the report's order. The Ray path (episodes shipped from runners) is in
`test_evaluate_cli.py`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from deploy.evaluation.datasets import dataset_ids, write_datasets
from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec, file_stem
from deploy.evaluation.replays import check_renderable, median_episode, record_replays
from deploy.evaluation.results import ItemResult, PolicyResult
from deploy.evaluation.scheduling import evaluate_plain
from deploy.evaluation.sources import policy_specs
from huggy_agent.cli import main
from tests.support.fixtures import REPO_ROOT, fixtures_dir

ENV = EnvSpec(num_agents=3, max_steps=80)
CONFIG = EvalConfig(episodes=7, episodes_per_item=3, seed=21, progress=False)


def _item(index: int, returns: tuple[float, ...]) -> ItemResult:
    n = len(returns)
    return ItemResult(policy_index=0, index=index, seed=index, returns=returns,
                      lengths=(5,) * n, terminated=(False,) * n, slots=tuple(range(n)),
                      episode_indices=(0,) * n, agent_steps=5 * n, seconds=1.0,
                      node_id="local", runner="plain")


def test_median_episode_is_the_lower_middle_return_ties_by_item_and_slot() -> None:
    policy = PolicyResult(PolicySpec("p"), items=[_item(1, (3.0, 1.0)), _item(0, (2.0, 1.0))])
    # returns 1.0 (item 0 slot 1), 1.0 (item 1 slot 1), 2.0, 3.0: the lower middle is the 2nd
    chosen = median_episode(policy)
    assert chosen is not None
    assert (chosen.item.index, chosen.slot, chosen.episode_return) == (1, 1, 1.0)
    policy.items.append(_item(2, (7.0,)))  # five episodes: the third, 2.0 of item 0 slot 0
    chosen = median_episode(policy)
    assert chosen is not None and (chosen.item.index, chosen.slot) == (0, 0)
    assert median_episode(PolicyResult(PolicySpec("q"))) is None


def test_dataset_ids_and_their_errors(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    assert dataset_ids("huggy/eval-v2", ["run@100"]) == ["huggy/eval-v2"]
    assert dataset_ids("eval-v0", ["ppo_baseline@2000343", "a/b c"]) == \
        ["eval/ppo_baseline-2000343-v0", "eval/a-b-c-v0"]
    with pytest.raises(ValueError, match=r"\(namespace/\)name-vN, such as huggy/ppo-v0; got "
                                         r"'huggy/eval'"):
        dataset_ids("huggy/eval", ["x"])
    (tmp_path / "eval" / "b-v0").mkdir(parents=True)
    with pytest.raises(ValueError, match="Minari dataset eval/b-v0 exists already"):
        dataset_ids("eval-v0", ["a", "b"])
    assert file_stem("@@") == "policy"


def test_replay_needs_frames() -> None:
    check_renderable(ENV)  # the stand-in playing Huggy draws the dog
    check_renderable(EnvSpec(behavior_spec={"inputs": [{"shape": [3, 8, 8]}]}))
    with pytest.raises(ValueError, match=r"needs the built-in stand-in playing Huggy or a camera "
                                         r"observation .* behavior 'Pyramids' observes \(56,\), "
                                         r"\(4,\)"):
        check_renderable(EnvSpec(behavior_spec={"behavior": "Pyramids", "inputs": [
            {"shape": [56]}, {"shape": [4]}]}))


@pytest.mark.standin
@pytest.mark.parametrize("stochastic", [False, True])
def test_replays_score_the_recorded_median_episode_exactly(tmp_path, stochastic) -> None:
    """Two policies, two instances per runner (items run side by side), deterministic or
    stochastic: each replay is the hand-picked median episode and re-plays to its recorded
    return and length bit for bit; the video has a frame per decision plus the first."""
    specs = policy_specs([fixtures_dir() / "ppo_baseline", fixtures_dir() / "ppo_num_layers_2"])
    config = replace(CONFIG, stochastic=stochastic)
    result = evaluate_plain(specs, config, replace(ENV, instances=2))
    replays = record_replays(result, tmp_path / "videos")
    assert [r.label for r in replays] == [s.label for s in specs]
    for replay, policy in zip(replays, result.policies, strict=True):
        returns = [r for item in policy.ordered_items() for r in item.returns]
        assert len(returns) == 7
        assert replay.episode.episode_return == sorted(returns)[3]
        assert (replay.replayed_return, replay.replayed_length) == \
            (replay.episode.episode_return, replay.episode.length)
        assert replay.same and "same return" in replay.describe()
        assert replay.path == tmp_path / "videos" / f"{file_stem(policy.spec.label)}.mp4"
        frames, _ = imageio_ffmpeg.count_frames_and_secs(str(replay.path))
        assert frames == replay.episode.length + 1


@pytest.mark.standin
def test_datasets_hold_every_episode_in_report_order(tmp_path, monkeypatch) -> None:
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    specs = policy_specs([fixtures_dir() / "ppo_baseline"])
    result = evaluate_plain(specs, replace(CONFIG, keep_episodes=True),
                            replace(ENV, parameters={"arena_size": 18.0}))
    (written,) = write_datasets(result, dataset_ids("huggy/kept-v0", [specs[0].label]))
    dataset = minari.load_dataset("huggy/kept-v0")
    assert dataset.spec.dataset_id == written.spec.dataset_id
    items = result.policies[0].ordered_items()
    returns = [r for item in items for r in item.returns]
    lengths = [n for item in items for n in item.lengths]
    episodes = list(dataset.iterate_episodes())
    assert len(episodes) == 7
    for episode, expected, length in zip(episodes, returns, lengths, strict=True):
        # float32 rewards summed in float64: pairwise vs in step order differ by < 1e-12
        assert float(np.sum(episode.rewards, dtype=np.float64)) == pytest.approx(expected,
                                                                                  abs=1e-9)
        assert len(episode.rewards) == length and episode.observations.shape == (length + 1, 59)
    metadata = list(dataset.storage.get_episode_metadata(range(7)))
    assert [m["env_seed"] for m in metadata] == [item.seed for item in items
                                                 for _ in item.returns]
    stored = dataset.storage.metadata
    assert stored["huggy_agent"]["fingerprint"] == result.policies[0].fingerprint
    assert stored["huggy_agent"]["seeds"] == [21, 22, 23]
    assert stored["env_spec"]  # the env to recover: max_steps and the arena size given
    spec = json.loads(stored["env_spec"])
    assert spec["kwargs"]["max_steps"] == 80
    assert spec["kwargs"]["env_parameters"] == {"arena_size": 18.0}


@pytest.mark.standin
def test_huggy_evaluate_video_dataset_and_model_card(tmp_path) -> None:
    """The command as a user runs it: the replay line says "same return" with the report's
    median, the dataset opens in `minari show`, and the model card, beside a copy of the run,
    gets replay.mp4 and a player for it."""
    run = tmp_path / "ppo_baseline"
    shutil.copytree(fixtures_dir() / "ppo_baseline", run)
    datasets = tmp_path / "datasets"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MINARI_DATASETS_PATH": str(datasets)}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("huggy")), "evaluate", str(run), "--no-ray",
         "--episodes", "5", "--episodes-per-item", "3", "--num-agents", "3", "--max-steps", "60",
         "--no-progress", "--out", str(tmp_path / "out"), "--video", "--dataset",
         "cli/eval-v0", "--model-card"],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    returns = sorted(r for item in report["policies"][0]["items"] for r in item["returns"])
    video = tmp_path / "out" / "videos" / "ppo_baseline-2000343.mp4"
    assert ("median episode" in done.stdout and f"return {returns[2]:.6f}" in done.stdout
            and f"same return -> {video}" in done.stdout)
    assert "Minari dataset: cli/eval-v0 (5 episodes" in done.stdout
    card = (run / "README.md").read_text()
    assert '<video src="replay.mp4"' in card
    assert (run / "replay.mp4").read_bytes() == video.read_bytes()
    shown = subprocess.run([str(Path(sys.executable).with_name("minari")), "show",
                            "cli/eval-v0"], capture_output=True, text=True, timeout=120, env=env)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "Total Episodes" in shown.stdout and "huggy evaluate of ppo_baseline" in shown.stdout


@pytest.mark.standin
def test_model_card_alone_writes_the_report_the_replay_and_the_card(tmp_path, capsys) -> None:
    """`--model-card` without `--video`: the report's five files, the replay of the run's last
    checkpoint in --out/videos (a `replay:` line says so) and the card with its copy beside it,
    nothing else; and the course workflow names every one of those files."""
    run = tmp_path / "results" / "Huggy"
    shutil.copytree(fixtures_dir() / "ppo_baseline", run)
    before = {path.relative_to(run) for path in run.rglob("*")}
    out = tmp_path / "out" / "evaluate"
    assert main(["evaluate", str(run), "--no-ray", "--episodes", "5", "--episodes-per-item", "3",
                 "--num-agents", "3", "--max-steps", "60", "--no-progress", "--out", str(out),
                 "--model-card"]) == 0
    replay_lines = [line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("replay: ")]
    video = Path("videos") / "Huggy-2000343.mp4"
    assert len(replay_lines) == 1 and replay_lines[0].endswith(f"-> {out / video}")
    report = {"evaluation.json", "evaluation.csv", "learning_curve.png",
              "probability_of_improvement.png", "performance_profile.png"}
    assert {str(path.relative_to(out)) for path in out.rglob("*") if path.is_file()} == \
        report | {str(video)}
    assert {path.relative_to(run) for path in run.rglob("*")} - before == \
        {Path("README.md"), Path("replay.mp4")}
    assert (run / "replay.mp4").read_bytes() == (out / video).read_bytes()
    workflow = (REPO_ROOT / "docs" / "course-workflow.md").read_text()
    section = workflow.split("### 2. Evaluate", 1)[1].split("\n### ", 1)[0]
    named = report | {"out/evaluate/videos/<policy>.mp4", "results/<run>/README.md",
                      "results/<run>/replay.mp4", "replay:"}
    assert {name for name in named if f"`{name}" not in section} == set()
