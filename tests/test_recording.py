"""Recording a rollout: videos, ML-Agents demonstrations (read back by ML-Agents' own trainer),
Minari datasets (read back by Minari), Gymnasium's vector RecordEpisodeStatistics, the replay of
one episode, and `huggy rollout --video/--demo/--dataset`.

The reference for the recorded episodes is a plain log of what the environment returned and
what was sent to it (`RawLog`), cut into episodes by hand (`reference_episodes`), never the
recorders' own collections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import envs
from envs import HuggyVectorEnv, UnityVectorEnv, rollout
from envs.recording.dataset import MinariRecorder, dataset_env_spec
from envs.recording.demo import DemoRecorder
from envs.recording.replay import replay_episode
from envs.recording.video import VideoRecorder, VideoWriter, write_video
from envs.rollout import slot_quotas
from huggy_agent import HuggyAgent
from tests.support.envs import env_kwargs
from tests.support.fixtures import REPO_ROOT
from tests.support.processes import free_port

SPEC = {"inputs": [{"name": "obs_0", "shape": [3, 12, 10], "kind": "visual"},
                   {"name": "obs_1", "shape": [5], "kind": "vector"},
                   {"name": "obs_2", "shape": [4, 3], "kind": "variable"}],
        "continuous_size": 2, "discrete_branches": [3, 2], "behavior": "Mixed"}
"""A spec-driven stand-in behavior with every kind of observation and hybrid actions."""


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent(device="cpu", seed=0)


class MaskedRandomAgent:
    """Seeded random actions for `SPEC`: continuous in [-1, 1], each discrete branch an allowed
    action (masks honoured)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def compute_action(self, obs: Any, deterministic: bool = True, seed: int | None = None,
                       row_offset: int = 0, action_mask: np.ndarray | None = None) -> Any:
        from huggy_agent import Actions

        n = len(obs[0])
        continuous = self.rng.uniform(-1, 1, (n, 2)).astype(np.float32)
        discrete = np.zeros((n, 2), np.int64)
        assert action_mask is not None
        for row in range(n):
            for branch, (start, size) in enumerate(((0, 3), (3, 2))):
                allowed = np.flatnonzero(action_mask[row, start:start + size])
                discrete[row, branch] = self.rng.choice(allowed)
        return Actions(continuous, discrete)


