"""ML-Agents PyTorch checkpoints (`<Behavior>-<step>.pt`, `checkpoint.pt`): `torch.save` of a dict
whose `Policy` entry is the actor's state dict. Loaded with `weights_only=True`: no code is
unpickled.

A checkpoint holds weights, not the observation spec. When the weights do not tell it (visual or
variable-length inputs, several vector inputs without normalizers), the spec comes from the run's
ONNX export beside the checkpoint: `<Behavior>-<step>.onnx` next to it, else the run's final
`<Behavior>.onnx` one folder up, as ML-Agents lays out `results/<run_id>/`.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from huggy_agent.errors import PolicyLoadError
from huggy_agent.formats.architecture import (
    BODY,
    ENCODER,
    KNOWN_PREFIXES,
    check_declared,
    infer_architecture,
    refuse_unsupported,
    vector_inputs_from_weights,
)
from huggy_agent.formats.loaded import LoadedPolicy, step_from_filename
from huggy_agent.formats.mlagents_onnx import read_spec
from huggy_agent_client.spec import ObservationInput

NORMALIZER_STATS = ("running_mean", "running_variance", "normalization_steps")


def _check_archive(path: Path) -> None:
    """torch.save writes a zip archive whose members carry CRC-32s, which torch.load ignores:
    test them, so truncated files and flipped bytes are refused and junk never reaches pickle."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError) as error:
        raise PolicyLoadError(f"{path}: truncated or corrupt checkpoint (not a readable zip "
                              f"archive as torch.save writes: {error})") from error
    if damaged is not None:
        raise PolicyLoadError(f"{path}: corrupt checkpoint: CRC-32 mismatch in member {damaged}")


def _read_checkpoint(path: Path) -> dict[str, Any]:
    _check_archive(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise PolicyLoadError(f"{path}: refused to unpickle it with weights_only=True (it holds "
                              f"code or objects, not only tensors): {error}") from error
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as error:
        raise PolicyLoadError(f"{path}: truncated or corrupt checkpoint ({error})") from error
    if not isinstance(checkpoint, dict) or "Policy" not in checkpoint:
        keys = list(checkpoint)[:5] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise PolicyLoadError(f"{path}: not an ML-Agents checkpoint: expected a dict with a 'Policy' "
                              f"entry, got {keys}")
    policy: dict[str, Any] = checkpoint["Policy"]
    return policy


def normalizer_std(running_variance: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """A normalizer's standard deviation from its running statistics.

    Computed in float64 and rounded once to float32, so every machine gets the same bits (float32
    kernels may divide through a reciprocal), within 1 ulp of the std an ML-Agents ONNX export folds
    in.

    Args:
        running_variance: the normalizer's running sum of squared deviations.
        steps: its `normalization_steps`.

    Returns:
        float32 `sqrt(running_variance / steps)`.
    """
    variance = running_variance.detach().double().numpy()
    std = np.sqrt(variance / float(steps)).astype(np.float32)
    return torch.from_numpy(std)


def _actor_tensors(policy: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The actor's weights under its keys: ML-Agents' own, with each normalizer's running
    statistics turned into its std, and the `network_body.processors.*` aliases, critic heads
    and bookkeeping scalars left out."""
    tensors: dict[str, torch.Tensor] = {}
    unknown = sorted(key for key in policy if key.startswith(("network_body.", "action_model."))
                     and not key.startswith((*KNOWN_PREFIXES, "network_body.processors.")))
    if unknown:
        raise PolicyLoadError(f"unsupported network parts (not an ML-Agents SimpleActor this "
                              f"loader knows): {unknown[:4]}")
    for key, value in policy.items():
        if not key.startswith(KNOWN_PREFIXES):
            continue
        if key.endswith("normalizer.running_mean"):
            prefix = key[: -len("running_mean")]
            tensors[key] = value.float()
            tensors[prefix + "std"] = normalizer_std(policy[prefix + "running_variance"],
                                                     policy[prefix + "normalization_steps"])
        elif not key.endswith(NORMALIZER_STATS):
            tensors[key] = value.float()
    return tensors


def _sibling_export(path: Path) -> Path | None:
    """The run's ONNX export that belongs with checkpoint `path`, if it is there."""
    candidates = [path.with_suffix(".onnx")]
    behavior = path.parent.name
    candidates.append(path.parent.parent / f"{behavior}.onnx")
    return next((c for c in candidates if c.is_file()), None)


def _inputs(path: Path, tensors: dict[str, torch.Tensor]) -> tuple[tuple[ObservationInput, ...],
                                                                     str]:
    """The observation inputs, and where they were read: the run's ONNX export beside the
    checkpoint when it is there, else the weights (see `vector_inputs_from_weights`)."""
    export = _sibling_export(path)
    if export is None:
        return vector_inputs_from_weights(tensors, path), "weights"
    try:
        model = onnx.load(str(export), load_external_data=False)
    except Exception as error:  # protobuf raises several unrelated types here
        raise PolicyLoadError(f"{path}: its run's export {export} is unreadable ({error})") from error
    initializers = {i.name: None for i in model.graph.initializer}
    inputs, _ = read_spec(model, initializers, export)
    return inputs, str(export)


def load_pt(path: str | Path) -> LoadedPolicy:
    """An ML-Agents checkpoint's actor weights and architecture, every key and shape checked.

    Args:
        path: the `.pt` checkpoint; its run's ONNX export beside it, where there is one, gives the
            observation shapes.

    Returns:
        The loaded policy; `extras` records where the observation spec came from and the
            normalizers' step count.

    Raises:
        PolicyLoadError: the file is corrupt, holds code or objects beyond tensors, is not an
            ML-Agents policy checkpoint, holds network parts this loader cannot run, or does not
            tell its observation shapes.
    """
    path = Path(path)
    policy = _read_checkpoint(path)
    refuse_unsupported(list(policy), path)
    try:
        tensors = _actor_tensors(policy)
    except PolicyLoadError as error:
        raise PolicyLoadError(f"{path}: {error}") from None
    if not any(key.startswith("network_body.") for key in tensors):
        raise PolicyLoadError(f"{path}: not an ML-Agents policy: its Policy state dict has no "
                              "network_body weights")
    if f"{BODY}0.weight" not in tensors:
        raise PolicyLoadError(f"{path}: no {BODY}0.weight: not an ML-Agents policy network")
    inputs, spec_source = _inputs(path, tensors)
    arch = infer_architecture(tensors, inputs, path)
    check_declared({name: policy[name].flatten().tolist() for name in
                    ("continuous_act_size_vector", "discrete_act_size_vector", "memory_size_vector")
                    if name in policy}, arch, path)
    loaded = LoadedPolicy(arch, tensors, path, "mlagents-pt", step_from_filename(path))
    loaded.extras["observation_spec_from"] = spec_source
    steps = [int(policy[k]) for k in policy if k.endswith("normalizer.normalization_steps")
             and k.startswith(ENCODER)]
    if steps:
        loaded.extras["normalization_steps"] = steps[0]
    loaded.build()  # every key and shape checked now, with the file's name in the error
    return loaded
