"""What the rollout loop hands its recorders: the sink interface, beside the statistics.

`envs.rollout.rollout(..., recorders=[...])` (and `rollout_per_instance`, one list per instance)
calls each recorder's `start` after the reset, `step` after every step with a `StepRecord` of
the recorder's slots, and `end` once, with the `RolloutResult` or None when the rollout was
interrupted. The statistics are counted as without recorders; recorders only read.

Each `StepRecord` says which episode every slot was in during the step (`episode_index`, counted
from the reset); with the quotas of `RecordingContext` (the per-slot quota estimator of
`envs.rollout`: slot s counts its episodes 0 to quota - 1), a recorder keeps exactly the counted
episodes, or the first episodes of a slot, without counting anything itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from envs.results import RolloutResult


@dataclass(frozen=True)
class RecordingContext:
    """Where a recorder's slots are: `env` (a `UnityVectorEnv`), its rows `slots` (slot s of
    the records is env slot `slots.start + s`), each slot's quota of counted episodes, and the
    seed the environment was reset with (None: not reseeded)."""

    env: Any
    slots: slice
    quotas: np.ndarray
    seed: int | None

    def env_slot(self, slot: int) -> int:
        """The env's slot of a record slot.

        Args:
            slot: a slot of the records (from 0).

        Returns:
            `slots.start + slot`.
        """
        return (self.slots.start or 0) + slot


@dataclass(frozen=True)
class StepRecord:
    """One step of a recorder's slots (rows of its group; arrays are the caller's, read only).

    Attributes:
        obs: what the policy saw: (n, *shape) array, or a tuple of them.
        actions: what it did, in the env's action form: (n, c) float32, (n, branches)
            integers, or (continuous, discrete).
        action_mask: (n, sum of branches) bool, True = allowed, the masks of this decision;
            None without discrete actions.
        rewards: (n,) float32; terminated, truncated: (n,) bool.
        next_obs: the observations after the step (a successor's first where an episode ended).
        final_obs: (n,) object array holding the last observation of each slot whose episode
            ended, else None; None when no episode ended.
        episode_index: (n,) int64, the index of the episode each slot was in during the step.
    """

    obs: Any
    actions: Any
    action_mask: np.ndarray | None
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: Any
    final_obs: np.ndarray | None
    episode_index: np.ndarray

    def rows(self, part: slice) -> StepRecord:
        """The record of some of its slots.

        Args:
            part: the slots.

        Returns:
            A record of views of those rows.
        """
        def cut(value: Any) -> Any:
            if value is None:
                return None
            if isinstance(value, tuple):
                return tuple(v[part] for v in value)
            return value[part]

        return StepRecord(cut(self.obs), cut(self.actions), cut(self.action_mask),
                          self.rewards[part], self.terminated[part], self.truncated[part],
                          cut(self.next_obs), cut(self.final_obs), self.episode_index[part])


class Recorder(Protocol):
    """A sink of the rollout loop (see the module docstring)."""

    def start(self, context: RecordingContext, obs: Any, infos: dict[str, Any]) -> None:
        """After the reset.

        Args:
            context: where the recorder's slots are, their quotas and the reset's seed.
            obs: the first observations of the recorder's slots.
            infos: the reset's infos.
        """

    def step(self, record: StepRecord) -> None:
        """After every step, until the rollout has counted all its episodes.

        Args:
            record: the step of the recorder's slots.
        """

    def end(self, result: RolloutResult | None) -> None:
        """Once, last.

        Args:
            result: the rollout's result (of the recorder's group), or None when it was interrupted
                (write nothing then; release what was opened).
        """


def observation_rows(obs: Any) -> tuple[np.ndarray, ...]:
    """Observations as a tuple of arrays, one per input.

    Args:
        obs: one array, or a tuple of them.

    Returns:
        The tuple.
    """
    return tuple(obs) if isinstance(obs, tuple) else (obs,)
