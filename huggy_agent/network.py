"""PolicyNet: ML-Agents' continuous-action actor, architecture read from its weights.

    obs (N, obs) float32 -> normalizer (float32, optional) -> [Linear -> SiLU] x depth -> mu (N, act)
    log_sigma: a (1, act) parameter (PPO) or Linear(hidden -> act) clamped to [-20, 2] (SAC).

The normalizer always runs in float32: ML-Agents' running variance (a sum of squares, ~1e5) and
step count (~2e6) overflow float16, so only the layers after it follow the requested precision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

Head = Literal["ppo", "sac"]
NORMALIZER_CLIP = 5.0
PPO_ACTION_CLIP = 3.0
SAC_LOG_SIGMA_RANGE = (-20.0, 2.0)


@dataclass(frozen=True)
class PolicyArchitecture:
    """What a set of weights describes; everything else about the network follows from it."""

    obs_size: int
    act_size: int
    hidden_sizes: tuple[int, ...]
    normalize: bool
    head: Head = "ppo"

    def as_dict(self) -> dict:
        """A JSON-serialisable description."""
        return {**asdict(self), "hidden_sizes": list(self.hidden_sizes)}

    def describe(self) -> str:
        """One line such as `59 -> norm -> 3x512 SiLU -> 21 (ppo)`."""
        widths = sorted(set(self.hidden_sizes))
        body = (f"{len(self.hidden_sizes)}x{widths[0]}" if len(widths) == 1
                else "-".join(str(w) for w in self.hidden_sizes))
        norm = "norm -> " if self.normalize else ""
        return f"{self.obs_size} -> {norm}{body} SiLU -> {self.act_size} ({self.head})"


class ObservationNormalizer(nn.Module):
    """`clamp((x - mean) / std, -5, 5)` in float32, no epsilon (as ML-Agents exports it)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("std", torch.ones(size))

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - torch's own signature
        # Keep the buffers float32 whatever `.to(dtype)` / `.half()` asks; moves still apply.
        # Restore the original float32 values: casting back after `fn` would keep fp16 rounding.
        mean, std = self.mean, self.std
        super()._apply(fn, recurse)
        self.mean = mean.to(self.mean.device)
        self.std = std.to(self.std.device)
        return self

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # (N, obs) float32 -> (N, obs) float32
        return torch.clamp((obs - self.mean) / self.std, -NORMALIZER_CLIP, NORMALIZER_CLIP)


class PolicyNet(nn.Module):
    """The actor. `forward(obs)` returns `(mu, log_sigma)` in the layers' dtype: mu (N, act);
    log_sigma (N, act) for SAC, or PPO's state-independent (1, act), which broadcasts."""

    def __init__(self, arch: PolicyArchitecture) -> None:
        super().__init__()
        self.arch = arch
        self.normalizer = ObservationNormalizer(arch.obs_size) if arch.normalize else None
        layers: list[nn.Module] = []
        width = arch.obs_size
        for hidden in arch.hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.hidden_layers: list[nn.Linear] = list(self.body[::2])
        self.mu = nn.Linear(width, arch.act_size)
        if arch.head == "ppo":
            self.log_sigma: nn.Module | nn.Parameter = nn.Parameter(torch.zeros(1, arch.act_size))
        else:
            self.log_sigma = nn.Linear(width, arch.act_size)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                # Store each (out, in) weight as the transpose of a contiguous (in, out) matrix:
                # F.linear multiplies by weight.t(), which is then contiguous, and the CPU matmul
                # is up to twice as fast for small batches. load_state_dict and .to() keep strides.
                module.weight = nn.Parameter(module.weight.detach().t().contiguous().t())

    @property
    def layer_dtype(self) -> torch.dtype:
        """The dtype of the Linear layers (the precision the agent runs in)."""
        return self.mu.weight.dtype

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs if obs.dtype == torch.float32 else obs.float()  # (N, obs)
        if self.normalizer is not None:
            x = self.normalizer(x)
        mu_layer = self.mu
        if x.dtype != mu_layer.weight.dtype:
            x = x.to(mu_layer.weight.dtype)
        for layer in self.hidden_layers:  # functional calls: module-call overhead counts here
            x = F.silu(F.linear(x, layer.weight, layer.bias), inplace=True)  # (N, hidden)
        mu = F.linear(x, mu_layer.weight, mu_layer.bias)  # (N, act)
        if isinstance(self.log_sigma, nn.Linear):
            return mu, torch.clamp(self.log_sigma(x), *SAC_LOG_SIGMA_RANGE)
        return mu, self.log_sigma  # (1, act)

    def linear_parameter_count(self) -> int:
        """Parameters of the body and mu layers (the figure ML-Agents users quote: 566,805 for Huggy)."""
        return sum(p.numel() for p in [*self.body.parameters(), *self.mu.parameters()])

    def log_sigma_parameter_count(self) -> int:
        """Parameters of the log-sigma parameter or layer."""
        return sum(p.numel() for p in ([self.log_sigma] if isinstance(self.log_sigma, nn.Parameter)
                                       else self.log_sigma.parameters()))

    def normalizer_buffer_count(self) -> int:
        """Values in the normalizer (mean and std), 0 without one."""
        return 0 if self.normalizer is None else 2 * self.arch.obs_size


def canonical_keys(arch: PolicyArchitecture) -> dict[str, tuple[int, ...]]:
    """The state-dict keys PolicyNet expects for `arch`, with their shapes, in a fixed order."""
    keys: dict[str, tuple[int, ...]] = {}
    if arch.normalize:
        keys["normalizer.mean"] = (arch.obs_size,)
        keys["normalizer.std"] = (arch.obs_size,)
    width = arch.obs_size
    for index, hidden in enumerate(arch.hidden_sizes):
        keys[f"body.{2 * index}.weight"] = (hidden, width)
        keys[f"body.{2 * index}.bias"] = (hidden,)
        width = hidden
    keys["mu.weight"] = (arch.act_size, width)
    keys["mu.bias"] = (arch.act_size,)
    if arch.head == "ppo":
        keys["log_sigma"] = (1, arch.act_size)
    else:
        keys["log_sigma.weight"] = (arch.act_size, width)
        keys["log_sigma.bias"] = (arch.act_size,)
    return keys


def build_policy(arch: PolicyArchitecture, tensors: dict[str, torch.Tensor], origin: str) -> PolicyNet:
    """A float32 PolicyNet holding `tensors` (canonical keys); every key and shape is checked.

    Raises ValueError naming `origin`, the key and both shapes on any mismatch.
    """
    expected = canonical_keys(arch)
    missing = [key for key in expected if key not in tensors]
    unexpected = [key for key in tensors if key not in expected]
    if missing or unexpected:
        raise ValueError(f"{origin}: weights do not match {arch.describe()}: "
                         f"missing {missing}, unexpected {unexpected}")
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise ValueError(f"{origin}: shape mismatch for {key}: expected {shape}, "
                             f"got {tuple(tensors[key].shape)}")
    net = PolicyNet(arch)
    net.load_state_dict({key: tensors[key].detach().float() for key in expected}, strict=True)
    return net.eval().requires_grad_(False)
