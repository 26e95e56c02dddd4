"""`rollout()`: drive every agent of a vector env with one batched `compute_action` per step.

Episode statistics are unbiased by construction. With many agents stepping together the short
episodes end first, so "the first N episodes to finish" over-counts them. Instead every slot
gets a quota fixed before the rollout starts (`slot_quotas`): slot s counts its first q_s
episodes, q_s = N // S + (1 if s < N % S else 0) (the first N mod S slots get one more), every
episode a slot starts toward its quota is finished and counted, slots past their quota keep
stepping uncounted, and episodes are reported in (slot, episode index) order, never in the
order they ended. This is Stable-Baselines3's `evaluate_policy` scheme.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

ESTIMATOR = "per-slot quota"
ESTIMATOR_DESCRIPTION = (
    "every agent slot s counts its first q_s episodes from the reset, q_s = N // S + "
    "(1 if s < N mod S else 0) for N episodes over S slots; episodes are ordered by (slot, "
    "episode index), never by when they ended")


class Agent(Protocol):
    """Anything with HuggyAgent's `compute_action` (a local agent, or a remote one over HTTP)."""

    def compute_action(self, obs: np.ndarray, deterministic: bool = True,
                       seed: int | None = None, row_offset: int = 0) -> np.ndarray: ...


@dataclass(frozen=True)
class EpisodeResult:
    """One counted episode: its return, its length in decisions, whether it reached the goal
    (terminated rather than truncated), its slot and its index among that slot's episodes."""

    episode_return: float
    length: int
    reached_stick: bool
    slot: int = 0
    index: int = 0


@dataclass
class RolloutResult:
    """Counted episodes in (slot, index) order, agent-steps taken and wall time."""

    episodes: list[EpisodeResult] = field(default_factory=list)
    agent_steps: int = 0
    seconds: float = 0.0

    @property
    def agent_steps_per_second(self) -> float:
        return self.agent_steps / self.seconds if self.seconds > 0 else 0.0


class RolloutInterrupted(RuntimeError):
    """The environment died mid-rollout; `.result` holds the episodes counted before, which
    no longer fill every quota (and so are not an unbiased sample)."""

    def __init__(self, message: str, result: RolloutResult) -> None:
        super().__init__(message)
        self.result = result


STEP_SEED_MULTIPLIER = 1_000_003  # seed of step t in stochastic mode: seed * M + t (mod 2**63)


def step_seed(seed: int, step: int) -> int:
    """The `compute_action` seed of decision `step` in a stochastic rollout seeded with `seed`."""
    return (seed * STEP_SEED_MULTIPLIER + step) % 2**63


def slot_quotas(episodes: int, slots: int) -> np.ndarray:
    """Episodes each of `slots` slots contributes to `episodes` in all: `episodes // slots`,
    plus one for the first `episodes % slots` slots. (slots,) int64, summing to `episodes`."""
    if episodes < 0 or slots < 1:
        raise ValueError(f"need episodes >= 0 and slots >= 1, got {episodes} and {slots}")
    quotas = np.full(slots, episodes // slots, dtype=np.int64)
    quotas[: episodes % slots] += 1
    return quotas


def rollout(
    agent: Agent,
    env: Any,
    episodes: int = 18,
    deterministic: bool = True,
    seed: int | None = None,
    progress: Callable[[EpisodeResult], None] | None = None,
) -> RolloutResult:
    """Run `env` (a `HuggyVectorEnv`) until every slot has finished its quota of episodes.

    Every step calls `agent.compute_action(obs)` once for all agents. Slot quotas follow
    `slot_quotas(episodes, env.num_envs)`; see the module docstring for why. With `seed`, the
    env is reset with it, and in stochastic mode decision t uses `compute_action(...,
    seed=step_seed(seed, t))`, so a local and a remote agent give identical results.
    `progress` is called with each counted episode as it ends (in the order they end).

    Raises:
        RolloutInterrupted: the Unity process died or stopped answering; `.result` holds the
            episodes counted so far.
        ValueError: `episodes` < 1.
    """
    from mlagents_envs.exception import UnityException

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    result = RolloutResult()
    counted: list[EpisodeResult] = []
    start = time.perf_counter()
    try:
        obs, _ = env.reset(seed=seed)
        n = env.num_envs
        quotas = slot_quotas(episodes, n)
        finished = np.zeros(n, dtype=np.int64)  # episodes each slot has ended so far
        returns = np.zeros(n, dtype=np.float64)
        lengths = np.zeros(n, dtype=np.int64)
        step = 0
        while len(counted) < episodes:
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
                if finished[slot] < quotas[slot]:
                    episode = EpisodeResult(float(returns[slot]), int(lengths[slot]),
                                            bool(terminated[slot]), int(slot),
                                            int(finished[slot]))
                    counted.append(episode)
                    if progress is not None:
                        progress(episode)
                finished[slot] += 1
                returns[slot] = 0.0
                lengths[slot] = 0
    except UnityException as error:
        result.episodes = sorted(counted, key=lambda e: (e.slot, e.index))
        result.seconds = time.perf_counter() - start
        raise RolloutInterrupted(
            f"the environment stopped after {len(counted)} of {episodes} episodes: "
            f"{error}", result,
        ) from error
    result.episodes = sorted(counted, key=lambda e: (e.slot, e.index))
    result.seconds = time.perf_counter() - start
    return result
