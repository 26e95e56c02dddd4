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
from tests.conftest import fixtures_dir

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
    assert _load(path).describe()["parameters"]["linear"] == 566_805


def _add_visual_encoder(policy: dict) -> None:
    policy["network_body.observation_encoder.processors.1.conv_layers.0.weight"] = (
        torch.zeros(16, 3, 8, 8))
    policy["network_body.observation_encoder.processors.1.conv_layers.0.bias"] = torch.zeros(16)


def _set(key: str, value: torch.Tensor) -> Callable[[dict], None]:
    return lambda policy: policy.__setitem__(key, value)


def _drop(key: str) -> Callable[[dict], None]:
    return lambda policy: policy.pop(key)


PT_CASES = {
    "visual": (_add_visual_encoder,
               "visual or multiple observations are not supported; expected one vector observation"),
    "discrete": (_set("discrete_act_size_vector", torch.tensor([[3.0, 2.0]])),
                 "discrete actions are not supported; only continuous-action policies are"),
    "recurrent": (_set("memory_size_vector", torch.tensor([256.0])),
                  "recurrent policy (memory) is not supported; only feed-forward policies are"),
    "no-mu": (_drop(f"{DIST}mu.weight"), "not an ML-Agents continuous-action policy: missing"),
    "act-size": (_set("continuous_act_size_vector", torch.tensor([20.0])),
                 "shape mismatch: continuous_act_size_vector says 20 actions, mu has 21"),
    "normalizer-58": (_set(f"{NORMALIZER}running_mean", torch.zeros(58)),
                      "shape mismatch for normalizer.mean: expected (59,), got (58,)"),
    "hidden-width": (_set(f"{BODY}2.weight", torch.zeros(512, 500)),
                     "shape mismatch for body.2.weight: expected (512, 512), got (512, 500)"),
    "log-sigma-width": (_set(f"{DIST}log_sigma", torch.zeros(1, 20)),
                        "shape mismatch for log_sigma: expected (1, 21), got (1, 20)"),
}


@pytest.mark.parametrize("case", PT_CASES)
def test_checkpoint_refusal(checkpoint: dict, tmp_path: Path, case: str) -> None:
    change, cause = PT_CASES[case]
    _refused(_save_policy(checkpoint, tmp_path, change), cause)


# --- ONNX graphs we cannot run ----------------------------------------------------------------

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


def _add_output(name: str) -> Callable[[onnx.ModelProto], None]:
    return lambda model: model.graph.output.append(
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", 1]))


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


def _relu_body(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if node.op_type == "Sigmoid":
            node.op_type = "Relu"


ONNX_CASES = {
    "visual-rank-4": (lambda m: _replace_input(m, ["batch", 84, 84, 3]),
                      "visual observations are not supported; expected input 'obs_0' of rank 2 "
                      "[batch, obs], got rank 4"),
    "two-observations": (_add_input("obs_1", ["batch", 84, 84, 3]),
                         "visual or multiple observations are not supported; expected one input "
                         "'obs_0', got ['obs_0', 'obs_1']"),
    "discrete": (_add_output("discrete_actions"),
                 "discrete actions are not supported; only continuous-action policies are"),
    "action-masks": (_add_input("action_masks", ["batch", 3]),
                     "discrete actions are not supported"),
    "recurrent-memory": (_set_initializer("memory_size_vector", np.array([256.0])),
                         "recurrent policy (memory) is not supported"),
    "recurrent-input": (_add_input("recurrent_in", ["batch", 1, 256]),
                        "recurrent policy (memory) is not supported"),
    "no-deterministic-output": (_remove_output("deterministic_continuous_actions"),
                                "not an ML-Agents continuous-action policy: outputs"),
    "unknown-operator": (_relu_body, "graph uses operators this loader cannot run: ['Relu']"),
    "missing-mu": (_drop_initializer(f"{DIST}mu.weight"),
                   "not an ML-Agents policy graph: missing"),
    "act-size": (_set_initializer("continuous_act_size_vector", np.array([20.0])),
                 "shape mismatch: continuous_act_size_vector says 20 actions, mu has 21"),
    "normalizer-58": (_set_initializer(f"{NORMALIZER}running_mean", np.zeros(58)),
                      "shape mismatch for normalizer.mean: expected (59,), got (58,)"),
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
    _refused(path, "not an ML-Agents policy: expected one input 'obs_0', got ['x']")


def test_unchanged_onnx_copy_loads(model: onnx.ModelProto, tmp_path: Path) -> None:
    path = _save_model(model, tmp_path, lambda m: None)
    assert _load(path).fingerprint == _load(BASELINE_ONNX).fingerprint
