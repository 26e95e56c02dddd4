"""deploy.report and the planning parts of deploy.evaluate: statistics, files, items, policies."""

from __future__ import annotations

import csv
import json
import re
import shutil

import numpy as np
import pytest

from deploy.evaluate import (
    EnvSpec,
    EvalConfig,
    EvaluationResult,
    ItemResult,
    PolicyResult,
    PolicySpec,
    expand_policies,
    plan_items,
    runner_options,
)
from deploy.report import format_table, summarize, t_quantile, write_report
from tests.conftest import FIXTURE_RUNS, fixtures_dir


@pytest.mark.parametrize(("p", "df", "table"), [
    # Student's t quantiles as printed in statistical tables (4 decimals).
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 10, 2.2281), (0.975, 35, 2.0301),
    (0.975, 120, 1.9799), (0.995, 5, 4.0321), (0.95, 20, 1.7247),
])
def test_t_quantile_matches_tables(p: float, df: int, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, abs=6e-5)


def test_t_quantile_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=re.escape("p must be in (0.5, 1), got 0.3")):
        t_quantile(0.3, 4)
    with pytest.raises(ValueError, match=re.escape("df must be an integer >= 1, got 0")):
        t_quantile(0.975, 0)


def _item(policy: int, index: int, returns: list[float], node: str = "n1",
          attempts: int = 1) -> ItemResult:
    return ItemResult(policy_index=policy, index=index, seed=index, returns=tuple(returns),
                      lengths=tuple(10 + i for i in range(len(returns))),
                      reached_stick=tuple(r > 1.0 for r in returns), agent_steps=100,
                      seconds=0.5, node_id=node, runner="runner-0", attempts=attempts)


def _result() -> EvaluationResult:
    rng = np.random.default_rng(3)
    first, second = rng.normal(2.0, 1.0, 18).tolist(), rng.normal(2.0, 1.0, 18).tolist()
    good = PolicyResult(PolicySpec("run_a@100", path="a.pt", run="run_a", step=100),
                        # finished out of order: statistics must not depend on it
                        items=[_item(0, 1, second, node="n2", attempts=2), _item(0, 0, first)],
                        fingerprint="abc")
    later = PolicyResult(PolicySpec("run_a@200", path="b.pt", run="run_a", step=200),
                         items=[_item(1, 0, [3.0, 4.0, 5.0])])
    broken = PolicyResult(PolicySpec("bad.pt", path="bad.pt"),
                          error="PolicyLoadError: bad.pt: truncated")
    return EvaluationResult([good, later, broken], EvalConfig(episodes=36), EnvSpec(),
                            seconds=1.25)


def test_summary_statistics_against_numpy() -> None:
    result = _result()
    summary = summarize(result.policies[0], expected_episodes=36)
    returns = np.array(result.policies[0].items[1].returns + result.policies[0].items[0].returns)
    assert summary.status == "ok" and summary.episodes == 36
    assert summary.mean_return == pytest.approx(returns.mean(), rel=1e-12)
    assert summary.std_return == pytest.approx(returns.std(ddof=1), rel=1e-12)
    half = 2.0301079 * returns.std(ddof=1) / 6.0  # t(0.975, 35) * s / sqrt(36)
    assert summary.ci_low == pytest.approx(returns.mean() - half, rel=1e-6)
    assert summary.ci_high == pytest.approx(returns.mean() + half, rel=1e-6)
    assert summary.reached_stick == pytest.approx((returns > 1.0).mean())
    assert summary.mean_length == pytest.approx(np.mean(list(range(10, 28)) * 2))
    assert summary.agent_steps_per_s == pytest.approx(200 / 1.0)
    assert summary.retries == 1 and summary.nodes == ("n1", "n2")
    short = summarize(result.policies[1], expected_episodes=36)
    assert short.status == "incomplete" and short.mean_return == pytest.approx(4.0)
    failed = summarize(result.policies[2], expected_episodes=36)
    assert failed.status == "failed" and failed.episodes == 0 and failed.mean_return is None


