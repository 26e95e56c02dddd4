"""deploy.report and the planning parts of deploy.evaluation: statistics, files, items, policies."""

from __future__ import annotations

import csv
import json
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest

from deploy.evaluation.charts import chart_label, env_name, learning_curve_figure
from deploy.evaluation.on_ray import runner_options
from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec, plan_items
from deploy.evaluation.report import format_table, write_report
from deploy.evaluation.results import EvaluationResult, ItemResult, PolicyResult
from deploy.evaluation.selection import SelectionOutcome
from deploy.evaluation.sources import policy_specs
from deploy.evaluation.statistics import t_quantile
from deploy.evaluation.summary import build_report, summarize, summarize_all
from envs.rollout import ESTIMATOR, ESTIMATOR_DESCRIPTION
from tests.support.fixtures import FIXTURE_RUNS, fixtures_dir


@pytest.mark.parametrize(("p", "df", "table"), [
    # Student's t quantiles as printed in statistical tables (4 decimals).
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 9, 2.2622), (0.975, 10, 2.2281),
    (0.975, 29, 2.0452), (0.975, 35, 2.0301), (0.975, 120, 1.9799), (0.995, 5, 4.0321),
    (0.95, 20, 1.7247),
])
def test_t_quantile_matches_tables(p: float, df: int, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, abs=6e-5)


@pytest.mark.parametrize(("n", "textbook_t"), [(2, 12.706), (10, 2.262), (30, 2.045)])
def test_confidence_interval_uses_textbook_t(n: int, textbook_t: float) -> None:
    # The 95% interval's half-width is t(0.975, n-1) * s / sqrt(n), t as printed in textbooks.
    returns = np.random.default_rng(n).normal(2.0, 1.0, n).tolist()
    policy = PolicyResult(PolicySpec("p.pt", path="p.pt"), items=[_item(0, 0, returns)])
    summary = summarize(policy, expected_episodes=n)
    std_error = np.std(returns, ddof=1) / np.sqrt(n)
    assert round((summary.ci_high - summary.mean_return) / std_error, 3) == textbook_t
    assert round((summary.mean_return - summary.ci_low) / std_error, 3) == textbook_t


def test_t_quantile_rejects_bad_arguments() -> None:
    for p in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=re.escape(f"p must be in (0, 1), got {p}")):
            t_quantile(p, 4)
    for df in (0, 2.5, True):
        with pytest.raises(ValueError, match=re.escape(f"df must be an integer >= 1, got {df}")):
            t_quantile(0.975, df)