class RawLog:
    """A vector env as it is, keeping copies of what `reset` and `step` returned and of the
    actions each step was sent."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.first: tuple[Any, dict] | None = None
        self.steps: list[tuple[Any, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, infos = self.env.reset(**kwargs)
        self.first = (_copy(obs), _copy(infos))
        self.steps = []
        return obs, infos

    def step(self, actions: Any) -> tuple:
        outcome = self.env.step(actions)
        self.steps.append((_copy(actions), _copy(outcome)))
        return outcome


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_copy(v) for v in value) if not hasattr(value, "_fields") \
            else type(value)(*(_copy(v) for v in value))
    return value.copy() if isinstance(value, np.ndarray) else value


def _inputs(obs: Any) -> tuple:
    return tuple(obs) if isinstance(obs, tuple) else (obs,)


def _split(actions: Any, hybrid: bool) -> tuple[np.ndarray, np.ndarray | None]:
    if hybrid:
        return np.asarray(actions[0]), np.asarray(actions[1])
    return np.asarray(actions), None


def reference_episodes(log: RawLog, episodes: int, hybrid: bool = False) -> list[dict]:
    """Each slot's first quota episodes (`slot_quotas`), cut by hand from the log, in (slot,
    index) order: observations (T + 1 per input, the last where it ended), actions, masks of
    each decision, rewards, and how it ended."""
    assert log.first is not None
    first_obs, first_infos = log.first
    n = len(log.steps[0][1][1])
    quotas = slot_quotas(episodes, n)
    out = []
    for slot in range(n):
        found: list[dict] = []
        current = {"obs": [[o[slot]] for o in _inputs(first_obs)], "continuous": [],
                   "discrete": [], "mask": [], "rewards": []}
        infos = first_infos
        for actions, (next_obs, rewards, terminated, truncated, next_infos) in log.steps:
            continuous, discrete = _split(actions, hybrid)
            current["continuous"].append(continuous[slot])
            if discrete is not None:
                current["discrete"].append(discrete[slot])
                current["mask"].append(infos["action_mask"][slot])
            current["rewards"].append(rewards[slot])
            if terminated[slot] or truncated[slot]:
                for rows, final in zip(current["obs"], _inputs(next_infos["final_obs"][slot]),
                                       strict=True):
                    rows.append(final)
                current.update(slot=slot, index=len(found), terminated=bool(terminated[slot]))
                found.append(current)
                current = {"obs": [[o[slot]] for o in _inputs(next_obs)], "continuous": [],
                           "discrete": [], "mask": [], "rewards": []}
            else:
                for rows, values in zip(current["obs"], _inputs(next_obs), strict=True):
                    rows.append(values[slot])
            infos = next_infos
        assert len(found) >= quotas[slot]
        out += found[: quotas[slot]]
    return out


# --- videos ---------------------------------------------------------------------------------


def _read_video(path: Path) -> tuple[dict, list[np.ndarray]]:
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    width, height = meta["size"]
    frames = [np.frombuffer(f, np.uint8).reshape(height, width, 3) for f in reader]
    return meta, frames


def test_video_writer_writes_h264_yuv420p_that_reads_back(tmp_path):
    rng = np.random.default_rng(0)
    colors = rng.integers(0, 256, (12, 3))
    frames = [np.broadcast_to(c.astype(np.uint8), (48, 64, 3)).copy() for c in colors]
    path = write_video(tmp_path / "flat.mp4", frames, fps=12.5)
    meta, back = _read_video(path)
    assert meta["codec"] == "h264" and meta["pix_fmt"].startswith("yuv420p")
    assert meta["fps"] == 12.5 and meta["size"] == (64, 48)
    assert len(back) == len(frames)
    # Flat colours through yuv420p at crf 20: chroma is subsampled (no effect on a flat frame)
    # and each channel is rounded through 8-bit YCbCr; a few levels at most.
    for frame, read in zip(frames, back, strict=True):
        assert np.abs(read.astype(int) - frame).max() <= 6


def test_video_writer_refuses_bad_frames(tmp_path):
    writer = VideoWriter(tmp_path / "x.mp4", fps=10)
    with pytest.raises(ValueError, match=r"expected an \(H, W, 3\) uint8 frame, got \(4, 4\)"):
        writer.write(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="even sides"):
        writer.write(np.zeros((5, 4, 3), np.uint8))
    writer.write(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="every frame must be 4x4, got 6x4"):
        writer.write(np.zeros((4, 6, 3), np.uint8))
    writer.close()
    assert (tmp_path / "x.mp4").is_file()


def test_video_recorder_needs_a_rendering_env():
    with pytest.raises(ValueError, match="one file: record one episode"):
        VideoRecorder(path="a.mp4", episodes=2)
    with pytest.raises(ValueError, match="a folder for the videos, or a path"):
        VideoRecorder()


@pytest.mark.standin
def test_recorders_leave_the_rollout_unchanged_and_videos_hold_each_episode(tmp_path, agent):
    """The same seed gives the same episodes with every recorder as without (the stand-in is
    deterministic given its seed and actions, and the batch is the same); slot 0's videos
    have one frame per decision plus the first."""
    with HuggyVectorEnv(**env_kwargs(tmp_path), render_mode="rgb_array") as env:
        plain = rollout(agent, env, episodes=20, seed=11)
        video = VideoRecorder(tmp_path / "videos", slot=0, episodes=2, label="bundled")
        demo = DemoRecorder(tmp_path / "all.demo")
        recorded = rollout(agent, env, episodes=20, seed=11, recorders=[video, demo])
    assert recorded.episodes == plain.episodes
    slot0 = [e for e in plain.episodes if e.slot == 0]
    assert [p.name for p in video.written] == ["rollout-slot0-episode0.mp4",
                                               "rollout-slot0-episode1.mp4"]
    for episode, path in zip(slot0, video.written, strict=True):
        meta, frames = _read_video(path)
        assert meta["codec"] == "h264" and meta["size"] == (640, 480)
        assert len(frames) == episode.length + 1


@pytest.mark.standin
def test_render_mode_changes_no_number(tmp_path, agent):
    """Rendering only reads: the stand-in's poses side channel leaves every episode as it is."""
    with HuggyVectorEnv(**env_kwargs(tmp_path)) as env:
        plain = rollout(agent, env, episodes=18, seed=4)
    with HuggyVectorEnv(**env_kwargs(tmp_path), render_mode="rgb_array") as env:
        rendered = rollout(agent, env, episodes=18, seed=4)
    assert rendered.episodes == plain.episodes


