"""A tournament's matches on Ray runners (`play_on_ray`): each runner a `MatchRunner` actor with
its own environment of `arenas` arenas, handed one batch of a round's fixtures at a time; the next
round is scheduled once every batch of this one is back. Faults are Ray's (see
`deploy.evaluation.tournament`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from deploy.evaluation import ratings
from deploy.evaluation.matchmaking import Fixture, Schedule
from deploy.evaluation.on_ray import ray_session, runner_options, runner_placement
from deploy.evaluation.runner import EnvironmentCrashed
from deploy.evaluation.scheduling import EvaluationError
from deploy.evaluation.tournament import (
    Contender,
    MatchRunner,
    TournamentConfig,
    TournamentEnv,
    TournamentResult,
    batches,
    progress_bar,
)


@functools.cache
def _remote_runner() -> Any:
    """`MatchRunner` as a Ray actor class (made once, so its definition is exported once)."""
    return ray.remote(MatchRunner)


def play_on_ray(entrants: Sequence[Contender], config: TournamentConfig, env: TournamentEnv,
                address: str | None = None) -> TournamentResult:
    """The tournament on `config.runners` Ray actors: the same matches and results as
    `tournament.play_plain`. Each runner plays `env.arenas` matches at once, or for a build without
    it, as many as the scene has arenas (the result's `env` records the number).

    Args:
        entrants: the contenders.
        config: the tournament's settings.
        env: the scene.
        address: the cluster, as `on_ray.ray_session` takes it.

    Returns:
        The result; on Ctrl-C the rounds played so far (`interrupted=True`).

    Raises:
        EvaluationError: the cluster cannot hold the runners, no runner can start, or a batch
            failed every try.
        RayTokenError: token auth is on and this process has no token, or the cluster refused it.
    """
    started = time.perf_counter()
    result = TournamentResult(list(entrants), config, env)
    schedule = Schedule(result.labels, config.schedule())
    by_label = {c.label: c for c in entrants}
    played: list[ratings.Match] = []
    with ray_session(address):
        placement = runner_placement(config.accelerator, config.runner_cpus, config.runners)
        options = runner_options(placement, config.max_attempts)
        actors = [_remote_runner().options(**options).remote(
            f"runner-{k}", env, placement.device, config.precision)
            for k in range(config.runners)]
        payloads = {c.label: [ray.put(Path(c.path).read_bytes())] for c in entrants
                    if c.path is not None}
        bar = progress_bar(config)
        try:
            result.runners = _started(actors)
            # every runner opens the same scene: a build's count is the same on each
            arenas = min(ray.get([actor.arenas.remote() for actor in actors]))
            result.env = dataclasses.replace(env, arenas=arenas)
            fixtures = schedule.next_round(played)
            while fixtures:
                found, retries = _play_round(actors, batches(fixtures, arenas), by_label,
                                             payloads, config)
                played += found
                result.retries += retries
                bar.update(len(found))
                fixtures = schedule.next_round(played)
        except KeyboardInterrupt:
            result.interrupted = True
        finally:
            bar.close()
            closing = [actor.close.remote() for actor in actors]
            ray.wait(closing, num_returns=len(closing), timeout=15)
            for actor in actors:
                ray.kill(actor, no_restart=True)
    result.matches = sorted(played, key=lambda match: match.index)
    result.selection = schedule.outcome(result.matches)
    result.seconds = time.perf_counter() - started
    return result


def _started(actors: list[Any]) -> list[Any]:
    """Each runner's info once it is ready; EvaluationError when none could start."""
    infos = []
    for actor in actors:
        try:
            infos.append(ray.get(actor.info.remote()))
        except RayError as error:
            raise EvaluationError(f"a runner could not start: {error}") from error
    return infos


def _play_round(actors: list[Any], queue: list[list[Fixture]], entrants: dict[str, Contender],
                payloads: dict[str, Any], config: TournamentConfig
                ) -> tuple[list[ratings.Match], int]:
    """Every batch of one round, one batch per idle runner at a time: the matches, and the
    retries Ray made. EvaluationError when a batch failed every try."""
    pending = deque(queue)
    idle = list(actors)
    running: dict[Any, tuple[Any, list[Fixture]]] = {}
    played: list[ratings.Match] = []
    retries = 0
    while pending or running:
        while pending and idle:
            actor, batch = idle.pop(), pending.popleft()
            method = actor.run.options(retry_exceptions=[EnvironmentCrashed])
            running[method.remote(batch, entrants, payloads, config.deterministic)] = (actor,
                                                                                     batch)
        (ready,), _ = ray.wait(list(running), num_returns=1)
        actor, batch = running.pop(ready)
        try:
            found, attempt = ray.get(ready)
        except RayError as error:
            raise EvaluationError(
                f"matches {batch[0].index}-{batch[-1].index} failed {config.max_attempts} "
                f"times: {error}") from error
        played += found
        retries += attempt - 1
        idle.append(actor)
    return played, retries
