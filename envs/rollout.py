"""`rollout()`: drive every agent of a vector env with one batched `compute_action` per step."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class Agent(Protocol):
    """Anything with HuggyAgent's `compute_action` (a local agent, or a remote one over HTTP)."""

    def compute_action(self, obs: np.ndarray, deterministic: bool = True,
                       seed: int | None = None, row_offset: int = 0) -> np.ndarray: ...


@dataclass(frozen=True)
class EpisodeResult:
    """One finished episode: its return, its length in decisions, whether it reached the stick."""

    episode_return: float
    length: int
    reached_stick: bool


@dataclass
class RolloutResult:
    """Finished episodes in the order they ended, agent-steps taken and wall time."""

    episodes: list[EpisodeResult] = field(default_factory=list)
    agent_steps: int = 0
    seconds: float = 0.0

    @property
    def agent_steps_per_second(self) -> float:
        return self.agent_steps / self.seconds if self.seconds > 0 else 0.0


class RolloutInterrupted(RuntimeError):
    """The environment died mid-rollout; `.result` holds the episodes finished before."""

    def __init__(self, message: str, result: RolloutResult) -> None:
        super().__init__(message)
        self.result = result


STEP_SEED_MULTIPLIER = 1_000_003  # seed of step t in stochastic mode: seed * M + t (mod 2**63)


def step_seed(seed: int, step: int) -> int:
    """The `compute_action` seed of decision `step` in a stochastic rollout seeded with `seed`."""
    return (seed * STEP_SEED_MULTIPLIER + step) % 2**63


def rollout(
    agent: Agent,
    env: Any,
    episodes: int = 18,
    deterministic: bool = True,
    seed: int | None = None,
    progress: Callable[[EpisodeResult], None] | None = None,
) -> RolloutResult:
    """Run `env` (a `HuggyVectorEnv`) until `episodes` episodes have finished.

    Every step calls `agent.compute_action(obs)` once for all agents. With `seed`, the env is
    reset with it, and in stochastic mode decision t uses `compute_action(..., seed=step_seed(
    seed, t))`, so a local and a remote agent give identical results. Episodes in progress when
    the count is reached are not counted. `progress` is called with each finished episode.

    Raises:
        RolloutInterrupted: the Unity process died or stopped answering; `.result` holds the
            episodes finished so far.
        ValueError: `episodes` < 1.
    """
    from mlagents_envs.exception import UnityException

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    result = RolloutResult()
    start = time.perf_counter()
    try:
        obs, _ = env.reset(seed=seed)
        n = env.num_envs
        returns = np.zeros(n, dtype=np.float64)
        lengths = np.zeros(n, dtype=np.int64)
        step = 0
        while len(result.episodes) < episodes:
            if deterministic:
                actions = agent.compute_action(obs, deterministic=True)
            else:
                noise_seed = None if seed is None else step_seed(seed, step)
                actions = agent.compute_action(obs, deterministic=False, seed=noise_seed)
            obs, rewards, terminated, truncated, _ = env.step(actions)
            step += 1
            result.agent_steps += n
            returns += rewards
            lengths += 1
            for slot in np.flatnonzero(terminated | truncated):
                episode = EpisodeResult(float(returns[slot]), int(lengths[slot]),
                                        bool(terminated[slot]))
                returns[slot] = 0.0
                lengths[slot] = 0
                if len(result.episodes) < episodes:
                    result.episodes.append(episode)
                    if progress is not None:
                        progress(episode)
    except UnityException as error:
        result.seconds = time.perf_counter() - start
        raise RolloutInterrupted(
            f"the environment stopped after {len(result.episodes)} of {episodes} episodes: "
            f"{error}", result,
        ) from error
    result.seconds = time.perf_counter() - start
    return result
