"""`huggy watch` on a team scene, end to end (`--no-ray`, in the command's own process): a finished
stand-in SoccerTwos run's checkpoints join a pool with the chaser and are rated by its matches
(progress lines, Elo scalars in the run's TensorBoard folder, the pool in watch.json); started
again on the same database, the watch plays no match again and gives the same ratings. `--serve`
with a team scene is refused before anything starts."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from deploy.evaluation.plan import EnvSpec, EvalConfig
from deploy.watch.decisions import RuleSettings
from deploy.watch.store import WatchStore, settings_of
from deploy.watch.teams import tournament_result
from tests.support.cli import huggy_in_process
from tests.support.soccer_run import SOCCER_STEPS, write_soccer_run

HUGGY = str(Path(sys.executable).with_name("huggy"))
SAFETY_S = 600
"""The longest a watch may run before the test gives up (a safety net, not a bound)."""
LABELS = [f"SoccerTwos@{step}" for step in SOCCER_STEPS]


def finish_training(folder: Path) -> None:
    """What mlagents-learn writes last: run_logs/timers.json with its end time."""
    (folder / "run_logs").mkdir(parents=True, exist_ok=True)
    (folder / "run_logs" / "timers.json").write_text(json.dumps(
        {"name": "root", "metadata": {"start_time_seconds": "1", "end_time_seconds": "2"}}))


def watch_command(run: Path, out: Path) -> list[str]:
    """Two round-robin rounds per checkpoint and no adaptive one, so every count is known."""
    return [HUGGY, "watch", str(run), "--env", "builtin:soccertwos", "--no-ray", "--out",
            str(out), "--rounds", "2", "--adaptive-rounds", "0", "--seed", "3",
            "--env-param", "max_environment_steps=400"]


def recorded_matches(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as connection:
        return connection.execute(
            "SELECT match_index, seed, team0, team1, score, runner, finished_at FROM matches "
            "ORDER BY match_index").fetchall()


def record_of(label: str, matches: list[tuple[Any, ...]]) -> tuple[int, int, int]:
    """(wins, draws, losses) of a label, counted from the database's rows."""
    wins = draws = losses = 0
    for _, _, team0, team1, score, _, _ in matches:
        if label not in (team0, team1):
            continue
        mine = score if label == team0 else 1.0 - score
        wins, draws, losses = wins + (mine == 1.0), draws + (mine == 0.5), losses + (mine == 0.0)
    return wins, draws, losses


