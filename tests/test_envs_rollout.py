"""rollout() against a plain loop, stochastic seeding, and the `huggy rollout` command."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from envs import EpisodeResult, HuggyVectorEnv, rollout
from envs.rollout import step_seed
from huggy_agent import HuggyAgent
from tests.conftest import REPO_ROOT, free_port
from tests.envs_support import env_kwargs


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent(device="cpu", seed=0)


def _plain_loop(agent: HuggyAgent, env: HuggyVectorEnv, episodes: int, seed: int,
                deterministic: bool) -> list[EpisodeResult]:
    """The reference: the same episodes collected step by step, by hand. Slot i counts its
    first `episodes // n + (i < episodes % n)` episodes; the result is in (slot, index) order."""
    n = env.num_envs
    quota = [episodes // n + (i < episodes % n) for i in range(n)]
    obs, _ = env.reset(seed=seed)
    returns, lengths = [0.0] * n, [0] * n
    done: list[list[EpisodeResult]] = [[] for _ in range(n)]
    t = 0
    while any(len(done[i]) < quota[i] for i in range(n)):
        if deterministic:
            actions = agent.compute_action(obs, deterministic=True)
        else:
            actions = agent.compute_action(obs, deterministic=False, seed=step_seed(seed, t))
        obs, rewards, terminated, truncated, _ = env.step(actions)
        t += 1
        for i in range(n):
            returns[i] += float(rewards[i])
            lengths[i] += 1
            if terminated[i] or truncated[i]:
                if len(done[i]) < quota[i]:
                    done[i].append(EpisodeResult(returns[i], lengths[i], bool(terminated[i]), i,
                                                 len(done[i])))
                returns[i], lengths[i] = 0.0, 0
    return [episode for slot in done for episode in slot]


@pytest.mark.parametrize("deterministic", [True, False])
def test_rollout_equals_a_plain_loop(tmp_path, agent: HuggyAgent, deterministic: bool) -> None:
    with HuggyVectorEnv(**env_kwargs(tmp_path, max_steps=40)) as env:
        seen: list[EpisodeResult] = []
        result = rollout(agent, env, episodes=20, deterministic=deterministic, seed=4,
                         progress=seen.append)
        expected = _plain_loop(agent, env, 20, 4, deterministic)
    assert len(result.episodes) == 20 and sorted(seen, key=lambda e: (e.slot, e.index)) == \
        result.episodes
    for mine, reference in zip(result.episodes, expected, strict=True):
        assert (mine.slot, mine.index) == (reference.slot, reference.index)
        assert mine.length == reference.length and mine.reached_stick == reference.reached_stick
        assert mine.episode_return == pytest.approx(reference.episode_return, abs=1e-9)
    assert result.agent_steps >= 18 * 40  # every slot's first episode at least
    assert result.seconds > 0 and result.agent_steps_per_second > 0


def test_stochastic_rollouts_depend_only_on_the_seed(tmp_path, agent: HuggyAgent) -> None:
    runs = []
    for seed in (9, 9, 10):
        with HuggyVectorEnv(**env_kwargs(tmp_path, max_steps=15)) as env:
            runs.append(rollout(agent, env, episodes=18, deterministic=False, seed=seed).episodes)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_rollout_rejects_no_episodes(tmp_path, agent: HuggyAgent) -> None:
    with pytest.raises(ValueError, match="episodes must be >= 1, got 0"):
        rollout(agent, None, episodes=0)


def test_huggy_rollout_command(tmp_path) -> None:
    record = tmp_path / "episodes.jsonl"
    out = subprocess.run(
        [sys.executable, "-m", "huggy_agent.cli", "rollout", "--episodes", "20", "--record",
         str(record), "--base-port", str(free_port()), "--timeout-wait", "30"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr
    table = out.stdout
    for label in ("episodes", "mean return", "mean length", "reached stick", "agent-steps/s"):
        assert label in table
    assert re.search(r"^episodes +20$", table, re.MULTILINE)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(lines) == 20
    assert [line["episode"] for line in lines] == list(range(20))
    # 20 episodes over 18 slots: slots 0 and 1 count two, in (slot, episode index) order.
    assert [(line["slot"], line["slot_episode"]) for line in lines] == [
        (0, 0), (0, 1), (1, 0), (1, 1), *[(slot, 0) for slot in range(2, 18)]]
    assert all(set(line) >= {"return", "length", "reached_stick", "seed"} for line in lines)
    mean = np.mean([line["return"] for line in lines])
    assert f"{mean:.4f}" in table
    assert "episode" in out.stderr  # the tqdm progress bar


def test_huggy_rollout_rejects_a_missing_executable(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "huggy_agent.cli", "rollout", "--env", str(tmp_path / "nope"),
         "--base-port", str(free_port())],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )
    assert out.returncode == 2
    assert "Unity executable not found" in out.stderr and str(tmp_path / "nope") in out.stderr
