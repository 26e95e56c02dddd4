"""HuggyVectorEnv (autoreset, final obs, stable slots, terminated vs truncated), HuggyEnv
(check_env) and the registered id `huggy_agent/Huggy-v0`."""

from __future__ import annotations

import re
from itertools import pairwise

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs import HuggyEnv, HuggyVectorEnv
from envs.standin.sim import ACT_SIZE, OBS_SIZE
from tests.support.envs import env_kwargs, gait_actions

pytestmark = pytest.mark.standin  # every test here starts the stand-in

MAX_STEPS = 60
FRESH_JOINTS = [2, 3, 5, 7, 10]  # upper X, Y, strength, lower X, strength of leg 0: 0.5 at spawn


@pytest.fixture(scope="module")
def trotting(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """300 steps of 18 dogs trotting to their sticks in a small arena, episodes capped at 60."""
    kwargs = env_kwargs(tmp_path_factory.mktemp("trot"), max_steps=MAX_STEPS, arena_size=4.0,
                        seed=2)
    steps = []
    with HuggyVectorEnv(**kwargs) as env:
        obs, infos = env.reset(seed=2)
        steps.append({"obs": obs, "infos": infos, "ids": env.agent_ids})
        for t in range(300):
            obs, rewards, terminated, truncated, infos = env.step(gait_actions(t, env.num_envs))
            steps.append({"obs": obs, "rewards": rewards, "terminated": terminated,
                          "truncated": truncated, "infos": infos, "ids": env.agent_ids})
    return steps


def test_spaces_and_metadata(tmp_path) -> None:
    with HuggyVectorEnv(**env_kwargs(tmp_path)) as env:
        assert env.num_envs == 18
        assert env.single_observation_space == gymnasium.spaces.Box(
            -np.inf, np.inf, (OBS_SIZE,), np.float32)
        assert env.single_action_space == gymnasium.spaces.Box(-1, 1, (ACT_SIZE,), np.float32)
        assert env.observation_space.shape == (18, OBS_SIZE)
        assert env.action_space.shape == (18, ACT_SIZE)
        assert env.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.SAME_STEP
        obs, infos = env.reset(seed=0)
        assert obs.shape == (18, OBS_SIZE) and obs.dtype == np.float32
        assert env.observation_space.contains(obs)
        with pytest.raises(ValueError, match=re.escape(
                "expected actions of shape (18, 21), got (17, 21)")):
            env.step(np.zeros((17, ACT_SIZE)))
        with pytest.raises(ValueError, match=re.escape("seed must be in [0, 16777216), got -1")):
            env.reset(seed=-1)


def test_terminated_and_truncated(trotting: list[dict]) -> None:
    """Reaching the stick (before the cap) is terminated; the 60-step cap is truncated."""
    lengths = np.zeros(18, dtype=int)
    reached = capped = 0
    for step in trotting[1:]:
        lengths += 1
        terminated, truncated = step["terminated"], step["truncated"]
        assert not (terminated & truncated).any()
        np.testing.assert_array_equal(truncated, lengths == MAX_STEPS)
        assert (lengths[terminated] < MAX_STEPS).all()
        reached += terminated.sum()
        capped += truncated.sum()
        lengths[terminated | truncated] = 0
    assert reached >= 10 and capped >= 10, (reached, capped)


def test_same_step_autoreset_and_final_obs(trotting: list[dict]) -> None:
    seen_final = 0
    for before, step in pairwise(trotting):
        ended = step["terminated"] | step["truncated"]
        infos = step["infos"]
        if not ended.any():
            assert "final_obs" not in infos
            continue
        np.testing.assert_array_equal(infos["_final_obs"], ended)
        np.testing.assert_array_equal(infos["_final_info"], ended)
        for slot in range(18):
            if not ended[slot]:
                assert infos["final_obs"][slot] is None
                continue
            final = infos["final_obs"][slot]
            assert final.shape == (OBS_SIZE,) and final.dtype == np.float32
            # The successor's first observation: a dog freshly spawned with relaxed joints.
            np.testing.assert_array_equal(step["obs"][slot, FRESH_JOINTS], 0.5)
            assert not np.array_equal(final, step["obs"][slot])
            assert infos["final_info"]["agent_id"][slot] == before["ids"][slot]
            seen_final += 1
    assert seen_final >= 20


def test_slots_are_stable_while_ids_change(trotting: list[dict]) -> None:
    all_ids = set(trotting[0]["ids"].tolist())
    for before, step in pairwise(trotting):
        ended = step["terminated"] | step["truncated"]
        np.testing.assert_array_equal(step["ids"][~ended], before["ids"][~ended])
        new = step["ids"][ended].tolist()
        assert not set(new) & all_ids  # Unity gives each episode a new id
        all_ids |= set(new)
        np.testing.assert_array_equal(step["infos"]["agent_id"], step["ids"])
    assert len(all_ids) > 18 + 20


# Huggy's observations are unbounded (positions, velocities): the Box is (-inf, inf) on purpose.
@pytest.mark.filterwarnings("ignore:.*Box observation space (minimum|maximum) value is")
def test_single_agent_view_passes_check_env(tmp_path) -> None:
    env = HuggyEnv(**env_kwargs(tmp_path, max_steps=5))
    try:
        check_env(env, skip_render_check=True)
        obs, _ = env.reset(seed=3)
        assert obs.shape == (OBS_SIZE,) and env.vector_env.num_envs == 1
        for _ in range(5):
            obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            assert isinstance(reward, float)
        assert truncated and not terminated
        with pytest.raises(RuntimeError, match="call reset"):
            env.step(env.action_space.sample())
        obs, _ = env.reset()
        np.testing.assert_array_equal(obs[FRESH_JOINTS], 0.5)
    finally:
        env.close()


def test_registered_id_for_make_and_make_vec(tmp_path) -> None:
    assert envs.registration.ENV_ID == "huggy_agent/Huggy-v0"
    single = gymnasium.make("huggy_agent/Huggy-v0", **env_kwargs(tmp_path, seed=1))
    try:
        assert isinstance(single.unwrapped, HuggyEnv)
        obs, _ = single.reset(seed=1)
        assert single.observation_space.contains(obs)
        single.step(single.action_space.sample())
    finally:
        single.close()
    every = gymnasium.make_vec("huggy_agent/Huggy-v0", **env_kwargs(tmp_path))
    try:
        assert isinstance(every, HuggyVectorEnv) and every.num_envs == 18
    finally:
        every.close()
    four = gymnasium.make_vec("huggy_agent/Huggy-v0", num_envs=4, **env_kwargs(tmp_path))
    try:
        assert four.num_envs == 4
        obs, _ = four.reset(seed=0)
        assert obs.shape == (4, OBS_SIZE)
    finally:
        four.close()
