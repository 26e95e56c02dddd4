"""HuggyAgent: the one inference boundary, `compute_action(obs, deterministic, seed)`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from huggy_agent.devices import resolve_device, resolve_precision
from huggy_agent.engines import Engine, create_engine
from huggy_agent.formats import LoadedPolicy, load_policy
from huggy_agent.network import PPO_ACTION_CLIP, Head, PolicyNet, canonical_keys
from huggy_agent.noise import SEED_RANGE, gaussian_noise
from huggy_agent.observations import as_observation_batch

WARMUP_PATHS = ("deterministic", "stochastic", "distribution")
_CLIP_HIGH = np.float32(PPO_ACTION_CLIP)
_CLIP_LOW = np.float32(-PPO_ACTION_CLIP)
"""The PPO clip as float32 scalars: ufuncs resolve their types faster than with Python floats."""


def bundled_policy_path() -> Path:
    """The default policy shipped with the package (see assets/ORIGIN.md)."""
    return Path(str(resources.files("huggy_agent") / "assets" / "Huggy.onnx"))


@dataclass(frozen=True)
class ActionDistribution:
    """The policy's output for a batch, float32: mu (N, act) and log_sigma, (N, act) or a
    state-independent (1, act) that broadcasts over rows. On the policy's device, or on the host
    for the CPU engines."""

    mu: torch.Tensor
    log_sigma: torch.Tensor

    def __len__(self) -> int:
        return self.mu.shape[0]

    def __getitem__(self, rows: slice) -> ActionDistribution:
        shared = self.log_sigma.shape[0] == 1 and len(self) != 1
        return ActionDistribution(self.mu[rows], self.log_sigma if shared else self.log_sigma[rows])


@dataclass(frozen=True)
class ActionHead:
    """Actions from (mu, log_sigma) and host noise z (None: deterministic).

    PPO: `clip(mu [+ z * exp(log_sigma)], -3, 3) / 3`; SAC: `tanh(mu [+ z * exp(log_sigma)])`.
    The torch and numpy versions do the same IEEE operations in the same order (their `exp` and
    `tanh` may differ by an ulp).
    """

    kind: Head

    def torch(self, outputs: tuple[torch.Tensor, ...], noise: torch.Tensor | None) -> torch.Tensor:
        """On the outputs' device, with no host synchronisation (graph engines capture it)."""
        mu, log_sigma = outputs[0], outputs[1]
        action = mu if noise is None else mu + noise * torch.exp(log_sigma)
        if self.kind == "sac":
            return torch.tanh(action)
        return torch.clamp(action, -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP

    def numpy(self, outputs: tuple[np.ndarray, ...], noise: np.ndarray | None) -> np.ndarray:
        """On the host; returns a new array."""
        mu, log_sigma = outputs[0], outputs[1]
        if noise is None:
            if self.kind == "sac":
                return np.tanh(mu)
            action = np.maximum(mu, _CLIP_LOW)
        else:
            action = np.multiply(noise, np.exp(log_sigma))
            np.add(mu, action, out=action)
            if self.kind == "sac":
                return np.tanh(action, out=action)
            np.maximum(action, _CLIP_LOW, out=action)
        np.minimum(action, _CLIP_HIGH, out=action)
        return np.divide(action, _CLIP_HIGH, out=action)


class HuggyAgent:
    """A loaded policy on a device, in a precision, run by an engine, with a seeded noise generator.

    Args:
        policy: a `.onnx`, a `.pt`, a results folder, or None for the bundled default policy.
        device: `auto` (NPU, then CUDA, then CPU), `cpu`, `cuda[:N]` or `npu[:N]`.
        precision: `fp32`, `fp16` or `bf16` for the layers; the normalizer stays float32.
        seed: seeds the generator used by stochastic calls that pass no seed of their own.
        engine: `auto` (the fastest correct engine for the device and precision, by a fixed rule:
            see `huggy_agent.engines.auto_engine`), `torch`, `onnxruntime` (CPU, fp32),
            `cuda-graph` or `npu-graph`. Every engine meets the numerical contract.
    """

    def __init__(self, policy: str | Path | None = None, *, device: str = "auto",
                 precision: str = "fp32", seed: int | None = None, engine: str = "auto") -> None:
        self.loaded: LoadedPolicy = load_policy(policy if policy is not None else bundled_policy_path())
        self.device = resolve_device(device)
        self.precision = precision
        dtype = resolve_precision(precision)
        self.net: PolicyNet = self.loaded.build().to(device=self.device, dtype=dtype)
        self.arch = self.loaded.arch
        self.obs_size = self.arch.obs_size
        self.act_size = self.arch.act_size
        self.head = ActionHead(self.arch.head)
        self._engine: Engine = create_engine(engine, self.net, ((self.obs_size,),), self.device,
                                             precision, self.head)
        self.engine: str = self._engine.name
        """The engine in use: `torch`, `onnxruntime`, `cuda-graph` or `npu-graph`."""
        self._rng = np.random.default_rng(seed)
        self.fingerprint = weights_fingerprint(self.loaded)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto", precision: str = "fp32",
                        seed: int | None = None, engine: str = "auto") -> HuggyAgent:
        """Load `path` (a `.onnx`, a `.pt` or a results folder); see the class docstring."""
        return cls(path, device=device, precision=precision, seed=seed, engine=engine)

    def distribution(self, obs: Any) -> ActionDistribution:
        """One forward pass over every row of `obs` ((obs,) or (N, obs)): mu and log_sigma, float32."""
        batch, _ = as_observation_batch(obs, self.obs_size)
        mu, log_sigma = self._engine.forward((batch,))
        return ActionDistribution(mu, log_sigma)

    def _noise(self, rows: int, seed: int | None, row_offset: int) -> np.ndarray:
        if seed is None:
            seed = int(self._rng.integers(SEED_RANGE))
        return gaussian_noise(seed, rows, self.act_size, row_offset)

    def actions_from(self, dist: ActionDistribution, deterministic: bool = True,
                     seed: int | None = None, row_offset: int = 0) -> np.ndarray:
        """Apply the action head to `dist`: (N, act) float32 numpy.

        PPO: `clip(mu [+ z * sigma], -3, 3) / 3`; SAC: `tanh(mu [+ z * sigma])`. The noise `z` is
        drawn on the host: row i gets the noise of row `row_offset + i` of stream `seed` (a fresh
        stream from the agent's generator when `seed` is None), then moves to the device.
        """
        noise = None if deterministic else self._noise(len(dist), seed, row_offset)
        if dist.mu.device.type == "cpu":
            return self.head.numpy((dist.mu.numpy(), dist.log_sigma.numpy()), noise)
        with torch.inference_mode():
            device_noise = None if noise is None else torch.from_numpy(noise).to(dist.mu.device)
            return self.head.torch((dist.mu, dist.log_sigma), device_noise).cpu().numpy()

    def compute_action(self, obs: Any, deterministic: bool = True, seed: int | None = None,
                       row_offset: int = 0) -> np.ndarray:
        """Actions for `obs`: (obs,) -> (act,), (N, obs) -> (N, act), float32 numpy.

        `obs` may be a list, a numpy array or a torch tensor. Raises ValueError on a wrong shape or
        a non-finite value. See `actions_from` for `seed` and `row_offset`; the result is the
        same (within the numerical contract) as `actions_from(distribution(obs), ...)`.
        """
        batch, single = as_observation_batch(obs, self.obs_size)
        noise = None if deterministic else self._noise(len(batch), seed, row_offset)
        actions = self._engine.act((batch,), noise)
        return actions[0] if single else actions

    def warmup(self, batch_sizes: Iterable[int], paths: Collection[str] = WARMUP_PATHS) -> None:
        """Run each of `paths` once per batch size on zero observations, so that later calls of
        those sizes find everything ready (graph engines capture their rungs here; the CPU
        engines set up their buffers). Leaves the agent's noise generator untouched.

        `paths`: `deterministic` and `stochastic` (compute_action), `distribution`.
        """
        unknown = sorted(set(paths) - set(WARMUP_PATHS))
        if unknown:
            raise ValueError(f"unknown warm-up path(s) {unknown}; expected some of "
                             f"{list(WARMUP_PATHS)}")
        for rows in batch_sizes:
            zeros = np.zeros((rows, self.obs_size), dtype=np.float32)
            if "deterministic" in paths:
                self.compute_action(zeros)
            if "stochastic" in paths:
                self.compute_action(zeros, deterministic=False, seed=0)
            if "distribution" in paths:
                self.distribution(zeros)

    def describe(self) -> dict:
        """A JSON-serialisable summary: architecture, parameter counts, origin, device, precision,
        engine."""
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
            "engine": self.engine,
            "engine_detail": self._engine.describe(),
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
