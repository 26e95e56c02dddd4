"""Tournaments (`huggy tournament`): matches between policies in a scene whose two teams share a
behavior (the stand-in SoccerTwos, a real SoccerTwos build), scheduled round by round
(`deploy.evaluation.matchmaking`), played in this process or on Ray runners, then rated
(`deploy.evaluation.ratings`).

A match is the first episode of one arena, policy A as team 0 and policy B as team 1; match i is
seeded S + i (`envs.matches`), so its result depends on neither the runners nor retries. A
runner holds one environment of `arenas` arenas and plays up to that many matches at once, one
per arena. Contenders are policy files, results folders (every checkpoint), `hf://` sources and
scripted players (`heuristic:idle`, `heuristic:random`, `heuristic:chaser`).

Faults are Ray's, as in `huggy evaluate`: a runner whose process dies is restarted and its batch
run again, a batch whose environment crashed runs again on a fresh environment, up to
`max_attempts` tries; a batch that fails every try ends the tournament (a schedule needs every
result of a round), with what was played before reported.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlagents_envs.exception import UnityException
from tqdm import tqdm

from deploy.evaluation import ratings
from deploy.evaluation.matchmaking import Fixture, Schedule, ScheduleConfig
from deploy.evaluation.results import RunnerInfo
from deploy.evaluation.runner import (
    EnvironmentCrashed,
    attempt,
    free_worker_id,
    load_policy_file,
    node_id,
)
from deploy.placement import ACCELERATORS
from envs.heuristics import is_heuristic, load_heuristic
from envs.matches import MatchPlan, count_arenas, play_matches
from envs.teams import TeamsEnv, check_builtin_parameters
from huggy_agent.discovery import find_policies


@dataclass(frozen=True)
class Contender:
    """One policy of a tournament: a policy file (`path`) or a scripted player (`heuristic`)."""

    label: str
    path: str | None = None
    heuristic: str | None = None
    run: str | None = None
    step: int | None = None
    folder: str | None = None
    source: str | None = None
    """What the user named when it was not a local path (`hf://owner/repo@commit/path`)."""


def contenders(sources: Sequence[str]) -> list[Contender]:
    """The contenders that sources name.

    Args:
        sources: `heuristic:NAME`, or what `huggy_agent.discovery` finds (a file, every checkpoint
            of a results folder, `hf://`).

    Returns:
        The contenders, in order.

    Raises:
        ValueError: fewer than two, an unknown scripted player, repeated labels, a folder without
            policy files, or a malformed Hub source.
        FileNotFoundError: a path or Hub source that does not exist.
    """
    found: list[Contender] = []
    for source in sources:
        if is_heuristic(source):
            load_heuristic(source)  # ValueError naming the known players
            found.append(Contender(label=source, heuristic=source))
        else:
            found += [Contender(label=p.label, path=p.path, run=p.run, step=p.step,
                                folder=p.folder, source=p.source)
                      for p in find_policies([source])]
    labels = [c.label for c in found]
    if len(found) < 2:
        raise ValueError(f"a tournament needs at least two policies, received {labels}")
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"each policy may enter once, received {repeated} more than once")
    return found


STANDIN_ARENAS = 8
"""The stand-in's arenas when neither `arenas` nor its `num_arenas` parameter says."""


@dataclass(frozen=True)
class TournamentEnv:
    """The scene each runner opens: a Unity build or "builtin:soccertwos", its arenas and more
    parameters.

    Raises:
        ValueError: arenas that are not an integer >= 1, another built-in scene, a stand-in
            `num_arenas` parameter that disagrees with `arenas`, or a parameter the stand-in would
            ignore.
    """

    file_name: str = "builtin:soccertwos"
    arenas: int | None = None
    """Matches a runner plays at once, one per arena. The stand-in gets that many arenas (its
    `num_arenas`); None there means its `num_arenas` parameter, else STANDIN_ARENAS. A build
    keeps its own arenas; None there means all of them, counted when a runner opens it
    (`MatchRunner.arenas`)."""
    parameters: dict[str, float] = field(default_factory=dict)
    timeout_wait: int = 60
    time_scale: float = 20.0

    def __post_init__(self) -> None:
        if self.arenas is not None and (isinstance(self.arenas, bool)
                                        or not isinstance(self.arenas, int) or self.arenas < 1):
            raise ValueError(f"arenas must be an integer >= 1, got {self.arenas!r}")
        if self.file_name.startswith("builtin") and self.file_name != "builtin:soccertwos":
            raise ValueError(f"a tournament needs a scene whose two teams share a behavior: "
                             f"'builtin:soccertwos' or a build, got {self.file_name!r}")
        stand_in = self.parameters.get("num_arenas") if self.file_name.startswith("builtin") \
            else None
        if self.file_name.startswith("builtin") and self.arenas is None:
            # frozen: the stand-in's count is fixed here, once, as if it had been given
            object.__setattr__(self, "arenas", STANDIN_ARENAS if stand_in is None
                               else int(stand_in))
        if stand_in is not None and stand_in != self.arenas:
            raise ValueError(f"num_arenas={stand_in:g} disagrees with arenas={self.arenas}: the "
                             "stand-in's arenas are the arenas (--arenas)")
        check_builtin_parameters(self.file_name, parameters=self.sent_parameters().items())

    def sent_parameters(self) -> dict[str, float]:
        """The EnvironmentParameters the scene gets.

        Returns:
            `parameters`, and for the stand-in its `num_arenas` (the arenas).
        """
        parameters = dict(self.parameters)
        if self.file_name.startswith("builtin") and self.arenas is not None:
            parameters.setdefault("num_arenas", float(self.arenas))
        return parameters

    def open(self) -> TeamsEnv:
        """The environment, on a port that was free a moment ago.

        Returns:
            The `TeamsEnv`.
        """
        return TeamsEnv(self.file_name, worker_id=free_worker_id(),
                        timeout_wait=self.timeout_wait, time_scale=self.time_scale,
                        env_parameters=self.sent_parameters())


