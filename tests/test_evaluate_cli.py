"""`huggy evaluate` end to end: argument errors in-process, and a real run as a subprocess on the
session's Ray cluster compared with the same command run without Ray."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from huggy_agent.cli import main
from tests.support.fixtures import REPO_ROOT, fixtures_dir
from tests.support.ray_cluster import RayCluster

COMMON = ["--episodes", "36", "--max-steps", "40", "--seed", "5", "--no-progress"]


def evaluate_on_cluster(ray_cluster: RayCluster, run: str, out: Path, *extra: str) -> str:
    """`huggy evaluate RUN ... --out OUT` as a subprocess on the session's cluster: its stdout."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run(
        [sys.executable, "-m", "huggy_agent.cli", "evaluate", run, *extra, "--address",
         ray_cluster.address, "--accelerator", "cpu", "--out", str(out), *COMMON],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_policy_and_policy_url_are_exclusive(capsys) -> None:
    policy = str(fixtures_dir() / "ppo_baseline" / "Huggy.onnx")
    assert main(["evaluate", policy, "--policy-url", "http://127.0.0.1:1/"]) == 2
    assert "give either POLICY... or --policy-url URL (exactly one of them), got 1 policies " \
           "and policy-url='http://127.0.0.1:1/'" in capsys.readouterr().err
    assert main(["evaluate"]) == 2
    assert "got 0 policies and policy-url=None" in capsys.readouterr().err


def test_bad_arguments_are_named(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "x.pt", "--runners", "0"])
    assert exit_info.value.code == 2
    assert "expected a whole number >= 1, got 0" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "missing.pt")]) == 2
    assert "policy not found:" in capsys.readouterr().err
    policy = str(fixtures_dir() / "ppo_baseline" / "Huggy.onnx")
    assert main(["evaluate", policy, "--env", str(tmp_path / "NoSuchBuild.x86_64")]) == 2
    assert "--env: Unity build not found" in capsys.readouterr().err


def test_cli_on_ray_equals_cli_without_ray(ray_cluster: RayCluster, tmp_path, capsys,
                                           monkeypatch) -> None:
    """The same numbers on Ray; the runners' kept episodes reach the driver, which writes the
    dataset once (its returns are the plain run's), and the replay scores its episode exactly."""
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    run = str(fixtures_dir() / "ppo_normalize_False")
    assert main(["evaluate", run, "--no-ray", "--out", str(tmp_path / "plain"), *COMMON]) == 0
    plain_table = capsys.readouterr().out
    ray_table = evaluate_on_cluster(ray_cluster, run, tmp_path / "ray", "--runners", "2",
                                    "--dataset", "ray/eval-v0", "--video")
    assert "Minari dataset: ray/eval-v0 (36 episodes" in ray_table
    assert "replay: ppo_normalize_False@2000073: median episode" in ray_table
    assert "same return" in ray_table
    assert "ppo_normalize_False@2000073" in ray_table
    assert plain_table.splitlines()[2].split()[:8] == ray_table.splitlines()[2].split()[:8]
    plain = json.loads((tmp_path / "plain" / "evaluation.json").read_text())
    ray_run = json.loads((tmp_path / "ray" / "evaluation.json").read_text())
    assert [i["returns"] for i in ray_run["policies"][0]["items"]] == \
        [i["returns"] for i in plain["policies"][0]["items"]]
    kept = [float(np.sum(e.rewards, dtype=np.float64))
            for e in minari.load_dataset("ray/eval-v0").iterate_episodes()]
    expected = [r for i in plain["policies"][0]["items"] for r in i["returns"]]
    np.testing.assert_allclose(kept, expected, rtol=0, atol=1e-9)  # pairwise vs ordered sums
    assert (tmp_path / "ray" / "learning_curve.png").stat().st_size > 0
    assert (tmp_path / "ray" / "evaluation.csv").read_text().count("\n") == 2


