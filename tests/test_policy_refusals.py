"""Loader refusals: each unusable file gets an error that names the file and the cause.

Bad checkpoints are the fixture's own `Policy` dict with one thing changed; bad ONNX files are the
fixture's graph edited with onnx.helper, so each test isolates one cause.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from huggy_agent import HuggyAgent, PolicyLoadError
from tests.support.fixtures import EXTRA_FIXTURES, fixtures_dir, mlagents_fixtures_dir

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

BASELINE_PT = fixtures_dir() / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt"
BASELINE_ONNX = fixtures_dir() / "ppo_baseline" / "Huggy.onnx"
NORMALIZER = "network_body.observation_encoder.processors.0.normalizer."
BODY = "network_body._body_endoder.seq_layers."
DIST = "action_model._continuous_distribution."


class NotATensor:
    """An arbitrary object: pickling it stores a reference to code, which weights_only refuses."""


def _load(path: Path) -> HuggyAgent:
    return HuggyAgent.from_checkpoint(path, device="cpu")


def _refused(path: Path, cause: str) -> None:
    """Loading `path` raises PolicyLoadError naming the file and containing `cause` verbatim."""
    with pytest.raises(PolicyLoadError, match=re.escape(cause)) as caught:
        _load(path)
    assert str(path) in str(caught.value)


# --- files that are not there, not whole, or not a policy -----------------------------------

def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    path = tmp_path / "Huggy.onnx"
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"policy not found: {path} (expected a .onnx, a .pt or a results folder)")):
        _load(path)


def test_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "Huggy.h5"
    shutil.copy(BASELINE_ONNX, path)
    _refused(path, "unknown policy format '.h5'; expected .onnx, .pt or a results folder")


@pytest.mark.parametrize("source", [BASELINE_PT, BASELINE_ONNX], ids=["pt", "onnx"])
def test_truncated_file(tmp_path: Path, source: Path) -> None:
    data = source.read_bytes()
    path = tmp_path / f"Huggy-1{source.suffix}"
    path.write_bytes(data[: len(data) // 2])
    cause = ("truncated or corrupt checkpoint" if source.suffix == ".pt"
             else "truncated or corrupt ONNX file")
    _refused(path, cause)


@pytest.mark.parametrize("suffix", [".pt", ".onnx"])
@pytest.mark.parametrize("content", ["random", "text", "empty"])
def test_corrupt_bytes(tmp_path: Path, suffix: str, content: str) -> None:
    data = {"random": np.random.default_rng(3).bytes(4096), "text": b"hello huggy\n" * 50,
            "empty": b""}[content]
    path = tmp_path / f"Huggy-1{suffix}"
    path.write_bytes(data)
    _refused(path, "truncated or corrupt checkpoint" if suffix == ".pt"
             else "truncated or corrupt ONNX file")


def test_checkpoint_with_flipped_weight_bytes_is_refused(tmp_path: Path) -> None:
    # torch.load does not check the archive's CRC-32s: without the loader's own check these
    # bytes would silently become different weights.
    data = bytearray(BASELINE_PT.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(255 - b for b in data[middle:middle + 8])
    path = tmp_path / "Huggy-1.pt"
    path.write_bytes(bytes(data))
    _refused(path, "corrupt checkpoint: CRC-32 mismatch in member")


def test_checkpoint_that_is_not_ml_agents(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    torch.save({"a": torch.zeros(3)}, path)
    _refused(path, "not an ML-Agents checkpoint: expected a dict with a 'Policy' entry, got ['a']")


def test_checkpoint_that_is_a_bare_tensor(tmp_path: Path) -> None:
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    _refused(path, "not an ML-Agents checkpoint: expected a dict with a 'Policy' entry, "
                   "got Tensor")


def test_pickle_with_code_is_refused_by_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "code.pt"
    torch.save({"Policy": NotATensor()}, path)
    _refused(path, "refused to unpickle it with weights_only=True (it holds code or objects, "
                   "not only tensors)")


# --- checkpoints of policies we cannot run ----------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint() -> dict:
    return torch.load(BASELINE_PT, map_location="cpu", weights_only=True)


def _save_policy(checkpoint: dict, tmp_path: Path, change: Callable[[dict], None]) -> Path:
    """The baseline checkpoint with `change` applied to a copy of its Policy dict."""
    policy = dict(checkpoint["Policy"])
    change(policy)
    path = tmp_path / "Huggy-1.pt"
    torch.save({**checkpoint, "Policy": policy}, path)
    return path


def test_unchanged_checkpoint_copy_loads(checkpoint: dict, tmp_path: Path) -> None:
    # The crafting itself does not break anything: each refusal below comes from its one change.
    path = _save_policy(checkpoint, tmp_path, lambda policy: None)
    counts = _load(path).describe()["parameters"]
    assert counts["body"] + counts["heads"] == 566_805


def _add_visual_encoder(policy: dict) -> None:
    policy["network_body.observation_encoder.processors.1.conv_layers.0.weight"] = (
        torch.zeros(16, 3, 8, 8))
    policy["network_body.observation_encoder.processors.1.conv_layers.0.bias"] = torch.zeros(16)


def _set(key: str, value: torch.Tensor) -> Callable[[dict], None]:
    return lambda policy: policy.__setitem__(key, value)


def _drop(key: str) -> Callable[[dict], None]:
    return lambda policy: policy.pop(key)


PT_CASES = {
    "visual-without-export": (
        _add_visual_encoder, "cannot tell the observation shapes from the checkpoint alone (it "
        "has visual or variable-length inputs); keep the run's ONNX export"),
    "normalizer-58": (
        _set(f"{NORMALIZER}running_mean", torch.zeros(58)),
        "cannot tell the observation shapes from the checkpoint alone (its normalizers, of inputs "
        "[0], cover 58 of the body's 59 input values: the rest are inputs without a normalizer)"),
    "no-body": (_drop(f"{BODY}0.weight"),
                f"no {BODY}0.weight: not an ML-Agents policy network"),
    "no-heads": (_drop(f"{DIST}mu.weight"), "no action heads (action_model._continuous_distribution"
                                            ".mu or action_model._discrete_distribution.branches.0)"),
    "act-size": (_set("continuous_act_size_vector", torch.tensor([20.0])),
                 "shape mismatch: continuous_act_size_vector says [20.0], the weights have [21.0]"),
    "memory-size": (_set("memory_size_vector", torch.tensor([256.0])),
                    "shape mismatch: memory_size_vector says [256.0], the weights have [0.0]"),
    "hidden-width": (_set(f"{BODY}2.weight", torch.zeros(512, 500)),
                     f"shape mismatch for {BODY}2.weight: expected (512, 512), got (512, 500)"),
    "log-sigma-width": (_set(f"{DIST}log_sigma", torch.zeros(1, 20)),
                        f"shape mismatch for {DIST}log_sigma: expected (1, 21), got (1, 20)"),
    "unknown-part": (_set("network_body.critic_trunk.0.weight", torch.zeros(3)),
                     "unsupported network parts (not an ML-Agents SimpleActor this loader knows): "
                     "['network_body.critic_trunk.0.weight']"),
    "two-layer-lstm": (_set("network_body.lstm.lstm.weight_ih_l1", torch.zeros(3)),
                       "an LSTM of more than one layer is not supported"),
    "nan-in-normalizer": (_set(f"{NORMALIZER}running_mean",
                               torch.zeros(59).index_fill(0, torch.tensor([3, 40]), torch.nan)),
                          f"{NORMALIZER}running_mean holds 2 NaN or infinite value(s) of 59: the "
                          "run diverged or the file is damaged"),
}


@pytest.mark.parametrize("case", PT_CASES)
def test_checkpoint_refusal(checkpoint: dict, tmp_path: Path, case: str) -> None:
    change, cause = PT_CASES[case]
    _refused(_save_policy(checkpoint, tmp_path, change), cause)


GOAL = EXTRA_FIXTURES / "goal_hyper"
GOAL_CAUSE = ("goal-conditioned policy (goal_conditioning_type: hyper, a hypernetwork body) is "
              "not supported; train it with goal_conditioning_type: none to run it here")


@pytest.mark.parametrize("path", [GOAL / "Goal.onnx", GOAL / "Goal" / "Goal-10000.pt"],
                         ids=["onnx", "pt"])
def test_goal_conditioned_policies_are_refused_by_name(path: Path) -> None:
    _refused(path, GOAL_CAUSE)


# --- ONNX graphs we cannot read ------------------------------------------------------------------

@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return onnx.load(str(BASELINE_ONNX))


def _save_model(model: onnx.ModelProto, tmp_path: Path,
                change: Callable[[onnx.ModelProto], None]) -> Path:
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    change(edited)
    path = tmp_path / "Huggy.onnx"
    onnx.save(edited, str(path))
    return path


def _replace_input(model: onnx.ModelProto, shape: list) -> None:
    del model.graph.input[:]
    model.graph.input.append(helper.make_tensor_value_info("obs_0", TensorProto.FLOAT, shape))


def _add_input(name: str, shape: list) -> Callable[[onnx.ModelProto], None]:
    return lambda model: model.graph.input.append(
        helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))


def _remove_output(name: str) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        (index,) = [i for i, out in enumerate(model.graph.output) if out.name == name]
        del model.graph.output[index]
    return change


def _set_initializer(name: str, value: np.ndarray) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        (init,) = [i for i in model.graph.initializer if i.name == name]
        init.CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
    return change


def _drop_initializer(name: str) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        (index,) = [i for i, init in enumerate(model.graph.initializer) if init.name == name]
        del model.graph.initializer[index]
    return change


def _rename_ops(old: str, new: str) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        for node in model.graph.node:
            if node.op_type == old:
                node.op_type = new
    return change


def _drop_normalizer_division(model: onnx.ModelProto) -> None:
    (index,) = [i for i, node in enumerate(model.graph.node)
                if node.op_type == "Div" and node.input[1].startswith("onnx::Div")]
    del model.graph.node[index]


ONNX_CASES = {
    "rank-5-input": (lambda m: _replace_input(m, ["batch", 3, 84, 84, 2]),
                     "input obs_0 has shape ['batch', 3, 84, 84, 2]; expected [batch, size], "
                     "[batch, C, H, W] or [batch, entities, size]"),
    "inputs-out-of-order": (_add_input("obs_2", ["batch", 4]),
                            "observation inputs must be obs_0, obs_1, ... in order, got "
                            "['obs_0', 'obs_2']"),
    "unknown-input": (_add_input("goal", ["batch", 3]),
                      "unknown graph inputs ['goal']; an ML-Agents policy has obs_<i>, "
                      "action_masks and recurrent_in"),
    "memory-without-lstm": (_add_input("recurrent_in", ["batch", 1, 256]),
                            "recurrent_in has 256 values, the LSTM needs 0"),
    "no-deterministic-output": (_remove_output("deterministic_continuous_actions"),
                                "not an ML-Agents policy: expected inputs obs_0, ... and an output "
                                "deterministic_continuous_actions or deterministic_discrete_actions"),
    "unknown-operator": (_rename_ops("Sigmoid", "Elu"),
                         "graph uses operators this loader cannot map: ['Elu']"),
    "missing-mu": (_drop_initializer(f"{DIST}mu.weight"), "no action heads"),
    "act-size": (_set_initializer("continuous_act_size_vector", np.array([20.0])),
                 "shape mismatch: continuous_act_size_vector says [20.0], the weights have [21.0]"),
    "normalizer-58": (_set_initializer(f"{NORMALIZER}running_mean", np.zeros(58)),
                      f"shape mismatch for {NORMALIZER}running_mean: expected (59,), got (58,)"),
    "infinite-weight": (_set_initializer(f"{DIST}mu.bias", np.full(21, np.inf)),
                        f"{DIST}mu.bias holds 21 NaN or infinite value(s) of 21: the run diverged "
                        "or the file is damaged"),
    "normalizer-without-division": (_drop_normalizer_division,
                                    f"normalizer {NORMALIZER}running_mean without its "
                                    "(x - mean) / std"),
}


@pytest.mark.parametrize("case", ONNX_CASES)
def test_onnx_refusal(model: onnx.ModelProto, tmp_path: Path, case: str) -> None:
    change, cause = ONNX_CASES[case]
    _refused(_save_model(model, tmp_path, change), cause)


def test_onnx_that_is_not_ml_agents(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 59])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 59])])
    path = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(graph), str(path))
    _refused(path, "not an ML-Agents policy: expected inputs obs_0, ... and an output "
                   "deterministic_continuous_actions or deterministic_discrete_actions, got inputs "
                   "['x'] and outputs ['y']")


def test_unchanged_onnx_copy_loads(model: onnx.ModelProto, tmp_path: Path) -> None:
    path = _save_model(model, tmp_path, lambda m: None)
    assert _load(path).fingerprint == _load(BASELINE_ONNX).fingerprint


def test_visual_checkpoint_reads_its_spec_from_the_export_beside_it(tmp_path: Path) -> None:
    """The shapes a checkpoint cannot tell come from the run's export; without it, a clear
    refusal (the shared visual fixture, copied with and without its export)."""
    run = mlagents_fixtures_dir() / "visual_simple" / "VisualSimple"
    shutil.copy(run / "VisualSimple-80000.pt", tmp_path / "VisualSimple-80000.pt")
    _refused(tmp_path / "VisualSimple-80000.pt", "cannot tell the observation shapes from the "
             "checkpoint alone (it has visual or variable-length inputs)")
    shutil.copy(run / "VisualSimple-80000.onnx", tmp_path / "VisualSimple-80000.onnx")
    agent = _load(tmp_path / "VisualSimple-80000.pt")
    assert [i.shape for i in agent.spec.inputs] == [(3, 32, 32), (8,)]
    assert agent.loaded.extras["observation_spec_from"] == str(tmp_path / "VisualSimple-80000.onnx")
