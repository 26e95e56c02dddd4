"""`UnityEnv`: one agent of a Unity environment as a plain `gymnasium.Env`; `HuggyEnv`, its
Huggy preset."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from envs.vector_env import RENDER_FPS, HuggyVectorEnv, UnityVectorEnv


def _row(values: Any, index: int) -> Any:
    """Row `index` of a batch: of one array, or of each array of a tuple."""
    return tuple(v[index] for v in values) if isinstance(values, tuple) else values[index]


class UnityEnv(gymnasium.Env):
    """Single-agent view: slot `agent_index` of a `UnityVectorEnv`; every other agent gets zero
    actions. With the built-in stand-in the scene is made of one agent (`num_agents=1`).

    `step` returns the agent's own last observation when its episode ends (the vector env has
    already started its successor, which `reset()` then hands out without restarting Unity,
    unless a seed is given). Infos hold only the agent's `action_mask` for its next decision
    where it has discrete actions (True = allowed): Unity's agent ids change every episode, so
    they would make equal seeds give unequal infos.

    Args:
        file_name: the Unity executable; None for the built-in stand-in.
        agent_index: the slot this env shows.
        render_mode: None, or "rgb_array" for `render()`.
        **kwargs: the vector env's other arguments (`UnityVectorEnv`).

    Raises:
        ValueError: `agent_index` is not a slot of the vector env; else as `UnityVectorEnv` raises.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": RENDER_FPS}
    vector_env_class: type[UnityVectorEnv] = UnityVectorEnv

    def __init__(self, file_name: str | None = None, agent_index: int = 0,
                 render_mode: str | None = None, **kwargs: Any) -> None:
        if file_name is None:
            kwargs.setdefault("num_agents", 1)
        self.vector_env = self.vector_env_class(file_name=file_name, render_mode=render_mode,
                                                **kwargs)
        self.render_mode = render_mode
        if not 0 <= agent_index < self.vector_env.num_envs:
            self.vector_env.close()
            raise ValueError(
                f"agent_index must be in [0, {self.vector_env.num_envs}), got {agent_index}"
            )
        self.agent_index = agent_index
        self.observation_space = self.vector_env.single_observation_space
        self.action_space = self.vector_env.single_action_space
        self._successor: Any = None
        self._successor_mask: np.ndarray | None = None
        self._needs_reset = True
        self._ended = False  # the last step ended the episode: render() shows its last frame

    def _info(self, infos: dict[str, Any]) -> dict[str, Any]:
        if "action_mask" not in infos:
            return {}
        return {"action_mask": infos["action_mask"][self.agent_index].copy()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start the agent's next episode.

        Args:
            seed: reseeds the environment and resets every agent; None hands out the successor that
                the vector env started when the last episode ended, without restarting Unity.
            options: the vector env's reset options.

        Returns:
            (obs, info): the first observation, and the action mask where there are discrete actions.
        """
        super().reset(seed=seed)
        i = self.agent_index
        if seed is None and self._successor is not None:
            obs, self._successor = self._successor, None
            info = {} if self._successor_mask is None else {"action_mask": self._successor_mask}
        else:
            batch, infos = self.vector_env.reset(seed=seed, options=options)
            obs, self._successor, info = _row(batch, i), None, self._info(infos)
        self._needs_reset = self._ended = False
        return obs, info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One step of the agent (every other agent gets zero actions).

        Args:
            action: an element of `action_space`.

        Returns:
            obs: the next observation; the agent's own last one when its episode ended.
            reward: the step's reward.
            terminated: the episode reached its goal.
            truncated: the episode was interrupted at its max step.
            info: the action mask for the next decision where there are discrete actions; empty when
                the episode ended.

        Raises:
            RuntimeError: no `reset()` since the env was made or the last episode ended.
            ValueError: `action` is not in `action_space`.
        """
        if self._needs_reset:
            raise RuntimeError("call reset() before step(), and again after an episode ends")
        if not self.action_space.contains(_as_space(action, self.action_space)):
            raise ValueError(f"expected an action in {self.action_space}, got {action!r}")
        venv, i = self.vector_env, self.agent_index
        actions = _zero_actions(venv.action_space)
        _set_row(actions, i, _as_space(action, self.action_space))
        obs, rewards, terminated, truncated, infos = venv.step(actions)
        info = self._info(infos)
        if terminated[i] or truncated[i]:
            self._successor, obs = _row(obs, i), infos["final_obs"][i]
            self._successor_mask = info.get("action_mask")
            info = {}
            self._needs_reset = self._ended = True
        else:
            obs = _row(obs, i)
        return obs, float(rewards[i]), bool(terminated[i]), bool(truncated[i]), info

    def render(self) -> np.ndarray | None:
        """The agent's frame (the vector env's `render_frame`): after a step that ended its episode, the
        episode's last frame; after `reset()`, the new episode's first.

        Returns:
            (H, W, 3) uint8; None, with a warning, without a render mode.
        """
        if self.render_mode is None:
            gymnasium.logger.warn("render() called on an environment made without render_mode; "
                                  "pass render_mode='rgb_array'")
            return None
        return self.vector_env.render_frame(self.agent_index, final=self._ended)

    def close(self) -> None:
        self.vector_env.close()


class HuggyEnv(UnityEnv):
    """The Huggy preset of `UnityEnv` (over a `HuggyVectorEnv`); passes `check_env`."""

    vector_env_class = HuggyVectorEnv


def _as_space(action: Any, space: gymnasium.Space) -> Any:
    """`action` converted to the dtypes of `space` (a Box, a MultiDiscrete or a Tuple)."""
    if isinstance(space, gymnasium.spaces.Tuple):
        if not isinstance(action, tuple) or len(action) != len(space.spaces):
            return action
        return tuple(_as_space(a, s) for a, s in zip(action, space.spaces, strict=True))
    try:
        return np.asarray(action, dtype=space.dtype)
    except (TypeError, ValueError):
        return action


def _zero_actions(space: gymnasium.Space) -> Any:
    if isinstance(space, gymnasium.spaces.Tuple):
        return tuple(np.zeros(s.shape, s.dtype) for s in space.spaces)
    return np.zeros(space.shape, space.dtype)


def _set_row(actions: Any, index: int, action: Any) -> None:
    if isinstance(actions, tuple):
        for target, value in zip(actions, action, strict=True):
            target[index] = value
    else:
        actions[index] = action
