"""HuggyAgent: the one inference boundary, `compute_action(obs, deterministic, seed)`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from huggy_agent.devices import resolve_device, resolve_precision
from huggy_agent.formats import LoadedPolicy, load_policy
from huggy_agent.network import PPO_ACTION_CLIP, PolicyNet, canonical_keys
from huggy_agent.noise import SEED_RANGE, gaussian_noise
from huggy_agent.observations import as_observation_batch

CPU_CHUNK_ROWS = 1024


def bundled_policy_path() -> Path:
    """The default policy shipped with the package (see assets/ORIGIN.md)."""
    return Path(str(resources.files("huggy_agent") / "assets" / "Huggy.onnx"))


@dataclass(frozen=True)
class ActionDistribution:
    """The policy's output for a batch, float32 on the policy's device: mu (N, act) and log_sigma,
    (N, act) or a state-independent (1, act) that broadcasts over rows."""

    mu: torch.Tensor
    log_sigma: torch.Tensor

    def __len__(self) -> int:
        return self.mu.shape[0]

    def __getitem__(self, rows: slice) -> ActionDistribution:
        shared = self.log_sigma.shape[0] == 1 and len(self) != 1
        return ActionDistribution(self.mu[rows], self.log_sigma if shared else self.log_sigma[rows])


class HuggyAgent:
    """A loaded policy on a device, in a precision, with a seeded noise generator.

    Args:
        policy: a `.onnx`, a `.pt`, a results folder, or None for the bundled default policy.
        device: `auto` (NPU, then CUDA, then CPU), `cpu`, `cuda[:N]` or `npu[:N]`.
        precision: `fp32`, `fp16` or `bf16` for the layers; the normalizer stays float32.
        seed: seeds the generator used by stochastic calls that pass no seed of their own.
    """

    def __init__(self, policy: str | Path | None = None, *, device: str = "auto",
                 precision: str = "fp32", seed: int | None = None) -> None:
        self.loaded: LoadedPolicy = load_policy(policy if policy is not None else bundled_policy_path())
        self.device = resolve_device(device)
        self.precision = precision
        dtype = resolve_precision(precision)
        self.net: PolicyNet = self.loaded.build().to(device=self.device, dtype=dtype)
        self.arch = self.loaded.arch
        self.obs_size = self.arch.obs_size
        self.act_size = self.arch.act_size
        self._rng = np.random.default_rng(seed)
        self.fingerprint = weights_fingerprint(self.loaded)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto", precision: str = "fp32",
                        seed: int | None = None) -> HuggyAgent:
        """Load `path` (a `.onnx`, a `.pt` or a results folder); see the class docstring."""
        return cls(path, device=device, precision=precision, seed=seed)

    def distribution(self, obs: Any) -> ActionDistribution:
        """One forward pass over every row of `obs` ((obs,) or (N, obs)): mu and log_sigma, float32."""
        batch, _ = as_observation_batch(obs, self.obs_size)
        return self._forward(batch)

    def _forward(self, batch: np.ndarray) -> ActionDistribution:
        with torch.inference_mode():
            obs = torch.from_numpy(batch).to(self.device)
            if self.device.type == "cpu" and len(obs) > CPU_CHUNK_ROWS:
                # Chunks whose activations stay in the CPU's cache: ~25% more throughput on
                # large batches (measured, 4,096 rows on 2 cores). Rows agree with an unchunked
                # call within the numerical contract, not bit for bit.
                parts = [self.net(obs[start:start + CPU_CHUNK_ROWS])
                         for start in range(0, len(obs), CPU_CHUNK_ROWS)]
                mu = torch.cat([part[0] for part in parts])
                log_sigma = (parts[0][1] if self.arch.head == "ppo"
                             else torch.cat([part[1] for part in parts]))
            else:
                mu, log_sigma = self.net(obs)
            if mu.dtype != torch.float32:
                mu, log_sigma = mu.float(), log_sigma.float()
        return ActionDistribution(mu, log_sigma)

    def actions_from(self, dist: ActionDistribution, deterministic: bool = True,
                     seed: int | None = None, row_offset: int = 0) -> np.ndarray:
        """Apply the action head to `dist`: (N, act) float32 numpy.

        PPO: `clip(mu [+ z * sigma], -3, 3) / 3`; SAC: `tanh(mu [+ z * sigma])`. The noise `z` is
        drawn on the host: row i gets the noise of row `row_offset + i` of stream `seed` (a fresh
        stream from the agent's generator when `seed` is None), then moves to the device.
        """
        with torch.inference_mode():
            action = dist.mu
            if not deterministic:
                if seed is None:
                    seed = int(self._rng.integers(SEED_RANGE))
                noise = gaussian_noise(seed, len(dist), self.act_size, row_offset)
                action = action + torch.from_numpy(noise).to(self.device) * torch.exp(dist.log_sigma)
            if self.arch.head == "sac":
                action = torch.tanh(action)
            else:
                action = torch.clamp(action, -PPO_ACTION_CLIP, PPO_ACTION_CLIP).div_(PPO_ACTION_CLIP)
            return action.cpu().numpy()

    def compute_action(self, obs: Any, deterministic: bool = True, seed: int | None = None,
                       row_offset: int = 0) -> np.ndarray:
        """Actions for `obs`: (obs,) -> (act,), (N, obs) -> (N, act), float32 numpy.

        `obs` may be a list, a numpy array or a torch tensor. Raises ValueError on a wrong shape or
        a non-finite value. See `actions_from` for `seed` and `row_offset`.
        """
        batch, single = as_observation_batch(obs, self.obs_size)
        actions = self.actions_from(self._forward(batch), deterministic, seed, row_offset)
        return actions[0] if single else actions

    def describe(self) -> dict:
        """A JSON-serialisable summary: architecture, parameter counts, origin, device, precision."""
        return {
            "architecture": self.arch.as_dict(),
            "summary": self.arch.describe(),
            "parameters": {
                "linear": self.net.linear_parameter_count(),
                "log_sigma": self.net.log_sigma_parameter_count(),
                "normalizer": self.net.normalizer_buffer_count(),
            },
            "source": str(self.loaded.origin),
            "format": self.loaded.file_format,
            "step": self.loaded.step,
            "fingerprint": self.fingerprint,
            "device": str(self.device),
            "precision": self.precision,
        }


STD_FINGERPRINT_BITS = 8
"""Significant bits of each normalizer std value in the weights fingerprint (see below)."""


def weights_fingerprint(loaded: LoadedPolicy) -> str:
    """A 16-hex-digit hash of the architecture and the weights, the same for one run's `.pt` and
    `.onnx` on any machine: it hashes only values that no machine's arithmetic touched.

    Stored tensors (every layer, the normalizer's mean, log-sigma) enter bit for bit. The
    normalizer's std is derived: a `.pt` stores a running variance and a step count (the loader
    takes `sqrt(variance / steps)` in float64, rounded once to float32), while an ONNX export
    holds the std that its exporter folded in float32, which can be 1 ulp off the correctly
    rounded value. So std enters rounded to `STD_FINGERPRINT_BITS` significant bits, far coarser
    than that ulp and exact to compute (frexp, a power of two, rint).
    """
    digest = hashlib.sha256(json.dumps(loaded.arch.as_dict(), sort_keys=True).encode())
    for key in canonical_keys(loaded.arch):
        values = loaded.tensors[key].detach().float().contiguous().numpy()
        if key.endswith(".std"):
            mantissa, exponent = np.frexp(values.astype(np.float64))
            values = np.stack([np.rint(mantissa * 2.0**STD_FINGERPRINT_BITS), exponent]).astype(
                np.int64)
        digest.update(key.encode())
        digest.update(values.tobytes())
    return digest.hexdigest()[:16]
