"""Batch evaluation on the session's two-node Ray cluster, against the plain single-process loop.

Every test evaluates the real shared fixtures on the built-in stand-in over real gRPC. The plain
loop (no Ray, one environment, items in order) is the reference: the Ray numbers must equal it
whatever the number of runners, the faults, or the nodes the items ran on.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from dataclasses import asdict, replace

import numpy as np
import pytest

from deploy.evaluation.on_ray import RunnerPool, evaluate_on_ray
from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec
from deploy.evaluation.report import format_table, write_report
from deploy.evaluation.results import EvaluationResult, ItemResult
from deploy.evaluation.scheduling import evaluate_plain
from deploy.evaluation.sources import policy_specs, stand_in_behavior
from deploy.evaluation.summary import build_report, summarize_all
from tests.support.fixtures import FIXTURE_RUNS, fixtures_dir, mlagents_fixtures_dir
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster

# Short episodes keep the suite fast; 18 agents per environment as in the Huggy scene.
ENV = EnvSpec(max_steps=60)
CONFIG = EvalConfig(episodes=36, episodes_per_item=18, seed=11, accelerator="cpu",
                    progress=False)


def _episodes(result: EvaluationResult) -> list[list[tuple]]:
    """Every item's episodes, per policy, in item order: what fixed seeds must reproduce."""
    return [[(item.index, item.seed, item.returns, item.lengths, item.terminated)
             for item in policy.ordered_items()] for policy in result.policies]


def _numbers(result: EvaluationResult) -> list[tuple]:
    return [summary.numbers() for summary in summarize_all(result)]


def wait_for_every_runner(result: ItemResult, pool: RunnerPool | None) -> None:
    """At the first finished item, block until every started runner is ready, so that each
    gets items even when one starts much later than the other (on a loaded machine)."""
    import ray

    assert pool is not None
    if len(pool.infos) < len(pool.actors):
        ray.get([actor.info.remote() for actor in pool.actors.values()], timeout=120)


@pytest.fixture(scope="module")
def specs():
    return policy_specs([fixtures_dir() / run for run in FIXTURE_RUNS])


@pytest.fixture(scope="module")
def reference(specs) -> EvaluationResult:
    """The plain loop's evaluation of the three fixtures: the independent reference."""
    result = evaluate_plain(specs, CONFIG, ENV)
    assert all(not policy.failed for policy in result.policies)
    assert [len(policy.items) for policy in result.policies] == [2, 2, 2]
    return result


def test_runners_1_and_2_equal_plain_loop_and_write_report(ray_cluster: RayCluster, specs,
                                                            reference, tmp_path) -> None:
    one = evaluate_on_ray(specs, CONFIG, ENV)
    two = evaluate_on_ray(specs, replace(CONFIG, runners=2), ENV,
                          on_result=wait_for_every_runner)
    assert _episodes(one) == _episodes(reference)
    assert _episodes(two) == _episodes(reference)
    assert _numbers(one) == _numbers(two) == _numbers(reference)
    assert all(s.episodes == 36 and s.status == "ok" for s in summarize_all(two))
    assert one.retries == two.retries == 0
    assert len(one.runners) == 1 and len(two.runners) == 2
    assert len({item.runner for p in two.policies for item in p.items}) == 2
    # Different policies really behave differently (the test would be vacuous otherwise).
    assert len({s.mean_return for s in summarize_all(two)}) == 3

    paths = write_report(build_report(two), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "evaluation.csv", "evaluation.json", "learning_curve.png", "performance_profile.png",
        "probability_of_improvement.png"]
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
    table = format_table(build_report(two))
    for run in FIXTURE_RUNS:
        assert run in table


def test_killed_runner_and_crashed_env_are_retried(ray_cluster: RayCluster, specs,
                                                   reference) -> None:
    """When the second item finishes (both runners are working by then), SIGKILL the other
    runner's process (busy with an item) and the finishing runner's environment process (about
    to get its next item). Ray restarts the runner and retries its item; the environment crash
    is retried on its runner, which opens a fresh environment. The numbers equal the fault-free
    ones, and the report counts both retries."""
    faults: list[str] = []
    finished: list[ItemResult] = []

    def inject(result: ItemResult, pool: RunnerPool | None) -> None:
        assert pool is not None
        finished.append(result)
        if len(finished) == 1:
            wait_for_every_runner(result, pool)
        if len(finished) != 2:
            return
        (other,) = [name for name in pool.busy if name != result.runner]
        os.kill(pool.infos[other].pid, signal.SIGKILL)
        env_pid = pool.infos[result.runner].env_pid
        assert env_pid is not None
        os.kill(env_pid, signal.SIGKILL)
        faults.extend([f"actor of {other}", f"environment of {result.runner}"])

    result = evaluate_on_ray(specs, replace(CONFIG, runners=2), ENV,
                             on_result=inject)
    assert len(faults) == 2
    assert result.retries == 2
    retried = [item for policy in result.policies for item in policy.items if item.attempts > 1]
    assert [item.attempts for item in retried] == [2, 2]
    assert {item.runner for item in retried} == {"runner-0", "runner-1"}
    assert _episodes(result) == _episodes(reference)
    assert _numbers(result) == _numbers(reference)
    assert "retries: 2" in format_table(build_report(result))


