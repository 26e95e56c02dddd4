"""ML-Agents demonstrations (`.demo`): what `mlagents-learn` reads for behavioral cloning and
GAIL (`behavioral_cloning: demo_path`, `gail: demo_path`), written from recorded episodes of any
behavior: vector, visual and variable-length observations, continuous and discrete actions,
action masks.

The format, as Unity's `DemonstrationWriter` lays it out and the trainer's
`mlagents.trainers.demo_loader.load_demonstration` reads it: a length-delimited
`DemonstrationMetaProto` (api_version 1, name, steps, episodes, mean reward) in the first
`META_BYTES` + 1 bytes, the length-delimited `BrainParametersProto` at offset 33, then one
length-delimited `AgentInfoActionPairProto` per agent step.

An episode of T decisions gives T + 1 records: record t < T holds observation t, the reward
that came with it (0 for the first), the action mask and the action taken at it; the last holds
the final observation and reward, `done` (and `max_step_reached` when truncated) and zero
actions. That is the pairing the trainer's `make_demo_buffer` assumes (each observation with
the action in its own record, the reward and done of the next record). Unity's recorder writes
each observation with the previous decision's action instead (it records before deciding);
these files hold the action the policy took at that observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envs.protobuf_wire import packed_floats_header, varint
from envs.recording.episodes import Behavior, EpisodeCollector, RecordedEpisode
from envs.standin.spec_client import DIMENSION_PROPERTIES

DEMO_API_VERSION = 1
"""`DemonstrationMetaProto.api_version` of Unity's ML-Agents 2.x (the trainer reads 0 and 1)."""
META_BYTES = 32
"""Bytes Unity reserves for the metadata; the brain parameters start one byte later."""
_KIND_OF_RANK = {1: "vector", 2: "variable", 3: "visual"}


@dataclass(frozen=True)
class DemoSummary:
    """What a `.demo` file holds: its metadata."""

    path: Path
    episodes: int
    steps: int
    mean_reward: float


def write_demonstration(path: str | Path, episodes: Sequence[RecordedEpisode],
                        behavior: Behavior, name: str | None = None) -> DemoSummary:
    """Write episodes (in the order given, each whole) as an ML-Agents demonstration file.

    Args:
        path: the file, named `*.demo` as the trainer requires; its folder is made if missing.
        episodes: the episodes.
        behavior: their behavior's name and slot layout.
        name: the demonstration's name (default: the file's stem), cut to what fits the metadata.

    Returns:
        The file, its episodes, steps and mean reward.

    Raises:
        ValueError: `path` does not end in `.demo`, there are no episodes, an episode's
            observations are not the behavior's, or the counts do not fit the metadata.
    """
    from mlagents_envs.communicator_objects.brain_parameters_pb2 import BrainParametersProto

    path = demo_path(path)
    if not episodes:
        raise ValueError("no episodes to write")
    layout = behavior.layout
    for episode in episodes:
        shapes = tuple(o.shape[1:] for o in episode.observations)
        if shapes != tuple(layout.observations):
            raise ValueError(f"episode (slot {episode.slot}, {episode.index}) has observations "
                             f"{shapes}, the behavior {layout.observations}")
    steps = sum(e.length + 1 for e in episodes)
    mean_reward = float(np.mean([e.episode_return for e in episodes]))
    brain = BrainParametersProto(brain_name=behavior.name, is_training=True)
    brain.action_spec.num_continuous_actions = layout.continuous_size
    brain.action_spec.num_discrete_actions = len(layout.discrete_branches)
    brain.action_spec.discrete_branch_sizes.extend(layout.discrete_branches)
    meta = _meta(name or path.stem, steps, len(episodes), mean_reward)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.write(meta.ljust(META_BYTES + 1, b"\0"))
        file.write(_delimited(brain.SerializeToString()))
        for number, episode in enumerate(episodes):
            for record in _episode_records(episode, number, layout):
                file.write(_delimited(record))
    return DemoSummary(path, len(episodes), steps, mean_reward)


