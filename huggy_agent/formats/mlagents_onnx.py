"""ML-Agents ONNX exports (`<Behavior>.onnx`): the observation spec from the graph's inputs, the
weights from its initializers.

Most initializers carry ML-Agents' own module names. Four kinds do not, and are found by the
graph's structure: a normalizer's std (folded into the `Div` after `x - running_mean`), the
LSTM's W, R and B (`LSTM` node; ONNX gate order i, o, f, c, torch's i, f, g, o), and the
attention path's Linear weights, exported as `MatMul` with a transposed, anonymous weight, whose
`Add` names the bias. Opset-9 exports of torch 1.x and 2.x are read alike. Where weights are
equal (the zero biases of an untrained network: a checkpoint written before the first update),
torch's exporter keeps one initializer and names the others as its `Identity` outputs; those
names are read as the initializer they copy (`_with_aliases`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from huggy_agent.errors import PolicyLoadError
from huggy_agent.formats.architecture import (
    CONTINUOUS,
    ENCODER,
    KNOWN_PREFIXES,
    LSTM,
    check_declared,
    infer_architecture,
    refuse_unsupported,
)
from huggy_agent.formats.loaded import LoadedPolicy, step_from_filename
from huggy_agent_client.spec import InputKind, ObservationInput

OUTPUTS = {"version_number", "memory_size", "continuous_actions", "continuous_action_output_shape",
           "deterministic_continuous_actions", "discrete_actions", "discrete_action_output_shape",
           "deterministic_discrete_actions", "recurrent_out", "action"}
SUPPORTED_OPS = {
    "Add", "ArgMax", "Cast", "Clip", "Concat", "Constant", "Conv", "Div", "Exp", "Gemm",
    "Identity", "LSTM", "LeakyRelu", "Less", "Log", "MatMul", "MaxPool", "Max", "Min", "Mul",
    "Multinomial", "Pow", "RandomNormalLike", "ReduceMean", "ReduceSum", "Relu", "Reshape",
    "Sigmoid", "Slice", "Softmax", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze",
    "Flatten", "Shape", "Gather", "Expand", "Tile", "Neg", "Equal", "Where", "ConstantOfShape",
}
KINDS: dict[int, InputKind] = {1: "vector", 3: "visual", 2: "variable"}
ONNX_TO_TORCH_GATES = [0, 2, 3, 1]  # blocks i, o, f, c -> i, f, g (= c), o


def _with_aliases(graph: onnx.GraphProto, initializers: dict[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """The initializers, and each `Identity` node's output that copies one, under that name."""
    aliases = {node.output[0]: initializers[node.input[0]] for node in graph.node
               if node.op_type == "Identity" and node.input[0] in initializers
               and node.output[0] not in initializers}
    return {**initializers, **aliases}


def _read_model(path: Path) -> onnx.ModelProto:
    try:
        model = onnx.load(str(path))
    except Exception as error:  # protobuf raises several unrelated types here
        raise PolicyLoadError(f"{path}: truncated or corrupt ONNX file ({error})") from error
    if not model.graph.node:  # an empty file parses as an empty model
        raise PolicyLoadError(f"{path}: truncated or corrupt ONNX file (it holds no graph)")
    return model


def read_spec(model: onnx.ModelProto, initializers: Mapping[str, object], path: Path
              ) -> tuple[tuple[ObservationInput, ...], int]:
    """The observation inputs and the memory size an ML-Agents graph declares.

    Args:
        model: the ONNX model.
        initializers: the graph's initializers by name (inputs that are initializers are skipped).
        path: the file, named in errors.

    Returns:
        The inputs `obs_0, obs_1, ...` with their shapes and kinds, and the memory size (0 without
            `recurrent_in`).

    Raises:
        PolicyLoadError: the graph is not an ML-Agents policy interface: no `obs_<i>` inputs or
            deterministic action outputs, observation inputs out of order, unknown inputs, or an
            input shape of another rank.
    """
    graph = model.graph
    names = [i.name for i in graph.input if i.name not in initializers]
    outputs = {o.name for o in graph.output}
    observations = [name for name in names if name.startswith("obs_")]
    if not observations or not outputs & {"deterministic_continuous_actions",
                                          "deterministic_discrete_actions"}:
        raise PolicyLoadError(f"{path}: not an ML-Agents policy: expected inputs obs_0, ... and "
                              "an output deterministic_continuous_actions or "
                              f"deterministic_discrete_actions, got inputs {names} and outputs "
                              f"{sorted(outputs)}")
    if observations != [f"obs_{i}" for i in range(len(observations))]:
        raise PolicyLoadError(f"{path}: observation inputs must be obs_0, obs_1, ... in order, "
                              f"got {observations}")
    unknown = sorted(set(names) - set(observations) - {"action_masks", "recurrent_in"})
    if unknown:
        raise PolicyLoadError(f"{path}: unknown graph inputs {unknown}; an ML-Agents policy has "
                              "obs_<i>, action_masks and recurrent_in")
    by_name = {i.name: i for i in graph.input}
    inputs = []
    for name in observations:
        dims = [d.dim_value for d in by_name[name].type.tensor_type.shape.dim][1:]
        if len(dims) not in KINDS or not all(dims):
            raise PolicyLoadError(f"{path}: input {name} has shape {['batch', *dims]}; expected "
                                  "[batch, size], [batch, C, H, W] or [batch, entities, size]")
        inputs.append(ObservationInput(name, tuple(dims), KINDS[len(dims)]))
    memory = 0
    if "recurrent_in" in names:
        memory = by_name["recurrent_in"].type.tensor_type.shape.dim[-1].dim_value
    return tuple(inputs), memory


