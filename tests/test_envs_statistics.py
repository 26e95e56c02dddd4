"""Unbiased episode statistics: on scripted stand-in episodes whose length and return are known
per slot, rollout() must give the exact expected mean, and the old "first N episodes to finish"
estimator must not.

Scripted episodes (`SimConfig.episode_length`): slot s's episodes last 4 + 6 s decisions and
return exactly s; even slots end terminated, odd ones truncated. With 15 episodes over 6 slots,
the quotas are 3, 3, 3, 2, 2, 2 (the first 15 mod 6 = 3 slots get one more), so, worked out by
hand:
    mean return  = (3*0 + 3*1 + 3*2 + 2*3 + 2*4 + 2*5) / 15 = 33 / 15 = 2.2
    mean length  = (3*4 + 3*10 + 3*16 + 2*22 + 2*28 + 2*34) / 15 = 258 / 15 = 17.2
    reached      = (3 + 3 + 2) / 15 (slots 0, 2, 4)
    steps taken  = the longest quota, slot 5: 2 * 34 = 68 decisions of 6 agents.
"""

from __future__ import annotations

import numpy as np
import pytest

from envs import HuggyVectorEnv, rollout
from envs.rollout import slot_quotas
from huggy_agent import HuggyAgent
from tests.envs_support import env_kwargs

SCRIPT = {"episode_length": 4, "episode_length_step": 6}
SLOTS, EPISODES = 6, 15
EXPECTED_RETURN, EXPECTED_LENGTH, EXPECTED_REACHED = 33 / 15, 258 / 15, 8 / 15


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent(device="cpu")


def _scripted_env(tmp_path) -> HuggyVectorEnv:
    return HuggyVectorEnv(**env_kwargs(tmp_path, num_agents=SLOTS, env_parameters=SCRIPT))


def _first_to_finish(agent: HuggyAgent, env: HuggyVectorEnv, episodes: int) -> list[tuple]:
    """The biased estimator this project used to have: the first `episodes` episodes to end."""
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


def test_rollout_gives_the_exact_expected_statistics(tmp_path, agent: HuggyAgent) -> None:
    with _scripted_env(tmp_path) as env:
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
    assert np.mean([e.reached_stick for e in episodes]) == pytest.approx(EXPECTED_REACHED)
    # Slots that filled their quota kept stepping until the last one did.
    assert result.agent_steps == SLOTS * 2 * 34


def test_first_to_finish_is_biased_on_the_same_episodes(tmp_path, agent: HuggyAgent) -> None:
    """The counterpart: the old estimator, on the same environment, misses the exact means."""
    with _scripted_env(tmp_path) as env:
        biased = _first_to_finish(agent, env, EPISODES)
    assert np.mean([r for r, _, _ in biased]) < EXPECTED_RETURN - 0.5
    assert np.mean([n for _, n, _ in biased]) < EXPECTED_LENGTH - 3


def test_progress_sees_each_counted_episode_once(tmp_path, agent: HuggyAgent) -> None:
    seen = []
    with _scripted_env(tmp_path) as env:
        result = rollout(agent, env, episodes=7, seed=1, progress=seen.append)
    assert sorted(seen, key=lambda e: (e.slot, e.index)) == result.episodes
    assert [e.slot for e in result.episodes] == [0, 0, 1, 2, 3, 4, 5]
