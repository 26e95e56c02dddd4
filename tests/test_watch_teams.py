"""Team scenes in `huggy watch` (deploy/watch/teams.py): the pool's schedule worked out by hand,
matches recorded once, ratings after a kill equal to an uninterrupted watch's (a synthetic arena,
as the tournament's schedule tests use), and the target on the stand-in SoccerTwos: a run's
checkpoints rated live with intervals, whose final ratings agree with `huggy tournament` on the
same policies."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from deploy.evaluation import ratings
from deploy.evaluation.matchmaking import Fixture
from deploy.evaluation.tournament import Contender, TournamentConfig, TournamentEnv
from deploy.watch.store import WatchStore
from deploy.watch.teams import (
    PlainMatchPlayer,
    PoolConfig,
    PoolMember,
    PoolStep,
    checkpoint,
    index_prefix,
    opponent,
    owed_round,
    pool_step,
    rate_pool,
    refit,
)
from envs.standin.launcher import builtin_soccertwos_path
from tests.support.ray_cluster import RayCluster
from tests.support.soccer_run import SOCCER_STEPS, write_soccer_run


def member(label: str, run: str | None = None, step: int | None = None) -> PoolMember:
    return PoolMember(Contender(label, heuristic="heuristic:idle", run=run, step=step),
                      f"fp-{label}", "checkpoint" if run else "opponent")


def played(fixture: Fixture, score: float) -> ratings.Match:
    return fixture.played(score)


# --- the schedule, by hand ------------------------------------------------------------------------


def test_each_new_member_owes_couples_against_every_earlier_one() -> None:
    """a, b, c with one round each: b plays a (a as team 0 first), then c plays a and b; match i
    is seeded 7 + i; nothing is owed once every match is in."""
    labels = ["a", "b", "c"]
    config = PoolConfig(seed=7, rounds=1, adaptive_rounds=0)
    first = owed_round(labels, config, [])
    assert [(f.index, f.seed, f.team0, f.team1) for f in first] == [
        (0, 7, "a", "b"), (1, 8, "b", "a")]
    done = [played(f, 1.0) for f in first]
    second = owed_round(labels, config, done)
    assert [(f.index, f.seed, f.team0, f.team1) for f in second] == [
        (2, 9, "a", "c"), (3, 10, "c", "a"), (4, 11, "b", "c"), (5, 12, "c", "b")]
    assert owed_round(labels, config, done + [played(f, 0.5) for f in second]) == []
    # the pool grows: the new member's round follows, numbered on
    fourth = owed_round([*labels, "d"], config, done + [played(f, 0.5) for f in second])
    assert [(f.index, f.team0, f.team1) for f in fourth][:2] == [(6, "a", "d"), (7, "d", "a")]
    assert len(fourth) == 6


def test_a_round_partly_played_owes_only_the_rest() -> None:
    labels = ["a", "b", "c"]
    config = PoolConfig(rounds=1, adaptive_rounds=0)
    fixtures = owed_round(labels, config, [])
    rest = [played(f, 1.0) for f in fixtures] + [
        played(f, 0.0) for f in owed_round(labels, config, [played(f, 1.0) for f in fixtures])
        if f.index in (2, 3)]
    assert [f.index for f in owed_round(labels, config, rest)] == [4, 5]


def test_adaptive_rounds_go_to_the_least_certain_pair() -> None:
    """b beat a 7 times of 8 (its three round-robin rounds and its adaptive one); in c's three
    round-robin rounds c beat a 5 times of 6 and drew b 6 times. The fit puts a about 300 Elo
    below both, b and c 13 apart: z(a, c) is about 2.0 (weight Phi(-2.0) = 0.02), z(b, c) about
    0.1 (weight 0.46). c's adaptive round, two couples (one per earlier member) apportioned by
    those weights (2 x 0.02 / 0.48 = 0.09 and 1.91), goes wholly to b."""
    labels = ["a", "b", "c"]
    config = PoolConfig(rounds=3, adaptive_rounds=1)
    done: list[ratings.Match] = []
    for round_index in range(4):  # b against a: a wins only its first match, as team 0
        done += [played(f, 1.0 if (round_index, f.team0) == (0, "a") else
                        0.0 if f.team0 == "a" else 1.0) for f in owed_round(labels, config, done)]
    assert len(done) == 8 and {(m.team0, m.team1) for m in done} == {("a", "b"), ("b", "a")}
    for round_index in range(3):
        fixtures = owed_round(labels, config, done)
        assert [(f.team0, f.team1) for f in fixtures] == [("a", "c"), ("c", "a"), ("b", "c"),
                                                          ("c", "b")]
        scores = {("a", "c"): 0.0, ("c", "a"): 0.0 if round_index == 2 else 1.0,
                  ("b", "c"): 0.5, ("c", "b"): 0.5}
        done += [played(f, scores[(f.team0, f.team1)]) for f in fixtures]
    adaptive = owed_round(labels, config, done)
    assert [(f.index, f.team0, f.team1) for f in adaptive] == [
        (20, "b", "c"), (21, "c", "b"), (22, "b", "c"), (23, "c", "b")]


def test_recorded_matches_of_another_pool_are_refused() -> None:
    config = PoolConfig(rounds=1, adaptive_rounds=0)
    other = [played(f, 1.0) for f in owed_round(["a", "x"], config, [])]
    with pytest.raises(ValueError, match="recorded match 0 \\('a' vs 'x', seed 0\\) is not the "
                                         "scheduled one \\('a' vs 'b', seed 0\\)"):
        owed_round(["a", "b"], config, other)


def test_only_matches_taken_in_index_order_count() -> None:
    fixtures = owed_round(["a", "b", "c"], PoolConfig(rounds=1, adaptive_rounds=0), [])
    assert index_prefix([played(fixtures[1], 1.0)]) == []
    assert [m.index for m in index_prefix([played(f, 1.0) for f in fixtures])] == [0, 1]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="rounds must be an integer >= 1, got 0"):
        PoolConfig(rounds=0)
    with pytest.raises(ValueError, match="confidence must be in \\(0, 1\\), got 1.0"):
        PoolConfig(confidence=1.0)


# --- the refit ----------------------------------------------------------------------------------


def test_refit_of_two_members_is_the_log_odds_of_their_record() -> None:
    """3 wins of a to 1 of b: Elo_a - Elo_b = 400 log10(3) (smoothing 1e-9, so the pseudo-matches
    move it by far less than the tolerance), centred on 1200; d, who has not played, is left
    out."""
    config = PoolConfig(rounds=2, adaptive_rounds=0, smoothing=1e-9, resamples=200)
    fixtures = owed_round(["a", "b"], config, [])
    fixtures += owed_round(["a", "b"], config, [played(f, 1.0) for f in fixtures])
    results = [1.0, 0.0, 1.0, 1.0]  # a wins as team 0, as team 1, as team 0; b wins as team 0
    rated = refit(["a", "b", "d"], [played(f, s) for f, s in zip(fixtures, results, strict=True)],
                  config)
    assert rated is not None and list(rated.policies) == ["a", "b"]
    a, b = rated.policies["a"], rated.policies["b"]
    assert a.elo - b.elo == pytest.approx(400 * math.log10(3), abs=1e-4)
    assert (a.elo + b.elo) / 2 == pytest.approx(1200.0)
    assert (a.wins, a.losses, b.wins, b.losses) == (3, 1, 1, 3)
    assert a.elo_ci[0] <= a.elo <= a.elo_ci[1]
    assert refit(["a", "b"], [], config) is None
    step = PoolStep((member("a"), member("b"), member("d")), rated, 4, 4)
    assert step.line("a") == (f"a: Elo {a.elo:.0f} [{a.elo_ci[0]:.0f}, {a.elo_ci[1]:.0f}] "
                              f"after 4 matches (4 in the pool)")
    assert round(a.elo) == 1200 + round(200 * math.log10(3))  # 1295
    assert step.line("d") == "d: no match yet (4 in the pool)"
    anchored = refit(["a", "b"], [played(f, s) for f, s in zip(fixtures, results, strict=True)],
                     PoolConfig(smoothing=1e-9, resamples=200, anchor={"b": 1000.0}))
    assert anchored is not None and anchored.policies["b"].elo == pytest.approx(1000.0)
    assert anchored.policies["a"].elo == pytest.approx(1000.0 + 400 * math.log10(3), abs=1e-4)
    with pytest.raises(ValueError, match=r"anchor: \['d'\] must name a member that has played"):
        refit(["a", "b", "d"], [played(f, 1.0) for f in fixtures],
              PoolConfig(anchor={"d": 1000.0}))


# --- recording and restarting, on a synthetic arena -----------------------------------------------

STRENGTH = {"idle": 0.0, "c@1": 200.0, "c@2": 400.0, "c@3": 600.0}


class SyntheticPlayer:
    """An arena whose result is a function of the fixture alone (as `matchmaking.simulate`'s
    sampler): team 0 wins with the Elo model's probability of the two strengths above, drawn from
    a generator seeded by the match's seed. `stop_after` batches, it raises, as a kill would end
    the watch."""

    def __init__(self, stop_after: int | None = None, arenas: int = 3) -> None:
        self.stop_after = stop_after
        self.arenas = arenas
        self.batches = 0

    def play(self, fixtures: Sequence[Fixture], entrants: Mapping[str, Contender],
             deterministic: bool) -> Iterator[tuple[list[ratings.Match], str]]:
        for start in range(0, len(fixtures), self.arenas):
            if self.stop_after is not None and self.batches == self.stop_after:
                raise KeyboardInterrupt
            self.batches += 1
            found = []
            for fixture in fixtures[start:start + self.arenas]:
                p = float(ratings.expected_score(STRENGTH[fixture.team0],
                                                 STRENGTH[fixture.team1]))
                won = random.Random(fixture.seed).random() < p
                found.append(fixture.played(1.0 if won else 0.0))
            yield found, "synthetic"


def checkpoints_as_taken() -> list[list[PoolMember]]:
    """The pool after each of three checkpoints is taken, one fixed opponent first."""
    pool = [member("idle")]
    grown = []
    for step in (1, 2, 3):
        pool = [*pool, member(f"c@{step}", run="c", step=step)]
        grown.append(pool)
    return grown


def watch(store: WatchStore, player: SyntheticPlayer, config: PoolConfig) -> list[dict]:
    """A watch's team scene: after each checkpoint is taken, steps until nothing is owed."""
    records = []
    for pool in checkpoints_as_taken():
        records.append(rate_pool(pool, store, player, config).record())
    return records