@dataclass(frozen=True)
class TournamentConfig:
    """What to play and how (the schedule's settings are `schedule()`'s).

    Raises:
        ValueError: an unknown accelerator, or `runners` or `max_attempts` not an integer >= 1.
    """

    matches: int = 120
    """The budget: matches in all (only whole rounds of K(K-1) are played)."""
    seed: int = 0
    """Match i is seeded seed + i."""
    deterministic: bool = False
    """Play each policy's mode instead of sampling (Unity samples unless told otherwise)."""
    adaptive: bool = False
    select_best: bool = False
    confidence: float = 0.95
    round_robin_rounds: int = 2
    runners: int = 1
    accelerator: str = "auto"
    precision: str = "fp32"
    runner_cpus: float = 1.0
    max_attempts: int = 3
    progress: bool = True

    def __post_init__(self) -> None:
        if self.accelerator not in ACCELERATORS:
            raise ValueError(f"accelerator must be one of {', '.join(ACCELERATORS)}, got "
                             f"{self.accelerator!r}")
        for name in ("runners", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    def schedule(self) -> ScheduleConfig:
        """The schedule's settings.

        Returns:
            The budget, seed, mode, confidence and round-robin rounds, as `matchmaking` takes them.
        """
        return ScheduleConfig(matches=self.matches, seed=self.seed, adaptive=self.adaptive,
                              select_best=self.select_best, confidence=self.confidence,
                              round_robin_rounds=self.round_robin_rounds)


@dataclass
class TournamentResult:
    """What a tournament played: every match (in index order), the schedule's outcome, the
    runners, and whether it was interrupted (then the matches of unfinished rounds are left
    out, and the schedule's outcome is that of the rounds played)."""

    contenders: list[Contender]
    config: TournamentConfig
    env: TournamentEnv
    """The scene, with the arenas the runners played on (counted for a build without them)."""
    matches: list[ratings.Match] = field(default_factory=list)
    selection: dict[str, Any] = field(default_factory=dict)
    runners: list[RunnerInfo] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    retries: int = 0

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.contenders]


class MatchRunner:
    """One environment of `env.arenas` arenas (a build's own count when that is None) and the
    contenders' agents (loaded on first use), playing batches of matches: in this process, or as
    a Ray actor.

    Args:
        name: the runner's name in results.
        env: the scene (opened here).
        device: the device of its policy copies.
        precision: the precision of its policy copies.
    """

    def __init__(self, name: str, env: TournamentEnv, device: str = "cpu",
                 precision: str = "fp32") -> None:
        self._name = name
        self._env_spec = env
        self._device = device
        self._precision = precision
        self._agents: dict[str, Any] = {}
        self._env: TeamsEnv | None = env.open()
        self._arenas = env.arenas

    def info(self) -> RunnerInfo:
        """What the runner reports of itself.

        Returns:
            Its name, node id, process id and its environment's process id.
        """
        pid = None if self._env is None else self._env.process_id
        return RunnerInfo(self._name, node_id(), os.getpid(), pid, (pid,))

    def arenas(self) -> int:
        """How many matches this runner plays at once: `env.arenas` when given, else the arenas its scene
        has (`envs.matches.count_arenas`, one reset, counted once).

        Returns:
            The arenas.

        Raises:
            ValueError: the scene is not one of two teams sharing a behavior.
        """
        if self._arenas is None:
            if self._env is None:
                self._env = self._env_spec.open()
            self._arenas = count_arenas(self._env)
        return self._arenas

    def run(self, fixtures: Sequence[Fixture], entrants: dict[str, Contender],
            payloads: dict[str, Any], deterministic: bool) -> tuple[list[ratings.Match], int]:
        """Play matches at once, one per arena.

        Args:
            fixtures: 1 to `arenas()` matches.
            entrants: the contenders by label.
            payloads: a file contender's bytes (or a one-element list of an ObjectRef of them) by
                label, so runners on other machines need no shared file system.
            deterministic: play each policy's mode instead of sampling.

        Returns:
            Each match's result, and which try of this batch it was (1 + Ray's retries).

        Raises:
            ValueError: not 1 to `arenas()` fixtures.
            EnvironmentCrashed: the environment died (the next call opens a new one).
        """
        if not 1 <= len(fixtures) <= self.arenas():
            raise ValueError(f"expected 1 to {self.arenas()} matches (one per arena), "
                             f"got {len(fixtures)}")
        agents = {label: self._agent(entrants[label], payloads.get(label))
                  for label in {f.team0 for f in fixtures} | {f.team1 for f in fixtures}}
        if self._env is None:
            self._env = self._env_spec.open()
        plans = [MatchPlan(f.index, f.seed, f.team0, f.team1) for f in fixtures]
        try:
            outcomes = play_matches(self._env, plans, agents, deterministic)
        except UnityException as error:
            self._env.close()
            self._env = None
            raise EnvironmentCrashed(f"runner {self._name}: environment died during matches "
                                     f"{fixtures[0].index}-{fixtures[-1].index}: {error}") from None
        return [ratings.Match(o.index, o.seed, o.team0, o.team1, o.score, o.reward0, o.reward1,
                              o.decisions) for o in outcomes], attempt()

    def _agent(self, contender: Contender, payload: Any) -> Any:
        if contender.label in self._agents:
            return self._agents[contender.label]
        if contender.heuristic is not None:
            agent = load_heuristic(contender.heuristic)
        else:
            assert contender.path is not None
            agent = load_policy_file(contender.path, payload, self._device, self._precision)
        self._agents[contender.label] = agent
        return agent

    def close(self) -> None:
        if self._env is not None:
            self._env.close()