def test_cli_instances_per_runner_equal_one_instance(ray_cluster: RayCluster, tmp_path,
                                                      capsys) -> None:
    """`--instances-per-runner 2`, without Ray and on Ray, gives the items of one instance."""
    run = str(fixtures_dir() / "ppo_normalize_False")
    outputs = {}
    for name, extra in (("one", []), ("two", ["--instances-per-runner", "2"])):
        assert main(["evaluate", run, "--no-ray", "--out", str(tmp_path / name), *extra,
                     *COMMON]) == 0
        outputs[name] = json.loads((tmp_path / name / "evaluation.json").read_text())
    capsys.readouterr()
    evaluate_on_cluster(ray_cluster, run, tmp_path / "ray", "--instances-per-runner", "2")
    outputs["ray"] = json.loads((tmp_path / "ray" / "evaluation.json").read_text())
    items = {name: [(i["index"], i["seed"], i["returns"], i["lengths"]) for i in
                    out["policies"][0]["items"]] for name, out in outputs.items()}
    assert items["two"] == items["one"] and items["ray"] == items["one"]
    assert len(items["one"]) == 2
    assert outputs["two"]["env"]["instances"] == outputs["ray"]["env"]["instances"] == 2


def test_select_best_arguments_are_checked_before_anything_runs(capsys) -> None:
    policy = str(fixtures_dir() / "ppo_baseline" / "Huggy.onnx")
    other = str(fixtures_dir() / "ppo_normalize_False" / "Huggy.onnx")
    assert main(["evaluate", policy, other, "--select-best", "--episodes", "20"]) == 2
    assert "--episodes 20 (the budget of all policies together) is too small for one round: " \
           "2 policies x 1 item x 18 episodes need 36" in capsys.readouterr().err
    assert main(["evaluate", policy, other, "--select-best", "--confidence", "1.5"]) == 2
    assert "confidence must be in (0, 1), got 1.5" in capsys.readouterr().err
    assert main(["evaluate", policy, "--select-best", "--no-ray"]) == 2
    assert ("--select-best chooses among two or more policies, got 1: evaluate a single policy "
            "without it") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["evaluate", policy, "--select-best", "--select-by", "max"])
    assert "argument --select-by: invalid choice: 'max'" in capsys.readouterr().err


def test_select_best_computes_each_comparison_once(monkeypatch, tmp_path, capsys) -> None:
    """The table, evaluation.json, the PNGs, TensorBoard and the model cards all render one
    report: 3 policies give exactly 3 pairwise comparisons and 3 summaries, however many
    outputs are asked for."""
    from deploy.evaluation import command, statistics, summary
    from deploy.evaluation.results import EvaluationResult, ItemResult, PolicyResult
    from deploy.evaluation.selection import Selection

    def fake_evaluate(specs, config, env):  # the selection's rounds, with made-up returns
        rng = np.random.default_rng(0)
        results = [PolicyResult(spec) for spec in specs]
        selection = Selection(len(specs), config)
        strata: dict[int, list] = {}
        items = selection.next_round(strata)
        while items:
            for item in items:
                returns = tuple(rng.normal(item.policy_index, 0.3, item.episodes).tolist())
                results[item.policy_index].items.append(ItemResult(
                    item.policy_index, item.index, item.seed, returns, (10,) * len(returns),
                    (True,) * len(returns), tuple(range(len(returns))), (0,) * len(returns),
                    10 * len(returns), 0.1, "local", "plain"))
                strata.setdefault(item.policy_index, []).append(returns)
            items = selection.next_round(strata)
        outcome = EvaluationResult(results, config, env)
        outcome.planned_episodes = selection.scheduled_episodes()
        outcome.selection = selection.outcome([spec.label for spec in specs], strata)
        return outcome

    calls = {"compare": 0, "summarize": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(command, "evaluate_plain", fake_evaluate)
    monkeypatch.setattr(statistics, "improvement_interval",
                        counted("compare", statistics.improvement_interval))
    monkeypatch.setattr(summary, "summarize", counted("summarize", summary.summarize))
    runs = []
    for run in ("ppo_baseline", "ppo_num_layers_2", "ppo_normalize_False"):
        (tmp_path / run).mkdir()  # model cards go beside the policies: not into the fixtures
        runs.append(str(shutil.copy(fixtures_dir() / run / "Huggy.onnx", tmp_path / run)))
    assert main(["evaluate", *runs, "--no-ray", "--select-best", "--episodes", "540",
                 "--out", str(tmp_path / "out"), "--tensorboard", str(tmp_path / "tb"),
                 "--model-card", "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "selection (successive-elimination-bonferroni" in table
    assert calls == {"compare": 3, "summarize": 3}
    document = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert document["selection"]["rule"] == "successive-elimination-bonferroni"
    assert document["best"]["label"] == document["selection"]["best"]
