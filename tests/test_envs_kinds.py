"""Any behavior through the real protocol: the stand-in's spec-driven mode, `UnityVectorEnv`
and `huggy_agent/Unity-v0` (spaces, action masks, several inputs, hybrid actions), and rollouts
of policies with masks and recurrent memory.

The spec-driven stand-in's rules (envs/standin/spec_sim.py) give exact expectations: a decision
earns 0.01 - 0.01 * mean(continuous^2) - 1 per forbidden discrete action, and an episode of slot
s lasts `episode_length + s * episode_length_step` decisions.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs import UnityVectorEnv, rollout
from envs.rollout import step_seed
from huggy_agent import HuggyAgent
from tests.support.envs import env_kwargs
from tests.support.fixtures import mlagents_fixtures_dir

pytestmark = pytest.mark.standin  # every test here starts the stand-in

HYBRID_VISUAL = {"behavior": "Mixed",
                 "inputs": [{"name": "obs_0", "shape": [2, 4, 5], "kind": "visual"},
                            {"name": "obs_1", "shape": [6, 3], "kind": "variable"},
                            {"name": "obs_2", "shape": [4], "kind": "vector"}],
                 "continuous_size": 2, "discrete_branches": [3, 2]}


def _kwargs(tmp_path, **overrides) -> dict:
    return env_kwargs(tmp_path, behavior_spec=HYBRID_VISUAL,
                      env_parameters={"episode_length": 5, "episode_length_step": 2,
                                      **overrides.pop("env_parameters", {})}, **overrides)


def test_spaces_observations_and_masks_follow_the_behavior(tmp_path) -> None:
    with UnityVectorEnv(**_kwargs(tmp_path, num_agents=4)) as env:
        assert env.num_envs == 4 and env.behavior_name == "Mixed?team=0"
        observation, action = env.single_observation_space, env.single_action_space
        assert isinstance(observation, gymnasium.spaces.Tuple)
        assert [s.shape for s in observation.spaces] == [(2, 4, 5), (6, 3), (4,)]
        assert (observation.spaces[0].low.min(), observation.spaces[0].high.max()) == (0, 1)
        assert isinstance(action, gymnasium.spaces.Tuple)
        assert action.spaces[0].shape == (2,) and list(action.spaces[1].nvec) == [3, 2]
        obs, infos = env.reset(seed=5)
        assert [o.shape for o in obs] == [(4, 2, 4, 5), (4, 6, 3), (4, 4)]
        assert env.observation_space.contains(obs)
        assert obs[0].min() >= 0 and obs[0].max() < 1
        empty = np.all(obs[1] == 0, axis=2)  # variable-length: padding after the entities
        assert all(np.all(np.diff(row.astype(int)) >= 0) for row in empty)
        mask = infos["action_mask"]
        assert mask.shape == (4, 5) and mask.dtype == bool
        assert mask[:, :3].any(axis=1).all() and mask[:, 3:].any(axis=1).all()
        assert not mask.all()  # some actions are forbidden


def test_actions_reach_the_stand_in_and_masks_are_its_own(tmp_path) -> None:
    """Forbidden actions cost exactly 1 each, allowed ones nothing: the env's masks are the
    stand-in's, True = allowed, and the discrete and continuous actions arrive per slot."""
    with UnityVectorEnv(**_kwargs(tmp_path, num_agents=6)) as env:
        _, infos = env.reset(seed=2)
        rng = np.random.default_rng(0)
        penalised = 0
        for _ in range(4):
            mask = infos["action_mask"]
            discrete = np.stack([rng.integers(0, 3, 6), rng.integers(0, 2, 6)], axis=1)
            continuous = rng.uniform(-1, 1, (6, 2)).astype(np.float32)
            forbidden = (~mask[np.arange(6), discrete[:, 0]]).astype(int) + \
                (~mask[np.arange(6), 3 + discrete[:, 1]]).astype(int)
            _, rewards, _, _, infos = env.step((continuous, discrete))
            expected = 0.01 - 0.01 * np.mean(continuous.astype(np.float64) ** 2, axis=1) - forbidden
            np.testing.assert_allclose(rewards, expected, rtol=0, atol=1e-6)
            penalised += int(forbidden.sum())
        assert penalised > 0  # the random draws did pick forbidden actions (seeded)


def test_episode_ends_and_final_observations_per_slot(tmp_path) -> None:
    with UnityVectorEnv(**_kwargs(tmp_path, num_agents=3)) as env:
        env.reset(seed=1)
        zeros = (np.zeros((3, 2), np.float32), np.zeros((3, 2), np.int64))
        ends = {}
        for t in range(1, 10):
            obs, _, terminated, truncated, infos = env.step(zeros)
            assert not truncated.any()
            for slot in np.flatnonzero(terminated):
                ends.setdefault(int(slot), t)
                final = infos["final_obs"][slot]
                assert [f.shape for f in final] == [(2, 4, 5), (6, 3), (4,)]
                assert not np.array_equal(final[2], obs[2][slot])  # the successor's first one
        assert ends == {0: 5, 1: 7, 2: 9}  # 5 + 2 s decisions


