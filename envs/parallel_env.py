"""`UnityParallelEnv`: every agent of every behavior of an ML-Agents scene as a PettingZoo
`ParallelEnv` (current PettingZoo, Gymnasium spaces), over one Unity process or a stand-in.

Agents are named as ML-Agents names them, `Behavior?team=T?agent_id=K`; their spaces come from
their behavior's spec (one Box per observation, a Tuple of them where there are several; a Box
of continuous actions in [-1, 1], a MultiDiscrete of the discrete branches, a Tuple of both for
hybrid actions), one space object per behavior.

Unity gives an agent a new id every episode, so agents come and go without any being dropped:
- an agent that finishes appears in that step's results with `terminated` (or `truncated` when
  the step limit ended it) and its last observation, then leaves `agents`;
- an agent that asks for its first decision appears in that step's results (reward 0) and joins
  `agents`; `possible_agents` lists every agent seen since the last reset;
- an agent that skips a decision (neither decides nor finishes in an exchange) stays in
  `agents`; the results give it its last observation and reward 0, and its action, if any, is
  not sent (`infos[agent]["decides"]` is False).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from pettingzoo import ParallelEnv

from envs.behaviors import agent_name, behavior_of, team_of
from envs.teams import BehaviorRows, TeamsEnv
from envs.vector_env import spaces_of


class UnityParallelEnv(ParallelEnv):
    """Every agent of an ML-Agents scene.

    Args:
        file_name: a Unity build, "builtin" (the Huggy stand-in, or the behaviors of
            `behavior_spec`) or "builtin:soccertwos" (the stand-in SoccerTwos).
        **kwargs: as for `envs.teams.TeamsEnv` (`behavior_spec`, `worker_id`, `base_port`,
            `seed`, `env_parameters`, ...).

    Raises:
        ValueError: an unknown scene, parameters the stand-in would ignore, or a seed out of
            range.
        FileNotFoundError: a build that is not there.
        RuntimeError: every port tried was busy.
        EnvironmentStartError: the executable could not be started, or never connected.
    """

    metadata = {"name": "unity_parallel_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, file_name: str | None = "builtin:soccertwos", **kwargs: Any) -> None:
        self._teams = TeamsEnv(file_name, **kwargs)
        self._spaces = {behavior: spaces_of(layout)
                        for behavior, layout in self._teams.layouts.items()}
        self.agents: list[str] = []
        self.possible_agents: list[str] = []
        self._last_obs: dict[str, Any] = {}
        self._rows: dict[str, BehaviorRows] = {}

    @property
    def behaviors(self) -> tuple[str, ...]:
        """The scene's behaviors, such as `("SoccerTwos?team=0", "SoccerTwos?team=1")`."""
        return self._teams.behaviors

    def observation_space(self, agent: str) -> gymnasium.Space:
        """An agent's observation space (the same object for every agent of a behavior).

        Args:
            agent: `Behavior?team=T?agent_id=K`.

        Returns:
            A Box, or a Tuple of Boxes.

        Raises:
            ValueError: the name is of no behavior of this scene.
        """
        return self._spaces[self._known_behavior(agent)][0]

    def action_space(self, agent: str) -> gymnasium.Space:
        """An agent's action space (the same object for every agent of a behavior).

        Args:
            agent: `Behavior?team=T?agent_id=K`.

        Returns:
            A Box, a MultiDiscrete, or a Tuple of both.

        Raises:
            ValueError: the name is of no behavior of this scene.
        """
        return self._spaces[self._known_behavior(agent)][1]

    def _known_behavior(self, agent: str) -> str:
        behavior = behavior_of(agent)
        if behavior not in self._spaces:
            raise ValueError(f"agent {agent!r} is of no behavior of this scene; it has "
                             f"{list(self.behaviors)}")
        return behavior

    def reset(self, seed: int | None = None, options: dict | None = None
              ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """New episodes for every agent.

        Args:
            seed: reseeds the scene, in [0, 2**24); None keeps its seed.
            options: unused.

        Returns:
            (observations, infos) of every deciding agent.

        Raises:
            ValueError: `seed` is out of range.
        """
        self._rows = self._teams.reset(seed)
        self.agents, self.possible_agents, self._last_obs = [], [], {}
        observations, _, _, _, infos = self._results(set())
        return observations, infos

    def step(self, actions: Mapping[str, Any]) -> tuple[
            dict[str, Any], dict[str, float], dict[str, bool], dict[str, bool],
            dict[str, dict[str, Any]]]:
        """Send the deciding agents' actions (the others' are ignored) and return the results of every
        agent that was live, and of every agent that appeared.

        Rewards are the agent's own reward plus its group's reward (a POCA scene such as SoccerTwos
        rewards only groups).

        Args:
            actions: {agent: action} for every deciding agent of `agents`.

        Returns:
            observations: each agent's observation (its last one where it finished or skipped).
            rewards: each agent's own reward plus its group's.
            terminated: each agent's episode reached its end.
            truncated: each agent's episode was cut by the step limit.
            infos: per agent `"reward"` and `"group_reward"` apart, `"group_id"`, `"team"`,
                `"behavior"`, `"decides"`, and `"action_mask"` (True = allowed) for a deciding agent
                with discrete actions.

        Raises:
            ValueError: an action of an agent that is not live, or a deciding agent without one.
        """
        stray = sorted(set(actions) - set(self.agents))
        if stray:
            raise ValueError(f"actions for agents that are not live: {stray[:4]}"
                             + (" ..." if len(stray) > 4 else ""))
        batches = {behavior: self._batch(rows, actions) for behavior, rows in self._rows.items()
                   if rows.deciding}
        before = set(self.agents)
        self._rows = self._teams.step(batches)
        return self._results(before)

    def _batch(self, rows: BehaviorRows, actions: Mapping[str, Any]
               ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The (continuous, discrete) arrays of a behavior's deciding agents, in row order."""
        layout = self._teams.layouts[rows.behavior]
        names = rows.names()[:rows.deciding]
        missing = [name for name in names if name not in actions]
        if missing:
            raise ValueError(f"no action for deciding agent(s) {missing[:4]}; give one for "
                             "every agent of `agents`")
        given = [actions[name] for name in names]
        if layout.continuous_size and layout.discrete_branches:
            return (np.asarray([a[0] for a in given], np.float32),
                    np.asarray([a[1] for a in given], np.int32))
        if layout.discrete_branches:
            return None, np.asarray(given, np.int32).reshape(len(names), -1)
        return np.asarray(given, np.float32).reshape(len(names), -1), None

    def _results(self, before: set[str]) -> tuple[
            dict[str, Any], dict[str, float], dict[str, bool], dict[str, bool],
            dict[str, dict[str, Any]]]:
        observations: dict[str, Any] = {}
        rewards: dict[str, float] = {}
        terminated: dict[str, bool] = {}
        truncated: dict[str, bool] = {}
        infos: dict[str, dict[str, Any]] = {}
        finished: set[str] = set()
        for behavior, rows in self._rows.items():
            for row, name in enumerate(rows.names()):
                obs = (rows.obs[0][row] if len(rows.obs) == 1
                       else tuple(o[row] for o in rows.obs))
                done = bool(rows.done[row])
                observations[name] = obs
                rewards[name] = float(rows.reward[row] + rows.group_reward[row])
                terminated[name] = done and not bool(rows.interrupted[row])
                truncated[name] = done and bool(rows.interrupted[row])
                info = {"behavior": behavior, "team": team_of(behavior),
                        "group_id": int(rows.group_id[row]), "reward": float(rows.reward[row]),
                        "group_reward": float(rows.group_reward[row]), "decides": not done}
                if rows.mask is not None and not done:
                    info["action_mask"] = rows.mask[row]
                infos[name] = info
                if done:
                    finished.add(name)
                else:
                    self._last_obs[name] = obs
        for name in before - set(observations):  # live, skipping this decision
            observations[name] = self._last_obs[name]
            rewards[name], terminated[name], truncated[name] = 0.0, False, False
            infos[name] = {"behavior": behavior_of(name), "team": team_of(behavior_of(name)),
                           "decides": False}
        arrived = [name for name in observations if name not in before and name not in finished]
        self.agents = [name for name in self.agents if name not in finished] + arrived
        self.possible_agents += [name for name in arrived if name not in self.possible_agents]
        for name in finished:
            self._last_obs.pop(name, None)
        return observations, rewards, terminated, truncated, infos

    def close(self) -> None:
        self._teams.close()


__all__ = ["UnityParallelEnv", "agent_name"]