def test_corrupt_checkpoint_is_reported_and_others_evaluated(ray_cluster: RayCluster, specs,
                                                            reference, tmp_path) -> None:
    baseline = fixtures_dir() / "ppo_baseline" / "Huggy"
    data = (baseline / "Huggy-2000343.pt").read_bytes()
    corrupt = tmp_path / "Huggy-1000.pt"
    corrupt.write_bytes(data[: len(data) // 3])
    onnx = tmp_path / "Huggy-2000139.onnx"
    shutil.copy(fixtures_dir() / "ppo_num_layers_2" / "Huggy" / "Huggy-2000139.onnx", onnx)
    chosen = policy_specs([baseline / "Huggy-2000343.onnx", corrupt, onnx,
                              baseline / "Huggy-2000343.pt"])
    result = evaluate_on_ray(chosen, replace(CONFIG, runners=2), ENV)
    ok_onnx, bad, ok_copy, ok_pt = summarize_all(result)
    assert bad.status == "failed" and bad.episodes == 0 and bad.fingerprint is None
    assert "Huggy-1000.pt" in bad.error and bad.error.startswith("PolicyLoadError: ")
    assert [s.status for s in (ok_onnx, ok_copy, ok_pt)] == ["ok", "ok", "ok"]
    # The same files as the reference's first two policies give the same episodes.
    assert _episodes(result)[0] == _episodes(reference)[0]
    assert _episodes(result)[2] == _episodes(reference)[1]
    # The .pt holds the same policy as the .onnx (to float rounding, which episodes can amplify).
    assert ok_pt.mean_return == pytest.approx(ok_onnx.mean_return, abs=0.02)
    assert f"failed: {bad.label}: PolicyLoadError" in format_table(build_report(result))


def test_estimator_is_exact_on_scripted_episodes_with_any_runners(ray_cluster: RayCluster,
                                                                  specs) -> None:
    """Scripted stand-in episodes (slot s: 4 + 6 s decisions, return s; see
    tests/test_envs_statistics.py): 15 episodes per item over 6 slots give the hand-worked
    means 2.2 and 17.2 for every item, with 1 and 2 runners and in the plain loop."""
    env = EnvSpec(num_agents=6, parameters={"episode_length": 4, "episode_length_step": 6})
    config = replace(CONFIG, episodes=30, episodes_per_item=15)
    results = [evaluate_plain(specs[:1], config, env),
               evaluate_on_ray(specs[:1], config, env),
               evaluate_on_ray(specs[:1], replace(config, runners=2), env)]
    for result in results:
        (summary,) = summarize_all(result)
        assert summary.episodes == 30
        assert summary.mean_return == pytest.approx(33 / 15)
        assert summary.mean_length == pytest.approx(258 / 15)
        assert summary.terminated_share == pytest.approx(8 / 15)
    assert _episodes(results[0]) == _episodes(results[1]) == _episodes(results[2])


def test_runs_on_both_nodes(ray_cluster: RayCluster, specs, reference) -> None:
    config = replace(CONFIG, runners=2,
                     pin_nodes=(ray_cluster.head_node_id, ray_cluster.worker_node_id))
    result = evaluate_on_ray(specs, config, ENV, on_result=wait_for_every_runner)
    nodes = result.node_episodes()
    assert set(nodes) == {ray_cluster.head_node_id, ray_cluster.worker_node_id}
    assert sum(nodes.values()) == 3 * 36
    assert {r.node_id for r in result.runners} == set(nodes)
    assert _episodes(result) == _episodes(reference)
    table = format_table(build_report(result))
    assert ray_cluster.head_node_id in table and ray_cluster.worker_node_id in table


def test_interrupt_keeps_finished_items_and_stops_runners(ray_cluster: RayCluster, specs,
                                                          reference) -> None:
    import ray

    seen: dict[str, object] = {}

    def interrupt(result: ItemResult, pool: RunnerPool | None) -> None:
        assert pool is not None
        seen.update(pool.actors)
        raise KeyboardInterrupt

    result = evaluate_on_ray(specs, replace(CONFIG, runners=2), ENV,
                             on_result=interrupt)
    assert result.interrupted
    finished = [item for policy in result.policies for item in policy.items]
    assert len(finished) == 1
    item = finished[0]
    expected = reference.policies[item.policy_index].ordered_items()[item.index]
    assert item.returns == expected.returns
    assert {s.status for s in summarize_all(result)} <= {"incomplete"}
    for actor in seen.values():  # ray.kill is asynchronous: calls may get in until it lands
        with pytest.raises(ray.exceptions.RayActorError):
            while True:
                ray.get(actor.info.remote())
                time.sleep(0.2)


def test_policy_url_runners_query_serve(ray_cluster: RayCluster, reference) -> None:
    """With a Serve URL instead of a file, runners query the served policy: same episodes as
    the plain loop with the same policy loaded locally. An unreachable URL is reported failed."""
    from deploy.serving.server import DEFAULT_INGRESS, deploy, start_serve, stop_serve
    from deploy.serving.settings import AppArgs

    served = fixtures_dir() / "ppo_num_layers_2" / "Huggy" / "Huggy-2000139.onnx"
    assert reference.policies[1].spec.path == str(served)
    port = free_port()
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    try:
        deploy(AppArgs(policy=str(served), accelerator="cpu", num_cpus=0.5), timeout_s=120)
        url = f"http://127.0.0.1:{port}"
        dead = f"http://127.0.0.1:{free_port()}"
        specs = [PolicySpec(label=url, url=url), PolicySpec(label=dead, url=dead)]
        result = evaluate_on_ray(specs, CONFIG, ENV)
    finally:
        stop_serve(port)
    good, bad = summarize_all(result)
    assert good.status == "ok" and good.fingerprint == reference.policies[1].fingerprint
    assert _episodes(result)[0] == _episodes(reference)[1]
    assert bad.status == "failed"
    assert bad.error.startswith("PolicyLoadError: ") and dead in bad.error


def test_stochastic_items_are_seeded(ray_cluster: RayCluster, specs, reference) -> None:
    """Sampled actions are seeded per item too: Ray equals the plain loop, and differs from the
    deterministic policy."""
    config = replace(CONFIG, stochastic=True, runners=2)
    plain = evaluate_plain(specs[:1], config, ENV)
    on_ray = evaluate_on_ray(specs[:1], config, ENV, on_result=wait_for_every_runner)
    assert _episodes(on_ray) == _episodes(plain)
    assert _numbers(on_ray) == _numbers(plain)
    assert _episodes(plain)[0] != _episodes(reference)[0]


def test_more_runners_than_the_cluster_holds_is_refused(ray_cluster: RayCluster, specs) -> None:
    config = replace(CONFIG, runners=5)  # 4 CPUs in the session cluster
    with pytest.raises(RuntimeError, match=re.escape(
            "cannot start 5 runners of 1 CPU each: cannot start 5 replicas on accelerator 'cpu': "
            "each needs {CPU: 1}, so 5 need CPU: 5, and the cluster has CPU: 4 in total")):
        evaluate_on_ray(specs, config, ENV)


def test_instances_per_runner_give_identical_episodes(ray_cluster: RayCluster, specs,
                                                      reference) -> None:
    """Runners with 2 Unity instances run 2 items at once, one per instance, with the policy
    called per instance: the episodes equal the one-instance reference exactly, in the plain
    loop and on Ray, deterministic or stochastic; the scripted estimator stays exact."""
    env = replace(ENV, instances=2)
    plain = evaluate_plain(specs, CONFIG, env)
    on_ray = evaluate_on_ray(specs, CONFIG, env)
    assert _episodes(plain) == _episodes(on_ray) == _episodes(reference)
    assert _numbers(plain) == _numbers(on_ray) == _numbers(reference)
    steps = [[item.agent_steps for item in p.ordered_items()] for p in reference.policies]
    for result in (plain, on_ray):
        assert [[item.agent_steps for item in p.ordered_items()]
                for p in result.policies] == steps
        (runner,) = result.runners
        assert len(runner.env_pids) == 2 and runner.env_pid == runner.env_pids[0]
    stochastic = replace(CONFIG, stochastic=True)
    assert _episodes(evaluate_plain(specs[:1], stochastic, env)) == \
        _episodes(evaluate_plain(specs[:1], stochastic, ENV))
    scripted = EnvSpec(num_agents=6, parameters={"episode_length": 4, "episode_length_step": 6},
                       instances=2)
    (summary,) = summarize_all(evaluate_plain(
        specs[:1], replace(CONFIG, episodes=30, episodes_per_item=15), scripted))
    assert summary.episodes == 30
    assert summary.mean_return == pytest.approx(33 / 15)
    assert summary.mean_length == pytest.approx(258 / 15)


def test_other_policy_kinds_are_evaluated_on_the_spec_driven_stand_in(ray_cluster: RayCluster
                                                                      ) -> None:
    """The trained Pyramids policy (4 inputs, masked discrete actions) and the recurrent one,
    evaluated on Ray: the stand-in plays each policy's own behavior (`stand_in_behavior`),
    Pyramids honours every mask (each 12-decision episode returns exactly 12 x 0.01), and the
    numbers equal the plain loop's."""
    parameters = {"episode_length": 12}
    config = replace(CONFIG, episodes=16, episodes_per_item=8, runners=2)
    for run in ("pyramids_trained", "lstm"):
        chosen = policy_specs([mlagents_fixtures_dir() / run])[-1:]
        env = EnvSpec(num_agents=8, parameters=parameters,
                      behavior_spec=stand_in_behavior(chosen))
        assert env.behavior_spec is not None and env.behavior_spec["inputs"]
        on_ray = evaluate_on_ray(chosen, config, env)
        plain = evaluate_plain(chosen, config, env)
        (summary,) = summarize_all(on_ray)
        assert summary.status == "ok" and summary.episodes == 16
        assert _episodes(on_ray) == _episodes(plain)
        if run == "pyramids_trained":
            assert summary.mean_return == pytest.approx(12 * float(np.float32(0.01)), abs=1e-9)
            assert summary.std_return == pytest.approx(0.0, abs=1e-12)


def test_policies_of_different_kinds_are_refused_together() -> None:
    chosen = policy_specs([fixtures_dir() / "ppo_baseline" / "Huggy.onnx",
                              mlagents_fixtures_dir() / "pyramids_trained"])
    with pytest.raises(ValueError, match=re.escape(
            "the policies have different interfaces, which one environment cannot play: "
            "ppo_baseline/Huggy.onnx: obs_0 (59,) -> 21 continuous; pyramids_trained/Pyramids.onnx: "
            "obs_0 (56,), obs_1 (56,), obs_2 (56,), obs_3 (4,) -> discrete (5,); evaluate them "
            "separately")):
        stand_in_behavior(chosen)
    assert stand_in_behavior(chosen[:1]) is None  # Huggy: the Huggy stand-in


def test_select_best_on_ray_with_instances_and_a_crash_equals_the_plain_loop(
        ray_cluster: RayCluster, specs, reference) -> None:
    """`--select-best` in rounds on 2 runners of 2 instances each, with the first finishing
    runner's environment killed: the same items, episodes and decisions as the plain loop, every
    item whole and from the uniform plan, the budget kept."""
    from deploy.evaluation.plan import SelectionConfig

    config = replace(CONFIG, episodes=3 * 18 * 4, selection=SelectionConfig())
    plain = evaluate_plain(specs, config, ENV)
    faults: list[str] = []

    def crash_env(result: ItemResult, pool: RunnerPool | None) -> None:
        assert pool is not None
        if faults:
            return
        wait_for_every_runner(result, pool)
        env_pid = pool.infos[result.runner].env_pid
        assert env_pid is not None
        os.kill(env_pid, signal.SIGKILL)  # its next batch finds the environment dead
        faults.append(result.runner)

    on_ray = evaluate_on_ray(specs, replace(config, runners=2), replace(ENV, instances=2),
                             on_result=crash_env)
    assert faults and on_ray.retries >= 1
    assert _episodes(on_ray) == _episodes(plain)
    assert on_ray.selection == plain.selection
    selection = asdict(plain.selection)
    assert selection["budget"] == 216 and selection["episodes_spent"] <= 216
    assert selection["episodes_spent"] == sum(
        len(item.returns) for policy in plain.policies for item in policy.items)
    # The first two items of every policy are exactly the uniform plan's (the reference).
    assert [items[:2] for items in _episodes(plain)] == _episodes(reference)
    for policy in plain.policies:
        assert all(len(item.returns) == 18 for item in policy.items)
    summaries = {s.label: s for s in summarize_all(plain)}
    kept = selection["remaining"]
    assert selection["best"] == max(kept, key=lambda label: summaries[label].mean_return)
    for label, episodes in selection["dropped"].items():
        assert summaries[label].episodes == episodes and summaries[label].status == "ok"
    assert selection["rounds"] >= 2 and selection["rule"] == "successive-elimination-bonferroni"
    assert "selection (successive-elimination-bonferroni, confidence 0.95)" in format_table(
        build_report(plain))