def _item(policy: int, index: int, returns: list[float], node: str = "n1",
          attempts: int = 1) -> ItemResult:
    """One item whose episode k ran in slot k % 18 as that slot's episode k // 18."""
    return ItemResult(policy_index=policy, index=index, seed=index, returns=tuple(returns),
                      lengths=tuple(10 + i for i in range(len(returns))),
                      terminated=tuple(r > 1.0 for r in returns),
                      slots=tuple(k % 18 for k in range(len(returns))),
                      episode_indices=tuple(k // 18 for k in range(len(returns))),
                      agent_steps=100, seconds=0.5, node_id=node, runner="runner-0",
                      attempts=attempts)


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
    assert summary.terminated_share == pytest.approx((returns > 1.0).mean())
    assert summary.mean_length == pytest.approx(np.mean(list(range(10, 28)) * 2))
    assert summary.agent_steps_per_s == pytest.approx(200 / 1.0)
    assert summary.retries == 1 and summary.nodes == ("n1", "n2")
    short = summarize(result.policies[1], expected_episodes=36)
    assert short.status == "incomplete" and short.mean_return == pytest.approx(4.0)
    failed = summarize(result.policies[2], expected_episodes=36)
    assert failed.status == "failed" and failed.episodes == 0 and failed.mean_return is None


def test_report_files(tmp_path) -> None:
    result = _result()
    paths = write_report(build_report(result), tmp_path / "out")
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
    assert data["estimator"] == {"name": ESTIMATOR, "description": ESTIMATOR_DESCRIPTION}
    assert data["estimator"]["name"] == "per-slot quota"
    items = data["policies"][1]["items"]
    assert items[0]["slots"] == [0, 1, 2] and items[0]["episode_indices"] == [0, 0, 0]
    assert data["policies"][0]["items"][0]["slots"] == list(range(18))
    png = paths["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    table = format_table(build_report(result))
    assert "run_a@100" in table and "retries: 1" in table and "n2 (18 episodes)" in table
    assert "failed: bad.pt: PolicyLoadError: bad.pt: truncated" in table


def test_table_names_terminated_episodes_for_the_behavior() -> None:
    result = _result()
    header = format_table(build_report(result)).splitlines()[0]
    assert "terminated" in header and "reached stick" not in header
    for policy in result.policies:
        policy.items = [replace(item, behavior="Huggy?team=0") for item in policy.items]
    header = format_table(build_report(result)).splitlines()[0]
    assert "reached stick" in header and "terminated" not in header


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

    config = EvalConfig(max_attempts=3)
    npu = runner_options(ReplicaPlacement("npu", "npu:0", 1.0), config.max_attempts,
                         node_id="ab" * 28)
    assert npu["resources"] == {"NPU": 1} and npu["num_cpus"] == 1.0
    assert isinstance(npu["scheduling_strategy"], NodeAffinitySchedulingStrategy)
    assert npu["scheduling_strategy"].node_id == "ab" * 28
    assert npu["scheduling_strategy"].soft is True
    gpu = runner_options(ReplicaPlacement("gpu", "cuda:0", 0.5), config.max_attempts)
    assert gpu["num_gpus"] == 1 and gpu["num_cpus"] == 0.5 and "resources" not in gpu
    assert gpu["scheduling_strategy"] == "SPREAD"
    assert gpu["max_restarts"] == -1 and gpu["max_task_retries"] == 2
    cpu = runner_options(ReplicaPlacement("cpu", "cpu", 1.0), config.max_attempts)
    assert "num_gpus" not in cpu and "resources" not in cpu


def test_expand_policies(tmp_path) -> None:
    root = fixtures_dir()
    specs = policy_specs([root / run for run in FIXTURE_RUNS])
    # Each fixture folder records ten checkpoints but holds only the final one's files.
    assert [(s.run, s.step) for s in specs] == [
        ("ppo_baseline", 2000343), ("ppo_num_layers_2", 2000139), ("ppo_normalize_False", 2000073)]
    assert all(s.path is not None and s.path.endswith(("Huggy-2000343.onnx", "Huggy-2000139.onnx",
                                                       "Huggy-2000073.onnx")) for s in specs)
    single = root / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt"
    copy = tmp_path / "Huggy-2000343.pt"
    shutil.copy(single, copy)
    files = policy_specs([single, copy])
    assert [s.step for s in files] == [2000343, 2000343]
    assert files[0].label != files[1].label
    with pytest.raises(FileNotFoundError, match="policy not found: .*missing.pt"):
        policy_specs([tmp_path / "missing.pt"])
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(ValueError, match="no checkpoint or export files found in results folder"):
        policy_specs([tmp_path / "empty_run"])
    # A folder with only its final export (as a shared policy comes) is that one policy.
    (tmp_path / "final_only").mkdir()
    shutil.copy(root / "ppo_baseline" / "Huggy.onnx", tmp_path / "final_only" / "Huggy.onnx")
    (final,) = policy_specs([tmp_path / "final_only"])
    assert (final.label, final.step) == ("final_only/Huggy.onnx", None)


# The chart. Each test builds an EvaluationResult by hand and inspects the Figure that
# learning_curve_figure returns (axes labelled "curves", "curves reached", "policies",
# "policies reached"), after a real layout and draw.


def _evaluation(policies: list[tuple[PolicySpec, float | None]],
                env: EnvSpec | None = None) -> EvaluationResult:
    """One policy per (spec, mean): 36 episodes around `mean`, or a load failure for None."""
    rng = np.random.default_rng(11)
    results = []
    for index, (spec, mean) in enumerate(policies):
        if mean is None:
            results.append(PolicyResult(spec, error="PolicyLoadError: truncated"))
        else:
            returns = rng.normal(mean, 1.0, 36).tolist()
            results.append(PolicyResult(spec, items=[_item(index, 0, returns[:18]),
                                                     _item(index, 1, returns[18:])]))
    return EvaluationResult(results, EvalConfig(episodes=36), env or EnvSpec())


def _file(label: str) -> PolicySpec:
    return PolicySpec(label, path=f"/somewhere/{label}")


def _checkpoint(run: str, step: int) -> PolicySpec:
    return PolicySpec(f"{run}@{step}", path=f"/results/{run}/Huggy-{step}.pt", run=run, step=step)


def _figure(result: EvaluationResult):
    """The chart of `result`, laid out and drawn, with its axes by label."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = learning_curve_figure(summarize_all(result), env_name(result.env))
    FigureCanvasAgg(figure).draw()
    return figure, {axes.get_label(): axes for axes in figure.axes}


def _marks(axes) -> list[str]:
    """Labels of the error-bar marks (one per curve or per policy) on `axes`."""
    from matplotlib.container import ErrorbarContainer

    return [c.get_label() for c in axes.containers if isinstance(c, ErrorbarContainer)]


def _ticks(axes) -> list[str]:
    return [label.get_text().replace("\n", "") for label in axes.get_xticklabels()]


def _texts(figure) -> str:
    from matplotlib.text import Text

    return "\n".join(text.get_text() for text in figure.findobj(Text))


def _assert_readable(figure, axes: dict) -> None:
    """Nothing drawn outside the figure, and no two policy tick labels overlap (rotated ones:
    the gap between neighbours, across the text's direction, exceeds the text's height)."""
    renderer = figure.canvas.get_renderer()
    drawn, page = figure.get_tightbbox(renderer), figure.bbox_inches  # inches
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01
    assert drawn.x1 <= page.x1 + 0.01 and drawn.y1 <= page.y1 + 0.01
    if "policies reached" not in axes or len(axes["policies reached"].get_xticks()) < 2:
        return
    bottom = axes["policies reached"]
    labels = bottom.get_xticklabels()
    angle = labels[0].get_rotation()
    if angle == 0:
        boxes = [label.get_window_extent(renderer) for label in labels]
        assert all(not a.overlaps(b) for a, b in zip(boxes, boxes[1:], strict=False))
        return
    spacing = bottom.transData.transform((1, 0))[0] - bottom.transData.transform((0, 0))[0]
    heights = []
    for label in labels:
        label.set_rotation(0)
        heights.append(label.get_window_extent(renderer).height)
        label.set_rotation(angle)
    assert spacing * np.sin(np.radians(angle)) > max(heights)


def _assert_policies(axes: dict, result: EvaluationResult, labels: list[str]) -> None:
    """The single-policy panels show exactly `labels`: one mark, one tick, one bar each, the
    mark at the policy's mean and the bar at its reached share."""
    summaries = {s.label: s for s in summarize_all(result)}
    assert _marks(axes["policies"]) == labels
    assert _ticks(axes["policies reached"]) == labels
    bars = axes["policies reached"].patches
    assert [bar.get_height() for bar in bars] == pytest.approx(
        [summaries[label].terminated_share for label in labels])
    means = [c.lines[0].get_ydata()[0] for c in axes["policies"].containers]
    assert means == pytest.approx([summaries[label].mean_return for label in labels])


def test_chart_two_stepless_policies_are_both_drawn() -> None:
    labels = ["ppo_gamma_0.8/Huggy.onnx", "ppo_baseline/Huggy.onnx"]
    result = _evaluation([(_file(label), 3.0 + k) for k, label in enumerate(labels)])
    figure, axes = _figure(result)
    assert set(axes) == {"policies", "policies reached"}
    _assert_policies(axes, result, labels)
    assert figure.get_suptitle() == "Evaluation: built-in stand-in"
    _assert_readable(figure, axes)


@pytest.mark.parametrize("count", [1, 2, 5])
def test_chart_of_1_2_5_policies(count: int) -> None:
    labels = [f"ppo_variant_{k}/Huggy.onnx" for k in range(count)]
    result = _evaluation([(_file(label), 1.0 + 0.5 * k) for k, label in enumerate(labels)],
                         env=EnvSpec(file_name="/opt/builds/Huggy/Huggy.x86_64"))
    figure, axes = _figure(result)
    assert set(axes) == {"policies", "policies reached"}
    _assert_policies(axes, result, labels)
    assert figure.get_suptitle() == "Evaluation: Huggy.x86_64"
    assert "failed" not in _texts(figure)
    _assert_readable(figure, axes)


def test_chart_mixes_learning_curve_and_single_policies(tmp_path) -> None:
    steps = [2000343, 500000, 1000000]  # out of order: the curve is drawn by step
    result = _evaluation([(_checkpoint("ppo_baseline", step), step / 1e6) for step in steps]
                         + [(_file("ppo_gamma_0.8/Huggy.onnx"), 3.1),
                            (_file("ppo_baseline/Huggy.onnx"), 3.5)])
    figure, axes = _figure(result)
    assert set(axes) == {"curves", "curves reached", "policies", "policies reached"}
    assert _marks(axes["curves"]) == ["ppo_baseline"]
    (curve,) = axes["curves"].containers
    assert list(curve.lines[0].get_xdata()) == [500000, 1000000, 2000343]
    assert [t.get_text() for t in axes["curves"].get_legend().get_texts()] == ["ppo_baseline"]
    assert len(axes["curves reached"].get_lines()) == 1
    _assert_policies(axes, result, ["ppo_gamma_0.8/Huggy.onnx", "ppo_baseline/Huggy.onnx"])
    # Both show mean return on one scale.
    assert axes["curves"].get_ylim() == axes["policies"].get_ylim()
    _assert_readable(figure, axes)
    png = write_report(build_report(result), tmp_path)["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_chart_two_runs_with_one_final_checkpoint_each_are_not_a_curve() -> None:
    result = _evaluation([(_checkpoint("ppo_baseline", 2000010), 3.5),
                          (_checkpoint("ppo_gamma_0.8", 2000057), 2.5)])
    figure, axes = _figure(result)
    assert "curves" not in axes
    _assert_policies(axes, result, ["ppo_baseline@2000010", "ppo_gamma_0.8@2000057"])
    _assert_readable(figure, axes)


def _selection(best: str, dropped: dict[str, int], remaining: list[str]) -> SelectionOutcome:
    return SelectionOutcome(best=best, statistic="mean", confidence=0.95, episodes_spent=216,
                            budget=216, dropped=dropped, remaining=remaining, rounds=4,
                            max_rounds=4, comparison_level=0.004)


def _selection_figure(result: EvaluationResult, selection: SelectionOutcome):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = learning_curve_figure(summarize_all(result), env_name(result.env),
                                   selection=selection)
    FigureCanvasAgg(figure).draw()
    return figure, {axes.get_label(): axes for axes in figure.axes}


def _is_white(color) -> bool:
    from matplotlib.colors import to_rgba

    return to_rgba(color) == to_rgba("white")


def test_chart_marks_the_pick_of_select_best_and_the_runs_it_dropped() -> None:
    """Three runs of one checkpoint each, as `huggy evaluate results/Huggy results/Huggy2
    results/Huggy3 --select-best` has them: no curve, each a point with its interval; the pick
    carries a star on its mean, the dropped run a hollow mark and its episode count, and a
    legend says what the star and the hollow mark mean."""
    result = _evaluation([(_checkpoint("Huggy", 2000343), 3.5),
                          (_checkpoint("Huggy2", 2000139), 3.0),
                          (_checkpoint("Huggy3", 2000073), 2.0)])
    labels = ["Huggy@2000343", "Huggy2@2000139", "Huggy3@2000073"]
    selection = _selection("Huggy@2000343", {"Huggy3@2000073": 18}, labels[:2])
    figure, axes = _selection_figure(result, selection)
    assert "curves" not in axes
    policies = axes["policies"]
    marks = [c for c in policies.containers if c.get_label() in labels]
    assert [c.get_label() for c in marks] == labels
    for mark in marks:  # a point with its interval, no line
        assert mark.has_yerr and mark.lines[0].get_marker() == "o"
        assert mark.lines[0].get_linestyle() == "None" and len(mark.lines[0].get_xdata()) == 1
    assert [_is_white(m.lines[0].get_markerfacecolor()) for m in marks] == [False, False, True]
    (star,) = [line for line in policies.lines if line.get_marker() == "*"]
    picked = marks[0].lines[0]
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (picked.get_xdata()[0],
                                                          picked.get_ydata()[0])
    assert "dropped after 18 episodes" in [t.get_text().replace("\n", " ") for t in policies.texts]
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "picked by --select-best", "dropped early by --select-best (hollow)"]
    _assert_readable(figure, axes)


def test_chart_marks_the_pick_and_the_drops_on_a_learning_curve() -> None:
    steps = [500000, 1000000, 2000000]
    result = _evaluation([(_checkpoint("run", step), step / 1e6) for step in steps])
    selection = _selection("run@2000000", {"run@500000": 36}, ["run@1000000", "run@2000000"])
    figure, axes = _selection_figure(result, selection)
    curves = axes["curves"]
    (star,) = [line for line in curves.lines if line.get_marker() == "*"]
    summaries = {s.label: s for s in summarize_all(result)}
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (
        2000000, pytest.approx(summaries["run@2000000"].mean_return))
    (hollow,) = [line for line in curves.lines if line.get_marker() == "o"
                 and _is_white(line.get_markerfacecolor())]
    assert list(hollow.get_xdata()) == [500000]
    assert "dropped after 36 episodes" in [t.get_text().replace("\n", " ") for t in curves.texts]
    _assert_readable(figure, axes)


def test_chart_names_failed_policies() -> None:
    result = _evaluation([(_file("good/Huggy.onnx"), 3.0), (_file("broken/Huggy.pt"), None)])
    figure, axes = _figure(result)
    _assert_policies(axes, result, ["good/Huggy.onnx"])
    assert "failed: broken/Huggy.pt" in _texts(figure)
    _assert_readable(figure, axes)
    nothing, _ = _figure(_evaluation([(_file("broken/Huggy.pt"), None)]))
    assert "failed: broken/Huggy.pt" in _texts(nothing)
    assert "no finished episodes" in _texts(nothing)


def test_chart_shortens_long_labels_and_rotates_them() -> None:
    long = "/home/someone/experiments/2026/november/ppo_gamma_0.8/Huggy.onnx"
    assert chart_label(long) == "…/ppo_gamma_0.8/Huggy.onnx"
    assert chart_label("ppo_gamma_0.8/Huggy.onnx") == "ppo_gamma_0.8/Huggy.onnx"
    assert len(chart_label("x" * 80 + "/Huggy.onnx")) == 32
    labels = [long, long.replace("0.8", "0.9"), "averyveryverylongrunname_with_params/Huggy.onnx",
              "http://127.0.0.1:8000"]
    result = _evaluation([(_file(label), 3.0) for label in labels])
    figure, axes = _figure(result)
    shown = [chart_label(label) for label in labels]
    assert all(len(label) <= 32 for label in shown)
    assert _marks(axes["policies"]) == shown and _ticks(axes["policies reached"]) == shown
    assert {label.get_rotation() for label in axes["policies reached"].get_xticklabels()} == {30}
    _assert_readable(figure, axes)


def test_json_robust_statistics_agree_with_scipy_on_its_own_episodes(tmp_path) -> None:
    """IQM, median and their intervals in evaluation.json, recomputed from the episodes the file
    lists: points with scipy exactly, intervals against an independent stratified bootstrap (a
    plain loop over items, scipy's trim_mean, its own generator) within Monte Carlo error."""
    from scipy import stats as scipy_stats

    result = _evaluation([(_checkpoint("run_a", 100), 1.0), (_checkpoint("run_a", 200), 2.0),
                          (_file("b/Huggy.onnx"), 1.2)])
    data = json.loads(write_report(build_report(result), tmp_path)["json"].read_text())
    rng = np.random.default_rng(123)
    for entry in data["policies"]:
        items = [np.array(item["returns"]) for item in entry["items"]]
        returns = np.concatenate(items)
        assert entry["iqm"] == pytest.approx(scipy_stats.trim_mean(returns, 0.25), abs=1e-12)
        assert entry["median"] == pytest.approx(np.median(returns), abs=1e-12)
        assert entry["mean"] == pytest.approx(returns.mean(), abs=1e-12)
        assert entry["bootstrap"] == {"method": "percentile", "resamples": 10_000, "seed": 0,
                                      "confidence": 0.95, "strata": "work items"}
        resamples = np.concatenate([item[rng.integers(0, item.size, (4000, item.size))]
                                    for item in items], axis=1)  # one stratified resample a row
        draws = scipy_stats.trim_mean(resamples, 0.25, axis=1)
        low, high = np.quantile(draws, [0.025, 0.975])
        # 4,000 resamples: the quantiles' Monte Carlo sd is about 0.04 standard errors.
        tolerance = 0.2 * draws.std()
        assert entry["iqm_ci"][0] == pytest.approx(low, abs=tolerance)
        assert entry["iqm_ci"][1] == pytest.approx(high, abs=tolerance)
        for name in ("mean", "median", "iqm"):
            assert entry[f"{name}_ci"][0] <= entry[name] <= entry[f"{name}_ci"][1]
    first, second = data["policies"][0], data["policies"][1]
    p = first["probability_of_improvement"]["run_a@200"]
    u = scipy_stats.mannwhitneyu(np.concatenate([i["returns"] for i in first["items"]]),
                                 np.concatenate([i["returns"] for i in second["items"]])).statistic
    assert p["p"] == pytest.approx(u / 36 ** 2, abs=1e-12)
    back = second["probability_of_improvement"]["run_a@100"]
    assert back["p"] == pytest.approx(1 - p["p"], abs=1e-12)
    assert back["ci"] == pytest.approx([1 - p["ci"][1], 1 - p["ci"][0]], abs=1e-12)
    assert set(first["probability_of_improvement"]) == {"run_a@200", "b/Huggy.onnx"}
    # Means 1.0, 2.0, 1.2 with sd 1 over 36 episodes: run_a@200 is best, b/Huggy.onnx second.
    assert data["best"]["label"] == "run_a@200" and data["best"]["runner_up"] == "b/Huggy.onnx"
    assert data["best"]["statistic"] == "mean"
    assert data["best"]["probability_of_improvement"]["p"] == pytest.approx(
        second["probability_of_improvement"]["b/Huggy.onnx"]["p"])
    assert data["selection"] is None


def test_table_shows_iqm_beside_mean_and_names_the_best(tmp_path) -> None:
    result = _evaluation([(_file("a/Huggy.onnx"), 1.0), (_file("b/Huggy.onnx"), 3.0)])
    table = format_table(build_report(result))
    header = table.splitlines()[0]
    assert header.index("mean [95% t-CI]") < header.index("IQM [95% bootstrap CI]")
    summary = summarize_all(result)[1]
    assert f"{summary.iqm:.3f} [{summary.iqm_ci[0]:.3f}, {summary.iqm_ci[1]:.3f}]" in table
    assert "best: b/Huggy.onnx by mean return" in table
    assert "P(b/Huggy.onnx > a/Huggy.onnx) = " in table
    paths = write_report(build_report(result), tmp_path)
    for kind in ("improvement_png", "profile_png"):
        assert paths[kind].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    rows = list(csv.DictReader(paths["csv"].read_text().splitlines()))
    assert float(rows[1]["iqm"]) == pytest.approx(summary.iqm)
    assert float(rows[1]["iqm_boot_ci_low"]) == pytest.approx(summary.iqm_ci[0])
    # the mean's two intervals, told apart by name: Student t and the bootstrap
    assert float(rows[1]["mean_t_ci_low"]) == pytest.approx(summary.ci_low)
    assert float(rows[1]["mean_boot_ci_high"]) == pytest.approx(summary.mean_ci[1])
    assert not {"ci_low", "ci_high", "mean_ci_low", "mean_ci_high"} & set(rows[1])


def test_learning_curve_draws_iqm_with_its_band() -> None:
    steps = [500000, 1000000, 2000343]
    result = _evaluation([(_checkpoint("ppo_baseline", step), step / 1e6) for step in steps])
    figure, axes = _figure(result)
    summaries = summarize_all(result)
    lines = [line for line in axes["curves"].get_lines() if line.get_linewidth() == 2]
    assert len(lines) == 1
    assert list(lines[0].get_xdata()) == steps
    assert list(lines[0].get_ydata()) == pytest.approx([s.iqm for s in summaries])
    (band,) = axes["curves"].collections[:1]
    vertices = band.get_paths()[0].vertices
    for step, summary in zip(steps, summaries, strict=True):
        at_step = vertices[vertices[:, 0] == step][:, 1]
        assert min(at_step) == pytest.approx(summary.iqm_ci[0])
        assert max(at_step) == pytest.approx(summary.iqm_ci[1])
    _assert_readable(figure, axes)