def test_report_files(tmp_path) -> None:
    result = _result()
    paths = write_report(result, tmp_path / "out")
    with open(paths["csv"]) as handle:
        rows = list(csv.DictReader(handle))
    assert [row["label"] for row in rows] == ["run_a@100", "run_a@200", "bad.pt"]
    assert [row["status"] for row in rows] == ["ok", "incomplete", "failed"]
    assert float(rows[1]["mean_return"]) == pytest.approx(4.0)
    assert rows[2]["mean_return"] == "" and "truncated" in rows[2]["error"]
    data = json.loads(paths["json"].read_text())
    assert data["retries"] == 1 and data["nodes"] == {"n1": 21, "n2": 18}
    assert [item["index"] for item in data["policies"][0]["items"]] == [0, 1]
    assert data["policies"][0]["items"][1]["node_id"] == "n2"
    assert data["config"]["episodes"] == 36
    png = paths["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    table = format_table(result)
    assert "run_a@100" in table and "retries: 1" in table and "n2 (18 episodes)" in table
    assert "failed: bad.pt: PolicyLoadError: bad.pt: truncated" in table


def test_plan_items_same_seeds_for_every_policy() -> None:
    items = plan_items(2, EvalConfig(episodes=40, episodes_per_item=18, seed=7))
    assert [(i.policy_index, i.index, i.seed, i.episodes) for i in items] == [
        (0, 0, 7, 18), (0, 1, 8, 18), (0, 2, 9, 4), (1, 0, 7, 18), (1, 1, 8, 18), (1, 2, 9, 4)]


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match=re.escape("runners must be an integer >= 1, got 0")):
        EvalConfig(runners=0)
    with pytest.raises(ValueError, match=re.escape(
            "accelerator must be one of auto, cpu, gpu, npu, got 'tpu'")):
        EvalConfig(accelerator="tpu")
    with pytest.raises(ValueError, match=re.escape(
            "seed must be >= 0 and seed + items - 1 < 2**24 (the environment's seed range), got "
            "seed 16777215 (last item's seed 16777216)")):
        EvalConfig(seed=2**24 - 1, episodes=36)
    with pytest.raises(ValueError, match=re.escape("got seed -1")):
        EvalConfig(seed=-1)


def test_runner_options_pin_accelerators_like_serve() -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from deploy.placement import ReplicaPlacement

    npu = runner_options(ReplicaPlacement("npu", "npu:0", 1.0), node_id="ab" * 28)
    assert npu["resources"] == {"NPU": 1} and npu["num_cpus"] == 1.0
    assert isinstance(npu["scheduling_strategy"], NodeAffinitySchedulingStrategy)
    assert npu["scheduling_strategy"].node_id == "ab" * 28
    assert npu["scheduling_strategy"].soft is False
    gpu = runner_options(ReplicaPlacement("gpu", "cuda:0", 0.5))
    assert gpu["num_gpus"] == 1 and gpu["num_cpus"] == 0.5 and "resources" not in gpu
    assert gpu["scheduling_strategy"] == "SPREAD" and gpu["max_restarts"] == 0
    cpu = runner_options(ReplicaPlacement("cpu", "cpu", 1.0))
    assert "num_gpus" not in cpu and "resources" not in cpu


def test_expand_policies(tmp_path) -> None:
    root = fixtures_dir()
    specs = expand_policies([root / run for run in FIXTURE_RUNS])
    # Each fixture folder records ten checkpoints but holds only the final one's files.
    assert [(s.run, s.step) for s in specs] == [
        ("ppo_baseline", 2000343), ("ppo_num_layers_2", 2000139), ("ppo_normalize_False", 2000073)]
    assert all(s.path is not None and s.path.endswith(("Huggy-2000343.onnx", "Huggy-2000139.onnx",
                                                       "Huggy-2000073.onnx")) for s in specs)
    single = root / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt"
    copy = tmp_path / "Huggy-2000343.pt"
    shutil.copy(single, copy)
    files = expand_policies([single, copy])
    assert [s.step for s in files] == [2000343, 2000343]
    assert files[0].label != files[1].label
    with pytest.raises(FileNotFoundError, match="policy not found: .*missing.pt"):
        expand_policies([tmp_path / "missing.pt"])
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(ValueError, match="no checkpoint files found in results folder"):
        expand_policies([tmp_path / "empty_run"])
