"""Replay videos of evaluated policies (`huggy evaluate --video`, and the model cards'
`replay.mp4`): per policy, its median-return episode played again from its work item's seed,
on one instance of the evaluation's environment with frames, and written as an MP4.

An item's episodes depend only on (policy, item seed) (`deploy.evaluation.plan`), so the
episode replays to the same return: bit for bit when the replay computes the actions as the
runner did (the same machine kind, device and precision, one torch thread as a one-CPU runner
has). `Replay.same` says whether it did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from deploy.evaluation.plan import EnvSpec, PolicySpec, file_stem
from deploy.evaluation.results import EvaluationResult, ItemResult, PolicyResult
from deploy.evaluation.runner import load_agent, open_env
from envs.recording.replay import replay_episode


@dataclass(frozen=True)
class EpisodeRef:
    """Episode `position` of work item `item` (of seed `item.seed`)."""

    item: ItemResult
    position: int

    @property
    def slot(self) -> int:
        return self.item.slots[self.position]

    @property
    def index(self) -> int:
        """The episode's index within its slot."""
        return self.item.episode_indices[self.position]

    @property
    def episode_return(self) -> float:
        return self.item.returns[self.position]

    @property
    def length(self) -> int:
        return self.item.lengths[self.position]


@dataclass(frozen=True)
class Replay:
    """A written replay: the policy, the video, the episode and what the replay scored."""

    label: str
    path: Path
    episode: EpisodeRef
    replayed_return: float
    replayed_length: int

    @property
    def same(self) -> bool:
        """The replay scored exactly what the evaluation recorded (return and length)."""
        return (self.replayed_return, self.replayed_length) == \
            (self.episode.episode_return, self.episode.length)

    def describe(self) -> str:
        """The replay in one line for the terminal.

        Returns:
            The policy, the episode and where it ran, its return and length, whether the replay
                scored the same, and the file.
        """
        episode = self.episode
        where = (f"item {episode.item.index} (seed {episode.item.seed}), slot {episode.slot}, "
                 f"episode {episode.index}")
        verdict = ("same return" if self.same else
                   f"DIFFERS: replayed {self.replayed_return:.6f} in {self.replayed_length} "
                   "steps (another device, precision or CPU kind computed the actions?)")
        return (f"replay: {self.label}: median episode, {where}: return "
                f"{episode.episode_return:.6f} in {episode.length} steps, {verdict} -> "
                f"{self.path}")


def median_episode(policy: PolicyResult) -> EpisodeRef | None:
    """A policy's median-return episode (the lower of the middle two for an even count), ties broken
    by (item, slot, index).

    Args:
        policy: the policy's results.

    Returns:
        The episode; None without episodes.
    """
    episodes = [EpisodeRef(item, k) for item in policy.ordered_items()
                for k in range(len(item.returns))]
    if not episodes:
        return None
    ranked = sorted(episodes, key=lambda e: (e.episode_return, e.item.index, e.slot, e.index))
    return ranked[(len(ranked) - 1) // 2]


def check_renderable(env: EnvSpec) -> None:
    """Refuse early what cannot give frames: the built-in stand-in renders Huggy, or a behavior with
    a camera observation ((C, H, W), 1 or 3 channels). A Unity build's observations are known only
    once it runs: its replay fails then, with the same reason.

    Args:
        env: the evaluation's environment.

    Raises:
        ValueError: the stand-in plays a behavior without a camera observation.
    """
    if env.file_name is not None or env.behavior_spec is None:
        return
    inputs = env.behavior_spec.get("inputs", [])
    if not any(len(i["shape"]) == 3 and i["shape"][0] in (1, 3) for i in inputs):
        shapes = ", ".join(str(tuple(i["shape"])) for i in inputs)
        raise ValueError(
            "a replay video needs the built-in stand-in playing Huggy or a camera observation "
            f"((C, H, W), 1 or 3 channels); behavior {env.behavior_spec.get('behavior')!r} "
            f"observes {shapes}")


def record_replays(result: EvaluationResult, folder: str | Path,
                   policies: Sequence[int] | None = None) -> list[Replay]:
    """Write the replay of the median episode of each policy that has episodes, as
    `folder/<label>.mp4`, on one environment of one instance (the evaluation's `EnvSpec`
    otherwise) opened here. The policies are loaded as the runners loaded them, on the CPU with
    one torch thread.

    Args:
        result: the evaluation's result.
        folder: where the videos go (made if missing).
        policies: the policies' indices; None for every one.

    Returns:
        One replay per video written, saying whether it scored what the evaluation recorded.
    """
    chosen = _medians(result, policies)
    if not chosen:
        return []
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    env = open_env(dataclasses.replace(result.env, instances=1), render_mode="rgb_array")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    replays = []
    try:
        for spec, episode in chosen:
            agent = (spec.remote_agent() if spec.url is not None
                     else load_agent(spec, precision=result.config.precision))
            path = folder / f"{file_stem(spec.label)}.mp4"
            replayed = replay_episode(agent, env, seed=episode.item.seed, slot=episode.slot,
                                      index=episode.index, path=path, label=spec.label,
                                      deterministic=not result.config.stochastic)
            replays.append(Replay(spec.label, path, episode, float(replayed.episode_return),
                                  int(replayed.length)))
    finally:
        torch.set_num_threads(threads)
        env.close()
    return replays


def _medians(result: EvaluationResult, policies: Sequence[int] | None
             ) -> list[tuple[PolicySpec, EpisodeRef]]:
    indices = range(len(result.policies)) if policies is None else policies
    found = []
    for index in indices:
        episode = median_episode(result.policies[index])
        if episode is not None:
            found.append((result.policies[index].spec, episode))
    return found
