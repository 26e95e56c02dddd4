"""What every loader returns: an architecture, canonical float32 tensors, and where they came from."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from huggy_agent.errors import PolicyLoadError
from huggy_agent.network import PolicyArchitecture, PolicyNet, build_policy

_STEP_IN_NAME = re.compile(r"-(\d+)\.(?:pt|onnx)$")


@dataclass
class LoadedPolicy:
    """Weights under PolicyNet's canonical keys (see `network.canonical_keys`)."""

    arch: PolicyArchitecture
    tensors: dict[str, torch.Tensor]
    origin: Path
    file_format: str
    step: int | None = None
    extras: dict = field(default_factory=dict)

    def build(self) -> PolicyNet:
        """A float32 PolicyNet on the CPU; key or shape mismatches raise PolicyLoadError."""
        try:
            return build_policy(self.arch, self.tensors, str(self.origin))
        except ValueError as error:
            raise PolicyLoadError(str(error)) from error


def step_from_filename(path: Path) -> int | None:
    """The training step in an ML-Agents checkpoint name such as `Huggy-2000343.pt`."""
    match = _STEP_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def infer_architecture(tensors: dict[str, torch.Tensor], origin: Path) -> PolicyArchitecture:
    """Read depth, widths, normalizer and head from canonical tensors."""
    hidden: list[int] = []
    while f"body.{2 * len(hidden)}.weight" in tensors:
        hidden.append(int(tensors[f"body.{2 * len(hidden)}.weight"].shape[0]))
    if not hidden or "mu.weight" not in tensors:
        raise PolicyLoadError(f"{origin}: no hidden layers or no mu layer found; not an ML-Agents "
                              "continuous-action policy")
    obs_size = int(tensors["body.0.weight"].shape[1])
    act_size = int(tensors["mu.weight"].shape[0])
    head = "sac" if "log_sigma.weight" in tensors else "ppo"
    return PolicyArchitecture(obs_size=obs_size, act_size=act_size, hidden_sizes=tuple(hidden),
                              normalize="normalizer.mean" in tensors, head=head)
