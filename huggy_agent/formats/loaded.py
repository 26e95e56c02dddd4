"""What every loader returns: an architecture, the actor's float32 tensors, and their origin."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from huggy_agent.actor import Actor, ActorArchitecture, build_actor
from huggy_agent.errors import PolicyLoadError
from huggy_agent_client.spec import ActorSpec

_STEP_IN_NAME = re.compile(r"-(\d+)\.(?:pt|onnx)$")


@dataclass
class LoadedPolicy:
    """Weights under the `Actor`'s own state-dict keys (ML-Agents' key names)."""

    arch: ActorArchitecture
    tensors: dict[str, torch.Tensor]
    origin: Path
    file_format: str
    step: int | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """PolicyLoadError for weights with a NaN or an infinity (a run that diverged, or a
        damaged file): every action would be NaN, or an observation blamed for it."""
        for name, tensor in self.tensors.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                bad = int((~torch.isfinite(tensor)).sum())
                raise PolicyLoadError(f"{self.origin}: {name} holds {bad} NaN or infinite "
                                      f"value(s) of {tensor.numel()}: the run diverged or the "
                                      "file is damaged")

    @property
    def spec(self) -> ActorSpec:
        return self.arch.spec

    def build(self) -> Actor:
        """The Actor network with these weights.

        Returns:
            A float32 Actor on the CPU.

        Raises:
            PolicyLoadError: a key or a shape of the weights does not match the architecture.
        """
        try:
            return build_actor(self.arch, self.tensors, str(self.origin))
        except ValueError as error:
            raise PolicyLoadError(str(error)) from error


def step_from_filename(path: Path) -> int | None:
    """The training step in an ML-Agents checkpoint's file name.

    Args:
        path: a file such as `Huggy-2000343.pt` or `Huggy-2000343.onnx`.

    Returns:
        The step (2000343 here), or None when the name carries none.
    """
    match = _STEP_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None
