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

Recording (videos, `.demo` files, Minari datasets) is done by recorders that the loop feeds
beside the statistics (`envs.recording.base`); they change nothing that is counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from envs.recording.base import Recorder, RecordingContext, StepRecord
from envs.results import EpisodeResult, RolloutInterrupted, RolloutResult

ESTIMATOR = "per-slot quota"
ESTIMATOR_DESCRIPTION = (
    "every agent slot s counts its first q_s episodes from the reset, q_s = N // S + "
    "(1 if s < N mod S else 0) for N episodes over S slots; episodes are ordered by (slot, "
    "episode index), never by when they ended")


def terminated_label(behaviors: Sequence[str | None]) -> str:
    """How reports name terminated episodes.

    Args:
        behaviors: ML-Agents behavior names such as `Huggy?team=0` (None for an unknown one).

    Returns:
        "reached stick" when every one is Huggy, whose episodes terminate at the stick, else
            "terminated".
    """
    huggy = bool(behaviors) and all(
        behavior is not None and behavior.split("?")[0] == "Huggy" for behavior in behaviors)
    return "reached stick" if huggy else "terminated"


class Agent(Protocol):
    """Anything with HuggyAgent's `compute_action` (a local agent, or a remote one over HTTP).
    `action_mask` and `memory` are passed only to policies with discrete actions (when the env
    reports masks) and with memory (an agent whose `spec.memory_size` > 0)."""

    def compute_action(self, obs: Any, deterministic: bool = True, seed: int | None = None,
                       row_offset: int = 0, **masks_and_memory: Any) -> Any:
        """Actions for a batch of observations, as `HuggyAgent.compute_action` gives them.

        Args:
            obs: the observations.
            deterministic: the mean action or a draw.
            seed: the noise stream of a stochastic call.
            row_offset: the stream's row of the first observation.
            **masks_and_memory: `action_mask` and `memory`, where the policy takes them.

        Returns:
            The actions; for a recurrent policy (actions, next memory).
        """
        ...


STEP_SEED_MULTIPLIER = 1_000_003  # seed of step t in stochastic mode: seed * M + t (mod 2**63)


def step_seed(seed: int, step: int) -> int:
    """The `compute_action` seed of one decision in a stochastic rollout.

    Args:
        seed: the rollout's seed.
        step: the decision's index.

    Returns:
        `(seed * STEP_SEED_MULTIPLIER + step) mod 2**63`.
    """
    return (seed * STEP_SEED_MULTIPLIER + step) % 2**63


def slot_quotas(episodes: int, slots: int) -> np.ndarray:
    """The episodes each slot contributes to a count.

    Args:
        episodes: the episodes in all, >= 0.
        slots: the slots, >= 1.

    Returns:
        (slots,) int64 summing to `episodes`: `episodes // slots`, plus one for the first
            `episodes % slots` slots.

    Raises:
        ValueError: `episodes` < 0 or `slots` < 1.
    """
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


class _Feed:
    """The recorders of one group of slots (`part` of the env's rows) and their quotas."""

    def __init__(self, recorders: Sequence[Recorder], env: Any, part: slice, tally: _SlotTally,
                 seed: int | None, obs: Any, infos: dict[str, Any]) -> None:
        self.recorders, self.part, self.tally = list(recorders), part, tally
        context = RecordingContext(env, part, tally.quotas, seed)
        rows = _rows(obs, part)
        infos = {key: _rows(value, part) for key, value in infos.items()
                 if isinstance(value, (np.ndarray, tuple))}
        for recorder in self.recorders:
            recorder.start(context, rows, infos)

    def step(self, record: StepRecord) -> None:
        """Hand every recorder this group's rows of `record` (before the tally counts it)."""
        if self.recorders and not self.tally.done:
            rows = record.rows(self.part)
            for recorder in self.recorders:
                recorder.step(rows)

    def end(self, result: RolloutResult | None) -> None:
        for recorder in self.recorders:
            recorder.end(result)


def _rows(value: Any, part: slice) -> Any:
    return tuple(v[part] for v in value) if isinstance(value, tuple) else value[part]


def _step_record(obs: Any, infos: dict[str, Any], actions: Any, step: tuple,
                 tallies: Sequence[_SlotTally]) -> StepRecord:
    """The whole env's `StepRecord` of one step (`step`: what `env.step` returned), with each
    slot's episode index from the tallies of its group (concatenated in slot order)."""
    next_obs, rewards, terminated, truncated, next_infos = step
    return StepRecord(obs, actions, infos.get("action_mask"), rewards, terminated, truncated,
                      next_obs, next_infos.get("final_obs"),
                      np.concatenate([tally.finished for tally in tallies]))


