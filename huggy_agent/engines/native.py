"""`native`: an MLP policy (Huggy's kind: see `huggy_agent.actor.MlpPolicy`) frozen into the
package's compiled kernels (`huggy_agent.native`), for single observations on the CPU.

One call runs the finiteness check, the normalizer, every layer and the head, with the weights
stored once, padded and aligned for the kernel. At one observation the work is reading every
weight once (2.2 MB for Huggy), bound by the memory's bandwidth; what onnxruntime and torch add
per call (graph walk, dispatch per operator, allocations) is most of the rest, and this call has
none of it. Batches of more rows than `NATIVE_ROWS` run through onnxruntime (torch where it is
not installed), whose matrix products read each weight once for many rows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType

import numpy as np
import torch
from torch import nn

from huggy_agent.actor import mlp_policy
from huggy_agent.engines.base import ActionHead, Engine, InputShapes
from huggy_agent.engines.onnx_runtime import OnnxRuntimeEngine, onnxruntime_available
from huggy_agent.engines.torch_eager import TorchEngine
from huggy_agent.native import KERNELS, mlp_kernels

NATIVE_ROWS = 1
"""Batches up to this many rows run in the kernels: one observation reads all the weights, so n
rows take n times as long there, while onnxruntime's matrix product reads them once."""


def usable_cpus() -> int:
    """The CPUs this process may run on.

    Returns:
        The size of its affinity where the OS tells it, else the CPU count (at least 1).
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _float32(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).contiguous().numpy()


class NativeEngine(Engine):
    """The compiled kernels for batches of up to `native_rows` rows, `batches` (onnxruntime, or
    torch without it) for larger ones.

    Args:
        net: an MLP policy (`huggy_agent.actor.MlpPolicy`).
        input_shapes: the feature shape of its input.
        device: the CPU.
        head: the agent's action head, for larger batches.
        kernel: `avx2` or `generic` (see `huggy_agent.native.mlp_kernels`); None for the fastest
            this CPU runs.
        native_rows: the largest batch the kernels run.

    Raises:
        ValueError: `net` is not an MLP policy, `device` is not the CPU, or the kernels were not
            built.
    """

    name = "native"

    def __init__(self, net: nn.Module, input_shapes: InputShapes, device: torch.device,
                 head: ActionHead, kernel: str | None = None, native_rows: int = NATIVE_ROWS
                 ) -> None:
        if device.type != "cpu":
            raise ValueError(f"the native engine runs on the CPU, not on {device}")
        kernels, compiled = mlp_kernels(), KERNELS
        if compiled is None or not kernels:
            raise ValueError("the native engine needs the package's compiled kernels, which were "
                             "not built (no C compiler at install); use engine='auto'")
        parts = mlp_policy(net)
        super().__init__(net, input_shapes, device, head)
        output_weight, output_bias = _float32(parts.mu.weight), _float32(parts.mu.bias)
        if isinstance(parts.log_sigma, nn.Linear):  # SAC: its rows after mu's, one product
            output_weight = np.concatenate([output_weight, _float32(parts.log_sigma.weight)])
            output_bias = np.concatenate([output_bias, _float32(parts.log_sigma.bias)])
            self._shared_log_sigma = None
        else:
            self._shared_log_sigma = parts.log_sigma.detach().to(torch.float32).clone()
        layers = [(_float32(layer.weight), _float32(layer.bias)) for layer in parts.hidden]
        layers.append((output_weight, output_bias))
        normalizer = parts.normalizer
        self.kernel = kernel or kernels[0]
        self._compiled: ModuleType = compiled
        self.plan = compiled.mlp_plan(
            None if normalizer is None else _float32(normalizer.running_mean),
            None if normalizer is None else _float32(normalizer.std),
            [(weight, bias, len(bias), weight.shape[1]) for weight, bias in layers],
            None if self._shared_log_sigma is None else self._shared_log_sigma.numpy(),
            parts.head == "sac", self.kernel)
        self.actions = parts.mu.out_features
        self.native_rows = native_rows
        self._shares_rows = usable_cpus() > 1
        self.batches: Engine = (OnnxRuntimeEngine if onnxruntime_available() else TorchEngine)(
            net, input_shapes, device, head)

    def forward(self, inputs: Sequence[np.ndarray]) -> tuple[torch.Tensor, ...]:
        """The network's outputs for a batch (see `Engine.forward`).

        Args:
            inputs: one (N, *feature_shape) float32 array.

        Returns:
            mu (N, c) and log_sigma ((1, c) shared for PPO, (N, c) for SAC), on the host.

        Raises:
            ValueError: an observation is not finite (the agent validates before).
        """
        rows = len(inputs[0])
        if rows > self.native_rows:
            return self.batches.forward(inputs)
        mu = np.empty((rows, self.actions), dtype=np.float32)
        log_sigma = None if self._shared_log_sigma is not None else np.empty_like(mu)
        if not self._compiled.mlp_forward(self.plan, inputs[0], mu, log_sigma, rows):
            raise ValueError("observations must be finite")  # validated by the agent before
        if log_sigma is None:
            assert self._shared_log_sigma is not None
            return torch.from_numpy(mu), self._shared_log_sigma
        return torch.from_numpy(mu), torch.from_numpy(log_sigma)

    def act(self, inputs: Sequence[np.ndarray], noise: np.ndarray | None) -> np.ndarray:
        """The actions for a batch, head included (see `Engine.act`).

        Args:
            inputs: one (N, *feature_shape) float32 array.
            noise: host noise (N, c), or None for deterministic actions.

        Returns:
            (N, c) float32 actions.

        Raises:
            ValueError: an observation is not finite (the agent validates before).
        """
        rows = len(inputs[0])
        if rows > self.native_rows:
            return self.batches.act(inputs, noise)
        actions = np.empty((rows, self.actions), dtype=np.float32)
        if not self._compiled.mlp_act(self.plan, inputs[0], actions, noise, rows):
            raise ValueError("observations must be finite")  # validated by the agent before
        return actions

    def act_row(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray | None:
        """The actions for one observation, unvalidated.

        Args:
            obs: a float32 C-contiguous observation of the policy's input shape.
            noise: host noise (1, c), or None for deterministic actions.

        Returns:
            (c,) float32 actions; None if a value is not finite (the caller raises, naming it).
        """
        actions = np.empty(self.actions, dtype=np.float32)
        return actions if self._compiled.mlp_act(self.plan, obs, actions, noise, 1) else None

    def expect_row(self) -> None:
        """Wake the kernels' row helper, a second core that shares the next one-observation pass's
        hidden layers (see `_native.c`): half as long when the weights must come from memory.

        The helper waits for that pass, spinning, for a bounded time, then sleeps. Call it as early as
        possible before the pass: waking a core is slow under a hypervisor (docs/benchmarks.md, "A second
        core for a lone request's pass"). Nothing with one usable CPU; the results are the same, bit for
        bit.
        """
        if self._shares_rows:
            self._compiled.row_helper_arm()

    def describe(self) -> str:
        """The engine and how it runs, in one line.

        Returns:
            The kernel, the largest batch it runs, and the engine of larger batches.
        """
        return (f"native ({self.kernel} kernel) for up to {self.native_rows} row(s), larger "
                f"batches: {self.batches.describe()}")
