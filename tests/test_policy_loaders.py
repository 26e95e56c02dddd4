"""Every shared fixture's .pt and .onnx loads against onnxruntime and a float64 numpy reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from huggy_agent import HuggyAgent
from huggy_agent.formats.export_onnx import export_onnx
from tests.support.fixtures import FIXTURE_RUNS, fixtures_dir
from tests.support.policy_reference import ReferencePolicy, normalizer_observations, ppo_actions

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

ROWS = 1000
TOLERANCE = 1e-5


def _policy_files(run: str) -> list[Path]:
    """Huggy.onnx, then every checkpoint file under Huggy/ (.onnx and .pt)."""
    folder = fixtures_dir() / run
    return [folder / "Huggy.onnx", *sorted((folder / "Huggy").glob("*.onnx")),
            *sorted((folder / "Huggy").glob("*.pt"))]


CASES = [(run, path.relative_to(fixtures_dir() / run)) for run in FIXTURE_RUNS
         for path in _policy_files(run)]


def _observations(run: str) -> np.ndarray:
    """1,000 observations from the run's own normalizer statistics. The run trained without a
    normalizer has none, so it gets the baseline's: the same environment's observation scale."""
    source = run if run != "ppo_normalize_False" else "ppo_baseline"
    return normalizer_observations(fixtures_dir() / source / "Huggy.onnx", ROWS, seed=7)


def _onnxruntime_actions(run: str, obs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(fixtures_dir() / run / "Huggy.onnx"),
                                   providers=["CPUExecutionProvider"])
    return session.run(["deterministic_continuous_actions"], {"obs_0": obs})[0]


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per run: the observations and onnxruntime's deterministic actions of its Huggy.onnx."""
    result = {}
    for run in FIXTURE_RUNS:
        obs = _observations(run)
        result[run] = obs, _onnxruntime_actions(run, obs)
    return result


def test_the_fixture_set_holds_pt_and_onnx_for_every_run() -> None:
    for run in FIXTURE_RUNS:
        suffixes = {path.suffix for path in _policy_files(run)[1:]}
        assert suffixes == {".onnx", ".pt"}, run


def test_observations_exercise_the_policy_without_saturating_it(references) -> None:
    # If most actions sat at the +-1 clip, a wrong network could still match onnxruntime.
    for run, (_, expected) in references.items():
        assert np.mean(np.abs(expected) < 0.99) > 0.5, run
        assert expected.std() > 0.1, run


@pytest.mark.parametrize(("run", "relative"), CASES, ids=[f"{r}/{p}" for r, p in CASES])
def test_load_matches_onnxruntime_of_the_run(references, run: str, relative: Path) -> None:
    obs, expected = references[run]
    agent = HuggyAgent.from_checkpoint(fixtures_dir() / run / relative, device="cpu")
    actions = agent.compute_action(obs, deterministic=True)
    assert actions.dtype == np.float32 and actions.shape == (ROWS, 21)
    assert np.abs(actions - expected).max() <= TOLERANCE


@pytest.mark.parametrize("run", FIXTURE_RUNS)
def test_pt_and_onnx_loads_agree(references, run: str) -> None:
    obs, _ = references[run]
    folder = fixtures_dir() / run
    (checkpoint,) = (folder / "Huggy").glob("Huggy-*.pt")
    from_pt = HuggyAgent.from_checkpoint(checkpoint, device="cpu").compute_action(obs)
    from_onnx = HuggyAgent.from_checkpoint(folder / "Huggy.onnx", device="cpu").compute_action(obs)
    assert np.abs(from_pt - from_onnx).max() <= TOLERANCE


@pytest.mark.parametrize("run", FIXTURE_RUNS)
def test_pt_load_matches_float64_forward_of_the_raw_checkpoint(references, run: str) -> None:
    obs, _ = references[run]
    (checkpoint,) = (fixtures_dir() / run / "Huggy").glob("Huggy-*.pt")
    policy = torch.load(checkpoint, map_location="cpu", weights_only=True)["Policy"]
    mu, log_sigma = ReferencePolicy.from_checkpoint_policy(policy).forward(obs)
    actions = HuggyAgent.from_checkpoint(checkpoint, device="cpu").compute_action(obs)
    assert np.abs(actions - ppo_actions(mu, log_sigma)).max() <= TOLERANCE


@pytest.mark.parametrize("run", FIXTURE_RUNS)
def test_onnxruntime_reference_is_the_float64_forward_of_the_initializers(references,
                                                                           run: str) -> None:
    # Confirms what the reference means: clip(mu, -3, 3) / 3 of the network in the initializers.
    obs, expected = references[run]
    mu, log_sigma = ReferencePolicy.from_onnx(fixtures_dir() / run / "Huggy.onnx").forward(obs)
    assert np.abs(ppo_actions(mu, log_sigma) - expected).max() <= TOLERANCE