@pytest.mark.standin
@pytest.mark.parametrize("deterministic", [True, False])
def test_replay_reproduces_an_episode_of_an_evaluation_item(tmp_path, agent, deterministic):
    """An episode of one instance of a two-instance rollout (as an evaluation work item runs)
    replays on a one-instance env from the item's seed: the same return and length, bit for
    bit (same batch, same noise seeds, same machine), and its video has one frame per decision
    plus the first."""
    seeds = [7, 123]
    with UnityVectorEnv(**env_kwargs(tmp_path), instances=2, num_agents=6) as env:
        original = envs.rollout_per_instance(agent, env, [6, 6], seeds, deterministic)[1]
    target = max(original.episodes, key=lambda e: e.length)
    with UnityVectorEnv(**env_kwargs(tmp_path), num_agents=6, render_mode="rgb_array") as env:
        replayed = replay_episode(agent, env, seed=seeds[1], slot=target.slot, index=target.index,
                                  path=tmp_path / "replay.mp4", deterministic=deterministic,
                                  label="bundled")
    assert replayed == target
    _, frames = _read_video(tmp_path / "replay.mp4")
    assert len(frames) == target.length + 1


# --- Gymnasium's episode statistics ---------------------------------------------------------


@pytest.mark.standin
def test_gymnasium_record_episode_statistics_agrees_with_the_rollout(tmp_path, agent):
    """Gymnasium's vector RecordEpisodeStatistics, reading the env's same-step autoreset mode,
    reports for each slot's first quota episodes the returns and lengths the rollout records."""
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    episodes = 24
    with HuggyVectorEnv(**env_kwargs(tmp_path)) as env:
        expected = rollout(agent, env, episodes=episodes, seed=9)
        wrapped = RecordEpisodeStatistics(env)
        quotas = slot_quotas(episodes, env.num_envs)
        seen: list[list[tuple[float, int]]] = [[] for _ in range(env.num_envs)]
        obs, _ = wrapped.reset(seed=9)
        for _ in range(5000):
            obs, _, _, _, infos = wrapped.step(agent.compute_action(obs))
            if "episode" in infos:
                for slot in np.flatnonzero(infos["_episode"]):
                    seen[slot].append((float(infos["episode"]["r"][slot]),
                                       int(infos["episode"]["l"][slot])))
            if all(len(s) >= q for s, q in zip(seen, quotas, strict=True)):
                break
    gymnasium_episodes = [pair for slot, quota in enumerate(quotas) for pair in seen[slot][:quota]]
    assert [length for _, length in gymnasium_episodes] == [e.length for e in expected.episodes]
    # Both sum the same float32 rewards in float64 in step order.
    np.testing.assert_allclose([r for r, _ in gymnasium_episodes],
                               [e.episode_return for e in expected.episodes], rtol=0, atol=1e-12)


# --- ML-Agents demonstrations ---------------------------------------------------------------


def _read_demo_with_mlagents(path: Path, tmp_path: Path) -> tuple[dict, Any]:
    out = tmp_path / "read.npz"
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "mlagents_demo_reader.py"), str(path),
         str(out)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert completed.returncode == 0, completed.stderr[-3000:]
    data = np.load(out)
    return json.loads(str(data["summary"])), data


