"""Unbiased episode statistics: on scripted episodes whose length and return are known per slot,
rollout() must give the exact expected mean, and the old "first N episodes to finish" estimator
must not. Each test runs on a small in-process environment with those episodes and on the
stand-in scripted the same way (`SimConfig.episode_length`), over real gRPC.

Scripted episodes: slot s's episodes last 4 + 6 s decisions and return exactly s; even slots
end terminated, odd ones truncated. With 15 episodes over 6 slots,
the quotas are 3, 3, 3, 2, 2, 2 (the first 15 mod 6 = 3 slots get one more), so, worked out by
hand:
    mean return  = (3*0 + 3*1 + 3*2 + 2*3 + 2*4 + 2*5) / 15 = 33 / 15 = 2.2
    mean length  = (3*4 + 3*10 + 3*16 + 2*22 + 2*28 + 2*34) / 15 = 258 / 15 = 17.2
    reached      = (3 + 3 + 2) / 15 (slots 0, 2, 4)
    steps taken  = the longest quota, slot 5: 2 * 34 = 68 decisions of 6 agents.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from envs import HuggyVectorEnv, rollout
from envs.rollout import slot_quotas
from huggy_agent import HuggyAgent
from tests.support.envs import env_kwargs

SCRIPT = {"episode_length": 4, "episode_length_step": 6}
SLOTS, EPISODES = 6, 15
EXPECTED_RETURN, EXPECTED_LENGTH, EXPECTED_TERMINATED = 33 / 15, 258 / 15, 8 / 15


class ScriptedEpisodes:
    """An in-process vector env of Huggy's shape with the scripted episodes above: slot s's
    episodes last 4 + 6 s decisions and their whole return s comes on the last one; the slot
    then starts its next episode in the same step, as the stand-in does."""

    def __init__(self, slots: int) -> None:
        self.num_envs = slots
        self.lengths = 4 + 6 * np.arange(slots)
        self.steps = np.zeros(slots, dtype=np.int64)

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        self.steps[:] = 0
        return self._observations(), {}

    def step(self, actions: np.ndarray) -> tuple:
        assert actions.shape == (self.num_envs, 21), actions.shape
        self.steps += 1
        ended = self.steps == self.lengths
        rewards = np.where(ended, np.arange(self.num_envs), 0).astype(np.float64)
        even = np.arange(self.num_envs) % 2 == 0
        self.steps[ended] = 0
        return self._observations(), rewards, ended & even, ended & ~even, {}

    def _observations(self) -> np.ndarray:
        obs = np.zeros((self.num_envs, 59), dtype=np.float32)
        obs[:, 0] = self.steps
        return obs

    def __enter__(self) -> ScriptedEpisodes:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent(device="cpu")


@pytest.fixture(params=["in-process", pytest.param("stand-in", marks=pytest.mark.standin)])
def scripted_env(request: pytest.FixtureRequest,
                  tmp_path: Path) -> Callable[[], ScriptedEpisodes | HuggyVectorEnv]:
    """A factory of fresh scripted envs: in-process, or the stand-in over real gRPC."""
    if request.param == "in-process":
        return lambda: ScriptedEpisodes(SLOTS)
    return lambda: HuggyVectorEnv(**env_kwargs(tmp_path, num_agents=SLOTS, env_parameters=SCRIPT))


def _first_to_finish(agent: HuggyAgent, env: HuggyVectorEnv, episodes: int) -> list[tuple]:
    """The biased estimator: the first `episodes` episodes to end, whichever slots they come from."""
    obs, _ = env.reset(seed=0)
    returns, lengths, done = np.zeros(env.num_envs), np.zeros(env.num_envs, int), []
    while len(done) < episodes:
        obs, rewards, terminated, truncated, _ = env.step(agent.compute_action(obs))
        returns += rewards
        lengths += 1
        for slot in np.flatnonzero(terminated | truncated):
            if len(done) < episodes:
                done.append((returns[slot], lengths[slot], bool(terminated[slot])))
            returns[slot], lengths[slot] = 0.0, 0
    return done


def test_quotas_spread_the_remainder_over_the_first_slots() -> None:
    assert slot_quotas(15, 6).tolist() == [3, 3, 3, 2, 2, 2]
    assert slot_quotas(18, 18).tolist() == [1] * 18
    assert slot_quotas(8, 18).tolist() == [1] * 8 + [0] * 10
    assert slot_quotas(0, 3).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="need episodes >= 0 and slots >= 1, got 5 and 0"):
        slot_quotas(5, 0)


def test_rollout_gives_the_exact_expected_statistics(scripted_env, agent: HuggyAgent) -> None:
    with scripted_env() as env:
        result = rollout(agent, env, episodes=EPISODES, seed=3)
    episodes = result.episodes
    assert len(episodes) == EPISODES
    # In (slot, episode index) order, never in the order they ended.
    assert [(e.slot, e.index) for e in episodes] == [
        (s, i) for s, quota in enumerate([3, 3, 3, 2, 2, 2]) for i in range(quota)]
    assert [e.episode_return for e in episodes] == [float(e.slot) for e in episodes]
    assert [e.length for e in episodes] == [4 + 6 * e.slot for e in episodes]
    assert np.mean([e.episode_return for e in episodes]) == pytest.approx(EXPECTED_RETURN)
    assert np.mean([e.length for e in episodes]) == pytest.approx(EXPECTED_LENGTH)
    assert np.mean([e.terminated for e in episodes]) == pytest.approx(EXPECTED_TERMINATED)
    # Slots that filled their quota kept stepping until the last one did.
    assert result.agent_steps == SLOTS * 2 * 34


def test_first_to_finish_is_biased_on_the_same_episodes(scripted_env, agent: HuggyAgent) -> None:
    """The counterpart: the old estimator, on the same environment, misses the exact means."""
    with scripted_env() as env:
        biased = _first_to_finish(agent, env, EPISODES)
    assert np.mean([r for r, _, _ in biased]) < EXPECTED_RETURN - 0.5
    assert np.mean([n for _, n, _ in biased]) < EXPECTED_LENGTH - 3


def test_progress_sees_each_counted_episode_once(scripted_env, agent: HuggyAgent) -> None:
    seen = []
    with scripted_env() as env:
        result = rollout(agent, env, episodes=7, seed=1, progress=seen.append)
    assert sorted(seen, key=lambda e: (e.slot, e.index)) == result.episodes
    assert [e.slot for e in result.episodes] == [0, 0, 1, 2, 3, 4, 5]