def test_an_export_of_equal_hidden_biases_loads_as_onnxruntime_runs_it(references,
                                                                       tmp_path: Path) -> None:
    # ML-Agents starts hidden biases at zero, so a checkpoint written before the first update
    # holds equal biases; torch's exporter keeps one and names the others as Identity nodes.
    obs, trained = references["ppo_baseline"]
    net = HuggyAgent.from_checkpoint(fixtures_dir() / "ppo_baseline" / "Huggy.onnx",
                                     device="cpu").net
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            if name.startswith("network_body._body_endoder.") and name.endswith(".bias"):
                parameter.zero_()
    path = export_onnx(net, tmp_path / "Huggy-9660.onnx")
    aliases = sorted(node.output[0] for node in onnx.load(str(path)).graph.node
                     if node.op_type == "Identity" and node.output[0].endswith(".bias"))
    assert aliases == [f"network_body._body_endoder.seq_layers.{i}.bias" for i in (2, 4)]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = session.run(["deterministic_continuous_actions"], {"obs_0": obs})[0]
    assert np.abs(expected - trained).max() > 100 * TOLERANCE  # the zeroed biases count
    actions = HuggyAgent.from_checkpoint(path, device="cpu").compute_action(obs)
    assert np.abs(actions - expected).max() <= TOLERANCE


def test_baseline_matches_the_values_recorded_in_the_fixture_readme() -> None:
    agent = HuggyAgent.from_checkpoint(fixtures_dir() / "ppo_baseline" / "Huggy.onnx", device="cpu")
    zero = agent.compute_action(np.zeros(59, dtype=np.float32))
    np.testing.assert_allclose(zero[:3], [0.1582, -0.59105, 0.49669], atol=6e-5)
    gaussian = np.random.default_rng(0).standard_normal((1, 59)).astype(np.float32)
    np.testing.assert_allclose(agent.compute_action(gaussian)[0, :3], [0.64365, -0.66459, 0.45534],
                               atol=6e-6)


def _linear_parameters(onnx_path: Path) -> int:
    """Parameters of the body and mu layers, counted from the raw initializers."""
    initializers = ReferencePolicy.from_onnx(onnx_path)
    return sum(w.size + b.size for w, b in [*initializers.layers, initializers.mu])


@pytest.mark.parametrize(("run", "hidden", "normalizer"), [
    ("ppo_baseline", [512, 512, 512], 2 * 59),
    ("ppo_num_layers_2", [512, 512], 2 * 59),
    ("ppo_normalize_False", [512, 512, 512], 0),
])
def test_describe_counts_layers_log_sigma_and_normalizer_apart(run: str, hidden: list[int],
                                                                normalizer: int) -> None:
    onnx_path = fixtures_dir() / run / "Huggy.onnx"
    description = HuggyAgent.from_checkpoint(onnx_path, device="cpu").describe()
    counts = description["parameters"]
    assert counts["body"] + counts["heads"] == _linear_parameters(onnx_path)
    assert (counts["log_sigma"], counts["normalizer"]) == (21, normalizer)
    assert (counts["encoders"], counts["lstm"]) == (0, 0)
    architecture = description["architecture"]
    assert (architecture["hidden_units"], architecture["num_layers"]) == (hidden[0], len(hidden))
    assert architecture["inputs"] == [{"input": {"name": "obs_0", "shape": [59], "kind": "vector"},
                                       "normalize": normalizer > 0, "encoder": None}]
    assert (architecture["continuous_size"], architecture["head"]) == (21, "ppo")


def test_baseline_has_566805_linear_parameters_in_four_layers() -> None:
    agent = HuggyAgent.from_checkpoint(
        fixtures_dir() / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt", device="cpu")
    counts = agent.describe()["parameters"]
    assert counts["body"] + counts["heads"] == 566_805
    assert len(ReferencePolicy.from_onnx(fixtures_dir() / "ppo_baseline" / "Huggy.onnx").layers) == 3


def test_describe_is_json_serialisable_and_names_source_device_precision() -> None:
    path = fixtures_dir() / "ppo_num_layers_2" / "Huggy" / "Huggy-2000139.pt"
    agent = HuggyAgent.from_checkpoint(path, device="cpu", precision="bf16")
    description = json.loads(json.dumps(agent.describe()))
    assert description["source"] == str(path)
    assert description["format"] == "mlagents-pt"
    assert description["step"] == 2_000_139
    assert (description["device"], description["precision"]) == ("cpu", "bf16")
    assert description["fingerprint"] == agent.fingerprint
    assert (agent.obs_size, agent.act_size) == (59, 21)


def test_fingerprint_is_stable_and_tells_runs_apart() -> None:
    prints = {run: HuggyAgent.from_checkpoint(fixtures_dir() / run / "Huggy.onnx",
                                              device="cpu").fingerprint for run in FIXTURE_RUNS}
    again = HuggyAgent.from_checkpoint(fixtures_dir() / "ppo_baseline" / "Huggy.onnx",
                                       device="cpu", precision="fp16").fingerprint
    assert again == prints["ppo_baseline"]
    assert len(set(prints.values())) == len(FIXTURE_RUNS)
    assert all(len(value) == 16 and int(value, 16) >= 0 for value in prints.values())
