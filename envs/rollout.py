"""`rollout()`: drive every agent of a vector env with one batched `compute_action` per step;
`rollout_per_instance()`: one independent rollout per instance of a multi-instance env.

Episode statistics are unbiased by construction. With many agents stepping together the short
episodes end first, so "the first N episodes to finish" over-counts them. Instead every slot
gets a quota fixed before the rollout starts (`slot_quotas`): slot s counts its first q_s
episodes, q_s = N // S + (1 if s < N % S else 0) (the first N mod S slots get one more), every
episode a slot starts toward its quota is finished and counted, slots past their quota keep
stepping uncounted, and episodes are reported in (slot, episode index) order, never in the
order they ended. This is Stable-Baselines3's `evaluate_policy` scheme. `rollout()` counts
the slots of every instance as one group; `rollout_per_instance()` gives each instance its own
N and its own quotas over its own slots.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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


class _SlotTally:
    """Per-slot quota counting over one group of slots (module docstring): running returns and
    lengths, episodes finished per slot, and the counted episodes (slots numbered from 0)."""

    def __init__(self, episodes: int, slots: int) -> None:
        self.quotas = slot_quotas(episodes, slots)
        self.episodes = episodes
        self.finished = np.zeros(slots, dtype=np.int64)  # episodes each slot has ended so far
        self.returns = np.zeros(slots, dtype=np.float64)
        self.lengths = np.zeros(slots, dtype=np.int64)
        self.counted: list[EpisodeResult] = []
        self.agent_steps = 0

    @property
    def done(self) -> bool:
        return len(self.counted) >= self.episodes

    def record(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
               progress: Callable[[EpisodeResult], None] | None) -> None:
        """Add one step of this group's slots."""
        self.agent_steps += len(rewards)
        self.returns += rewards
        self.lengths += 1
        for slot in np.flatnonzero(terminated | truncated):
            if self.finished[slot] < self.quotas[slot]:
                episode = EpisodeResult(float(self.returns[slot]), int(self.lengths[slot]),
                                        bool(terminated[slot]), int(slot),
                                        int(self.finished[slot]))
                self.counted.append(episode)
                if progress is not None:
                    progress(episode)
            self.finished[slot] += 1
            self.returns[slot] = 0.0
            self.lengths[slot] = 0

    def result(self, seconds: float) -> RolloutResult:
        return RolloutResult(sorted(self.counted, key=lambda e: (e.slot, e.index)),
                             self.agent_steps, seconds)


def _actions(agent: Agent, obs: np.ndarray, deterministic: bool, seed: int | None,
             step: int) -> np.ndarray:
    if deterministic:
        return agent.compute_action(obs, deterministic=True)
    noise_seed = None if seed is None else step_seed(seed, step)
    return agent.compute_action(obs, deterministic=False, seed=noise_seed)


def rollout(
    agent: Agent,
    env: Any,
    episodes: int = 18,
    deterministic: bool = True,
    seed: int | None = None,
    progress: Callable[[EpisodeResult], None] | None = None,
) -> RolloutResult:
    """Run `env` (a `HuggyVectorEnv`) until every slot has finished its quota of episodes.

    Every step calls `agent.compute_action(obs)` once for all agents (of every instance).
    Slot quotas follow `slot_quotas(episodes, env.num_envs)`; see the module docstring for why.
    With `seed`, the env is reset with it, and in stochastic mode decision t uses
    `compute_action(..., seed=step_seed(seed, t))`, so a local and a remote agent give identical
    results. `progress` is called with each counted episode as it ends (in the order they end).

    Raises:
        RolloutInterrupted: the Unity process died or stopped answering; `.result` holds the
            episodes counted so far.
        ValueError: `episodes` < 1.
    """
    from mlagents_envs.exception import UnityException

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    tally = _SlotTally(episodes, 1)
    start = time.perf_counter()
    try:
        obs, _ = env.reset(seed=seed)
        tally = _SlotTally(episodes, env.num_envs)
        step = 0
        while not tally.done:
            obs, rewards, terminated, truncated, _ = env.step(
                _actions(agent, obs, deterministic, seed, step))
            step += 1
            tally.record(rewards, terminated, truncated, progress)
    except UnityException as error:
        result = tally.result(time.perf_counter() - start)
        raise RolloutInterrupted(
            f"the environment stopped after {len(tally.counted)} of {episodes} episodes: "
            f"{error}", result,
        ) from error
    return tally.result(time.perf_counter() - start)