@pytest.mark.standin
def test_a_soccer_run_is_rated_in_a_pool_and_a_second_watch_plays_nothing_again(
        tmp_path: Path) -> None:
    """The chaser and three checkpoints, two rounds of one couple per earlier member for each
    checkpoint: checkpoint k (1, 2, 3) plays 2 x 2k matches in its own rounds, 2 x 2 x 2k in all
    by the end: 2 + 2, then 4 + 4, then 6 + 6 matches, 24 in the pool, 12 for every member (each
    plays 4 against each of the other three)."""
    run = tmp_path / "results" / "SoccerTwos"
    write_soccer_run(run)
    finish_training(run)
    out = tmp_path / "out"
    first = subprocess.run(watch_command(run, out), capture_output=True, text=True,
                           timeout=SAFETY_S)
    assert first.returncode == 0, first.stderr
    # one progress line per refit: a refit after each round, named for the round's checkpoint
    refits = [line for line in first.stdout.splitlines() if ": Elo " in line]
    assert [line.split(":")[0] for line in refits] == [label for label in LABELS
                                                      for _ in range(2)]
    assert [line.rsplit("(", 1)[1] for line in refits] == [
        f"{count} in the pool)" for count in (2, 4, 8, 12, 18, 24)]

    matches = recorded_matches(out / "watch.db")
    assert [row[0] for row in matches] == list(range(24))
    assert [row[1] for row in matches] == [3 + index for index in range(24)]
    summary = json.loads((out / "watch.json").read_text())
    pool = summary["pool"]
    assert pool["matches"] == 24
    assert [m["label"] for m in pool["members"]] == ["heuristic:chaser", *LABELS]
    assert set(pool["ratings"]) == {"heuristic:chaser", *LABELS}
    for label, rating in pool["ratings"].items():
        assert rating["matches"] == 12
        assert (rating["wins"], rating["draws"], rating["losses"]) == record_of(label, matches)
        low, high = rating["elo_ci"]
        assert low - 1e-6 <= rating["elo"] <= high + 1e-6
    checkpoint_elo = {label: pool["ratings"][label]["elo"] for label in LABELS}
    assert summary["best"] == max(checkpoint_elo, key=lambda label: checkpoint_elo[label])
    assert [c["label"] for c in summary["checkpoints"]] == LABELS
    assert all(c["rating"] == pool["ratings"][c["label"]] for c in summary["checkpoints"])

    # Evaluation/Elo and its bounds at each checkpoint's step, beside the trainer's scalars
    events = EventAccumulator(str(run / "SoccerTwos"))
    events.Reload()
    for tag, field in (("Evaluation/Elo", None), ("Evaluation/Elo CI Low", 0),
                       ("Evaluation/Elo CI High", 1)):
        points = events.Scalars(tag)
        assert [p.step for p in points] == list(SOCCER_STEPS)
        expected = [pool["ratings"][label]["elo"] if field is None
                    else pool["ratings"][label]["elo_ci"][field] for label in LABELS]
        assert [p.value for p in points] == pytest.approx(expected, rel=1e-6)

    # started again on the same database: nothing played twice, the same ratings
    second = subprocess.run(watch_command(run, out), capture_output=True, text=True,
                            timeout=SAFETY_S)
    assert second.returncode == 0, second.stderr
    assert recorded_matches(out / "watch.db") == matches  # same rows, same runners and times
    again = json.loads((out / "watch.json").read_text())["pool"]
    assert again["matches"] == 24
    for label, rating in pool["ratings"].items():
        assert again["ratings"][label]["elo"] == pytest.approx(rating["elo"])
        assert again["ratings"][label]["elo_ci"] == pytest.approx(rating["elo_ci"])
    assert again["rated_at"] == pool["rated_at"]  # the ratings of 24 matches, kept once

    # huggy tournament's report of the database, playing nothing: its 24 matches, each member's
    # record counted from the database rows, and the pool's fit (the same maximum likelihood
    # over the same matches, so the same Elo up to float rounding)
    report = subprocess.run([HUGGY, "tournament", "--db", str(out / "watch.db"), "--out",
                             str(tmp_path / "tournament")], capture_output=True, text=True,
                            timeout=SAFETY_S)
    assert report.returncode == 0, report.stderr
    tournament = json.loads((tmp_path / "tournament" / "tournament.json").read_text())
    assert [m["index"] for m in tournament["matches"]] == list(range(24))
    assert [p["label"] for p in tournament["policies"]] == ["heuristic:chaser", *LABELS]
    for label, rating in tournament["ratings"].items():
        assert (rating["wins"], rating["draws"], rating["losses"]) == record_of(label, matches)
        assert rating["elo"] == pytest.approx(pool["ratings"][label]["elo"], abs=1e-6)
    assert (tmp_path / "tournament" / "ratings.png").is_file()
    # the watch rewrote the same report after its last refit
    kept = json.loads((out / "report" / "tournament.json").read_text())["ratings"]
    assert set(kept) == set(tournament["ratings"])
    for label, rating in tournament["ratings"].items():
        assert kept[label]["elo"] == pytest.approx(rating["elo"], abs=1e-6)
        assert kept[label]["matches"] == rating["matches"]


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """`huggy ARGV` in this process (a refusal starts nothing): (exit code, stderr's lines)."""
    code, errors = huggy_in_process(capsys, argv)
    return code, errors.splitlines()


def test_serve_with_a_team_scene_is_refused_in_one_line(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "results" / "SoccerTwos"
    out = tmp_path / "out"
    assert refusal(["watch", str(run), "--env", "builtin:soccertwos", "--serve",
                    "http://127.0.0.1:9", "--out", str(out)], capsys) == (2, [
        "huggy watch: error: --serve promotes checkpoints of a single-behavior scene; --env "
        "builtin:soccertwos is a team scene, whose checkpoints are rated against a pool and "
        "never promoted: drop --serve"])
    assert not (out / "watch.db").exists()


def test_opponents_in_a_single_behavior_scene_are_refused(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    assert refusal(["watch", str(tmp_path / "results" / "Huggy"), "--opponent",
                    "heuristic:idle", "--out", str(tmp_path / "out")], capsys) == (2, [
        "huggy watch: error: --opponent plays matches in a team scene; --env builtin is a "
        "single-behavior scene, rated by episodes: drop --opponent"])


def test_tournament_db_refuses_a_single_behavior_watch(tmp_path: Path) -> None:
    store = WatchStore(tmp_path / "watch.db")
    try:
        store.check_settings(settings_of(EvalConfig(), EnvSpec(), RuleSettings().as_dict()))
        with pytest.raises(ValueError, match=r"no team scene's watch .* huggy evaluate --db"):
            tournament_result(store)
    finally:
        store.close()
