"""ML-Agents ONNX exports (`<Behavior>.onnx`): read the initializers, after checking that the graph
is the feed-forward continuous-action actor we can run (opset 9 exports of torch 1.x and 2.x)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from huggy_agent.errors import PolicyLoadError
from huggy_agent.formats.loaded import LoadedPolicy, infer_architecture, step_from_filename

INPUT = "obs_0"
OUTPUTS = ("version_number", "memory_size", "continuous_actions",
           "continuous_action_output_shape", "deterministic_continuous_actions")
SUPPORTED_OPS = {"Sub", "Div", "Clip", "Concat", "Gemm", "Sigmoid", "Mul", "Add", "Exp", "Tanh",
                 "RandomNormalLike", "Constant", "Identity", "Max", "Min"}
BODY = "network_body._body_endoder.seq_layers."
DIST = "action_model._continuous_distribution."


def _read_model(path: Path) -> onnx.ModelProto:
    try:
        model = onnx.load(str(path))
    except Exception as error:  # noqa: BLE001 - protobuf raises several unrelated types here
        raise PolicyLoadError(f"{path}: truncated or corrupt ONNX file ({error})") from error
    if not model.graph.node:  # an empty file parses as an empty model
        raise PolicyLoadError(f"{path}: truncated or corrupt ONNX file (it holds no graph)")
    return model


def _check_interface(model: onnx.ModelProto, initializers: dict, path: Path) -> None:
    graph = model.graph
    inputs = [i for i in graph.input if i.name not in initializers]
    names = [i.name for i in inputs]
    outputs = {o.name for o in graph.output}
    if "recurrent_in" in names or "recurrent_out" in outputs:
        raise PolicyLoadError(f"{path}: recurrent policy (memory) is not supported")
    if "discrete_actions" in outputs or "action_masks" in names:
        raise PolicyLoadError(f"{path}: discrete actions are not supported; "
                              "only continuous-action policies are")
    if names != [INPUT]:
        if any(name.startswith("obs_") for name in names):
            raise PolicyLoadError(f"{path}: visual or multiple observations are not supported; "
                                  f"expected one input {INPUT!r}, got {names}")
        raise PolicyLoadError(f"{path}: not an ML-Agents policy: expected one input {INPUT!r}, "
                              f"got {names}")
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != 2:
        raise PolicyLoadError(f"{path}: visual observations are not supported; expected input "
                              f"{INPUT!r} of rank 2 [batch, obs], got rank {len(dims)}")
    if "deterministic_continuous_actions" not in outputs:
        raise PolicyLoadError(f"{path}: not an ML-Agents continuous-action policy: outputs {sorted(outputs)} "
                              "lack 'deterministic_continuous_actions'")
    memory = initializers.get("memory_size_vector")
    if memory is not None and float(memory.flatten()[0]) > 0:
        raise PolicyLoadError(f"{path}: recurrent policy (memory) is not supported")
    unknown = sorted({node.op_type for node in graph.node} - SUPPORTED_OPS)
    if unknown:
        raise PolicyLoadError(f"{path}: graph uses operators this loader cannot run: {unknown}")


def _normalizer(graph: onnx.GraphProto, initializers: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) of `clamp((obs_0 - mean) / std)`, found by structure (std has no fixed name)."""
    subtract = next((n for n in graph.node if n.op_type == "Sub" and n.input[0] == INPUT), None)
    if subtract is None:
        return None
    divide = next(n for n in graph.node if n.op_type == "Div" and n.input[0] == subtract.output[0])
    return initializers[subtract.input[1]], initializers[divide.input[1]]


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A float32 tensor owning a copy of an initializer (onnx gives read-only arrays)."""
    return torch.from_numpy(np.array(array, dtype=np.float32))


def load_onnx(path: str | Path) -> LoadedPolicy:
    """Canonical tensors of an ML-Agents ONNX export; refuses what the graph shows we cannot run."""
    path = Path(path)
    model = _read_model(path)
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    _check_interface(model, initializers, path)
    tensors: dict[str, torch.Tensor] = {}
    try:
        normalizer = _normalizer(model.graph, initializers)
        if normalizer is not None:
            tensors["normalizer.mean"] = _tensor(normalizer[0])
            tensors["normalizer.std"] = _tensor(normalizer[1])
        index = 0
        while f"{BODY}{index}.weight" in initializers:
            tensors[f"body.{index}.weight"] = _tensor(initializers[f"{BODY}{index}.weight"])
            tensors[f"body.{index}.bias"] = _tensor(initializers[f"{BODY}{index}.bias"])
            index += 2
        tensors["mu.weight"] = _tensor(initializers[f"{DIST}mu.weight"])
        tensors["mu.bias"] = _tensor(initializers[f"{DIST}mu.bias"])
        if f"{DIST}log_sigma.weight" in initializers:
            tensors["log_sigma.weight"] = _tensor(initializers[f"{DIST}log_sigma.weight"])
            tensors["log_sigma.bias"] = _tensor(initializers[f"{DIST}log_sigma.bias"])
        else:
            tensors["log_sigma"] = _tensor(initializers[f"{DIST}log_sigma"])
    except (KeyError, StopIteration) as error:
        raise PolicyLoadError(f"{path}: not an ML-Agents policy graph: missing {error}") from error
    arch = infer_architecture(tensors, path)
    declared = initializers.get("continuous_act_size_vector")
    if declared is not None and int(declared.flatten()[0]) != arch.act_size:
        raise PolicyLoadError(f"{path}: shape mismatch: continuous_act_size_vector says "
                              f"{int(declared.flatten()[0])} actions, mu has {arch.act_size}")
    return LoadedPolicy(arch, tensors, path, "mlagents-onnx", step_from_filename(path))
