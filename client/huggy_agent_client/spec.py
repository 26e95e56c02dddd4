"""What a policy consumes and produces: its observation inputs, its actions, its memory.

Mirrors ML-Agents' BehaviorSpec as its ONNX interface shows it: inputs `obs_0, obs_1, ...` in
order, each a vector (size,), a channels-first image (C, H, W) or a variable-length buffer
(max entities, entity size); a continuous action size, discrete branch sizes, and the size of
the recurrent memory (0 without one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

InputKind = Literal["vector", "visual", "variable"]
INPUT_RANKS: dict[InputKind, int] = {"vector": 1, "visual": 3, "variable": 2}


@dataclass(frozen=True)
class ObservationInput:
    """One observation input: its ONNX name (`obs_<i>`), its shape without the batch, its kind."""

    name: str
    shape: tuple[int, ...]
    kind: InputKind

    def __post_init__(self) -> None:
        if len(self.shape) != INPUT_RANKS[self.kind]:
            raise ValueError(f"{self.name}: a {self.kind} input has rank {INPUT_RANKS[self.kind]}, "
                             f"got shape {self.shape}")
        if any(d < 1 for d in self.shape):
            raise ValueError(f"{self.name}: every dimension must be >= 1, got {self.shape}")

    @property
    def size(self) -> int:
        """Values per row."""
        size = 1
        for dim in self.shape:
            size *= dim
        return size

    def as_dict(self) -> dict[str, Any]:
        """The input as JSON-ready data.

        Returns:
            `{"name": ..., "shape": [...], "kind": ...}`.
        """
        return {"name": self.name, "shape": list(self.shape), "kind": self.kind}


@dataclass(frozen=True)
class ActorSpec:
    """A policy's interface: inputs in `obs_i` order, actions, memory."""

    inputs: tuple[ObservationInput, ...]
    continuous_size: int = 0
    discrete_branches: tuple[int, ...] = ()
    memory_size: int = 0

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError("a policy needs at least one observation input")
        if self.continuous_size < 0 or any(b < 1 for b in self.discrete_branches):
            raise ValueError(f"bad action spec: continuous {self.continuous_size}, discrete "
                             f"branches {self.discrete_branches}")
        if not self.continuous_size and not self.discrete_branches:
            raise ValueError("a policy needs continuous or discrete actions")

    @property
    def mask_size(self) -> int:
        """Length of an action mask row: the sum of the branch sizes."""
        return sum(self.discrete_branches)

    @property
    def kind(self) -> str:
        """'continuous', 'discrete' or 'hybrid'."""
        if self.continuous_size and self.discrete_branches:
            return "hybrid"
        return "continuous" if self.continuous_size else "discrete"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActorSpec:
        """The spec that `as_dict` described (for example in a server's `/v1/info`).

        Args:
            data: the output of `as_dict` (its `action_kind` is ignored).

        Returns:
            The spec.
        """
        return cls(tuple(ObservationInput(i["name"], tuple(i["shape"]), i["kind"])
                         for i in data["inputs"]), data["continuous_size"],
                   tuple(data["discrete_branches"]), data["memory_size"])

    def as_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data.

        Returns:
            `inputs` (each input's `as_dict`), `action_kind`, `continuous_size`, `discrete_branches`
                and `memory_size`.
        """
        return {"inputs": [i.as_dict() for i in self.inputs], "action_kind": self.kind,
                "continuous_size": self.continuous_size,
                "discrete_branches": list(self.discrete_branches), "memory_size": self.memory_size}

    def describe(self) -> str:
        """The spec in one line.

        Returns:
            Such as `obs_0 (59,) -> 21 continuous` or
                `obs_0 (3, 64, 64) visual, obs_1 (8,) -> discrete (3, 3), memory 32`.
        """
        inputs = ", ".join(f"{i.name} {i.shape}" + ("" if i.kind == "vector" else f" {i.kind}")
                           for i in self.inputs)
        memory = f", memory {self.memory_size}" if self.memory_size else ""
        return f"{inputs} -> {self.describe_actions()}{memory}"

    def describe_actions(self, head: str | None = None) -> str:
        """The actions in words.

        Args:
            head: the continuous head's kind (`ppo` or `sac`) to name, or None.

        Returns:
            Such as `21 continuous`, `discrete (3, 3)` or `2 continuous (sac) + discrete (4,)`.
        """
        actions = []
        if self.continuous_size:
            actions.append(f"{self.continuous_size} continuous" + (f" ({head})" if head else ""))
        if self.discrete_branches:
            actions.append(f"discrete {self.discrete_branches}")
        return " + ".join(actions)
