"""Team scenes in a watch: each new checkpoint plays matches against a pool (the fixed opponents
the watch began with: scripted players and policies the user names, then every earlier
checkpoint), and the whole pool is refitted (Bradley-Terry ratings on the Elo scale, each with
its stratified-bootstrap interval) as matches arrive.

Matches are those of `huggy tournament`: played by its runners (`deploy.evaluation.tournament`),
scheduled in its couples (two matches per pair, sides swapped; `deploy.evaluation.matchmaking`)
and rated by its ratings (`deploy.evaluation.ratings`). The schedule is a function of the pool's
order of entry and the matches played, never of time: the member that entered k-th owes `rounds`
rounds against every member before it (one couple per member a round), then `adaptive_rounds`
rounds whose couples go to its pairs whose order is least certain (`uncertain_shares`, from the
fit of every match before the round). Matches are numbered across the whole watch, match i seeded
`seed + i`, so a watch started again after a kill owes and plays the same matches, and its
ratings, from the matches taken in index order, are the same. A watch does the following through
`PoolRating`, its `TeamRating` where `is_team_scene`:

    members = [opponent("heuristic:chaser")]             # then, as the watch takes each one:
    members.append(checkpoint(record))
    step = pool_step(members, store, PlainMatchPlayer(TournamentEnv()), config)  # one round
    ...  # step.ratings (Elo with intervals), step.scalars(); again while step.owed
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch

from deploy.evaluation import ratings
from deploy.evaluation.matchmaking import Fixture, couples, order_z, uncertain_shares
from deploy.evaluation.plan import ENV_SEED_LIMIT
from deploy.evaluation.runner import free_worker_id
from deploy.evaluation.sinks import write_scalars
from deploy.evaluation.tournament import (
    Contender,
    MatchRunner,
    TournamentConfig,
    TournamentEnv,
    TournamentResult,
    play_batches,
)
from deploy.evaluation.tournament_report import (
    build_tournament_report,
    elo_scalars,
    write_tournament_report,
)
from deploy.watch.loop import EVENTS_SUFFIX
from deploy.watch.store import PolicyRecord, WatchStore
from envs.heuristics import is_heuristic, load_heuristic
from envs.matches import team_behaviors
from envs.teams import BUILTIN, TeamsEnv, builtin_stand_in
from huggy_agent import HuggyAgent


@dataclass(frozen=True)
class PoolMember:
    """A policy of the pool: a fixed opponent (`kind` "opponent") or a checkpoint of a followed
    run (`kind` "checkpoint"), as the tournament's runners take it (`contender`)."""

    contender: Contender
    fingerprint: str
    kind: str

    @property
    def label(self) -> str:
        return self.contender.label


def opponent(source: str, label: str | None = None) -> PoolMember:
    """A fixed opponent: a scripted player (`heuristic:NAME`) or a policy file the user names.

    Args:
        source: `heuristic:idle`, `heuristic:random`, `heuristic:chaser`, or a policy file.
        label: its label (default: `source`).

    Returns:
        The member, with its fingerprint.

    Raises:
        ValueError: an unknown scripted player, or a file no loader reads.
        FileNotFoundError: a file that does not exist.
    """
    if is_heuristic(source):
        fingerprint = load_heuristic(source).fingerprint
        return PoolMember(Contender(label or source, heuristic=source), fingerprint, "opponent")
    fingerprint = HuggyAgent.from_checkpoint(source, device="cpu").fingerprint
    return PoolMember(Contender(label or source, path=source), fingerprint, "opponent")


def checkpoint(record: PolicyRecord) -> PoolMember:
    """A checkpoint the watch took, as a member of the pool.

    Args:
        record: its record in the watch's database (its own copy of the file).

    Returns:
        The member.

    Raises:
        ValueError: a record without a file (a served policy the runners reach by URL only:
            a team scene's runners load policies from files).
    """
    if record.path is None:
        raise ValueError(f"{record.label!r}: a team scene plays policy files, and this one has "
                         f"none here (served at {record.url!r})")
    return PoolMember(Contender(record.label, path=record.path, run=record.run, step=record.step,
                                folder=record.folder), record.fingerprint, "checkpoint")


