"""The policy subcommands of `huggy`, run in-process through `main` (one real subprocess too)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import huggy_agent
from huggy_agent import benchmark
from huggy_agent.cli import build_parser, main
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent.tables import format_table
from tests.support.cli import huggy_in_process
from tests.support.fixtures import fixtures_dir, mlagents_fixtures_dir

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

BASELINE = fixtures_dir() / "ppo_baseline"


def run_json(capsys, *argv: str) -> object:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_subcommand_has_help(capsys) -> None:
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert {"info", "act", "sample", "batch", "precision", "onnx-compare", "fingerprint", "stats",
            "benchmark", "export-onnx", "checkpoints"} <= set(subcommands)
    for name in subcommands:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
        assert "usage: huggy " + name in capsys.readouterr().out


def test_version_is_the_one_in_pyproject(capsys) -> None:
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text("utf-8")
    declared = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE).group(1)
    assert huggy_agent.__version__ == declared
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"huggy {declared}"


def test_info_shows_the_three_parameter_counts(capsys) -> None:
    assert main(["info", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "566,805" in text and "log-sigma parameters" in text and "normalizer values" in text
    assert "obs_0 (59,) -> 21 continuous" in text
    info = run_json(capsys, "info", "--policy", str(BASELINE / "Huggy" / "Huggy-2000343.pt"))
    counts = info["parameters"]
    assert counts["body"] + counts["heads"] == 566_805
    assert (counts["log_sigma"], counts["normalizer"]) == (21, 118)
    assert info["step"] == 2_000_343
    assert info["spec"]["inputs"] == [{"name": "obs_0", "shape": [59], "kind": "vector"}]


def test_info_of_a_results_folder_shows_a_missing_step_as_a_dash(capsys) -> None:
    """The final export of a results folder has no training step in its name: the table shows
    "-", as every other table does for a missing value."""
    assert main(["info", "--device", "cpu", "--policy", str(BASELINE)]) == 0
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1)
                for line in capsys.readouterr().out.splitlines()[2:])
    assert rows["source"] == str(BASELINE / "Huggy.onnx") and rows["step"] == "-"


def test_tables_show_a_missing_value_as_a_dash_aligned_with_the_numbers() -> None:
    table = format_table(["run", "step"], [("a", 1_000), ("b", None), ("c", 20)])
    assert table.splitlines() == ["run   step", "---  -----", "a    1,000", "b        -",
                                  "c       20"]


def test_act_matches_onnxruntime(capsys) -> None:
    obs = np.random.default_rng(3).standard_normal(59).astype(np.float32)
    out = run_json(capsys, "act", "--obs", json.dumps(obs.tolist()), "--device", "cpu")
    session = ort.InferenceSession(str(BASELINE / "Huggy.onnx"), providers=["CPUExecutionProvider"])
    (reference,) = session.run(["deterministic_continuous_actions"], {"obs_0": obs[None]})
    assert np.abs(np.array(out["continuous"]) - reference[0]).max() <= 1e-5


def test_act_takes_several_inputs_and_a_mask(capsys) -> None:
    """A multi-input discrete policy (the trained Pyramids one) from the command line: the mask
    allows only action 3, so that is the answer whatever the observation."""
    pyramids = mlagents_fixtures_dir() / "pyramids_trained"
    obs = json.dumps([[0.1] * 56, [0.2] * 56, [0.3] * 56, [0.4] * 4])
    out = run_json(capsys, "act", "--policy", str(pyramids), "--obs", obs, "--mask",
                   "[0, 0, 0, 1, 0]", "--device", "cpu")
    assert out["discrete"] == [3]
    free = run_json(capsys, "act", "--policy", str(pyramids), "--obs", obs, "--device", "cpu")
    session = ort.InferenceSession(str(pyramids / "Pyramids.onnx"),
                                   providers=["CPUExecutionProvider"])
    feed = {f"obs_{i}": np.asarray([row], np.float32) for i, row in enumerate(json.loads(obs))}
    feed["action_masks"] = np.ones((1, 5), np.float32)
    (reference,) = session.run(["deterministic_discrete_actions"], feed)
    assert free["discrete"] == reference[0].tolist()
    assert main(["act", "--policy", str(pyramids), "--obs", "[[0.1]]"]) == 2
    assert "this policy has 4 inputs" in capsys.readouterr().err


def test_act_rejects_a_wrong_shape(capsys) -> None:
    assert main(["act", "--obs", "[1, 2, 3]"]) == 2
    assert "expected (59,) or (N, 59)" in capsys.readouterr().err


def test_sample_spread_follows_log_sigma(capsys) -> None:
    out = run_json(capsys, "sample", "--samples", "4000", "--seed", "1", "--device", "cpu")
    # Sigma is ~1 (log-sigma ~0) on a [-3, 3] / 3 scale: the spread per action is ~0.3 unless clipped.
    assert 0.15 < float(np.median(out["std"])) < 0.4
    assert np.abs(np.array(out["mean"]) - np.array(out["deterministic"]["continuous"])).max() < 0.1


def refusal(capsys, *argv: str) -> str:
    """The one line `huggy` ends with for bad input, with exit status 2 (argparse's own
    refusals exit through SystemExit)."""
    code, errors = huggy_in_process(capsys, argv)
    assert code == 2
    lines = errors.strip().splitlines()
    assert "Traceback" not in "\n".join(lines)
    return lines[-1]


HYBRID = mlagents_fixtures_dir() / "hybrid"
LSTM = mlagents_fixtures_dir() / "lstm"
REFUSED = [
    (["act", "--obs", '{"a": 1}'], "--obs: expected numbers in JSON lists, received an object"),
    (["act", "--obs", '[0.5, "1"]'],
     "--obs: expected numbers in JSON lists, received the string '1' at [1]"),
    (["act", "--obs", "[[0.5], [true]]"],
     "--obs: expected numbers in JSON lists, received true at [1][0]"),
    (["act", "--obs", "[null]"], "--obs: expected numbers in JSON lists, received null at [0]"),
    (["act", "--obs", ""], "--obs: expected numbers in JSON lists, received '', which is not "
                           "JSON (Expecting value at character 0)"),
    (["act", "--obs", "[[1, 2], [3]]"],
     "--obs: expected lists of one length at each level, received ragged lists"),
    (["act", "--obs", "[0, 1e39]"],
     "--obs: expected float32 numbers, received 1e+39 at [1], beyond float32's range"),
    (["act", "--mask", "[1]"], "--mask: this policy has no discrete actions to mask "
                               "(obs_0 (59,) -> 21 continuous)"),
    (["act", "--memory", "[0.5]"], "--memory: this policy has no recurrent memory "
                                   "(obs_0 (59,) -> 21 continuous)"),
    (["act", "--policy", str(LSTM), "--memory", '{"a": 1}'],
     "--memory: expected numbers in JSON lists, received an object"),
    (["act", "--policy", str(HYBRID), "--mask", "[1, 2, 1]"],
     "action_mask must hold booleans or 0/1 (1 = allowed), received 2 at column 1"),
    (["info", "--policy", ""], "argument --policy: expected a .onnx, a .pt, a results folder "
                               "or hf://owner/repo, got ''"),
    (["batch", "--count", "0"], "argument --count: expected a whole number >= 1, got 0"),
    (["precision", "--count", "-3"], "argument --count: expected a whole number >= 1, got -3"),
    (["benchmark", "--calls", "x"], "argument --calls: expected a whole number >= 1, got 'x'"),
    (["sample", "--samples", "0"], "argument --samples: expected a whole number >= 1, got 0"),
    (["sample", "--seed", "-1"], "argument --seed: expected a whole number, 0 to 2**64 - 1, got -1"),
    (["act", "--obs-seed", str(2**64)],
     f"argument --obs-seed: expected a whole number, 0 to 2**64 - 1, got {2**64}"),
    (["batch", "--policy", str(HYBRID), "--count", "3", "--output", "actions.npy"],
     "--output actions.npy: expected a path ending in .npz (this policy's actions are "
     "continuous, discrete)"),
    (["batch", "--count", "3", "--output", "actions"],
     "--output actions: expected a path ending in .npy (this policy's actions are continuous)"),
    (["onnx-compare", str(BASELINE / "Huggy" / "Huggy-2000343.pt")],
     f"{BASELINE / 'Huggy' / 'Huggy-2000343.pt'}: expected an ML-Agents .onnx file (to compare a "
     ".pt with it, pass the .pt as --policy)"),
    (["onnx-compare", str(HYBRID / "Hybrid.onnx"), "--policy", str(LSTM)],
     f"{HYBRID / 'Hybrid.onnx'} is obs_0 (10,) -> 2 continuous + discrete (3,), the policy "
     "obs_0 (8,) -> 2 continuous, memory 32: they cannot be compared"),
    (["onnx-compare", str(BASELINE / "Huggy.onnx"), "--engine", "onnxruntime"],
     "--engine onnxruntime runs batches on onnxruntime here (onnxruntime): onnxruntime would be "
     "compared with itself; use --engine torch"),
    (["benchmark", "--policy", str(LSTM)],
     "benchmark measures MLP policies (one vector input, continuous actions only: what its "
     "eager torch baseline runs); this policy is obs_0 (8,) -> 2 continuous, memory 32"),
    (["benchmark", "--engine", "cuda-graph" if not torch.cuda.is_available() else "npu-graph"],
     "runs on no device here"),
]


@pytest.mark.parametrize(("argv", "message"), REFUSED, ids=lambda value: " ".join(value)
                         if isinstance(value, list) else "")
def test_bad_input_ends_with_one_line_naming_it(capsys, tmp_path, monkeypatch, argv: list[str],
                                                message: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert message in refusal(capsys, *argv)
    assert not list(tmp_path.iterdir())  # nothing written


def test_files_that_cannot_be_used_end_with_one_line(capsys, tmp_path) -> None:
    assert "Is a directory" in refusal(capsys, "export-onnx", str(tmp_path))
    text = tmp_path / "observations.txt"
    text.write_text("1 2 3\n")
    assert refusal(capsys, "batch", "--input", str(text)).startswith(
        f"huggy batch: error: --input {text}: expected a .npy or .npz file of numbers; ")
    assert refusal(capsys, "checkpoints", str(tmp_path)) == (
        f"huggy checkpoints: error: no checkpoints in {tmp_path}: expected an ML-Agents "
        "results/<run_id>/ folder, with run_logs/training_status.json or "
        "<Behavior>/<Behavior>-<step>.onnx or .pt files")
    status = tmp_path / "run_logs" / "training_status.json"
    status.parent.mkdir()
    status.write_text("[1, 2]")
    assert refusal(capsys, "checkpoints", str(tmp_path)).endswith(
        f"{status}: expected a JSON object of behaviors, received list")
    status.write_text(json.dumps({"Huggy": {"checkpoints": [{"steps": "abc", "file_path": "x"}]}}))
    assert refusal(capsys, "checkpoints", str(tmp_path)).endswith(
        f"{status}: checkpoint 0 of Huggy: expected an object with 'steps' (an integer) and "
        "'file_path', received {'steps': 'abc', 'file_path': 'x'}")


def test_a_reader_that_leaves_early_ends_the_command_quietly() -> None:
    """`huggy stats | head -1`: the pipe is closed before the command writes (it is still
    importing), so its first write fails; it stops with 141 (128 + SIGPIPE), as `cat` does,
    and prints no traceback."""
    process = subprocess.Popen([sys.executable, "-m", "huggy_agent.cli", "stats"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    _, errors = process.communicate(timeout=120)
    assert (process.returncode, errors.decode()) == (141, "")


def test_batch_writes_actions(capsys, tmp_path) -> None:
    obs = np.random.default_rng(0).standard_normal((300, 59)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    out = run_json(capsys, "batch", "--input", str(tmp_path / "obs.npy"), "--output",
                   str(tmp_path / "actions.npy"), "--device", "cpu")
    assert out["rows"] == 300
    session = ort.InferenceSession(str(BASELINE / "Huggy.onnx"), providers=["CPUExecutionProvider"])
    (reference,) = session.run(["deterministic_continuous_actions"], {"obs_0": obs})
    assert np.abs(np.load(tmp_path / "actions.npy") - reference).max() <= 1e-5
    np.save(tmp_path / "one.npy", obs[7])  # one row, without a batch axis: one observation
    out = run_json(capsys, "batch", "--input", str(tmp_path / "one.npy"), "--output",
                   str(tmp_path / "one-actions.npy"), "--device", "cpu")
    assert out["rows"] == 1
    assert np.abs(np.load(tmp_path / "one-actions.npy") - reference[7]).max() <= 1e-5


def test_precision_table_meets_the_tolerances(capsys) -> None:
    rows = run_json(capsys, "precision", "--count", "256")
    by_label = {row["label"]: row for row in rows}
    assert by_label["cpu fp32"]["max_abs_error"] <= 1e-5
    assert by_label["cpu fp16"]["max_abs_error"] <= 5e-3
    assert by_label["cpu bf16"]["max_abs_error"] <= 5e-2
    assert all(row["finite"] and row["cosine_similarity"] > 0.999 for row in rows)
    assert main(["precision", "--count", "64"]) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in ("cpu fp32", "cpu fp16", "cpu bf16", "max abs error"))


def test_onnx_compare_pt_against_the_runs_export(capsys) -> None:
    result = run_json(capsys, "onnx-compare", str(BASELINE / "Huggy.onnx"), "--policy",
                      str(BASELINE / "Huggy" / "Huggy-2000343.pt"), "--device", "cpu")
    assert result["max_abs_error"] <= 1e-5 and result["passed"]
    # by default our network runs on torch, not onnxruntime (which would meet itself)
    alone = run_json(capsys, "onnx-compare", str(BASELINE / "Huggy.onnx"), "--count", "16")
    assert alone["label"] == "cpu fp32 torch vs onnxruntime" and alone["passed"]


def test_fingerprint_is_the_same_for_pt_and_onnx_of_one_run(capsys) -> None:
    from_pt = run_json(capsys, "fingerprint", "--policy", str(BASELINE / "Huggy" / "Huggy-2000343.pt"))
    from_onnx = run_json(capsys, "fingerprint", "--policy", str(BASELINE / "Huggy.onnx"))
    other = run_json(capsys, "fingerprint", "--policy", str(fixtures_dir() / "ppo_num_layers_2"))
    assert from_pt["fingerprint"] == from_onnx["fingerprint"]  # exact on any machine, by construction
    assert other["fingerprint"] != from_onnx["fingerprint"]
    actions = {name: np.asarray(run["reference_actions"]["continuous"])
               for name, run in (("pt", from_pt), ("onnx", from_onnx), ("other", other))}
    assert np.abs(actions["pt"] - actions["onnx"]).max() <= FP32_ACTION_ATOL
    assert np.abs(actions["other"] - actions["onnx"]).max() > 100 * FP32_ACTION_ATOL
    bf16 = run_json(capsys, "fingerprint", "--policy", str(BASELINE / "Huggy.onnx"),
                    "--precision", "bf16")
    assert bf16["fingerprint"] == from_onnx["fingerprint"]


def test_stats_counts_each_layer(capsys) -> None:
    stats = run_json(capsys, "stats", "--policy", str(BASELINE / "Huggy.onnx"))
    counts = {layer["name"]: layer["count"] for layer in stats["layers"]}
    body = "network_body._body_endoder.seq_layers."
    assert counts[f"{body}0.weight"] == 512 * 59
    assert counts["action_model._continuous_distribution.mu.weight"] == 21 * 512
    assert sum(v for k, v in counts.items() if not k.endswith("log_sigma")) == 566_805
    (normalizer,) = stats["normalizers"]
    assert normalizer["input"] == "obs_0" and normalizer["std_min"] > 0


def test_export_then_fingerprint(capsys, tmp_path) -> None:
    assert main(["export-onnx", str(tmp_path / "out.onnx")]) == 0
    capsys.readouterr()
    exported = run_json(capsys, "fingerprint", "--policy", str(tmp_path / "out.onnx"))
    bundled = run_json(capsys, "fingerprint")
    assert exported["fingerprint"] == bundled["fingerprint"]


def test_checkpoints_table_follows_training_status(capsys) -> None:
    rows = run_json(capsys, "checkpoints", str(BASELINE))
    status = json.loads((BASELINE / "run_logs" / "training_status.json").read_text())["Huggy"]
    assert [r["step"] for r in rows] == [c["steps"] for c in status["checkpoints"]]
    assert [r["reward"] for r in rows] == [c["reward"] for c in status["checkpoints"]]
    assert rows[-1]["path"].endswith("Huggy-2000343.onnx")
    assert all(r["path"] is None for r in rows[:-1])


def test_benchmark_reports_every_implementation(capsys, monkeypatch) -> None:
    monkeypatch.setattr(benchmark, "SETTLE_S", 0.0)  # the pause only steadies the figures
    monkeypatch.setattr(benchmark, "EVICT_BYTES", 1 << 20)  # its size only makes the calls cold
    report = run_json(capsys, "benchmark", "--rounds", "1", "--calls", "20", "--batch", "256")
    names = [r["name"] for r in report["results"]]
    assert names[:3] == ["huggy compute_action", "onnxruntime", "torch eager Sequential"]
    assert report["matmul_gflops"] > 1 and report["load_ms"] > 0
    ours, reference = report["results"][:2]
    assert report["ratios"]["p50_vs_onnxruntime"] == pytest.approx(
        ours["p50_us"] / reference["p50_us"])
    assert report["ratios"]["cold_p50_vs_onnxruntime"] == pytest.approx(
        ours["cold_p50_us"] / reference["cold_p50_us"]) == pytest.approx(
        ours["cold_p50_vs_onnxruntime"])
    assert all(r["cold_p50_us"] > 0 for r in report["results"])
    sampled, sampled_reference = report["results"][3:5]
    assert (sampled["name"], sampled_reference["name"]) == (
        "huggy compute_action, stochastic", "onnxruntime, stochastic")
    assert report["ratios"]["stochastic_p50_vs_onnxruntime"] == pytest.approx(
        sampled["p50_us"] / sampled_reference["p50_us"]) == pytest.approx(
        sampled["p50_vs_onnxruntime"])


def test_entry_point_runs_as_a_process() -> None:
    done = subprocess.run([sys.executable, "-m", "huggy_agent.cli", "info", "--json"],
                          capture_output=True, text=True, timeout=120, check=True)
    counts = json.loads(done.stdout)["parameters"]
    assert counts["body"] + counts["heads"] == 566_805