def rollout_per_instance(
    agent: Agent,
    env: Any,
    episodes: Sequence[int],
    seeds: Sequence[int],
    deterministic: bool = True,
) -> list[RolloutResult]:
    """One independent rollout per instance of `env` (a `HuggyVectorEnv` of K instances),
    stepped together: what `rollout(agent, <one instance>, episodes[j], deterministic,
    seeds[j])` gives, for every instance j at once.

    Instance j is reset with `seeds[j]` (`reset(options={"seeds": seeds})`) and counts
    `episodes[j]` episodes with per-slot quotas over its own slots, numbered from 0 within the
    instance (`slot_quotas(episodes[j], slots of j)`). Every step calls the policy once per
    instance that has not filled its quotas, with that instance's rows only and, in stochastic
    mode, `step_seed(seeds[j], t)`: the batch and the seeds a one-instance rollout would use, so
    no float can differ with K. An instance that is done (or has `episodes[j] == 0`) gets zero
    actions, which cannot affect the others, until every instance is done.

    Returns one `RolloutResult` per instance; `agent_steps` counts instance j's agent-steps
    until its quotas were filled (as `rollout` would), `seconds` is its share of the shared wall
    time in proportion to those agent-steps (the shares add up to the wall time).

    Raises:
        RolloutInterrupted: an instance died or stopped answering (the whole environment is
            then closed); `.result` holds every instance's counted episodes, slots numbered
            across instances.
        ValueError: `episodes` or `seeds` do not give one non-negative count per instance.
    """
    from mlagents_envs.exception import UnityException

    slices = env.instance_slices
    if len(episodes) != len(slices) or len(seeds) != len(slices):
        raise ValueError(f"need one episode count and one seed per instance ({len(slices)}), "
                         f"got {len(episodes)} and {len(seeds)}")
    if any(count < 0 for count in episodes):
        raise ValueError(f"episode counts must be >= 0, got {list(episodes)}")
    tallies = [_SlotTally(count, part.stop - part.start)
               for count, part in zip(episodes, slices, strict=True)]
    start = time.perf_counter()
    try:
        obs, _ = env.reset(options={"seeds": list(seeds)})
        actions = np.zeros(env.action_space.shape, dtype=np.float32)
        step = 0
        while not all(tally.done for tally in tallies):
            for tally, part, seed in zip(tallies, slices, seeds, strict=True):
                # A fresh array of its own, as a one-instance rollout passes (no view into the
                # middle of `obs`: matrix kernels may take another path on unaligned input).
                actions[part] = (0.0 if tally.done else
                                 _actions(agent, obs[part].copy(), deterministic, seed, step))
            obs, rewards, terminated, truncated, _ = env.step(actions)
            step += 1
            for tally, part in zip(tallies, slices, strict=True):
                if not tally.done:
                    tally.record(rewards[part], terminated[part], truncated[part], None)
    except UnityException as error:
        counted = sum(len(tally.counted) for tally in tallies)
        offsets = [part.start for part in slices]
        merged = RolloutResult(
            [replace(e, slot=e.slot + offset) for tally, offset in zip(tallies, offsets, strict=True)
             for e in tally.result(0.0).episodes],
            sum(tally.agent_steps for tally in tallies), time.perf_counter() - start)
        raise RolloutInterrupted(
            f"the environment stopped after {counted} of {sum(episodes)} episodes: {error}",
            merged) from error
    seconds = time.perf_counter() - start
    steps = sum(tally.agent_steps for tally in tallies)
    return [tally.result(seconds * tally.agent_steps / steps if steps else 0.0)
            for tally in tallies]
