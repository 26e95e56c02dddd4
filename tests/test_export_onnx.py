"""ONNX export in ML-Agents' interface for every policy kind, checked with onnxruntime on the
original file, onnx's own checker and our loader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from huggy_agent import HuggyAgent
from huggy_agent.formats.export_onnx import export_onnx, output_names
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.support.fixtures import FIXTURE_RUNS, fixtures_dir, mlagents_policy_files
from tests.support.kinds import random_inputs, random_masks, run_onnx

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

ORIGINALS = [fixtures_dir() / run / "Huggy.onnx" for run in FIXTURE_RUNS] + [
    path for path in mlagents_policy_files() if path.suffix == ".onnx"]


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _label(path: Path) -> str:
    return path.parent.name


@pytest.mark.parametrize("original", ORIGINALS, ids=_label)
def test_export_keeps_the_interface_the_outputs_and_the_fingerprint(original: Path,
                                                                    tmp_path: Path) -> None:
    agent = HuggyAgent(original, device="cpu")
    path = export_onnx(agent.net, tmp_path / "export.onnx")
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert model.opset_import[0].version == 9
    theirs, ours = _session(original), _session(path)
    assert [i.name for i in ours.get_inputs()] == [i.name for i in theirs.get_inputs()]
    assert [o.name for o in ours.get_outputs()] == [o.name for o in theirs.get_outputs()]
    assert [o.name for o in ours.get_outputs()] == output_names(agent.net)
    # Our loader reads the export back to the same weights, bit for bit.
    assert HuggyAgent(path, device="cpu").fingerprint == agent.fingerprint
    spec = agent.spec
    rng = np.random.default_rng(2)
    inputs = random_inputs(spec, 256, rng)
    mask = random_masks(spec, 256, rng) if spec.discrete_branches else None
    memory = (rng.standard_normal((256, spec.memory_size)).astype(np.float32)
              if spec.memory_size else None)
    expected, exported = run_onnx(theirs, inputs, mask, memory), run_onnx(ours, inputs, mask, memory)
    for name in ("version_number", "memory_size", "continuous_action_output_shape",
                 "discrete_action_output_shape"):
        if name in expected:
            np.testing.assert_array_equal(exported[name], expected[name])
    for name in ("deterministic_continuous_actions", "recurrent_out"):
        if name in expected:
            assert np.abs(exported[name] - expected[name]).max() <= FP32_ACTION_ATOL
    if "deterministic_discrete_actions" in expected:
        assert np.mean(exported["deterministic_discrete_actions"]
                       == expected["deterministic_discrete_actions"]) >= 0.999
        start = 0  # the in-graph samples respect the masks
        for branch, size in enumerate(spec.discrete_branches):
            sampled = exported["discrete_actions"][:, branch]
            assert mask[np.arange(256), start + sampled].all()
            start += size
    if "continuous_actions" in expected:  # sampled in-graph: bounded, and not the mean
        sampled, mean = exported["continuous_actions"], exported["deterministic_continuous_actions"]
        # PPO: clip(sample, -3, 3) / 3, at most 1 exactly. SAC: onnxruntime's float32 Tanh, a
        # rational approximation, rounds past 1 near saturation: at most 2 ulps over 2 million
        # inputs in [-50, 50] (x86-64, AVX2); twice that is the bound.
        bound = 1.0 + 4 * float(np.finfo(np.float32).eps) if agent.arch.head == "sac" else 1.0
        assert np.abs(sampled).max() <= bound
        if agent.arch.head == "sac":
            mean = np.tanh(mean)  # ML-Agents' SAC export carries the unsquashed mean
        assert np.abs(sampled - mean).mean() > 0.01


def test_round_trip_keeps_the_fingerprint(tmp_path: Path) -> None:
    pt = fixtures_dir() / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt"
    original = HuggyAgent(pt, device="cpu")
    first = export_onnx(original.net, tmp_path / "first.onnx")
    reloaded = HuggyAgent(first, device="cpu")
    second = export_onnx(reloaded.net, tmp_path / "second.onnx")
    assert reloaded.fingerprint == original.fingerprint
    assert HuggyAgent(second, device="cpu").fingerprint == original.fingerprint
    first_init = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(first)).graph.initializer}
    second_init = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(second)).graph.initializer}
    assert first_init.keys() == second_init.keys()
    assert all(np.array_equal(first_init[k], second_init[k]) for k in first_init)


def test_equal_weights_exported_once_load_back(tmp_path: Path) -> None:
    """A checkpoint written before the first update has all its hidden biases still zero; torch's
    exporter then writes one of them and names the others as `Identity` outputs of it. The
    loader reads those names as the copied tensor: the file loads, with the zero biases, and acts
    as onnxruntime runs it."""
    import torch

    pt = fixtures_dir() / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt"
    original = HuggyAgent(pt, device="cpu")
    actor = original.loaded.build()
    state = actor.state_dict()
    biases = [key for key in state if key.startswith("network_body._body_endoder.seq_layers.")
              and key.endswith(".bias")]
    assert len(biases) == 3
    for key in biases:
        state[key] = torch.zeros_like(state[key])
    actor.load_state_dict(state)
    path = export_onnx(actor, tmp_path / "untrained.onnx")
    graph = onnx.load(str(path)).graph
    stored = {i.name for i in graph.initializer}
    assert len([key for key in biases if key not in stored]) == 2  # written once
    loaded = HuggyAgent(path, device="cpu")
    for key in biases:
        assert not loaded.loaded.tensors[key].any()
    inputs = random_inputs(loaded.spec, 64, np.random.default_rng(3))
    expected = run_onnx(_session(path), inputs, None, None)["deterministic_continuous_actions"]
    (observations,) = inputs  # Huggy has one input
    assert np.abs(loaded.compute_action(observations) - expected).max() <= FP32_ACTION_ATOL


def test_half_precision_net_exports_float32(tmp_path: Path) -> None:
    agent = HuggyAgent(fixtures_dir() / "ppo_baseline" / "Huggy.onnx", device="cpu", precision="bf16")
    path = export_onnx(agent.net, tmp_path / "bf16.onnx")
    types = {i.data_type for i in onnx.load(str(path)).graph.initializer}
    assert types == {onnx.TensorProto.FLOAT}
    # bf16-rounded weights are a different model; the source weights export unchanged.
    assert HuggyAgent(path, device="cpu").fingerprint != agent.fingerprint
    source = export_onnx(agent.loaded.build(), tmp_path / "source.onnx")
    assert HuggyAgent(source, device="cpu").fingerprint == agent.fingerprint