def test_a_killed_watch_started_again_counts_each_match_once_and_rates_alike(
        tmp_path: Path) -> None:
    config = PoolConfig(seed=11, rounds=2, adaptive_rounds=1, resamples=300)
    whole = WatchStore(tmp_path / "whole.db")
    expected = watch(whole, SyntheticPlayer(), config)
    # 3 checkpoints: 1, 2 and 3 earlier members, 3 rounds of one couple each per member
    assert expected[-1]["matches"] == 3 * 2 * (1 + 2 + 3)
    stop = random.Random(5).randrange(1, 10)  # the kill point, in batches
    killed = WatchStore(tmp_path / "killed.db")
    with pytest.raises(KeyboardInterrupt):
        watch(killed, SyntheticPlayer(stop_after=stop), config)
    killed.close()
    again = WatchStore(tmp_path / "killed.db")
    found = watch(again, SyntheticPlayer(), config)
    assert found == expected
    assert [m.index for m in again.matches()] == list(range(36))
    assert again.matches() == whole.matches()
    # the ratings after each checkpoint's last round, kept once each
    kept = {count: record for count, _, record in again.pool_ratings()}
    assert [kept[r["matches"]] for r in expected] == expected


def test_a_watch_with_other_pool_settings_is_refused(tmp_path: Path) -> None:
    store = WatchStore(tmp_path / "watch.db")
    store.check_settings(PoolConfig(rounds=2).settings())
    store.check_settings(PoolConfig(rounds=2).settings())
    with pytest.raises(ValueError, match="pool.rounds: 2 recorded, 3 now"):
        store.check_settings(PoolConfig(rounds=3).settings())


