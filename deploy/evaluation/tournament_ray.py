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
from collections.abc import Iterator, Sequence
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
        actors = start_runners(config, env)
        payloads = payloads_of(entrants)
        bar = progress_bar(config)
        try:
            result.runners = wait_started(actors)
            arenas = runner_arenas(actors)
            result.env = dataclasses.replace(env, arenas=arenas)
            fixtures = schedule.next_round(played)
            while fixtures:
                for found, attempt, _ in play_round(actors, batches(fixtures, arenas), by_label,
                                                 payloads, config):
                    played += found
                    result.retries += attempt - 1
                    bar.update(len(found))
                fixtures = schedule.next_round(played)
        except KeyboardInterrupt:
            result.interrupted = True
        finally:
            bar.close()
            stop_runners(actors)
    result.matches = sorted(played, key=lambda match: match.index)
    result.selection = schedule.outcome(result.matches)
    result.seconds = time.perf_counter() - started
    return result


def start_runners(config: TournamentConfig, env: TournamentEnv) -> list[Any]:
    """`config.runners` `MatchRunner` actors on the connected cluster, placed as `config` says.

    Args:
        config: the runners' settings (`runners`, `accelerator`, `runner_cpus`, `precision`,
            `max_attempts`).
        env: the scene each opens.

    Returns:
        The actors (starting; `runner_arenas` waits for them).

    Raises:
        EvaluationError: the cluster cannot hold the runners.
    """
    placement = runner_placement(config.accelerator, config.runner_cpus, config.runners)
    options = runner_options(placement, config.max_attempts)
    return [_remote_runner().options(**options).remote(f"runner-{k}", env, placement.device,
                                                       config.precision)
            for k in range(config.runners)]


def runner_arenas(actors: list[Any]) -> int:
    """The matches each runner plays at once: every runner opens the same scene, so a build's
    count is the same on each.

    Args:
        actors: the runners.

    Returns:
        The smallest count.
    """
    return int(min(ray.get([actor.arenas.remote() for actor in actors])))


def payloads_of(entrants: Sequence[Contender]) -> dict[str, Any]:
    """Each policy file's bytes in Ray's object store, so runners on other machines need no
    shared file system.

    Args:
        entrants: the contenders.

    Returns:
        {label: [ObjectRef]} of the file contenders.
    """
    return {c.label: [ray.put(Path(c.path).read_bytes())] for c in entrants
            if c.path is not None}


def stop_runners(actors: list[Any]) -> None:
    """Close the runners' environments (waiting up to 15 s), then end the actors.

    Args:
        actors: the runners.
    """
    closing = [actor.close.remote() for actor in actors]
    ray.wait(closing, num_returns=len(closing), timeout=15)
    for actor in actors:
        ray.kill(actor, no_restart=True)


def wait_started(actors: list[Any]) -> list[Any]:
    """Wait for the runners to start.

    Args:
        actors: the runners.

    Returns:
        Each runner's `RunnerInfo`.

    Raises:
        EvaluationError: a runner could not start.
    """
    infos = []
    for actor in actors:
        try:
            infos.append(ray.get(actor.info.remote()))
        except RayError as error:
            raise EvaluationError(f"a runner could not start: {error}") from error
    return infos


def play_round(actors: list[Any], queue: list[list[Fixture]], entrants: dict[str, Contender],
               payloads: dict[str, Any], config: TournamentConfig
               ) -> Iterator[tuple[list[ratings.Match], int, int]]:
    """Every batch of one round, one batch per idle runner at a time.

    Args:
        actors: the runners.
        queue: the batches (`batches`).
        entrants: the contenders by label.
        payloads: the files' bytes (`payloads_of`).
        config: `deterministic` and `max_attempts`.

    Yields:
        Each batch's matches as it comes back, which try it was (1 + Ray's retries), and the
            index of the runner that played it in `actors`.

    Raises:
        EvaluationError: a batch failed every try.
    """
    pending = deque(queue)
    idle = list(actors)
    running: dict[Any, tuple[Any, list[Fixture]]] = {}
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
        idle.append(actor)
        yield found, attempt, actors.index(actor)
