"""`replay_episode`: play one episode of a rollout again from its seed and record its video."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envs.recording.video import VideoRecorder
from envs.rollout import EpisodeResult, rollout


def replay_episode(agent: Any, env: Any, *, seed: int, slot: int, index: int = 0,
                   path: str | Path, deterministic: bool = True,
                   label: str | None = None) -> EpisodeResult:
    """Play one episode of a rollout again and write its video.

    The rollout is repeated with a quota of `index + 1` episodes for every slot, so it runs at
    least until the chosen episode ends; the quotas change nothing before that (every slot's
    episodes play out the same whatever is counted). An episode of an evaluation work item
    (`rollout_per_instance`, instance reset with the item's seed) replays on a one-instance env
    with that seed: the same seed, batch and noise seeds.

    Args:
        agent: the policy of the original rollout.
        env: an env made with `render_mode="rgb_array"`, of the original's instances and agent
            count.
        seed: the original rollout's seed.
        slot: the agent slot.
        index: the episode's index among the slot's episodes.
        path: the MP4 file to write.
        deterministic: as in the original rollout.
        label: the policy's name drawn on the frames.

    Returns:
        The episode's result: equal to the original's under those conditions.

    Raises:
        ValueError: `slot` is out of range or `index` is negative.
        RolloutInterrupted: the environment died during the replay.
    """
    if not 0 <= slot < env.num_envs:
        raise ValueError(f"slot must be in [0, {env.num_envs}), got {slot}")
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    recorder = VideoRecorder(slot=slot, episodes={index}, label=label, path=path)
    result = rollout(agent, env, episodes=env.num_envs * (index + 1),
                     deterministic=deterministic, seed=seed, recorders=[recorder])
    (episode,) = [e for e in result.episodes if (e.slot, e.index) == (slot, index)]
    return episode
