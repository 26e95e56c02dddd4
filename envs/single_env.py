"""`HuggyEnv`: one agent of a Huggy environment as a plain `gymnasium.Env`."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from envs.vector_env import HuggyVectorEnv


class HuggyEnv(gymnasium.Env):
    """Single-agent view: slot `agent_index` of a `HuggyVectorEnv`; every other agent gets zero
    actions. With the built-in stand-in the scene is made of one agent (`num_agents=1`).

    `step` returns the agent's own last observation when its episode ends (the vector env has
    already started its successor, which `reset()` then hands out without restarting Unity,
    unless a seed is given). Infos are empty: Unity's agent ids change every episode, so they
    would make equal seeds give unequal infos. Keyword arguments go to `HuggyVectorEnv`.
    """

    metadata = {"render_modes": []}

    def __init__(self, file_name: str | None = None, agent_index: int = 0, **kwargs: Any) -> None:
        if file_name is None:
            kwargs.setdefault("num_agents", 1)
        self.vector_env = HuggyVectorEnv(file_name=file_name, **kwargs)
        if not 0 <= agent_index < self.vector_env.num_envs:
            self.vector_env.close()
            raise ValueError(
                f"agent_index must be in [0, {self.vector_env.num_envs}), got {agent_index}"
            )
        self.agent_index = agent_index
        self.observation_space = self.vector_env.single_observation_space
        self.action_space = self.vector_env.single_action_space
        self._successor: np.ndarray | None = None
        self._needs_reset = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        i = self.agent_index
        if seed is None and self._successor is not None:
            obs, self._successor = self._successor, None
        else:
            batch, _ = self.vector_env.reset(seed=seed, options=options)
            obs, self._successor = batch[i], None
        self._needs_reset = False
        return obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step(), and again after an episode ends")
        action = np.asarray(action, dtype=np.float32)
        if action.shape != self.action_space.shape:
            raise ValueError(f"expected an action of shape {self.action_space.shape}, "
                             f"got {action.shape}")
        venv, i = self.vector_env, self.agent_index
        actions = np.zeros((venv.num_envs, *action.shape), dtype=np.float32)
        actions[i] = action
        obs, rewards, terminated, truncated, infos = venv.step(actions)
        if terminated[i] or truncated[i]:
            self._successor, obs = obs[i], infos["final_obs"][i]
            self._needs_reset = True
        else:
            obs = obs[i]
        return obs, float(rewards[i]), bool(terminated[i]), bool(truncated[i]), {}

    def close(self) -> None:
        self.vector_env.close()