def test_a_match_recorded_twice_counts_once(tmp_path: Path) -> None:
    store = WatchStore(tmp_path / "watch.db")
    fixtures = owed_round(["a", "b"], PoolConfig(), [])
    matches = [played(f, 1.0) for f in fixtures]
    prints = {"a": "fp-a", "b": "fp-b"}
    assert store.add_matches(matches, prints, "r1", "2026-01-01T00:00:00+00:00") == 2
    assert store.add_matches(matches[1:], prints, "r2", "2026-01-01T00:00:01+00:00") == 0
    assert store.matches() == matches
    with pytest.raises(KeyError):
        store.add_matches([played(fixtures[0], 1.0)], {"a": "fp-a"}, "r1", "now")


def test_checkpoints_are_rated_live_with_intervals_on_the_elo_scale(tmp_path: Path) -> None:
    """Each step's ratings name the new checkpoint once it has played, with an interval around
    its Elo, and the scalars carry it at its training step in its run."""
    store = WatchStore(tmp_path / "watch.db")
    config = PoolConfig(rounds=1, adaptive_rounds=0, resamples=200)
    for pool in checkpoints_as_taken():
        step = pool_step(pool, store, SyntheticPlayer(), config)
        newest = pool[-1]
        assert step.ratings is not None and newest.label in step.ratings.policies
        low, high = step.ratings.policies[newest.label].elo_ci
        assert low - 1e-3 <= step.ratings.policies[newest.label].elo <= high + 1e-3
        scalars = {s: tags for s, tags in step.scalars()["c"]}
        assert scalars[newest.contender.step]["Evaluation/Elo"] == \
            step.ratings.policies[newest.label].elo
        assert scalars[newest.contender.step]["Evaluation/Elo CI Low"] == low
        assert not step.owed and step.rated_at is not None
    # every checkpoint at its step, in its run; the fixed opponent, of no run, has none
    assert list(step.scalars()) == ["c"] and [s for s, _ in step.scalars()["c"]] == [1, 2, 3]


