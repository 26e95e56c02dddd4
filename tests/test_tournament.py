"""`huggy tournament`: contenders, matches played in this process and on Ray runners (the same
results), and the report (table, JSON, CSV, PNGs, TensorBoard, model cards) read back."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from deploy.evaluation import ratings
from deploy.evaluation.tournament import (
    Contender,
    TournamentConfig,
    TournamentEnv,
    TournamentResult,
    contenders,
    play_plain,
)
from deploy.evaluation.tournament_report import (
    build_tournament_report,
    format_tournament_table,
    write_model_cards,
    write_tensorboard,
    write_tournament_report,
)
from envs.standin.launcher import builtin_soccertwos_path
from huggy_agent.cli import main
from tests.support.fixtures import EXTRA_FIXTURES, fixtures_dir
from tests.support.ray_cluster import RayCluster

HEURISTICS = ["heuristic:chaser", "heuristic:random", "heuristic:idle"]


def test_contenders_are_files_runs_and_scripted_players(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(fixtures_dir() / "ppo_baseline", run)
    found = contenders([str(run), "heuristic:chaser"])
    assert [c.label for c in found] == ["run@2000343", "heuristic:chaser"]
    assert found[0].path is not None and found[0].step == 2000343 and found[0].heuristic is None
    assert found[1].heuristic == "heuristic:chaser" and found[1].path is None
    with pytest.raises(ValueError, match="at least two policies"):
        contenders(["heuristic:idle"])
    with pytest.raises(ValueError, match="more than once"):
        contenders(["heuristic:idle", "heuristic:idle"])
    with pytest.raises(ValueError, match="heuristic:nope"):
        contenders(["heuristic:nope", "heuristic:idle"])


def _result(tmp_path: Path) -> TournamentResult:
    """Checkpoints 100 and 200 of run `ppo` and a scripted player: 200 beats 100 beats idle,
    by hand-picked scores, two rounds."""
    folder = tmp_path / "ppo"
    folder.mkdir()
    entrants = [Contender("ppo@100", path=str(folder / "a.onnx"), run="ppo", step=100,
                          folder=str(folder)),
                Contender("ppo@200", path=str(folder / "b.onnx"), run="ppo", step=200,
                          folder=str(folder)),
                Contender("heuristic:idle", heuristic="heuristic:idle")]
    wins = {("ppo@200", "ppo@100"): 0.75, ("ppo@100", "heuristic:idle"): 1.0,
            ("ppo@200", "heuristic:idle"): 1.0}
    matches = []
    labels = [c.label for c in entrants]
    for index in range(24):
        a, b = labels[index % 3], labels[(index + 1 + index // 3) % 3]
        if a == b:
            b = labels[(index + 2) % 3]
        p = wins.get((a, b), 1 - wins.get((b, a), 0.5))
        score = 1.0 if (index * 0.37) % 1 < p else 0.0
        matches.append(ratings.Match(index, 7 + index, a, b, score, 1.0 if score else -1.0,
                                     -1.0 if score else 1.0, 50))
    return TournamentResult(entrants, TournamentConfig(matches=24, seed=7), TournamentEnv(),
                            matches, {"mode": "round-robin", "budget": 24}, seconds=1.0)


def test_report_files_read_back(tmp_path: Path) -> None:
    result = _result(tmp_path)
    report = build_tournament_report(result)
    assert report.ratings is not None
    expected = ratings.rate(result.matches, result.labels, seed=7)
    paths = write_tournament_report(report, tmp_path / "out")
    document = json.loads(paths["json"].read_text())
    assert document["ratings"] == json.loads(json.dumps(expected.as_dict()["ratings"]))
    assert set(document) >= {"ratings", "pairs", "best", "selection", "matches", "policies"}
    assert [m["seed"] for m in document["matches"]] == list(range(7, 31))
    assert document["matches"][0]["team0"] == "ppo@100"
    rows = list(csv.DictReader(paths["csv"].read_text().splitlines()))
    assert [row["label"] for row in rows] == list(expected.policies)
    assert float(rows[0]["elo"]) == pytest.approx(expected.policies[rows[0]["label"]].elo)
    for kind in ("ratings_png", "win_rate_png"):
        assert paths[kind].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    table = format_tournament_table(report)
    assert table.splitlines()[0].split()[:3] == ["policy", "step", "Elo"]
    assert f"best: {expected.best}" in table
    anchored = build_tournament_report(result, {"heuristic:idle": 1000.0})
    assert anchored.ratings.policies["heuristic:idle"].elo == pytest.approx(1000.0)


def test_tensorboard_and_model_cards_carry_the_elo(tmp_path: Path) -> None:
    from huggingface_hub import ModelCard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    report = build_tournament_report(_result(tmp_path))
    assert report.ratings is not None
    (folder,) = write_tensorboard(report, tmp_path / "tb")
    write_tensorboard(report, tmp_path / "tb")  # again: replaced, not appended
    events = EventAccumulator(str(folder))
    events.Reload()
    points = events.Scalars("Evaluation/Elo")
    assert [p.step for p in points] == [100, 200]
    assert [p.value for p in points] == pytest.approx(
        [report.ratings.policies[label].elo for label in ("ppo@100", "ppo@200")], rel=1e-6)
    (card_path,) = write_model_cards(report, tmp_path / "cards")
    assert card_path == tmp_path / "ppo" / "README.md"
    card = ModelCard.load(card_path)
    (elo,) = [r for r in card.data.eval_results if r.metric_type == "elo"]
    final = report.ratings.policies["ppo@200"]
    assert elo.metric_value == pytest.approx(final.elo, abs=0.05)
    assert [elo.metric_args["ci_low"], elo.metric_args["ci_high"]] == pytest.approx(
        list(final.elo_ci), abs=0.05)
    write_model_cards(report, tmp_path / "cards")
    assert card_path.read_text().count("<!-- huggy tournament: start -->") == 1


def test_a_model_card_names_the_opponents_its_policy_played_and_counts_its_matches(
        tmp_path: Path) -> None:
    """A policy file (no run) among scripted players, as `huggy tournament results/SoccerTwos
    heuristic:...` has it: 8 matches, of which the policy played 4, against chaser and random
    (never idle). The card says so, in its text and in its metadata."""
    from huggingface_hub import ModelCard

    folder = tmp_path / "SoccerTwos"
    folder.mkdir()
    entrants = [Contender("SoccerTwos/SoccerTwos.onnx", path=str(folder / "SoccerTwos.onnx")),
                *(Contender(name, heuristic=name) for name in HEURISTICS)]
    policy, chaser, random, idle = (c.label for c in entrants)
    pairings = [(policy, chaser), (chaser, policy), (policy, random), (random, policy),
                (chaser, random), (random, chaser), (chaser, idle), (idle, chaser)]
    matches = [ratings.Match(index, index, team0, team1, [1.0, 0.5, 0.0][index % 3])
               for index, (team0, team1) in enumerate(pairings)]
    result = TournamentResult(entrants, TournamentConfig(matches=8), TournamentEnv(), matches,
                              {"mode": "round-robin", "budget": 8})
    (card_path,) = write_model_cards(build_tournament_report(result), tmp_path / "cards")
    assert card_path == folder / "README.md"
    card = ModelCard.load(card_path)
    assert (f"Bradley-Terry Elo of `{policy}` over its 4 matches (of 8 in the tournament) "
            f"against {chaser}, {random}, 95% bootstrap intervals") in " ".join(card.text.split())
    (elo,) = card.data.eval_results
    assert elo.metric_args["matches"] == 4
    assert elo.metric_args["opponents"] == [chaser, random]


@pytest.mark.standin
def test_matches_are_the_schedule_and_replay_alike(tmp_path: Path) -> None:
    """Two round-robin rounds of three scripted players: every pair plays both sides each round,
    match i has seed S + i, and a second tournament gives the same results."""
    config = TournamentConfig(matches=12, seed=40, progress=False)
    env = TournamentEnv(arenas=6, parameters={"max_environment_steps": 1500})
    first = play_plain(contenders(HEURISTICS), config, env)
    again = play_plain(contenders(HEURISTICS), config, env)
    assert [(m.index, m.seed, m.team0, m.team1) for m in first.matches] == [
        (m.index, m.seed, m.team0, m.team1) for m in again.matches]
    assert [m.score for m in first.matches] == [m.score for m in again.matches]
    assert [m.seed for m in first.matches] == list(range(40, 52))
    sides = [(m.team0, m.team1) for m in first.matches[:6]]
    assert sorted(sides) == sorted((a, b) for a in HEURISTICS for b in HEURISTICS if a != b)
    assert first.selection["matches_spent"] == 12 and first.selection["rounds"] == 2


@pytest.mark.standin
def test_ray_runners_play_the_same_matches(ray_cluster: RayCluster) -> None:
    from deploy.evaluation.tournament_ray import play_on_ray

    config = TournamentConfig(matches=12, seed=3, runners=2, accelerator="cpu",
                              runner_cpus=0.5, progress=False)
    # the stand-in started as a build of 3 arenas, without `arenas`: each runner counts them
    env = TournamentEnv(file_name=builtin_soccertwos_path(),
                        parameters={"num_arenas": 3, "max_environment_steps": 1500})
    plain = play_plain(contenders(HEURISTICS), config, TournamentEnv(
        arenas=6, parameters={"max_environment_steps": 1500}))
    on_ray = play_on_ray(contenders(HEURISTICS), config, env)
    assert [(m.index, m.seed, m.team0, m.team1, m.score, m.reward0) for m in on_ray.matches] == [
        (m.index, m.seed, m.team0, m.team1, m.score, m.reward0) for m in plain.matches]
    assert len(on_ray.runners) == 2 and on_ray.env.arenas == 3


def test_arenas_default_to_the_stand_ins_or_the_builds_own() -> None:
    assert TournamentEnv().arenas == 8 and TournamentEnv().sent_parameters()["num_arenas"] == 8
    given = TournamentEnv(parameters={"num_arenas": 4})
    assert given.arenas == 4 and given.sent_parameters()["num_arenas"] == 4
    build = TournamentEnv(file_name="SoccerTwos.x86_64")
    assert build.arenas is None and "num_arenas" not in build.sent_parameters()
    with pytest.raises(ValueError, match="arenas must be an integer >= 1, got 0"):
        TournamentEnv(file_name="SoccerTwos.x86_64", arenas=0)


def test_tournament_arguments_are_checked_before_anything_runs(capsys) -> None:
    assert main(["tournament", *HEURISTICS, "--matches", "5", "--no-ray"]) == 2
    assert "--matches 5 is too small for one round: 3 policies play 6 matches a round" in \
        capsys.readouterr().err
    assert main(["tournament", *HEURISTICS, "--anchor", "heuristic:nope=1000", "--no-ray"]) == 2
    assert "--anchor names 'heuristic:nope'" in capsys.readouterr().err
    assert main(["tournament", *HEURISTICS, "--arenas", "4", "--env-param", "num_arenas=1",
                 "--no-ray"]) == 2
    assert ("num_arenas=1 disagrees with arenas=4: the stand-in's arenas are the arenas "
            "(--arenas)") in capsys.readouterr().err


@pytest.mark.standin
def test_huggy_tournament_writes_its_report(tmp_path: Path, capsys) -> None:
    assert main(["tournament", *HEURISTICS, "--matches", "6", "--arenas", "6", "--no-ray",
                 "--no-progress", "--out", str(tmp_path), "--env-param",
                 "max_environment_steps=1500", "--anchor", "heuristic:idle=1000"]) == 0
    table = capsys.readouterr().out
    assert "Elo [95% CI]" in table and "heuristic:chaser" in table
    document = json.loads((tmp_path / "tournament.json").read_text())
    assert document["ratings"]["heuristic:idle"]["elo"] == pytest.approx(1000.0)
    assert sum(r["matches"] for r in document["ratings"].values()) == 12


@pytest.mark.standin
def test_a_build_without_arenas_plays_as_many_matches_at_once_as_it_has_arenas(
        tmp_path: Path, capsys) -> None:
    """`--env PATH` without `--arenas`: the runner counts the scene's arenas (here the stand-in
    started as a build, given one arena) and plays that many matches at once; `--arenas` more
    than the scene has is still refused."""
    build = builtin_soccertwos_path()
    scene = ["--env", build, "--env-param", "num_arenas=1", "--env-param",
             "max_environment_steps=1500", "--matches", "6", "--no-ray", "--no-progress"]
    assert main(["tournament", *HEURISTICS, *scene, "--out", str(tmp_path)]) == 0, \
        capsys.readouterr().err
    document = json.loads((tmp_path / "tournament.json").read_text())
    assert document["env"]["file_name"] == build and document["env"]["arenas"] == 1
    assert [m["index"] for m in document["matches"]] == list(range(6))
    assert main(["tournament", *HEURISTICS, *scene, "--arenas", "2", "--out",
                 str(tmp_path / "two")]) == 2
    assert "2 matches at once need 2 arenas; the scene has 1" in capsys.readouterr().err


@pytest.mark.standin
def test_a_network_policy_plays_matches() -> None:
    """The stand-in-trained SoccerTwos.onnx (a real ML-Agents export) against a scripted player:
    every match is played and reported, on both sides."""
    network = str(EXTRA_FIXTURES / "soccertwos_standin" / "SoccerTwos.onnx")
    result = play_plain(contenders([network, "heuristic:random"]),
                        TournamentConfig(matches=4, progress=False),
                        TournamentEnv(arenas=2, parameters={"max_environment_steps": 1000}))
    assert [(m.team0, m.team1) for m in result.matches] == [
        ("soccertwos_standin/SoccerTwos.onnx", "heuristic:random"),
        ("heuristic:random", "soccertwos_standin/SoccerTwos.onnx")] * 2
    assert all(m.score in (0.0, 0.5, 1.0) for m in result.matches)
