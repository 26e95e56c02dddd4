"""What an evaluation produced: episodes per work item, per policy, and for the whole run."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec
from deploy.evaluation.selection import SelectionOutcome
from envs.recording.episodes import Behavior, EpisodeCollector, RecordedEpisode


@dataclass(frozen=True)
class KeptEpisodes:
    """A work item's episodes whole (`EvalConfig.keep_episodes`), in (slot, index) order as
    its results, and the behavior that played them (plain data: it travels from runners)."""

    behavior: Behavior
    episodes: tuple[RecordedEpisode, ...]

    @classmethod
    def of(cls, collector: EpisodeCollector) -> KeptEpisodes:
        """What an `EpisodeCollector` kept of a finished rollout.

        Args:
            collector: the collector, after the rollout.

        Returns:
            Its behavior and episodes.
        """
        assert collector.behavior is not None, "the rollout never started"
        return cls(collector.behavior, tuple(collector.episodes))


@dataclass(frozen=True)
class ItemResult:
    """The counted episodes of one work item, in (slot, episode index) order, and where they
    ran. `slots[k]` and `episode_indices[k]` name episode k's agent slot and its index there;
    `terminated[k]` whether the environment ended it (Huggy: at the stick) rather than the step
    limit; `behavior` is the ML-Agents behavior the environment ran."""

    policy_index: int
    index: int
    seed: int
    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    terminated: tuple[bool, ...]
    slots: tuple[int, ...]
    episode_indices: tuple[int, ...]
    agent_steps: int
    seconds: float
    node_id: str
    runner: str
    attempts: int = 1
    behavior: str | None = None
    kept: KeptEpisodes | None = field(default=None, repr=False, compare=False)
    """The episodes whole, when the evaluation keeps them (`EvalConfig.keep_episodes`)."""

    def record(self) -> dict[str, Any]:
        """The item as the JSON report lists it.

        Returns:
            Every field but the kept episodes.
        """
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "kept"}


@dataclass(frozen=True)
class RunnerInfo:
    """A started runner: its name, node, process id, and its environment's Unity process ids
    (`env_pid`: the first instance's, `env_pids`: every instance's)."""

    name: str
    node_id: str
    pid: int
    env_pid: int | None
    env_pids: tuple[int | None, ...] = ()


@dataclass
class PolicyResult:
    """Everything evaluated for one policy; `error` is set when it failed (load or items)."""

    spec: PolicySpec
    items: list[ItemResult] = field(default_factory=list)
    error: str | None = None
    fingerprint: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def ordered_items(self) -> list[ItemResult]:
        """The items by index, so statistics never depend on completion order.

        Returns:
            The items, sorted by index.
        """
        return sorted(self.items, key=lambda item: item.index)


@dataclass
class EvaluationResult:
    """The outcome of one evaluation."""

    policies: list[PolicyResult]
    config: EvalConfig
    env: EnvSpec
    runners: list[RunnerInfo] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    """Wall time of the whole evaluation."""
    startup_seconds: float | None = None
    """Wall time until the first runner was ready for items (None if none ever was)."""
    planned_episodes: list[int] = field(default_factory=list)
    """Episodes scheduled for each policy (empty: `config.episodes` each)."""
    selection: SelectionOutcome | None = None
    """The adaptive selection's outcome (`deploy.evaluation.selection.Selection.outcome`)."""

    @property
    def retries(self) -> int:
        """Item runs beyond the first: one per crashed environment or lost runner."""
        return sum(item.attempts - 1 for policy in self.policies for item in policy.items)

    def behaviors(self) -> list[str | None]:
        """The ML-Agents behavior each work item's environment ran.

        Returns:
            One per item (None where unknown).
        """
        return [item.behavior for policy in self.policies for item in policy.items]

    def node_episodes(self) -> dict[str, int]:
        """The episodes run on each node.

        Returns:
            {node id: episodes}.
        """
        counts: dict[str, int] = {}
        for policy in self.policies:
            for item in policy.items:
                counts[item.node_id] = counts.get(item.node_id, 0) + len(item.returns)
        return counts
