"""What a rollout gives: its counted episodes (`EpisodeResult`), the whole result
(`RolloutResult`), and the error that carries the episodes counted before the environment died
(`RolloutInterrupted`). Plain data, used by `envs.rollout` and the recorders it feeds."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EpisodeResult:
    """One counted episode: its return, its length in decisions, whether the environment ended
    it (`terminated`, as Gymnasium names it; Huggy's episodes terminate at the stick) rather than
    the step limit (truncated), its slot and its index among that slot's episodes."""

    episode_return: float
    length: int
    terminated: bool
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
    no longer fill every quota (and so are not an unbiased sample).

    Args:
        message: what happened.
        result: the episodes counted before.
    """

    def __init__(self, message: str, result: RolloutResult) -> None:
        super().__init__(message)
        self.result = result