class _Acting:
    """The agent's side of a rollout: one `compute_action` per call, with the slots' action masks
    (from the env's infos) and, for a recurrent policy, each slot's memory, kept here and zeroed
    when the slot's episode ends (its successor starts with a fresh memory)."""

    def __init__(self, agent: Agent, slots: int, deterministic: bool, seed: int | None) -> None:
        self.agent = agent
        self.deterministic = deterministic
        self.seed = seed
        memory = getattr(getattr(agent, "spec", None), "memory_size", 0)
        self.memory = np.zeros((slots, memory), np.float32) if memory else None

    def act(self, obs: Any, infos: dict[str, Any], step: int, part: slice = slice(None),
            seed: int | None = None) -> Any:
        """Actions for the slots `part` (their rows of `obs`, copied: a fresh array, as a
        one-instance rollout passes, since matrix kernels may take another path on input that
        is a view into the middle of another). `seed` overrides the rollout's."""
        seed = self.seed if seed is None else seed
        rows = tuple(o[part].copy() for o in obs) if isinstance(obs, tuple) else obs[part].copy()
        kwargs: dict[str, Any] = {}
        if "action_mask" in infos:
            kwargs["action_mask"] = infos["action_mask"][part]
        if self.memory is not None:
            kwargs["memory"] = self.memory[part]
        if self.deterministic:
            result = self.agent.compute_action(rows, deterministic=True, **kwargs)
        else:
            result = self.agent.compute_action(
                rows, deterministic=False, seed=None if seed is None else step_seed(seed, step),
                **kwargs)
        if self.memory is not None:
            result, self.memory[part] = result
        return result

    def ended(self, terminated: np.ndarray, truncated: np.ndarray) -> None:
        """Forget the memory of slots whose episode just ended."""
        if self.memory is not None:
            self.memory[terminated | truncated] = 0.0


def _zero_actions(space: Any) -> Any:
    """Zero actions of a batched action space: one array, or a tuple of them (hybrid)."""
    if hasattr(space, "spaces"):
        return tuple(np.zeros(s.shape, s.dtype) for s in space.spaces)
    return np.zeros(space.shape, space.dtype)


def _set_rows(actions: Any, part: slice, values: Any) -> None:
    """Write `values` (an array, a tuple of arrays, or 0) into rows `part` of `actions`."""
    if isinstance(actions, tuple):
        for target, value in zip(actions, values if isinstance(values, tuple)
                                 else (values,) * len(actions), strict=True):
            target[part] = value
    else:
        actions[part] = values


def rollout(
    agent: Agent,
    env: Any,
    episodes: int = 18,
    deterministic: bool = True,
    seed: int | None = None,
    progress: Callable[[EpisodeResult], None] | None = None,
    recorders: Sequence[Recorder] = (),
) -> RolloutResult:
    """Run a vector env until every slot has finished its quota of episodes.

    Every step calls `agent.compute_action(obs)` once for all agents (of every instance), with
    their action masks where the env reports them, and their memories for a recurrent policy
    (zeros when an episode starts). Slot quotas follow `slot_quotas(episodes, env.num_envs)`; the
    module docstring says why.

    Args:
        agent: the policy (local or remote).
        env: a `UnityVectorEnv`.
        episodes: the episodes to count, >= 1.
        deterministic: the policy's mean actions, or draws.
        seed: resets the env with it; in stochastic mode decision t then uses
            `compute_action(..., seed=step_seed(seed, t))`, so a local and a remote agent give
            identical results.
        progress: called with each counted episode as it ends (in the order they end).
        recorders: see every step of every slot (`envs.recording.base`) until the last counted
            episode ends, then the result (None if interrupted).

    Returns:
        The counted episodes in (slot, index) order, the agent-steps and the wall time.

    Raises:
        RolloutInterrupted: the Unity process died or stopped answering; `.result` holds the
            episodes counted so far.
        ValueError: `episodes` < 1.
    """
    from mlagents_envs.exception import UnityException

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    tally = _SlotTally(episodes, 1)
    feed: _Feed | None = None
    start = time.perf_counter()
    try:
        obs, infos = env.reset(seed=seed)
        tally = _SlotTally(episodes, env.num_envs)
        if recorders:
            feed = _Feed(recorders, env, slice(0, env.num_envs), tally, seed, obs, infos)
        acting = _Acting(agent, env.num_envs, deterministic, seed)
        step = 0
        while not tally.done:
            actions = acting.act(obs, infos, step)
            outcome = env.step(actions)
            if feed is not None:
                feed.step(_step_record(obs, infos, actions, outcome, [tally]))
            obs, rewards, terminated, truncated, infos = outcome
            step += 1
            acting.ended(terminated, truncated)
            tally.record(rewards, terminated, truncated, progress)
    except BaseException as error:
        if feed is not None:
            feed.end(None)
        if not isinstance(error, UnityException):
            raise
        result = tally.result(time.perf_counter() - start)
        raise RolloutInterrupted(
            f"the environment stopped after {len(tally.counted)} of {episodes} episodes: "
            f"{error}", result,
        ) from error
    result = tally.result(time.perf_counter() - start)
    if feed is not None:
        feed.end(result)
    return result


