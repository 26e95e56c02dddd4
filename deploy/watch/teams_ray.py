"""A team scene's matches on Ray runners (`RayMatchPlayer`): the tournament's `MatchRunner`
actors (`deploy.evaluation.tournament_ray`), started once on the connected cluster and kept for
the whole watch, across checkpoints, with the tournament's fault tolerance (a lost runner
restarted and its batch retried, a crashed scene reopened, `max_attempts` tries in all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from deploy.evaluation import ratings
from deploy.evaluation.matchmaking import Fixture
from deploy.evaluation.results import RunnerInfo
from deploy.evaluation.tournament import Contender, TournamentConfig, TournamentEnv, batches
from deploy.evaluation.tournament_ray import (
    payloads_of,
    play_round,
    runner_arenas,
    start_runners,
    stop_runners,
    wait_started,
)


class RayMatchPlayer:
    """`config.runners` runners on the connected cluster (`deploy.evaluation.on_ray.ray_session`
    opened by the watch), each playing one batch of as many matches as its scene has arenas at
    a time. A policy file travels to the runners once, through Ray's object store.

    Args:
        config: the runners' settings (`runners`, `accelerator`, `runner_cpus`, `precision`,
            `max_attempts`); the schedule's settings in it are not used.
        env: the scene each runner opens.

    Raises:
        EvaluationError: the cluster cannot hold the runners, or one could not start.
    """

    def __init__(self, config: TournamentConfig, env: TournamentEnv) -> None:
        self._config = config
        self._actors = start_runners(config, env)
        try:
            self.runners: list[RunnerInfo] = wait_started(self._actors)
            self.arenas = runner_arenas(self._actors)
        except BaseException:
            stop_runners(self._actors)
            raise
        self._payloads: dict[str, Any] = {}

    def play(self, fixtures: Sequence[Fixture], entrants: Mapping[str, Contender],
             deterministic: bool) -> Iterator[tuple[list[ratings.Match], str]]:
        """Play matches, one batch per idle runner at a time.

        Args:
            fixtures: the matches.
            entrants: the members' contenders by label.
            deterministic: play each policy's mode instead of sampling.

        Yields:
            Each batch's results as it comes back (in any order), and its runner's name.

        Raises:
            EvaluationError: a batch failed every try.
        """
        new = [c for label, c in entrants.items() if label not in self._payloads]
        self._payloads.update(payloads_of(new))
        config = dataclasses.replace(self._config, deterministic=deterministic)
        for found, _, runner in play_round(self._actors, batches(fixtures, self.arenas),
                                           dict(entrants), self._payloads, config):
            yield found, self.runners[runner].name

    def close(self) -> None:
        """Close the runners' scenes and end the runners."""
        stop_runners(self._actors)
