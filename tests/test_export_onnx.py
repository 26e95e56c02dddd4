"""ONNX export in ML-Agents' interface, checked with onnxruntime and onnx's own checker."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import FIXTURE_RUNS, fixtures_dir

from huggy_agent import HuggyAgent
from huggy_agent.formats import load_policy
from huggy_agent.formats.export_onnx import OUTPUTS, export_onnx
from huggy_agent.network import PolicyArchitecture, build_policy, canonical_keys
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent.reference import canonical_observations, float64_actions

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths


def _session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("run", FIXTURE_RUNS)
def test_export_matches_ours_and_keeps_mlagents_interface(run: str, tmp_path) -> None:
    agent = HuggyAgent(fixtures_dir() / run / "Huggy.onnx", device="cpu")
    path = export_onnx(agent.net, tmp_path / "export.onnx")
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == list(OUTPUTS)
    assert [i.name for i in model.graph.input] == ["obs_0"]
    assert model.opset_import[0].version == 9
    obs = canonical_observations(agent.loaded, 512)
    version, memory, sampled, shape, deterministic = _session(path).run(None, {"obs_0": obs})
    assert version.tolist() == [3.0] and memory.tolist() == [0.0] and shape.tolist() == [21.0]
    assert np.abs(deterministic - agent.compute_action(obs)).max() <= FP32_ACTION_ATOL
    # The in-graph sample is mu + z * sigma, clipped: inside [-1, 1] and not the mean.
    assert np.abs(sampled).max() <= 1.0 and np.abs(sampled - deterministic).mean() > 0.05


def test_round_trip_keeps_the_fingerprint(tmp_path) -> None:
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


def test_half_precision_net_exports_float32(tmp_path) -> None:
    agent = HuggyAgent(fixtures_dir() / "ppo_baseline" / "Huggy.onnx", device="cpu", precision="bf16")
    path = export_onnx(agent.net, tmp_path / "bf16.onnx")
    types = {i.data_type for i in onnx.load(str(path)).graph.initializer}
    assert types == {onnx.TensorProto.FLOAT}
    # bf16-rounded weights are a different model; the source weights export unchanged.
    assert HuggyAgent(path, device="cpu").fingerprint != agent.fingerprint
    source = export_onnx(agent.loaded.build(), tmp_path / "source.onnx")
    assert HuggyAgent(source, device="cpu").fingerprint == agent.fingerprint


def test_sac_export_follows_mlagents_and_loads_back(tmp_path) -> None:
    arch = PolicyArchitecture(obs_size=7, act_size=3, hidden_sizes=(16, 16), normalize=True, head="sac")
    generator = torch.Generator().manual_seed(0)
    tensors = {k: 0.3 * torch.randn(shape, generator=generator)
               for k, shape in canonical_keys(arch).items()}
    tensors["normalizer.std"] = tensors["normalizer.std"].abs() + 0.5
    net = build_policy(arch, tensors, "synthetic SAC")
    path = export_onnx(net, tmp_path / "sac.onnx")
    loaded = load_policy(path)
    assert loaded.arch == arch
    obs = np.random.default_rng(0).standard_normal((32, 7)).astype(np.float32)
    (raw_mean,) = _session(path).run(["deterministic_continuous_actions"], {"obs_0": obs})
    # ML-Agents' SAC export carries the unsquashed mean; the policy's action is its tanh.
    assert np.abs(np.tanh(raw_mean) - float64_actions(loaded, obs)).max() <= 1e-5
    assert np.abs(HuggyAgent(path, device="cpu").compute_action(obs) - np.tanh(raw_mean)).max() <= 1e-5