def _consumer(graph: onnx.GraphProto, output: str, op_type: str) -> onnx.NodeProto | None:
    return next((n for n in graph.node if n.op_type == op_type and output in n.input), None)


def _anonymous_weights(graph: onnx.GraphProto, initializers: dict[str, np.ndarray], path: Path
                       ) -> dict[str, np.ndarray]:
    """The weights that lost their names on export, under their module keys (see module doc)."""
    found: dict[str, np.ndarray] = {}
    for name in [n for n in initializers if n.endswith("normalizer.running_mean")]:
        subtract = next((n for n in graph.node if n.op_type == "Sub" and n.input[1] == name), None)
        divide = subtract and _consumer(graph, subtract.output[0], "Div")
        if divide is None or divide.input[1] not in initializers:
            raise PolicyLoadError(f"{path}: normalizer {name} without its (x - mean) / std")
        found[name.replace("running_mean", "std")] = initializers[divide.input[1]]
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in initializers \
                and not node.input[1].startswith(KNOWN_PREFIXES):
            add = _consumer(graph, node.output[0], "Add")
            bias = add and next((i for i in add.input if i.endswith(".bias")), None)
            if bias is None:
                raise PolicyLoadError(f"{path}: MatMul weight {node.input[1]} without a named bias")
            found[bias[: -len("bias")] + "weight"] = initializers[node.input[1]].T
        elif node.op_type == "LSTM":
            weight, recurrence, bias = (initializers[name] for name in node.input[1:4])
            hidden = recurrence.shape[-1]

            def gates(matrix: np.ndarray, hidden: int = hidden) -> np.ndarray:
                return np.concatenate([matrix[k * hidden:(k + 1) * hidden]
                                       for k in ONNX_TO_TORCH_GATES])

            found[f"{LSTM}weight_ih_l0"] = gates(weight[0])
            found[f"{LSTM}weight_hh_l0"] = gates(recurrence[0])
            found[f"{LSTM}bias_ih_l0"] = gates(bias[0, : 4 * hidden])
            found[f"{LSTM}bias_hh_l0"] = gates(bias[0, 4 * hidden:])
    return found


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A float32 tensor owning a copy of an initializer (onnx gives read-only arrays)."""
    return torch.from_numpy(np.array(array, dtype=np.float32))


def load_onnx(path: str | Path) -> LoadedPolicy:
    """The spec and weights of an ML-Agents ONNX export.

    Args:
        path: the `.onnx` file.

    Returns:
        The loaded policy, its every key and shape checked by building the network once.

    Raises:
        PolicyLoadError: the file is corrupt or truncated, or holds what this loader cannot run
            (unsupported features or operators, inconsistent sizes), naming why.
    """
    path = Path(path)
    model = _read_model(path)
    try:
        initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    except (TypeError, ValueError) as error:
        raise PolicyLoadError(f"{path}: corrupt ONNX initializer ({error})") from error
    initializers = _with_aliases(model.graph, initializers)
    refuse_unsupported(list(initializers), path)
    inputs, memory = read_spec(model, initializers, path)
    unsupported = sorted({node.op_type for node in model.graph.node} - SUPPORTED_OPS)
    if unsupported:
        raise PolicyLoadError(f"{path}: graph uses operators this loader cannot map: {unsupported}")
    named = {k: v for k, v in initializers.items() if k.startswith(KNOWN_PREFIXES)}
    tensors = {k: _tensor(v) for k, v in {**named, **_anonymous_weights(model.graph, initializers,
                                                                        path)}.items()}
    arch = infer_architecture(tensors, inputs, path)
    if arch.memory_size != memory:
        raise PolicyLoadError(f"{path}: recurrent_in has {memory} values, the LSTM needs "
                              f"{arch.memory_size}")
    check_declared({name: initializers[name].flatten().tolist() for name in
                    ("continuous_act_size_vector", "discrete_act_size_vector", "memory_size_vector")
                    if name in initializers}, arch, path)
    if arch.head == "sac" and f"{CONTINUOUS}log_sigma.weight" not in tensors:
        raise PolicyLoadError(f"{path}: SAC head without its log_sigma layer")
    loaded = LoadedPolicy(arch, tensors, path, "mlagents-onnx", step_from_filename(path))
    loaded.build()  # every key and shape checked now, with the file's name in the error
    return loaded


__all__ = ["ENCODER", "load_onnx", "read_spec"]