@dataclass(frozen=True)
class PoolConfig:
    """How a team scene schedules and rates its pool.

    Raises:
        ValueError: a seed outside the environment's seed range, `rounds` not an integer >= 1,
            `adaptive_rounds` or `resamples` not an integer >= 0 (resamples >= 1), a confidence
            outside (0, 1), or a smoothing that is not a finite number > 0.
    """

    seed: int = 0
    """Match i of the watch is seeded `seed + i`."""
    rounds: int = 2
    """Round-robin rounds each new member plays against every member before it."""
    adaptive_rounds: int = 2
    """Further rounds, of one couple per earlier member, given to its least certain pairs."""
    confidence: float = ratings.DEFAULT_CONFIDENCE
    resamples: int = ratings.DEFAULT_RESAMPLES
    smoothing: float = ratings.SMOOTHING
    anchor: dict[str, float] | None = None
    """`{label: elo}` fixes one member's rating (a fixed opponent's keeps checkpoints comparable
    as the pool grows); None centres the mean at 1200, as `huggy tournament` does."""
    deterministic: bool = False
    """Play each policy's mode instead of sampling."""

    def __post_init__(self) -> None:
        def whole(name: str, least: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")

        whole("seed", 0)
        whole("rounds", 1)
        whole("adaptive_rounds", 0)
        whole("resamples", 1)
        if self.seed >= ENV_SEED_LIMIT:
            raise ValueError(f"seed must be below {ENV_SEED_LIMIT} (environment seeds travel as "
                             f"float32), got {self.seed}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")
        if not (math.isfinite(self.smoothing) and self.smoothing > 0):
            raise ValueError(f"smoothing must be a finite number > 0, got {self.smoothing!r}")

    def settings(self) -> dict[str, Any]:
        """The settings a watch records (`WatchStore.check_settings`) for its team scene.

        Returns:
            JSON-ready settings.
        """
        return {"pool": asdict(self)}


def scheduled_matches(members: int, config: PoolConfig) -> int:
    """How many matches the whole schedule of a pool holds: the k-th member (from 0) plays
    `rounds + adaptive_rounds` rounds of k couples.

    Args:
        members: the pool's size.
        config: the schedule's settings.

    Returns:
        The matches.
    """
    return (config.rounds + config.adaptive_rounds) * members * (members - 1)


def index_prefix(played: Iterable[ratings.Match]) -> list[ratings.Match]:
    """The matches taken in index order: those numbered 0, 1, 2, ... up to the first missing one,
    so what is rated never depends on which runner finished first.

    Args:
        played: matches, in any order.

    Returns:
        The prefix, by index.
    """
    found = []
    for expected, match in enumerate(sorted(played, key=lambda m: m.index)):
        if match.index != expected:
            break
        found.append(match)
    return found


def owed_round(labels: Sequence[str], config: PoolConfig, played: Sequence[ratings.Match]
               ) -> list[Fixture]:
    """The pool's next round: the first round of the schedule (see the module's docstring) that
    `played` does not complete, less the matches of it already played.

    Args:
        labels: the pool's members, in order of entry.
        config: the schedule's settings.
        played: the matches taken in index order (`index_prefix`).

    Returns:
        Its fixtures still to play, by index; [] when every member has played all its rounds.

    Raises:
        ValueError: a played match that is not the scheduled one (another pool or other
            settings), or a match seed past the environment's seed range.
    """
    done = {match.index: match for match in played}
    start = 0
    for newest in range(1, len(labels)):
        earlier = [(member, newest) for member in range(newest)]
        for round_index in range(config.rounds + config.adaptive_rounds):
            if round_index < config.rounds:
                pairs = earlier
            else:
                pairs = _uncertain_pairs(labels[:newest + 1], earlier, config,
                                         [done[k] for k in range(start)])
            fixtures = couples(labels, pairs, config.seed, start)
            if fixtures[-1].seed > ENV_SEED_LIMIT:
                raise ValueError(f"match {fixtures[-1].index} would be seeded "
                                 f"{fixtures[-1].seed}, past the environment's seed range "
                                 f"(<= {ENV_SEED_LIMIT}); start the watch with a smaller seed")
            owed = [fixture for fixture in fixtures if fixture.index not in done]
            for fixture in fixtures:
                if fixture.index in done:
                    _check_scheduled(done[fixture.index], fixture)
            if owed:
                return owed
            start += len(fixtures)
    return []


def _uncertain_pairs(labels: Sequence[str], candidates: list[tuple[int, int]],
                     config: PoolConfig, before: Sequence[ratings.Match]) -> list[tuple[int, int]]:
    """One couple per candidate pair, apportioned by how uncertain each pair's order is after
    `before` (the tournament's adaptive rounds)."""
    fit = ratings.fit_elo(before, labels, smoothing=config.smoothing)
    shares = uncertain_shares(len(candidates), order_z(fit, ratings.elo_covariance(fit),
                                                       candidates))
    return [pair for pair, count in zip(candidates, shares, strict=True) for _ in range(count)]


def _check_scheduled(match: ratings.Match, fixture: Fixture) -> None:
    if (match.seed, match.team0, match.team1) != (fixture.seed, fixture.team0, fixture.team1):
        raise ValueError(f"recorded match {match.index} ({match.team0!r} vs {match.team1!r}, "
                         f"seed {match.seed}) is not the scheduled one ({fixture.team0!r} vs "
                         f"{fixture.team1!r}, seed {fixture.seed}): the database holds another "
                         f"pool; start the watch with the same opponents, or use another --db")


def refit(labels: Sequence[str], played: Sequence[ratings.Match], config: PoolConfig
          ) -> ratings.Ratings | None:
    """The ratings of the whole pool from its matches, as `huggy tournament` rates them.

    Args:
        labels: the pool's members, in order of entry.
        played: the matches taken in index order (`index_prefix`).
        config: the fit's and the bootstrap's settings (its seed seeds the bootstrap).

    Returns:
        The ratings of the members that played, best first; None before the first match.

    Raises:
        ValueError: an anchor that names no member that played.
    """
    if not played:
        return None
    playing = {label for match in played for label in (match.team0, match.team1)}
    rated = [label for label in labels if label in playing]
    anchor = config.anchor
    if anchor is not None and not set(anchor) <= playing:
        raise ValueError(f"anchor: {sorted(anchor)} must name a member that has played, got "
                         f"{sorted(playing)}")
    return ratings.rate(played, rated, anchor=anchor, smoothing=config.smoothing,
                        confidence=config.confidence, resamples=config.resamples,
                        seed=config.seed)


class MatchPlayer(Protocol):
    """Where a team scene's matches run."""

    def play(self, fixtures: Sequence[Fixture], entrants: Mapping[str, Contender],
             deterministic: bool) -> Iterator[tuple[list[ratings.Match], str]]:
        """Play matches.

        Args:
            fixtures: the matches.
            entrants: the members' contenders by label.
            deterministic: play each policy's mode instead of sampling.

        Returns:
            An iterator of each batch's results as it finishes, with the name of the runner
                that played it.
        """
        ...


class PlainMatchPlayer:
    """Matches in this process on one environment (`--no-ray`): the tournament's `MatchRunner`,
    `env.arenas` matches at a time, the environment kept open across rounds and checkpoints.

    Args:
        env: the scene.
        precision: the precision of the policy copies.
    """

    def __init__(self, env: TournamentEnv, precision: str = "fp32") -> None:
        self._runner = MatchRunner("plain", env, device="cpu", precision=precision)

    def play(self, fixtures: Sequence[Fixture], entrants: Mapping[str, Contender],
             deterministic: bool) -> Iterator[tuple[list[ratings.Match], str]]:
        """Play matches, a batch of one per arena at a time, with one torch thread (as
        `huggy evaluate --no-ray` runs its items: the scene's own process needs the other cores).

        Args:
            fixtures: the matches.
            entrants: the members' contenders by label.
            deterministic: play each policy's mode instead of sampling.

        Yields:
            Each batch's results and the runner's name ("plain").

        Raises:
            EnvironmentCrashed: the environment died (the next call opens a new one).
        """
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for found in play_batches(self._runner, fixtures, dict(entrants), deterministic):
                yield found, "plain"
        finally:
            torch.set_num_threads(threads)

    def close(self) -> None:
        """Close the environment."""
        self._runner.close()


@dataclass(frozen=True)
class PoolStep:
    """Where the pool stands after a step: its ratings and what it still owes."""

    members: tuple[PoolMember, ...]
    ratings: ratings.Ratings | None
    """The ratings of the members that have played, from the first `matches` matches."""
    matches: int
    """Matches taken in index order."""
    played_now: int
    """Matches this step played and recorded."""
    owed: tuple[Fixture, ...] = field(default=())
    """The next round still to play; () when the schedule of this pool is complete."""
    rated_at: str | None = None
    """When these ratings were first made (UTC ISO)."""

    def scalars(self) -> dict[str, list[tuple[int, dict[str, float | None]]]]:
        """The checkpoints' ratings as TensorBoard scalars: `Evaluation/Elo` and its interval's
        bounds at each checkpoint's training step, in its run's folder.

        Returns:
            {run: [(step, {tag: value})]}, as `deploy.evaluation.sinks.write_scalars` takes them;
                {} before the first match.
        """
        if self.ratings is None:
            return {}
        steps: dict[str, tuple[str, int]] = {}
        for member in self.members:
            run, step = member.contender.run, member.contender.step
            if run is not None and step is not None:
                steps[member.label] = (run, step)
        return elo_scalars(self.ratings, steps)

    def line(self, label: str) -> str:
        """One progress line for a member, as a watch prints it after a refit.

        Args:
            label: the member.

        Returns:
            "LABEL: Elo E [LOW, HIGH] after N matches (M in the pool)", or that it has not
                played yet.
        """
        rating = None if self.ratings is None else self.ratings.policies.get(label)
        if rating is None:
            return f"{label}: no match yet ({self.matches} in the pool)"
        low, high = rating.elo_ci
        return (f"{label}: Elo {rating.elo:.0f} [{low:.0f}, {high:.0f}] after {rating.matches} "
                f"matches ({self.matches} in the pool)")

    def record(self) -> dict[str, Any]:
        """The JSON form kept in the database and in watch.json.

        Returns:
            "matches", "members" [{"label", "kind", "fingerprint", "run", "step"}] and the
                ratings' JSON form (`ratings.Ratings.as_dict`: "ratings", "pairs", "best", "fit").
        """
        found: dict[str, Any] = {
            "matches": self.matches,
            "members": [{"label": m.label, "kind": m.kind, "fingerprint": m.fingerprint,
                         "run": m.contender.run, "step": m.contender.step}
                        for m in self.members]}
        if self.ratings is not None:
            found.update(self.ratings.as_dict())
        return found


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def pool_step(members: Sequence[PoolMember], store: WatchStore, player: MatchPlayer,
              config: PoolConfig, now: Callable[[], str] = _now) -> PoolStep:
    """One step of a team scene, the call a watch makes whenever the pool may owe matches: play
    the next owed round (each batch recorded as it comes back), then refit the whole pool from
    the matches taken in index order and keep the ratings in the database.

    A watch calls it after adding a checkpoint to `members`, and again while `owed` is not
    empty; started again after a kill with the same members, it plays only what the database
    lacks and reaches the same ratings.

    Args:
        members: the pool, in order of entry (fixed opponents first, then checkpoints as taken).
        store: the watch's database.
        player: where matches run.
        config: the schedule's and the ratings' settings.
        now: the clock (UTC ISO).

    Returns:
        The pool's ratings, and the round it owes next.

    Raises:
        ValueError: repeated labels, recorded matches of another pool, or a bad anchor.
        EnvironmentCrashed: the scene died while playing (what came back before is kept).
    """
    labels = [m.label for m in members]
    if len(set(labels)) != len(labels):
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        raise ValueError(f"each member of the pool may enter once, got {repeated} more than once")
    fingerprints = {m.label: m.fingerprint for m in members}
    entrants = {m.label: m.contender for m in members}
    # a database written by a watch that had taken more checkpoints holds their matches too
    scheduled = scheduled_matches(len(members), config)
    played_now = 0
    fixtures = owed_round(labels, config, index_prefix(store.matches())[:scheduled])
    if fixtures:
        for found, runner in player.play(fixtures, entrants, config.deterministic):
            played_now += store.add_matches(found, fingerprints, runner, now())
    played = index_prefix(store.matches())[:scheduled]
    owed = owed_round(labels, config, played)
    rated = refit(labels, played, config)
    step = PoolStep(tuple(members), rated, len(played), played_now, tuple(owed))
    if rated is None:
        return step
    at = store.record_pool_ratings(len(played), now(), step.record())
    return PoolStep(step.members, rated, step.matches, played_now, step.owed, at)


def rate_pool(members: Sequence[PoolMember], store: WatchStore, player: MatchPlayer,
              config: PoolConfig, on_step: Callable[[PoolStep], None] | None = None,
              now: Callable[[], str] = _now) -> PoolStep:
    """Every match the pool owes, round by round (`pool_step`), then its ratings.

    Args:
        members: the pool, in order of entry.
        store: the watch's database.
        player: where matches run.
        config: the schedule's and the ratings' settings.
        on_step: called with each step's ratings (to show them as they arrive).
        now: the clock (UTC ISO).

    Returns:
        The last step: the ratings of the whole schedule.

    Raises:
        ValueError: as `pool_step` raises.
        EnvironmentCrashed: the scene died while playing.
    """
    while True:
        step = pool_step(members, store, player, config, now)
        if on_step is not None:
            on_step(step)
        if not step.owed:
            return step



def tournament_result(store: WatchStore) -> tuple[TournamentResult, dict[str, float] | None]:
    """A team scene's watch database as a tournament's result, for `huggy tournament --db`: every
    member that played (the fixed opponents, then the checkpoints in the order taken) and every
    match taken in index order, as `huggy tournament` would have played them.

    Args:
        store: the database.

    Returns:
        The result, and the pool's anchor (None: the mean at 1200).

    Raises:
        ValueError: a database of a single-behavior scene's watch, or of no watch yet.
    """
    settings = store.settings()
    if "pool" not in settings:
        raise ValueError(f"{store.path} holds no team scene's watch (no pool settings); a "
                         "single-behavior scene's database is read by huggy evaluate --db")
    played = index_prefix(store.matches())
    taken = {record.label: checkpoint(record).contender for record in store.policies()}
    labels = dict.fromkeys(label for match in played for label in (match.team0, match.team1))
    fixed = [Contender(label, heuristic=label) if is_heuristic(label) else Contender(label,
                                                                                    path=label)
             for label in labels if label not in taken]
    contenders = fixed + [contender for label, contender in taken.items() if label in labels]
    pool = settings["pool"]
    config = TournamentConfig(matches=len(played), seed=pool["seed"],
                              deterministic=pool["deterministic"], confidence=pool["confidence"],
                              progress=False)
    env = TournamentEnv(file_name=settings["env"]["file_name"],
                        parameters=settings["env"]["parameters"])
    return TournamentResult(contenders, config, env, played), pool["anchor"]


def is_team_scene(file_name: str) -> bool:
    """Whether a watch's `--env` is a scene whose two teams share a behavior (`B?team=0`,
    `B?team=1`), as `huggy tournament` plays: "builtin:soccertwos" is; "builtin" (Huggy) is
    not; a build is opened once, headless, and its behaviors read.

    Args:
        file_name: "builtin", "builtin:<scene>" or a Unity build.

    Returns:
        True for a team scene.

    Raises:
        FileNotFoundError: a build that is not there.
        EnvironmentStartError: a build that could not be started.
    """
    if file_name == BUILTIN or file_name.startswith(BUILTIN + ":"):
        return builtin_stand_in(file_name) == "soccertwos"
    with TeamsEnv(file_name, worker_id=free_worker_id()) as env:
        try:
            team_behaviors(env.behaviors)
        except ValueError:
            return False
    return True


class PoolRating:
    """A watch's team scene (`deploy.watch.loop.TeamRating`): the fixed opponents enter the pool
    first, then each checkpoint as the watch takes it; whenever the pool grew or owes matches,
    `pool_step` plays its next round and refits it. After each refit: one progress line (the
    newest member that has played, `PoolStep.line`), `Evaluation/Elo` and its bounds at each
    checkpoint's step in its run's own TensorBoard folder (beside the trainer's scalars), and with
    `report_dir`, `huggy tournament`'s report of every match recorded (`tournament_result`).

    Args:
        opponents: the fixed opponents, in order.
        player: where matches run.
        config: the schedule's and the ratings' settings.
        tensorboard: write the scalars.
        output: where progress lines go.
        report_dir: where to rewrite the tournament's report after each refit (None: nowhere).
    """

    def __init__(self, opponents: Sequence[PoolMember], player: MatchPlayer, config: PoolConfig,
                 tensorboard: bool = True, output: TextIO = sys.stdout,
                 report_dir: Path | None = None) -> None:
        self.opponents = list(opponents)
        self.player = player
        self.config = config
        self.tensorboard = tensorboard
        self.report_dir = report_dir
        self._output = output
        self.last: PoolStep | None = None
        """The last refit."""

    def rate(self, policies: Sequence[PolicyRecord], store: WatchStore) -> bool:
        """Play the pool's next round and refit it, when it grew or owes matches.

        Args:
            policies: every checkpoint taken so far, in order.
            store: the database.

        Returns:
            True when the pool was refitted; False before the first checkpoint, and when the pool
                neither grew nor owes matches.

        Raises:
            ValueError: a policy without a file, or a database that holds another pool's matches.
            EnvironmentCrashed: the scene died while playing (what came back before is kept).
        """
        if not policies:
            return False
        members = [*self.opponents, *(checkpoint(record) for record in policies)]
        if (self.last is not None and not self.last.owed
                and len(self.last.members) == len(members)):
            return False
        self.last = pool_step(members, store, self.player, self.config)
        playing = [] if self.last.ratings is None else list(self.last.ratings.policies)
        newest = next((m.label for m in reversed(members) if m.label in playing),
                      members[-1].label)
        print(self.last.line(newest), file=self._output, flush=True)
        if self.tensorboard:
            self._write_tensorboard(self.last, policies)
        if self.report_dir is not None:
            result, anchor = tournament_result(store)
            write_tournament_report(build_tournament_report(result, anchor), self.report_dir)
        return True

    def owes(self) -> bool:
        """Whether the pool owes matches.

        Returns:
            True from a refit that left a round to play until the one that played the last.
        """
        return self.last is not None and bool(self.last.owed)

    def summary(self) -> dict[str, Any]:
        """The pool as watch.json holds it.

        Returns:
            "pool": the last refit's record (`PoolStep.record`, with its `rated_at`), None before
                the first; "best": the checkpoint rated highest, None before one has played.
        """
        if self.last is None:
            return {"pool": None, "best": None}
        pool = {**self.last.record(), "rated_at": self.last.rated_at}
        rated = pool.get("ratings", {})
        checkpoints = [m.label for m in self.last.members
                       if m.kind == "checkpoint" and m.label in rated]
        best = max(checkpoints, key=lambda label: rated[label]["elo"], default=None)
        return {"pool": pool, "best": best}

    @staticmethod
    def _write_tensorboard(step: PoolStep, policies: Sequence[PolicyRecord]) -> None:
        """Every rated checkpoint of a run in that run's behavior folder, replacing the watch's
        earlier event files there."""
        places = {record.run: (record.folder, Path(record.source).parent.name)
                  for record in policies if record.folder is not None}
        for run, points in step.scalars().items():
            if run in places:
                folder, behavior = places[run]
                write_scalars({behavior: points}, str(folder), EVENTS_SUFFIX)
