"""Reading an `ActorArchitecture` off a set of ML-Agents weights and an observation spec.

Both loaders end here: the ONNX loader knows every input's shape from the graph; the `.pt`
loader takes them from the run's ONNX export beside it, or from the weights when they tell
(vector inputs only). Everything else follows from the tensors' keys and shapes.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from huggy_agent.actor import ActorArchitecture, InputArchitecture
from huggy_agent.errors import PolicyLoadError
from huggy_agent_client.spec import ObservationInput

ENCODER = "network_body.observation_encoder."
PROCESSOR = re.compile(r"^network_body\.observation_encoder\.processors\.(\d+)\.")
BODY = "network_body._body_endoder.seq_layers."
LSTM = "network_body.lstm.lstm."
CONTINUOUS = "action_model._continuous_distribution."
DISCRETE = "action_model._discrete_distribution.branches."
KNOWN_PREFIXES = (ENCODER, BODY, LSTM, CONTINUOUS, DISCRETE)


def refuse_unsupported(keys: list[str], origin: Path) -> None:
    """Refuse the ML-Agents network features this project cannot run.

    Args:
        keys: the checkpoint's tensor names.
        origin: the file, named in the error.

    Raises:
        PolicyLoadError: the keys show a hypernetwork body (goal conditioning) or an LSTM of more
            than one layer.
    """
    if any(".hypernet." in key for key in keys):
        raise PolicyLoadError(f"{origin}: goal-conditioned policy (goal_conditioning_type: hyper, "
                              "a hypernetwork body) is not supported; train it with "
                              "goal_conditioning_type: none to run it here")
    if any(key.startswith("network_body.lstm.lstm.") and key.endswith("_l1") for key in keys):
        raise PolicyLoadError(f"{origin}: an LSTM of more than one layer is not supported")


def processor_keys(tensors: dict[str, torch.Tensor], index: int) -> list[str]:
    """The keys of one observation processor.

    Args:
        tensors: the Actor's tensors by key.
        index: the processor's (the observation input's) index.

    Returns:
        Its keys without the `...processors.<index>.` prefix, sorted.
    """
    prefix = f"{ENCODER}processors.{index}."
    return sorted(key[len(prefix):] for key in tensors if key.startswith(prefix))


def visual_encoder_kind(keys: list[str], tensors: dict[str, torch.Tensor], prefix: str,
                        origin: Path) -> str:
    """Which of ML-Agents' visual encoders one processor's keys belong to.

    Args:
        keys: the processor's keys (`processor_keys`).
        tensors: the Actor's tensors by key.
        prefix: the processor's key prefix.
        origin: the file, named in the error.

    Returns:
        `resnet`, `fully_connected`, `simple`, `nature_cnn` or `match3`.

    Raises:
        PolicyLoadError: the keys or the convolutions' kernel sizes match none of them.
    """
    if any(key.startswith("sequential.") for key in keys):
        return "resnet"
    convs = sorted({int(key.split(".")[1]) for key in keys if key.startswith("conv_layers.")})
    if not convs:
        if keys == ["dense.0.bias", "dense.0.weight"]:
            return "fully_connected"
        raise PolicyLoadError(f"{origin}: unknown observation encoder with weights {keys}")
    kernels = tuple(tensors[f"{prefix}conv_layers.{i}.weight"].shape[-1] for i in convs)
    kinds = {(8, 4): "simple", (8, 4, 3): "nature_cnn", (3, 3): "match3"}
    if kernels not in kinds:
        raise PolicyLoadError(f"{origin}: unknown convolutional encoder (kernel sizes {kernels})")
    return kinds[kernels]


def vector_inputs_from_weights(tensors: dict[str, torch.Tensor], origin: Path
                               ) -> tuple[ObservationInput, ...]:
    """The observation inputs as far as the weights tell them, when every input is a vector.

    Each normalized input is its own; without normalizers, one input as wide as the body (the network
    concatenates several unnormalized vector inputs in order, so they act as one).

    Args:
        tensors: the Actor's tensors by key.
        origin: the file, named in the error.

    Returns:
        The inputs `obs_0`, `obs_1`, ... with their sizes.

    Raises:
        PolicyLoadError: the weights cannot tell the shapes (visual or variable-length inputs, or
            inputs without a normalizer beside normalized ones); the message says to keep the run's
            ONNX export beside the checkpoint.
    """
    indices = sorted({int(m.group(1)) for key in tensors if (m := PROCESSOR.match(key))})
    vector_only = all(key.startswith("normalizer.") for i in indices
                      for key in processor_keys(tensors, i))
    width = int(tensors[f"{BODY}0.weight"].shape[1]) if f"{BODY}0.weight" in tensors else 0
    if not vector_only or any(key.startswith(f"{ENCODER}rsa.") for key in tensors):
        why = "it has visual or variable-length inputs"
    elif not indices:
        return (ObservationInput("obs_0", (width,), "vector"),)
    else:
        sizes = [int(tensors[f"{ENCODER}processors.{i}.normalizer.running_mean"].shape[0])
                 for i in indices]
        if indices == list(range(len(indices))) and sum(sizes) == width:
            return tuple(ObservationInput(f"obs_{i}", (size,), "vector")
                         for i, size in enumerate(sizes))
        why = (f"its normalizers, of inputs {indices}, cover {sum(sizes)} of the body's {width} "
               "input values: the rest are inputs without a normalizer")
    raise PolicyLoadError(f"{origin}: cannot tell the observation shapes from the checkpoint "
                          f"alone ({why}); keep the run's ONNX export (<Behavior>-<step>.onnx or "
                          "<Behavior>.onnx) beside it, as ML-Agents writes them")


def infer_architecture(tensors: dict[str, torch.Tensor], inputs: tuple[ObservationInput, ...],
                       origin: Path) -> ActorArchitecture:
    """The architecture of a set of ML-Agents actor weights.

    Args:
        tensors: the Actor's tensors under ML-Agents' keys.
        inputs: the observation inputs, in order.
        origin: the file, named in errors.

    Returns:
        The inputs with their normalizers and encoders, the body's size, the memory size, the
            action heads and the head kind (`sac` where there is a `log_sigma` layer, else `ppo`).

    Raises:
        PolicyLoadError: unknown keys, no body layer, no action head, or an unknown visual encoder.
    """
    unknown = sorted(key for key in tensors if not key.startswith(KNOWN_PREFIXES))
    if unknown:
        raise PolicyLoadError(f"{origin}: unsupported network parts (not an ML-Agents SimpleActor "
                              f"this loader knows, e.g. goal conditioning): {unknown[:4]}")
    layers = 0
    while f"{BODY}{2 * layers}.weight" in tensors:
        layers += 1
    if not layers:
        raise PolicyLoadError(f"{origin}: no {BODY}0.weight: not an ML-Agents policy network")
    hidden = int(tensors[f"{BODY}0.weight"].shape[0])
    memory = 0
    if f"{LSTM}weight_hh_l0" in tensors:
        memory = 2 * int(tensors[f"{LSTM}weight_hh_l0"].shape[1])
    continuous = int(tensors[f"{CONTINUOUS}mu.weight"].shape[0]) \
        if f"{CONTINUOUS}mu.weight" in tensors else 0
    branches: list[int] = []
    while f"{DISCRETE}{len(branches)}.weight" in tensors:
        branches.append(int(tensors[f"{DISCRETE}{len(branches)}.weight"].shape[0]))
    if not continuous and not branches:
        raise PolicyLoadError(f"{origin}: no action heads ({CONTINUOUS}mu or {DISCRETE}0): "
                              "not an ML-Agents policy network")
    architectures = []
    for index, observation in enumerate(inputs):
        keys = processor_keys(tensors, index)
        prefix = f"{ENCODER}processors.{index}."
        encoder = (visual_encoder_kind(keys, tensors, prefix, origin)
                   if observation.kind == "visual" else None)
        architectures.append(InputArchitecture(observation, normalize="normalizer.std" in keys,
                                               encoder=encoder))
    return ActorArchitecture(
        inputs=tuple(architectures), hidden_units=hidden, num_layers=layers,
        continuous_size=continuous, discrete_branches=tuple(branches), memory_size=memory,
        head="sac" if f"{CONTINUOUS}log_sigma.weight" in tensors else "ppo")


def check_declared(declared: dict[str, list[float]], arch: ActorArchitecture, origin: Path) -> None:
    """Check the sizes a file declares against those of the weights.

    Args:
        declared: `continuous_act_size_vector`, `discrete_act_size_vector` and
            `memory_size_vector` as the file holds them; other names are ignored.
        arch: the architecture read off the weights.
        origin: the file, named in the error.

    Raises:
        PolicyLoadError: a declared size differs from the weights'.
    """
    expected = {"continuous_act_size_vector": [float(arch.continuous_size)],
                "discrete_act_size_vector": [float(b) for b in arch.discrete_branches],
                "memory_size_vector": [float(arch.memory_size)]}
    for name, values in declared.items():
        if name in expected and values and values != expected[name]:
            raise PolicyLoadError(f"{origin}: shape mismatch: {name} says {values}, the weights "
                                  f"have {expected[name]}")