def test_bad_actions_are_refused(tmp_path) -> None:
    with UnityVectorEnv(**_kwargs(tmp_path, num_agents=2)) as env:
        env.reset(seed=0)
        with pytest.raises(ValueError, match="expected .continuous, discrete. actions"):
            env.step(np.zeros((2, 2), np.float32))
        with pytest.raises(ValueError, match=r"integers in \[0, branch size\) for branches"):
            env.step((np.zeros((2, 2), np.float32), np.full((2, 2), 3)))


def test_two_instances_of_any_behavior(tmp_path) -> None:
    with UnityVectorEnv(**_kwargs(tmp_path, num_agents=2, instances=2)) as env:
        obs, infos = env.reset(seed=4)
        assert env.num_envs == 4 and [o.shape[0] for o in obs] == [4, 4, 4]
        assert infos["action_mask"].shape == (4, 5)
        obs2, _, _, _, _ = env.step((np.zeros((4, 2), np.float32), np.zeros((4, 2), np.int64)))
        assert not np.array_equal(obs[2][:2], obs[2][2:])  # the instances are seeded apart


# ML-Agents observations are unbounded: the env checker's warning about infinite bounds is moot.
@pytest.mark.filterwarnings("ignore:.*Box observation space (minimum|maximum) value is")
def test_make_vec_and_make_give_unity_envs(tmp_path) -> None:
    vec = gymnasium.make_vec("huggy_agent/Unity-v0", **_kwargs(tmp_path, num_agents=2))
    try:
        assert isinstance(vec, envs.UnityVectorEnv) and vec.num_envs == 2
    finally:
        vec.close()
    single = gymnasium.make("huggy_agent/Unity-v0", disable_env_checker=True,
                            **_kwargs(tmp_path))
    try:
        check_env(single.unwrapped, skip_render_check=True)
        _, info = single.reset(seed=3)
        assert info["action_mask"].shape == (5,)
    finally:
        single.close()


def test_huggy_env_refuses_another_behavior(tmp_path) -> None:
    with pytest.raises(ValueError, match="HuggyVectorEnv plays Huggy"):
        envs.HuggyVectorEnv(**_kwargs(tmp_path))


# --- rollouts of other policy kinds -----------------------------------------------------------

def test_pyramids_policy_honours_its_masks(tmp_path) -> None:
    """The real trained Pyramids policy on the spec-driven stand-in: every decision allowed,
    so every 12-decision episode returns exactly 12 * 0.01 (float32 rewards, summed)."""
    agent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "pyramids_trained", device="cpu")
    spec = {**agent.spec.as_dict(), "behavior": "Pyramids"}
    with UnityVectorEnv(**env_kwargs(tmp_path, behavior_spec=spec, num_agents=8,
                                     env_parameters={"episode_length": 12})) as env:
        result = rollout(agent, env, episodes=16, seed=3)
    expected = float(np.float32(0.01)) * 12
    assert [e.episode_return for e in result.episodes] == pytest.approx([expected] * 16, abs=1e-9)
    assert [e.length for e in result.episodes] == [12] * 16


def _recurrent_reference(agent: HuggyAgent, env: UnityVectorEnv, seed: int,
                         reset_memory: bool) -> list[list[float]]:
    """Stochastic returns of the first two episodes of each slot, by a plain loop that keeps
    each slot's memory and, with `reset_memory`, zeroes it when its episode ends."""
    obs, _ = env.reset(seed=seed)
    memory = np.zeros((env.num_envs, agent.spec.memory_size), np.float32)
    returns = np.zeros(env.num_envs)
    done: list[list[float]] = [[] for _ in range(env.num_envs)]
    step = 0
    while any(len(d) < 2 for d in done):
        actions, memory = agent.compute_action(obs, deterministic=False,
                                               seed=step_seed(seed, step), memory=memory)
        obs, rewards, terminated, truncated, _ = env.step(actions)
        step += 1
        returns += rewards
        for slot in np.flatnonzero(terminated | truncated):
            done[slot].append(float(returns[slot]))
            returns[slot] = 0.0
            if reset_memory:
                memory[slot] = 0.0
    return [d[:2] for d in done]


def test_rollout_keeps_each_slots_memory_and_zeroes_it_between_episodes(tmp_path) -> None:
    """A recurrent policy: the rollout's returns are those of a plain loop that keeps each slot's
    memory and zeroes it at every episode's start, and not those of one that carries it over
    (the rewards depend on the continuous actions, so on the memory)."""
    agent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "lstm", device="cpu")
    spec = {**agent.spec.as_dict(), "behavior": "Recurrent"}
    kwargs = env_kwargs(tmp_path, behavior_spec=spec, num_agents=4,
                        env_parameters={"episode_length": 3, "episode_length_step": 2})
    with UnityVectorEnv(**kwargs) as env:
        result = rollout(agent, env, episodes=8, deterministic=False, seed=6)
        zeroed = _recurrent_reference(agent, env, 6, reset_memory=True)
        carried = _recurrent_reference(agent, env, 6, reset_memory=False)
    ours = [[e.episode_return for e in result.episodes if e.slot == slot] for slot in range(4)]
    np.testing.assert_allclose(ours, zeroed, rtol=0, atol=1e-6)
    assert [o[0] for o in ours] == pytest.approx([c[0] for c in carried], abs=1e-6)
    assert max(abs(o[1] - c[1]) for o, c in zip(ours, carried, strict=True)) > 1e-4