def rollout_per_instance(
    agent: Agent,
    env: Any,
    episodes: Sequence[int],
    seeds: Sequence[int],
    deterministic: bool = True,
    recorders: Sequence[Sequence[Recorder]] = (),
) -> list[RolloutResult]:
    """One independent rollout per instance of a multi-instance env, stepped together: what
    `rollout(agent, <one instance>, episodes[j], deterministic, seeds[j])` gives, for every
    instance j at once.

    Instance j is reset with `seeds[j]` (`reset(options={"seeds": seeds})`) and counts
    `episodes[j]` episodes with per-slot quotas over its own slots, numbered from 0 within the
    instance. Every step calls the policy once per instance that has not filled its quotas, with
    that instance's rows only and, in stochastic mode, `step_seed(seeds[j], t)`: the batch and the
    seeds a one-instance rollout would use, so no float can differ with K. An instance that is done
    (or has `episodes[j] == 0`) gets zero actions, which cannot affect the others, until every
    instance is done.

    Args:
        agent: the policy (local or remote).
        env: a `UnityVectorEnv` of K instances.
        episodes: the episodes each instance counts, each >= 0.
        seeds: each instance's seed.
        deterministic: the policy's mean actions, or draws.
        recorders: empty, or one list per instance: `recorders[j]` see instance j's slots,
            numbered from 0, until its quotas are filled (`envs.recording.base`), then its result.

    Returns:
        One result per instance; `agent_steps` counts instance j's agent-steps until its quotas
            were filled (as `rollout` would), `seconds` is its share of the shared wall time in
            proportion to those agent-steps (the shares add up to the wall time).

    Raises:
        RolloutInterrupted: an instance died or stopped answering (the whole environment is then
            closed); `.result` holds every instance's counted episodes, slots numbered across
            instances.
        ValueError: `episodes`, `seeds` or `recorders` do not give one entry per instance, or a
            count is negative.
    """
    from mlagents_envs.exception import UnityException

    slices = env.instance_slices
    if len(episodes) != len(slices) or len(seeds) != len(slices):
        raise ValueError(f"need one episode count and one seed per instance ({len(slices)}), "
                         f"got {len(episodes)} and {len(seeds)}")
    if any(count < 0 for count in episodes):
        raise ValueError(f"episode counts must be >= 0, got {list(episodes)}")
    if recorders and len(recorders) != len(slices):
        raise ValueError(f"need one list of recorders per instance ({len(slices)}), got "
                         f"{len(recorders)}")
    tallies = [_SlotTally(count, part.stop - part.start)
               for count, part in zip(episodes, slices, strict=True)]
    feeds: dict[int, _Feed] = {}
    start = time.perf_counter()
    try:
        obs, infos = env.reset(options={"seeds": list(seeds)})
        feeds = {j: _Feed(group, env, slices[j], tallies[j], seeds[j], obs, infos)
                 for j, group in enumerate(recorders) if group}
        actions = _zero_actions(env.action_space)
        acting = _Acting(agent, env.num_envs, deterministic, None)
        step = 0
        while not all(tally.done for tally in tallies):
            for tally, part, seed in zip(tallies, slices, seeds, strict=True):
                _set_rows(actions, part, 0 if tally.done else
                          acting.act(obs, infos, step, part, seed))
            outcome = env.step(actions)
            if feeds:
                record = _step_record(obs, infos, actions, outcome, tallies)
                for feed in feeds.values():
                    feed.step(record)
            obs, rewards, terminated, truncated, infos = outcome
            step += 1
            acting.ended(terminated, truncated)
            for tally, part in zip(tallies, slices, strict=True):
                if not tally.done:
                    tally.record(rewards[part], terminated[part], truncated[part], None)
    except BaseException as error:
        for feed in feeds.values():
            feed.end(None)
        if not isinstance(error, UnityException):
            raise
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
    results = [tally.result(seconds * tally.agent_steps / steps if steps else 0.0)
               for tally in tallies]
    for j, feed in feeds.items():
        feed.end(results[j])
    return results