def test_members_are_made_from_opponents_and_records(tmp_path: Path) -> None:
    idle = opponent("heuristic:idle")
    assert idle.kind == "opponent" and idle.contender.heuristic == "heuristic:idle"
    assert len(idle.fingerprint) == 16
    with pytest.raises(ValueError, match="heuristic:nope"):
        opponent("heuristic:nope")
    store = WatchStore(tmp_path / "watch.db")
    served = store.add_policy("served", "f" * 16, "served", "http://127.0.0.1:1", "now",
                              url="http://127.0.0.1:1", policy_id="default")
    with pytest.raises(ValueError, match="a team scene plays policy files"):
        checkpoint(served)
    with pytest.raises(ValueError, match=r"each member of the pool may enter once, got \['a'\]"):
        pool_step([member("a"), member("a")], store, SyntheticPlayer(), PoolConfig())


# --- the target, on the stand-in SoccerTwos -------------------------------------------------------

@pytest.mark.standin
def test_a_soccer_run_is_rated_live_and_agrees_with_huggy_tournament(tmp_path: Path) -> None:
    """The target: a stand-in SoccerTwos run's checkpoints, taken one at a time, each rated once
    its rounds are in (Elo with an interval, written to TensorBoard at its step) against a pool of
    the chaser and the checkpoints before it, `--no-ray` in this process. The pool's final
    ratings and those of `huggy tournament` over the same policies (its own schedule and other
    match seeds: independent matches) agree within their intervals: every member's two 95%
    intervals overlap, and both name the chaser best."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from deploy.evaluation.sinks import write_scalars
    from huggy_agent.cli import main

    run = tmp_path / "results" / "SoccerTwos"
    files = write_soccer_run(run)
    store = WatchStore(tmp_path / "watch.db")
    config = PoolConfig(seed=0, rounds=2, adaptive_rounds=1, resamples=1000)
    env = TournamentEnv(arenas=8, parameters={"max_environment_steps": 400})
    player = PlainMatchPlayer(env)
    pool = [opponent("heuristic:chaser")]
    try:
        for path, step_number in zip(files, SOCCER_STEPS, strict=True):
            record = store.add_policy(f"SoccerTwos@{step_number}", f"fp{step_number}",
                                      "checkpoint", str(path), "2026-01-01T00:00:00+00:00",
                                      path=str(path), run="SoccerTwos", step=step_number)
            pool.append(checkpoint(record))
            steps = []
            step = rate_pool(pool, store, player, config, on_step=steps.append)
            assert len(steps) == 3  # a refit after each of its three rounds
            rated = step.ratings
            assert rated is not None and set(rated.policies) == {m.label for m in pool}
            low, high = rated.policies[record.label].elo_ci
            assert low < high
            write_scalars(step.scalars(), tmp_path / "tb", ".watch")
    finally:
        player.close()
    assert step.matches == len(store.matches()) == 3 * 4 * 3
    events = EventAccumulator(str(tmp_path / "tb" / "SoccerTwos"))
    events.Reload()
    assert [p.step for p in events.Scalars("Evaluation/Elo")] == list(SOCCER_STEPS)
    assert [p.value for p in events.Scalars("Evaluation/Elo CI High")] == pytest.approx(
        [rated.policies[f"SoccerTwos@{s}"].elo_ci[1] for s in SOCCER_STEPS], rel=1e-6)

    out = tmp_path / "tournament"
    assert main(["tournament", "heuristic:chaser", str(run), "--matches", "36", "--seed", "1000",
                 "--arenas", "8", "--env-param", "max_environment_steps=400", "--no-ray",
                 "--no-progress", "--out", str(out)]) == 0
    tournament = json.loads((out / "tournament.json").read_text())["ratings"]
    assert set(tournament) == set(rated.policies)
    for label, watched in rated.policies.items():
        other = tournament[label]["elo_ci"]
        assert watched.elo_ci[0] <= other[1] and other[0] <= watched.elo_ci[1], (
            label, watched.elo_ci, other)
    assert rated.best == "heuristic:chaser" == max(tournament, key=lambda k: tournament[k]["elo"])


@pytest.mark.standin
@pytest.mark.ray
def test_ray_runners_play_the_pools_matches_as_the_plain_loop_does(
        tmp_path: Path, ray_cluster: RayCluster) -> None:
    """Two Ray runners kept across the pool's growth, the stand-in started as a build of 3 arenas:
    the same matches, results and ratings as in this process on 6 arenas."""
    from deploy.evaluation.on_ray import ray_session
    from deploy.watch.teams_ray import RayMatchPlayer

    config = PoolConfig(seed=5, rounds=1, adaptive_rounds=1, resamples=300)
    players = [opponent(name) for name in ("heuristic:chaser", "heuristic:random",
                                           "heuristic:idle")]

    def watch_pool(store: WatchStore, player: Any) -> dict[str, Any]:
        for size in (2, 3):
            step = rate_pool(players[:size], store, player, config)
        return step.record()

    plain = PlainMatchPlayer(TournamentEnv(arenas=6, parameters={"max_environment_steps": 1500}))
    try:
        expected = watch_pool(WatchStore(tmp_path / "plain.db"), plain)
    finally:
        plain.close()
    with ray_session():
        on_ray = RayMatchPlayer(
            TournamentConfig(runners=2, accelerator="cpu", runner_cpus=0.5),
            TournamentEnv(file_name=builtin_soccertwos_path(),
                          parameters={"num_arenas": 3, "max_environment_steps": 1500}))
        try:
            assert on_ray.arenas == 3 and len(on_ray.runners) == 2
            store = WatchStore(tmp_path / "ray.db")
            found = watch_pool(store, on_ray)
        finally:
            on_ray.close()
    assert found == expected and found["matches"] == 2 * 2 * (1 + 2)
    assert [m.index for m in store.matches()] == list(range(12))