def _check_demo_against(reference: list[dict], summary: dict, data: Any, inputs: int,
                        hybrid: bool) -> None:
    steps = sum(len(e["rewards"]) + 1 for e in reference)
    assert summary["pairs"] == summary["expected"] == summary["meta"]["steps"] == steps
    assert summary["meta"]["api_version"] == 1
    assert summary["meta"]["episodes"] == len(reference)
    returns = [float(np.sum(np.asarray(e["rewards"], np.float64))) for e in reference]
    assert summary["meta"]["mean_reward"] == pytest.approx(np.mean(returns), rel=1e-6)
    k = 0
    for episode in reference:
        length = len(episode["rewards"])
        for t in range(length + 1):
            for i in range(inputs):
                np.testing.assert_array_equal(data[f"obs{i}_{k}"], episode["obs"][i][t])
            last = t == length
            assert data["done"][k] == last
            assert data["max_step"][k] == (last and not episode["terminated"])
            assert data["reward"][k] == (0.0 if t == 0 else np.float32(episode["rewards"][t - 1]))
            if not last:
                np.testing.assert_array_equal(data[f"continuous_{k}"], episode["continuous"][t])
                if hybrid:
                    np.testing.assert_array_equal(data[f"discrete_{k}"], episode["discrete"][t])
                    # ML-Agents' masks: True = not allowed
                    np.testing.assert_array_equal(data[f"mask_{k}"], ~episode["mask"][t])
            k += 1
    # The trainer's buffer pairs each observation with its record's action and the next
    # record's reward and done (the last record starts no sample).
    np.testing.assert_array_equal(data["buffer_done"], data["done"][1:])
    np.testing.assert_array_equal(data["buffer_reward"], data["reward"][1:])
    np.testing.assert_array_equal(
        data["buffer_continuous"],
        np.stack([data[f"continuous_{j}"] for j in range(k - 1)]))


@pytest.mark.standin
def test_demo_of_huggy_reads_back_through_mlagents(tmp_path, agent):
    with HuggyVectorEnv(**env_kwargs(tmp_path)) as env:
        log = RawLog(env)
        recorder = DemoRecorder(tmp_path / "huggy.demo")
        result = rollout(agent, log, episodes=20, seed=3, recorders=[recorder])
    reference = reference_episodes(log, 20)
    assert [len(e["rewards"]) for e in reference] == [e.length for e in result.episodes]
    summary, data = _read_demo_with_mlagents(tmp_path / "huggy.demo", tmp_path)
    assert summary["observation_shapes"] == [[59]] and summary["continuous_size"] == 21
    assert summary["discrete_branches"] == []
    assert summary["meta"]["name"] == "huggy"
    _check_demo_against(reference, summary, data, inputs=1, hybrid=False)


@pytest.mark.standin
def test_demo_of_every_observation_kind_and_hybrid_actions_reads_back(tmp_path):
    with UnityVectorEnv(**env_kwargs(tmp_path), behavior_spec=SPEC, num_agents=4,
                        env_parameters={"episode_length": 3, "episode_length_step": 2}) as env:
        log = RawLog(env)
        recorder = DemoRecorder(tmp_path / "mixed.demo", name="a name longer than what fits")
        rollout(MaskedRandomAgent(), log, episodes=6, seed=2, recorders=[recorder])
    reference = reference_episodes(log, 6, hybrid=True)
    summary, data = _read_demo_with_mlagents(tmp_path / "mixed.demo", tmp_path)
    assert summary["observation_shapes"] == [[3, 12, 10], [5], [4, 3]]
    # NONE = 1, TRANSLATIONAL_EQUIVARIANCE = 2, VARIABLE_SIZE = 4 (ML-Agents' DimensionProperty)
    assert summary["dimension_properties"] == [[1, 2, 2], [1], [4, 1]]
    assert summary["continuous_size"] == 2 and summary["discrete_branches"] == [3, 2]
    assert "a name longer".startswith(summary["meta"]["name"][:13])
    _check_demo_against(reference, summary, data, inputs=3, hybrid=True)


def test_demo_path_must_end_in_demo():
    with pytest.raises(ValueError, match=r"files named \*.demo, got out.txt"):
        DemoRecorder("out.txt")


# --- Minari datasets ------------------------------------------------------------------------


