"""rollout() against a plain loop and stochastic seeding, each on a small in-process environment
and on the stand-in over real gRPC, and the `huggy rollout` command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from envs import EpisodeResult, HuggyVectorEnv, rollout
from envs.commands import summary_rows
from envs.rollout import RolloutResult, step_seed, terminated_label
from huggy_agent import HuggyAgent
from huggy_agent.cli import main
from tests.support.envs import env_kwargs
from tests.support.fixtures import REPO_ROOT
from tests.support.processes import free_port


class DriftingDogs:
    """A small in-process vector env of Huggy's shape whose episodes depend on the actions and the
    reset seed, for the rollout loop alone: each slot's observation drifts with its actions, the
    reward is the first action times the first observation, an episode ends terminated once the
    first three actions sum above 1.5, truncated after `max_steps`; a slot starts its next
    episode in the same step (from the env's seeded generator), as the stand-in does."""

    def __init__(self, slots: int = 18, max_steps: int = 40) -> None:
        self.num_envs, self.max_steps = slots, max_steps
        self.rng = np.random.default_rng()
        self.obs = np.zeros((slots, 59), dtype=np.float32)
        self.steps = np.zeros(slots, dtype=np.int64)

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        self.rng = np.random.default_rng(seed)
        self.obs = self.rng.standard_normal((self.num_envs, 59)).astype(np.float32)
        self.steps[:] = 0
        return self.obs.copy(), {}

    def step(self, actions: np.ndarray) -> tuple:
        assert actions.shape == (self.num_envs, 21), actions.shape
        rewards = actions[:, 0].astype(np.float64) * self.obs[:, 0]
        self.obs[:, :21] = 0.9 * self.obs[:, :21] + actions
        self.steps += 1
        terminated = actions[:, :3].sum(axis=1) > 1.5
        truncated = ~terminated & (self.steps >= self.max_steps)
        ended = terminated | truncated
        self.obs[ended] = self.rng.standard_normal((int(ended.sum()), 59)).astype(np.float32)
        self.steps[ended] = 0
        return self.obs.copy(), rewards, terminated, truncated, {}

    def __enter__(self) -> DriftingDogs:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent(device="cpu", seed=0)


@pytest.fixture(params=["in-process", pytest.param("stand-in", marks=pytest.mark.standin)])
def make_env(request: pytest.FixtureRequest,
             tmp_path: Path) -> Callable[[int], DriftingDogs | HuggyVectorEnv]:
    """A factory of fresh 18-slot envs with episodes capped at `max_steps`: in-process, or the
    stand-in over real gRPC."""
    if request.param == "in-process":
        return lambda max_steps: DriftingDogs(max_steps=max_steps)
    return lambda max_steps: HuggyVectorEnv(**env_kwargs(tmp_path, max_steps=max_steps))


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
def test_rollout_equals_a_plain_loop(make_env, agent: HuggyAgent, deterministic: bool) -> None:
    with make_env(40) as env:
        seen: list[EpisodeResult] = []
        result = rollout(agent, env, episodes=20, deterministic=deterministic, seed=4,
                         progress=seen.append)
        expected = _plain_loop(agent, env, 20, 4, deterministic)
    assert len(result.episodes) == 20 and sorted(seen, key=lambda e: (e.slot, e.index)) == \
        result.episodes
    for mine, reference in zip(result.episodes, expected, strict=True):
        assert (mine.slot, mine.index) == (reference.slot, reference.index)
        assert mine.length == reference.length and mine.terminated == reference.terminated
        assert mine.episode_return == pytest.approx(reference.episode_return, abs=1e-9)
    assert result.agent_steps >= 18 * 40  # every slot's first episode at least
    assert result.seconds > 0 and result.agent_steps_per_second > 0


def test_stochastic_rollouts_depend_only_on_the_seed(make_env, agent: HuggyAgent) -> None:
    runs = []
    for seed in (9, 9, 10):
        with make_env(15) as env:
            runs.append(rollout(agent, env, episodes=18, deterministic=False, seed=seed).episodes)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_rollout_rejects_no_episodes(tmp_path, agent: HuggyAgent) -> None:
    with pytest.raises(ValueError, match="episodes must be >= 1, got 0"):
        rollout(agent, None, episodes=0)


@pytest.mark.standin
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
    assert all(set(line) >= {"return", "length", "terminated", "seed"} for line in lines)
    mean = np.mean([line["return"] for line in lines])
    assert f"{mean:.4f}" in table
    assert "episode" in out.stderr  # the tqdm progress bar


def test_terminated_episodes_are_named_for_the_behavior() -> None:
    assert terminated_label(["Huggy?team=0", "Huggy?team=0"]) == "reached stick"
    assert terminated_label(["Pyramids?team=0"]) == "terminated"
    assert terminated_label(["Huggy?team=0", "Pyramids?team=0"]) == "terminated"
    assert terminated_label([]) == terminated_label([None]) == "terminated"
    result = RolloutResult([EpisodeResult(1.0, 5, True), EpisodeResult(0.0, 9, False)], 14, 1.0)
    assert ("terminated", "1/2") in summary_rows(result, 2, "Pyramids?team=0")
    assert ("reached stick", "1/2") in summary_rows(result, 2, "Huggy?team=0")


def test_huggy_rollout_rejects_a_missing_executable(tmp_path, capsys) -> None:
    assert main(["rollout", "--env", str(tmp_path / "nope"), "--base-port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "Unity executable not found" in err and str(tmp_path / "nope") in err
