"""What every engine shares: the contract, the action head it is handed, and row bookkeeping.

An engine runs an opaque network: `net(*inputs)` takes a tuple of float32 tensors, one per input,
each (N, *feature_shape), and returns a tuple of outputs. An output is *per-row* when its first
dimension is the batch (N) and *shared* when it is 1 while the batch is larger (PPO's
state-independent log-sigma): shared outputs are passed through unchanged, never padded or
sliced. Engines know the input feature shapes and nothing else about the network.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Protocol

import numpy as np
import torch
from torch import nn

InputShapes = tuple[tuple[int, ...], ...]
"""The feature shape of each network input, without the batch dimension: ((59,),) for Huggy."""


class ActionHead(Protocol):
    """The agent's head: network outputs (and host noise, or None) -> actions. Engines run it but
    never look inside; the same head in torch (any device, capturable in a graph: no host
    synchronisation) and in numpy (host outputs) must agree within the numerical contract."""

    def torch(self, outputs: tuple[torch.Tensor, ...], noise: torch.Tensor | None) -> torch.Tensor:
        """Actions from float32 outputs on one device, with no host synchronisation.

        Args:
            outputs: the network's outputs, on one device.
            noise: host noise (N, *action) float32 on that device, or None for deterministic actions.

        Returns:
            The actions, on that device.
        """
        ...

    def numpy(self, outputs: tuple[np.ndarray, ...], noise: np.ndarray | None) -> np.ndarray:
        """The same on the host; the outputs are left untouched.

        Args:
            outputs: the network's outputs as float32 arrays.
            noise: host noise (N, *action) float32, or None for deterministic actions.

        Returns:
            A new float32 array of actions.
        """
        ...


class EngineFailure(RuntimeError):
    """An engine that cannot be trusted to serve: a graph that failed its check against eager
    torch, or raised in capture or replay. The agent runs the `torch` engine instead.

    Args:
        engine: the engine's name.
        rows: the batch size at which it failed.
        cause: what went wrong.
    """

    def __init__(self, engine: str, rows: int, cause: str) -> None:
        super().__init__(f"the {engine} engine failed at batch size {rows}: {cause}")
        self.engine = engine
        self.rows = rows
        self.cause = cause


class Engine(ABC):
    """Runs `net` on `device`. Inputs are validated, C-contiguous float32 numpy arrays with the
    same number of rows N >= 1; outputs keep their row order.

    Calls are serialised by the engine where it holds buffers; an engine is not shared across
    processes.

    Args:
        net: the network: `net(*inputs)` takes one float32 tensor per input and returns a tuple.
        input_shapes: the feature shape of each input, without the batch dimension.
        device: where it runs.
        head: the agent's action head, which `act` runs.
    """

    name: ClassVar[str]

    def __init__(self, net: nn.Module, input_shapes: InputShapes, device: torch.device,
                 head: ActionHead) -> None:
        self.net = net
        self.input_shapes = input_shapes
        self.device = device
        self.head = head

    @abstractmethod
    def forward(self, inputs: Sequence[np.ndarray]) -> tuple[torch.Tensor, ...]:
        """The network's outputs for a batch.

        Args:
            inputs: one (N, *feature_shape) float32 array per input.

        Returns:
            The outputs, floating ones as float32, on `self.device` or on the host (CPU engines).
                Per-row outputs have N rows; shared ones come as they are.
        """

    def act(self, inputs: Sequence[np.ndarray], noise: np.ndarray | None) -> np.ndarray:
        """`head(forward(inputs), noise)`.

        Args:
            inputs: one (N, *feature_shape) float32 array per input.
            noise: host noise for every row (stochastic), or None (deterministic).

        Returns:
            (N, *action) float32 numpy actions.
        """
        outputs = self.forward(inputs)
        if outputs[0].device.type == "cpu":
            return self.head.numpy(tuple(output.numpy() for output in outputs), noise)
        with torch.inference_mode():
            device_noise = None if noise is None else torch.from_numpy(noise).to(self.device)
            return self.head.torch(outputs, device_noise).cpu().numpy()

    def expect_row(self) -> None:
        """A hint: one observation comes soon. Engines that can prepare for it do (see
        `NativeEngine.expect_row`); the others ignore it."""
        return

    def describe(self) -> str:
        """The engine and how it runs, in one line.

        Returns:
            Such as `torch on cpu`.
        """
        return f"{self.name} on {self.device}"


def as_float32(outputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Floating outputs in float32 (a half-precision network's layers), others unchanged.

    Args:
        outputs: a network's outputs.

    Returns:
        The outputs, in order.
    """
    return tuple(output.float() if output.is_floating_point() and output.dtype != torch.float32
                 else output for output in outputs)


def per_row_flags(outputs: Sequence[torch.Tensor | np.ndarray], rows: int) -> tuple[bool, ...]:
    """Which outputs of a batch are per-row and which are shared.

    Args:
        outputs: a network's outputs for a batch of `rows` rows.
        rows: the batch's rows, more than 1.

    Returns:
        For each output, True if per-row (first dimension `rows`), False if shared (first
            dimension 1).

    Raises:
        ValueError: an output is neither.
    """
    flags = []
    for index, output in enumerate(outputs):
        first = output.shape[0] if len(output.shape) else None
        if first not in (rows, 1):
            raise ValueError(f"network output {index} has shape {tuple(output.shape)} for a batch "
                             f"of {rows} rows: expected a first dimension of {rows} (per-row) or "
                             "1 (shared by every row)")
        flags.append(first == rows)
    return tuple(flags)


def merge_parts(parts: Sequence[tuple[torch.Tensor, ...]], per_row: Sequence[bool]
                ) -> tuple[torch.Tensor, ...]:
    """Outputs of consecutive row chunks as one batch.

    Args:
        parts: each chunk's outputs, in row order.
        per_row: which outputs are per-row (`per_row_flags`).

    Returns:
        Per-row outputs concatenated in order, shared outputs taken from the first chunk.
    """
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat([part[index] for part in parts]) if row else parts[0][index]
                 for index, row in enumerate(per_row))


def chunk_bounds(rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    """Row ranges covering a batch in order.

    Args:
        rows: the batch's rows.
        chunk_rows: the most rows per chunk.

    Returns:
        [(start, stop), ...], each at most `chunk_rows` long.
    """
    return [(start, min(start + chunk_rows, rows)) for start in range(0, rows, chunk_rows)]