@pytest.mark.standin
def test_minari_dataset_of_huggy_loads_with_minari(tmp_path, agent, monkeypatch):
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    with HuggyVectorEnv(**env_kwargs(tmp_path)) as env:
        log = RawLog(env)
        recorder = MinariRecorder("huggy/test-v0", env_spec=dataset_env_spec(None, None),
                                  metadata={"policy": "bundled", "seed": 5})
        result = rollout(agent, log, episodes=20, seed=5, recorders=[recorder])
    reference = reference_episodes(log, 20)
    dataset = minari.load_dataset("huggy/test-v0")
    assert dataset.total_episodes == 20
    assert dataset.spec.env_spec.id == "huggy_agent/Huggy-v0"
    loaded = list(dataset.iterate_episodes())
    for episode, expected, counted in zip(loaded, reference, result.episodes, strict=True):
        np.testing.assert_array_equal(episode.observations, np.stack(expected["obs"][0]))
        np.testing.assert_array_equal(episode.actions, np.stack(expected["continuous"]))
        np.testing.assert_array_equal(episode.rewards, np.asarray(expected["rewards"]))
        assert bool(episode.terminations[-1]) == counted.terminated
        assert bool(episode.truncations[-1]) == (not counted.terminated)
        assert not episode.terminations[:-1].any() and not episode.truncations[:-1].any()
        assert float(np.sum(episode.rewards)) == pytest.approx(counted.episode_return,
                                                               abs=1e-9)
    metadata = list(dataset.storage.get_episode_metadata(range(20)))
    assert [(m["slot"], m["slot_episode"], m["env_seed"]) for m in metadata] == \
        [(e.slot, e.index, 5) for e in result.episodes]
    stored = json.loads((tmp_path / "datasets" / "huggy" / "test-v0" / "data" /
                         "metadata.json").read_text())
    assert stored["huggy_agent"] == {"policy": "bundled", "seed": 5}
    shown = subprocess.run([str(Path(sys.executable).with_name("minari")), "show",
                            "huggy/test-v0"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                                "MINARI_DATASETS_PATH": str(tmp_path / "datasets")})
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "Total Episodes" in shown.stdout and "huggy_agent/Huggy-v0" in shown.stdout


@pytest.mark.standin
def test_minari_dataset_of_tuple_spaces(tmp_path, monkeypatch):
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    with UnityVectorEnv(**env_kwargs(tmp_path), behavior_spec=SPEC, num_agents=3,
                        env_parameters={"episode_length": 4}) as env:
        log = RawLog(env)
        recorder = MinariRecorder("mixed-v0", env_spec=dataset_env_spec(None, SPEC))
        rollout(MaskedRandomAgent(1), log, episodes=3, seed=8, recorders=[recorder])
    reference = reference_episodes(log, 3, hybrid=True)
    dataset = minari.load_dataset("mixed-v0")
    assert dataset.spec.env_spec.kwargs["behavior_spec"] == SPEC
    for episode, expected in zip(dataset.iterate_episodes(), reference, strict=True):
        for i in range(3):
            np.testing.assert_array_equal(episode.observations[i], np.stack(expected["obs"][i]))
        np.testing.assert_array_equal(episode.actions[0], np.stack(expected["continuous"]))
        np.testing.assert_array_equal(episode.actions[1], np.stack(expected["discrete"]))


# --- the command ----------------------------------------------------------------------------


@pytest.mark.standin
def test_huggy_rollout_writes_video_demo_and_dataset(tmp_path):
    command = [str(Path(sys.executable).with_name("huggy")), "rollout", "--episodes", "3",
               "--no-progress", "--base-port", str(free_port()), "--video", str(tmp_path / "v"),
               "--demo", str(tmp_path / "run.demo"), "--dataset", "cli/run-v0",
               "--record", str(tmp_path / "run.jsonl")]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                                    "MINARI_DATASETS_PATH": str(tmp_path / "datasets")})
    assert completed.returncode == 0, completed.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    video = tmp_path / "v" / "rollout-slot0-episode0.mp4"
    assert f"video: {video}" in completed.stdout
    _, frames = _read_video(video)
    assert len(frames) == records[0]["length"] + 1
    steps = sum(r["length"] + 1 for r in records)
    assert f"demonstration: {tmp_path / 'run.demo'} (3 episodes, {steps} steps" in \
        completed.stdout
    assert "Minari dataset: cli/run-v0 (3 episodes" in completed.stdout
