"""Scenes with several behaviors or teams, over real mlagents-envs and the stand-in: the PettingZoo
env (PettingZoo's own API and seed tests), agents that come and go without one being dropped,
goals rewarded on the step they end the match, opponents in the vector env, matches that depend
only on their seed, and team rollouts counted by per-unit quotas."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

import envs  # noqa: F401  (applies the compatibility layer)
from envs import UnityVectorEnv, rollout
from envs.heuristics import load_heuristic
from envs.matches import MatchPlan, play_matches
from envs.parallel_env import UnityParallelEnv
from envs.team_rollout import rollout_teams
from envs.teams import TeamsEnv
from huggy_agent.cli import main
from tests.support.fixtures import fixtures_dir
from tests.support.processes import free_port

pytestmark = pytest.mark.standin

TEAM0, TEAM1 = "SoccerTwos?team=0", "SoccerTwos?team=1"
SOCCER_LAYOUT = "(264,), (72,) -> discrete (3, 3, 3)"  # the stand-in's sensors and branches
AGENT_NAME = re.compile(r"^SoccerTwos\?team=[01]\?agent_id=\d+$")
TWO_BEHAVIORS = [
    {"behavior": "Striker", "team": 0, "agents": 2, "continuous_size": 3, "discrete_branches": [],
     "inputs": [{"name": "obs_0", "shape": [6], "kind": "vector"}]},
    {"behavior": "Goalie", "team": 1, "agents": 1, "continuous_size": 0,
     "discrete_branches": [3, 2], "inputs": [{"name": "obs_0", "shape": [4], "kind": "vector"},
                                             {"name": "obs_1", "shape": [2, 3], "kind": "variable"}]},
]


def soccer(arenas: int = 2, **kwargs: object) -> UnityParallelEnv:
    return UnityParallelEnv("builtin:soccertwos", base_port=free_port(), timeout_wait=30,
                            env_parameters={"num_arenas": arenas}, **kwargs)


@pytest.fixture(scope="module")
def two_arenas() -> Iterator[UnityParallelEnv]:
    env = soccer(2)
    try:
        yield env
    finally:
        env.close()


def test_pettingzoo_api_test_passes_without_a_warning(two_arenas: UnityParallelEnv) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel_api_test(two_arenas, num_cycles=400)
    assert [str(w.message) for w in caught] == []


def test_pettingzoo_api_test_passes_with_two_different_behaviors() -> None:
    env = UnityParallelEnv("builtin", behavior_spec=TWO_BEHAVIORS, base_port=free_port(),
                           timeout_wait=30, env_parameters={"episode_length": 7})
    try:
        assert env.behaviors == ("Goalie?team=1", "Striker?team=0")
        obs, infos = env.reset(seed=4)
        striker = next(a for a in env.agents if a.startswith("Striker"))
        goalie = next(a for a in env.agents if a.startswith("Goalie"))
        assert env.action_space(striker).shape == (3,)
        assert list(env.action_space(goalie).nvec) == [3, 2]
        assert [space.shape for space in env.observation_space(goalie).spaces] == [(4,), (2, 3)]
        assert infos[goalie]["action_mask"].shape == (5,) and "action_mask" not in infos[striker]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parallel_api_test(env, num_cycles=60)
        assert [str(w.message) for w in caught] == []
    finally:
        env.close()


def test_pettingzoo_seed_test_passes() -> None:
    parallel_seed_test(lambda: soccer(1), num_cycles=60)


def test_agents_are_named_as_ml_agents_names_them(two_arenas: UnityParallelEnv) -> None:
    _, infos = two_arenas.reset(seed=11)
    assert len(two_arenas.agents) == 8 and all(AGENT_NAME.match(a) for a in two_arenas.agents)
    for agent in two_arenas.agents:
        info = infos[agent]
        assert info["behavior"] == agent.split("?agent_id=")[0]
        assert info["team"] == int(info["behavior"][-1])
        # arena a's groups are 2a + 1 (team 0) and 2a + 2 (team 1)
        assert (info["group_id"] - 1) % 2 == info["team"] and 1 <= info["group_id"] <= 4
    assert two_arenas.possible_agents == two_arenas.agents


def test_goals_are_rewarded_on_the_step_that_ends_the_match_and_no_agent_is_dropped(
        two_arenas: UnityParallelEnv) -> None:
    """Random play until 6 matches end: every agent that leaves does so in a step that reports
    it terminated or truncated; a goal gives the team that conceded exactly -1 and the scorers
    1 - t / 5000 in (0, 1], both on that step; the step limit gives both 0."""
    _, _ = two_arenas.reset(seed=5)
    seen: set[str] = set(two_arenas.agents)
    ended = 0
    rng = np.random.default_rng(0)
    for _ in range(6000):
        live = list(two_arenas.agents)
        actions = {a: rng.integers(0, 3, 3) for a in live}
        _, rewards, terminated, truncated, infos = two_arenas.step(actions)
        left = set(live) - set(two_arenas.agents)
        assert left == {a for a in live if terminated[a] or truncated[a]}
        by_group: dict[int, list[float]] = {}
        for agent in left:
            by_group.setdefault(infos[agent]["group_id"], []).append(rewards[agent])
            assert rewards[agent] == infos[agent]["group_reward"] + infos[agent]["reward"]
        for group, found in by_group.items():
            other = group + 1 if group % 2 else group - 1
            assert len(found) == 2 and len(set(found)) == 1, (group, found)
            assert other in by_group, "both teams of an arena end together"
            mine, theirs = found[0], by_group[other][0]
            if any(truncated[a] for a in left if infos[a]["group_id"] == group):
                assert mine == theirs == 0.0
            else:
                assert sorted([mine, theirs])[0] == -1.0 and 0.0 < max(mine, theirs) <= 1.0
        ended += len(by_group) // 2
        seen |= set(two_arenas.agents)
        assert set(two_arenas.agents) <= set(two_arenas.possible_agents)
        if ended >= 6:
            break
    assert ended >= 6
    assert seen == set(two_arenas.possible_agents)


def test_opponents_play_the_other_team_of_a_vector_env() -> None:
    """The learner's view of one team, the other played in process: the chaser beats an idle
    opponent and only draws level with a chaser; an opponent key may not name the driven
    behavior."""
    chaser = load_heuristic("heuristic:chaser")
    means = {}
    for opponent in ("heuristic:idle", "heuristic:chaser"):
        env = UnityVectorEnv("builtin:soccertwos", behavior_name=TEAM0, base_port=free_port(),
                             timeout_wait=30, env_parameters={"num_arenas": 4},
                             opponents={"team=1": opponent})
        try:
            assert env.num_envs == 8 and env.single_action_space.shape == (3,)
            result = rollout(chaser, env, episodes=16, seed=3)
        finally:
            env.close()
        means[opponent] = np.mean([e.episode_return for e in result.episodes])
    assert means["heuristic:idle"] > 0.4 and means["heuristic:idle"] > means["heuristic:chaser"] + 0.3
    with pytest.raises(ValueError, match="opponent key 'team=0' names the driven behavior"):
        UnityVectorEnv("builtin:soccertwos", behavior_name=TEAM0, base_port=free_port(),
                       timeout_wait=30, opponents={"team=0": "heuristic:idle"})
    huggy = str(fixtures_dir() / "ppo_baseline" / "Huggy.onnx")
    with pytest.raises(ValueError, match=re.escape(
            f"{huggy} ((59,) -> 21 continuous) does not fit {TEAM1} ({SOCCER_LAYOUT})")):
        UnityVectorEnv("builtin:soccertwos", behavior_name=TEAM0, base_port=free_port(),
                       timeout_wait=30, opponents={"team=1": huggy})


def test_a_match_depends_only_on_its_seed() -> None:
    """The match seeded 102 plays alike as the third of three matches and alone on another
    arena: same final rewards and decisions, deterministic and sampled."""
    players = {name: load_heuristic(f"heuristic:{name}") for name in ("chaser", "random")}
    with TeamsEnv("builtin:soccertwos", base_port=free_port(), timeout_wait=30,
                  env_parameters={"num_arenas": 3}) as env:
        for deterministic in (True, False):
            batch = play_matches(env, [MatchPlan(0, 100, "chaser", "random"),
                                       MatchPlan(1, 101, "random", "chaser"),
                                       MatchPlan(2, 102, "random", "chaser")], players,
                                 deterministic)
            (alone,) = play_matches(env, [MatchPlan(9, 102, "random", "chaser")], players,
                                    deterministic)
            third = batch[2]
            assert (alone.reward0, alone.reward1, alone.decisions, alone.truncated) == (
                third.reward0, third.reward1, third.decisions, third.truncated)
            assert {o.score for o in batch} <= {0.0, 0.5, 1.0}
        # a fourth match would have no arena, and would never end: refused before it starts
        with pytest.raises(ValueError, match=re.escape(
                "4 matches at once need 4 arenas; the scene has 3")):
            play_matches(env, [MatchPlan(k, 100 + k, "chaser", "random") for k in range(4)],
                         players)


def test_team_rollout_counts_each_team_by_quotas() -> None:
    """10 episodes per team over 4 arenas: quotas 3, 3, 2, 2 per unit, and each team counts the
    same matches, so team 0's wins are team 1's losses, exactly."""
    players = {TEAM0: load_heuristic("heuristic:chaser"), TEAM1: load_heuristic("heuristic:idle")}
    with TeamsEnv("builtin:soccertwos", base_port=free_port(), timeout_wait=30,
                  env_parameters={"num_arenas": 4}) as env:
        result = rollout_teams(env, players, episodes=10, seed=2)
    team0, team1 = result.by_team()
    assert team0.episodes == team1.episodes == 10
    per_unit = {}
    for episode in result.episodes:
        per_unit.setdefault((episode.team, episode.unit), []).append(episode.index)
    assert sorted(len(v) for k, v in per_unit.items() if k[0] == 0) == [2, 2, 3, 3]
    assert all(v == list(range(len(v))) for v in per_unit.values())
    assert (team0.wins, team0.draws, team0.losses) == (team1.losses, team1.draws, team1.wins)
    assert team0.wins > team0.losses


def test_huggy_rollout_prints_one_row_per_team(capsys) -> None:
    code = main(["rollout", "--env", "builtin:soccertwos", "--policy", "team=0=heuristic:chaser",
                 "--policy", "SoccerTwos?team=1=heuristic:random", "--episodes", "4",
                 "--env-param", "num_arenas=2", "--base-port", str(free_port()),
                 "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line[:2] in ("0 ", "1 ")]
    assert [row[:4] for row in rows] == [["0", "SoccerTwos?team=0", "heuristic:chaser", "4"],
                                         ["1", "SoccerTwos?team=1", "heuristic:random", "4"]]
    assert main(["rollout", "--env", "builtin:soccertwos", "--policy", "team=0=heuristic:nope",
                 "--base-port", str(free_port())]) == 2
    assert "heuristic:nope" in capsys.readouterr().err


def test_huggy_rollout_refuses_a_team_that_is_not_a_number_or_a_policy_that_misfits(
        capsys) -> None:
    huggy = str(fixtures_dir() / "ppo_baseline" / "Huggy.onnx")
    assert main(["rollout", "--env", "builtin:soccertwos", "--policy", f"team=x={huggy}"]) == 2
    assert f"--policy team=x={huggy}: a team is a number" in capsys.readouterr().err
    assert main(["rollout", "--env", "builtin:soccertwos", "--policy", "team=0=heuristic:idle",
                 "--policy", f"team=1={huggy}", "--env-param", "num_arenas=1",
                 "--base-port", str(free_port()), "--no-progress"]) == 2
    assert (f"{huggy} ((59,) -> 21 continuous) does not fit {TEAM1} ({SOCCER_LAYOUT})"
            in capsys.readouterr().err)


def test_a_lone_policy_plays_every_behavior_it_fits(capsys) -> None:
    assert main(["rollout", "--env", "builtin:soccertwos", "--policy", "heuristic:idle",
                 "--episodes", "2", "--env-param", "num_arenas=2", "--env-param",
                 "max_environment_steps=200", "--base-port", str(free_port()),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("heuristic:idle") == 2 and "agent-steps" in out
