"""ML-Agents PyTorch checkpoints (`Huggy-<step>.pt`, `checkpoint.pt`): `torch.save` of a dict whose
`Policy` entry is the actor's state dict. Loaded with `weights_only=True`: no code is unpickled."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import torch

from huggy_agent.errors import PolicyLoadError
from huggy_agent.formats.loaded import LoadedPolicy, infer_architecture, step_from_filename

NORMALIZER = "network_body.observation_encoder.processors.0.normalizer."
BODY = "network_body._body_endoder.seq_layers."
DIST = "action_model._continuous_distribution."


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


def _read_checkpoint(path: Path) -> dict:
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
    return checkpoint["Policy"]


def _refuse_unsupported(policy: dict, path: Path) -> None:
    """Name the first feature of `policy` that this project cannot run."""
    memory = policy.get("memory_size_vector")
    if memory is not None and float(memory.flatten()[0]) > 0 or any("lstm" in k for k in policy):
        raise PolicyLoadError(f"{path}: recurrent policy (memory) is not supported; "
                              "only feed-forward policies are")
    discrete = policy.get("discrete_act_size_vector")
    if (discrete is not None and discrete.numel() > 0) or any(
            k.startswith("action_model._discrete_distribution") for k in policy):
        raise PolicyLoadError(f"{path}: discrete actions are not supported; "
                              "only continuous-action policies are")
    encoders = {k.split("processors.")[1].split(".")[0] for k in policy
                if k.startswith("network_body.observation_encoder.processors.")}
    visual = [k for k in policy if k.startswith("network_body.observation_encoder.processors.")
              and "normalizer" not in k]
    if visual or len(encoders) > 1:
        raise PolicyLoadError(f"{path}: visual or multiple observations are not supported; "
                              "expected one vector observation")
    if f"{DIST}mu.weight" not in policy or f"{BODY}0.weight" not in policy:
        raise PolicyLoadError(f"{path}: not an ML-Agents continuous-action policy: missing "
                              f"{BODY}0.weight or {DIST}mu.weight")


def normalizer_std(running_variance: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """`sqrt(running_variance / steps)` computed in float64 and rounded once to float32: the
    same bits on every machine (float32 kernels may divide through a reciprocal), and within
    1 ulp of the std an ML-Agents ONNX export folds in."""
    variance = running_variance.detach().double().numpy()
    std = np.sqrt(variance / float(steps)).astype(np.float32)
    return torch.from_numpy(std)


def load_pt(path: str | Path) -> LoadedPolicy:
    """Map an ML-Agents checkpoint's keys onto PolicyNet's canonical keys, checking every shape."""
    path = Path(path)
    policy = _read_checkpoint(path)
    _refuse_unsupported(policy, path)
    tensors: dict[str, torch.Tensor] = {}
    if f"{NORMALIZER}running_mean" in policy:
        tensors["normalizer.mean"] = policy[f"{NORMALIZER}running_mean"].float()
        tensors["normalizer.std"] = normalizer_std(policy[f"{NORMALIZER}running_variance"],
                                                   policy[f"{NORMALIZER}normalization_steps"])
    index = 0
    while f"{BODY}{index}.weight" in policy:
        tensors[f"body.{index}.weight"] = policy[f"{BODY}{index}.weight"]
        tensors[f"body.{index}.bias"] = policy[f"{BODY}{index}.bias"]
        index += 2
    tensors["mu.weight"] = policy[f"{DIST}mu.weight"]
    tensors["mu.bias"] = policy[f"{DIST}mu.bias"]
    if f"{DIST}log_sigma.weight" in policy:  # SAC: state-dependent log sigma
        tensors["log_sigma.weight"] = policy[f"{DIST}log_sigma.weight"]
        tensors["log_sigma.bias"] = policy[f"{DIST}log_sigma.bias"]
    else:
        tensors["log_sigma"] = policy[f"{DIST}log_sigma"]
    arch = infer_architecture(tensors, path)
    declared = policy.get("continuous_act_size_vector")
    if declared is not None and int(declared.flatten()[0]) != arch.act_size:
        raise PolicyLoadError(f"{path}: shape mismatch: continuous_act_size_vector says "
                              f"{int(declared.flatten()[0])} actions, mu has {arch.act_size}")
    loaded = LoadedPolicy(arch, tensors, path, "mlagents-pt", step_from_filename(path))
    if arch.normalize:
        loaded.extras["normalization_steps"] = int(policy[f"{NORMALIZER}normalization_steps"])
    return loaded