def demo_path(path: str | Path) -> Path:
    """A demonstration file's path, checked.

    Args:
        path: the path.

    Returns:
        `path` as a Path.

    Raises:
        ValueError: it does not end in `.demo`, as the trainer requires.
    """
    path = Path(path)
    if path.suffix != ".demo":
        raise ValueError(f"ML-Agents reads demonstrations from files named *.demo, got {path}")
    return path


def _delimited(message: bytes) -> bytes:
    return varint(len(message)) + message


def _meta(name: str, steps: int, episodes: int, mean_reward: float) -> bytes:
    """The length-delimited metadata, the name shortened until it fits `META_BYTES` + 1."""
    from mlagents_envs.communicator_objects.demonstration_meta_pb2 import (
        DemonstrationMetaProto,
    )

    for length in range(len(name), -1, -1):
        meta = _delimited(DemonstrationMetaProto(
            api_version=DEMO_API_VERSION, demonstration_name=name[:length], number_steps=steps,
            number_episodes=episodes, mean_reward=mean_reward).SerializeToString())
        if len(meta) <= META_BYTES + 1:
            return meta
    raise ValueError(f"{steps} steps and {episodes} episodes do not fit the demo metadata")


def _episode_records(episode: RecordedEpisode, agent_id: int, layout: Any) -> list[bytes]:
    """The serialized `AgentInfoActionPairProto`s of one episode (see the module docstring)."""
    from mlagents_envs.communicator_objects.agent_info_action_pair_pb2 import (
        AgentInfoActionPairProto,
    )
    from mlagents_envs.communicator_objects.observation_pb2 import ObservationProto

    length = episode.length
    rewards = np.concatenate([[0.0], episode.rewards]).astype(np.float32)
    continuous = np.concatenate([episode.continuous,
                                 np.zeros((1, layout.continuous_size), np.float32)])
    discrete = np.concatenate([episode.discrete,
                               np.zeros((1, len(layout.discrete_branches)), np.int32)])
    records = []
    for t in range(length + 1):
        pair = AgentInfoActionPairProto()
        info = pair.agent_info
        info.id, info.reward = agent_id, float(rewards[t])
        if t == length:
            info.done = True
            info.max_step_reached = not episode.terminated
        elif layout.discrete_branches:
            info.action_mask.extend((~episode.action_masks[t]).tolist())  # True = not allowed
        for index, observations in enumerate(episode.observations):
            values = np.ascontiguousarray(observations[t], "<f4")
            proto = ObservationProto(
                shape=values.shape, name=f"obs_{index}",
                dimension_properties=DIMENSION_PROPERTIES[_KIND_OF_RANK[values.ndim]])
            proto.float_data.MergeFromString(packed_floats_header(1, values.size)
                                             + values.tobytes())
            info.observations.append(proto)
        if layout.continuous_size:
            pair.action_info.continuous_actions.extend(continuous[t].tolist())
        if layout.discrete_branches:
            pair.action_info.discrete_actions.extend(discrete[t].tolist())
        records.append(pair.SerializeToString())
    return records


class DemoRecorder(EpisodeCollector):
    """A recorder (`envs.recording.base`) that writes the counted episodes of its slots, in
    (slot, index) order, to a `.demo` file when the rollout ends (nothing when it was
    interrupted). `summary` then describes the file.

    Args:
        path: the `.demo` file.
        name: the demonstration's name (default: the file's stem).

    Raises:
        ValueError: `path` does not end in `.demo`.
    """

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        super().__init__()
        self.path, self.name = demo_path(path), name
        self.summary: DemoSummary | None = None

    def end(self, result: Any) -> None:
        """Write the file, unless the rollout was interrupted.

        Args:
            result: the rollout's result, or None when it was interrupted.
        """
        super().end(result)
        if result is not None and self.behavior is not None:
            self.summary = write_demonstration(self.path, self.episodes, self.behavior,
                                               self.name)
