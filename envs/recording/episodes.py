"""`EpisodeCollector`: a recorder that keeps every counted episode of its slots whole, as
`RecordedEpisode`s (plain numpy: they pickle, so runners can send them to a head that writes
them once, as `.demo` files or a Minari dataset)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envs.instance import SlotLayout
from envs.recording.base import RecordingContext, StepRecord, observation_rows


@dataclass(frozen=True)
class Behavior:
    """What the writers need to know of the behavior: its name (without `?team=`) and its
    slot layout (observation shapes, continuous size, discrete branches). Plain data."""

    name: str
    layout: SlotLayout

    @classmethod
    def of(cls, env: Any) -> Behavior:
        """The behavior of a vector env.

        Args:
            env: a `UnityVectorEnv`.

        Returns:
            Its name without `?team=`, and its slot layout.
        """
        return cls(str(env.behavior_name).split("?")[0], env.layout)


@dataclass(frozen=True)
class RecordedEpisode:
    """One counted episode of `length` T decisions of agent slot `slot` (its `index`-th
    episode since the reset with `seed`).

    Attributes:
        observations: per input, (T + 1, *shape) float32: what the agent saw at each decision,
            then its last observation (where the episode ended).
        continuous: (T, c) float32 actions taken (c = 0 without continuous actions).
        discrete: (T, branches) int32 actions taken (no columns without discrete actions).
        action_masks: (T, sum of branches) bool, True = allowed, at each decision (no columns
            without discrete actions).
        rewards: (T,) float32: the reward of each step (of the decision before it).
        terminated: the environment ended it (Huggy: at the stick); else it was truncated.
    """

    slot: int
    index: int
    seed: int | None
    observations: tuple[np.ndarray, ...]
    continuous: np.ndarray
    discrete: np.ndarray
    action_masks: np.ndarray
    rewards: np.ndarray
    terminated: bool

    @property
    def length(self) -> int:
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        """The sum of the rewards in float64, in step order (as the rollout counts it)."""
        total = 0.0
        for reward in self.rewards.tolist():
            total += reward
        return total


@dataclass
class _Running:
    """One slot's episode being collected: lists of rows, stacked when it ends."""

    index: int
    observations: list[list[np.ndarray]]
    continuous: list[np.ndarray] = field(default_factory=list)
    discrete: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


class EpisodeCollector:
    """Keeps the counted episodes of its slots (`envs.recording.base`: each slot's quota),
    whole; `episodes` lists them in (slot, index) order once the rollout has ended.

    Args:
        slots: the record slots to keep; None keeps all.
    """

    def __init__(self, slots: set[int] | None = None) -> None:
        self.wanted = slots
        self.episodes: list[RecordedEpisode] = []
        self.behavior: Behavior | None = None
        self._running: dict[int, _Running] = {}
        self._seed: int | None = None
        self._quotas = np.zeros(0, np.int64)

    def start(self, context: RecordingContext, obs: Any, infos: dict[str, Any]) -> None:
        """See `Recorder.start`: starts an episode in every wanted slot whose quota is not 0.

        Args:
            context: where the slots are, their quotas and the reset's seed.
            obs: the first observations.
            infos: the reset's infos.
        """
        self.behavior = Behavior.of(context.env)
        self._seed = context.seed
        self._quotas = context.quotas
        self.episodes, self._running = [], {}
        rows = observation_rows(obs)
        for slot, quota in enumerate(context.quotas.tolist()):
            if quota > 0 and (self.wanted is None or slot in self.wanted):
                self._running[slot] = _Running(0, [[o[slot].copy()] for o in rows])

    def step(self, record: StepRecord) -> None:
        """See `Recorder.step`: adds the step to each running episode, and finishes those that ended.

        Args:
            record: the step of the recorder's slots.
        """
        assert self.behavior is not None, "start() first"
        continuous, discrete = self.behavior.layout.split_actions(record.actions)
        next_rows = observation_rows(record.next_obs)
        ended = record.terminated | record.truncated
        for slot in list(self._running):
            running = self._running[slot]
            if continuous is not None:
                running.continuous.append(np.asarray(continuous[slot], np.float32).copy())
            if discrete is not None:
                running.discrete.append(np.asarray(discrete[slot], np.int32).copy())
            if record.action_mask is not None:
                running.masks.append(record.action_mask[slot].copy())
            running.rewards.append(float(record.rewards[slot]))
            if not ended[slot]:
                for rows, values in zip(running.observations, next_rows, strict=True):
                    rows.append(values[slot].copy())
                continue
            assert record.final_obs is not None  # an episode ended
            final = observation_rows(record.final_obs[slot])
            for rows, values in zip(running.observations, final, strict=True):
                rows.append(np.asarray(values, np.float32).copy())
            self.episodes.append(self._finish(slot, running, bool(record.terminated[slot])))
            del self._running[slot]
            if running.index + 1 < self._quotas[slot]:
                self._running[slot] = _Running(running.index + 1,
                                               [[o[slot].copy()] for o in next_rows])

    def end(self, result: Any) -> None:
        """Sorts the episodes into (slot, index) order (they end in any order).

        Args:
            result: the rollout's result, or None when it was interrupted (the episodes finished so
                far are kept).
        """
        self._running = {}
        self.episodes.sort(key=lambda e: (e.slot, e.index))

    def _finish(self, slot: int, running: _Running, terminated: bool) -> RecordedEpisode:
        assert self.behavior is not None
        layout = self.behavior.layout
        length = len(running.rewards)
        mask_size = sum(layout.discrete_branches)
        return RecordedEpisode(
            slot=slot, index=running.index, seed=self._seed,
            observations=tuple(np.stack(rows).astype(np.float32, copy=False)
                               for rows in running.observations),
            continuous=(np.stack(running.continuous) if running.continuous
                        else np.zeros((length, layout.continuous_size), np.float32)),
            discrete=(np.stack(running.discrete) if running.discrete
                      else np.zeros((length, len(layout.discrete_branches)), np.int32)),
            action_masks=(np.stack(running.masks) if running.masks
                          else np.ones((length, mask_size), bool)),
            rewards=np.asarray(running.rewards, np.float32), terminated=terminated)