def batches(fixtures: Sequence[Fixture], arenas: int) -> list[list[Fixture]]:
    """The matches one runner plays at once.

    Args:
        fixtures: the round's matches, in order.
        arenas: matches per batch.

    Returns:
        `fixtures` in order, `arenas` at a time.
    """
    return [list(fixtures[start:start + arenas]) for start in range(0, len(fixtures), arenas)]


def play_batches(runner: MatchRunner, fixtures: Sequence[Fixture],
                 entrants: dict[str, Contender], deterministic: bool
                 ) -> Iterator[list[ratings.Match]]:
    """Matches on one runner in this process, `runner.arenas()` at a time.

    Args:
        runner: the runner.
        fixtures: the matches, in order.
        entrants: the contenders by label.
        deterministic: play each policy's mode instead of sampling.

    Yields:
        Each batch's results as it finishes, in the order of `fixtures`.

    Raises:
        EnvironmentCrashed: the environment died (no retry here).
    """
    for batch in batches(fixtures, runner.arenas()):
        found, _ = runner.run(batch, entrants, {}, deterministic)
        yield found


def progress_bar(config: TournamentConfig) -> Any:
    """The tournament's progress bar on stderr, in matches (up to the budget).

    Args:
        config: the tournament's settings (`progress` off hides it).

    Returns:
        The tqdm bar.
    """
    return tqdm(total=config.matches, unit="match", desc="tournament",
                disable=not config.progress, file=sys.stderr, dynamic_ncols=True)


def play_plain(entrants: Sequence[Contender], config: TournamentConfig, env: TournamentEnv
               ) -> TournamentResult:
    """Every match in this process, on one environment, round after round: the reference for
    `deploy.evaluation.tournament_ray.play_on_ray` (the same matches, seeds and results).
    `env.arenas` matches at a time, or for a build without it, as many as the scene has arenas
    (the result's `env` records the number).

    Args:
        entrants: the contenders.
        config: the tournament's settings.
        env: the scene.

    Returns:
        The result; on Ctrl-C the rounds played so far (`interrupted=True`).

    Raises:
        ValueError: the budget has no room for one round, or the scene is not one of two teams
            sharing a behavior.
        EnvironmentCrashed: the environment died (the plain loop does not retry).
    """
    started = time.perf_counter()
    result = TournamentResult(list(entrants), config, env)
    schedule = Schedule(result.labels, config.schedule())
    by_label = {c.label: c for c in entrants}
    runner = MatchRunner("plain", env, device="cpu", precision=config.precision)
    result.runners.append(runner.info())
    bar = progress_bar(config)
    played: list[ratings.Match] = []
    try:
        result.env = dataclasses.replace(env, arenas=runner.arenas())
        fixtures = schedule.next_round(played)
        while fixtures:
            round_played = []
            for found in play_batches(runner, fixtures, by_label, config.deterministic):
                round_played += found
                bar.update(len(found))
            played += round_played
            fixtures = schedule.next_round(played)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        bar.close()
        runner.close()
    result.matches = sorted(played, key=lambda match: match.index)
    result.selection = schedule.outcome(result.matches)
    result.seconds = time.perf_counter() - started
    return result


def check_budget(entrants: Sequence[Contender], config: TournamentConfig) -> None:
    """Refuse a budget that has no room for one round, before anything runs.

    Args:
        entrants: the contenders.
        config: the tournament's settings.

    Raises:
        ValueError: with the numbers.
    """
    Schedule([c.label for c in entrants], config.schedule())


__all__ = ["Contender", "MatchRunner", "TournamentConfig", "TournamentEnv",
           "TournamentResult", "batches", "check_budget", "contenders", "play_batches",
           "play_plain"]
