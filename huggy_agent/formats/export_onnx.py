"""Export a PolicyNet in ML-Agents' own ONNX interface, so the file drops back into Unity.

Input `obs_0` [batch, obs]; outputs `version_number` (3), `memory_size` (0), `continuous_actions`
(sampled in-graph with RandomNormalLike, as ML-Agents does), `continuous_action_output_shape`,
`deterministic_continuous_actions`; opset 9. Module paths mirror ML-Agents' so the initializers
carry its names (`network_body._body_endoder.seq_layers.0.weight`, ...), and our own loader and
Unity's importer both read the file like one ML-Agents wrote.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from huggy_agent.network import NORMALIZER_CLIP, PPO_ACTION_CLIP, SAC_LOG_SIGMA_RANGE, PolicyNet

OPSET = 9
MLAGENTS_EXPORT_VERSION = 3.0
OUTPUTS = ("version_number", "memory_size", "continuous_actions",
           "continuous_action_output_shape", "deterministic_continuous_actions")


class _Normalizer(nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("running_mean", mean.detach().float().clone())
        self.register_buffer("std", std.detach().float().clone())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.clamp((obs - self.running_mean) / self.std, -NORMALIZER_CLIP, NORMALIZER_CLIP)


class _Processor(nn.Module):
    def __init__(self, normalizer: _Normalizer) -> None:
        super().__init__()
        self.normalizer = normalizer


class _ObservationEncoder(nn.Module):
    def __init__(self, normalizer: _Normalizer | None) -> None:
        super().__init__()
        self.processors = nn.ModuleList([_Processor(normalizer)] if normalizer is not None else [])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.processors[0].normalizer(obs) if len(self.processors) else obs


class _BodyEncoder(nn.Module):
    def __init__(self, body: nn.Sequential) -> None:
        super().__init__()
        self.seq_layers = body


class _NetworkBody(nn.Module):
    def __init__(self, normalizer: _Normalizer | None, body: nn.Sequential) -> None:
        super().__init__()
        self.observation_encoder = _ObservationEncoder(normalizer)
        self._body_endoder = _BodyEncoder(body)  # ML-Agents' own spelling

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self._body_endoder.seq_layers(self.observation_encoder(obs))


class _Distribution(nn.Module):
    def __init__(self, net: PolicyNet) -> None:
        super().__init__()
        self.mu = net.mu
        self.log_sigma = net.log_sigma


class _ActionModel(nn.Module):
    def __init__(self, net: PolicyNet) -> None:
        super().__init__()
        self._continuous_distribution = _Distribution(net)


class MLAgentsExportModule(nn.Module):
    """A float32 CPU PolicyNet's weights under ML-Agents' module names, computing its five outputs."""

    def __init__(self, net: PolicyNet) -> None:
        super().__init__()
        normalizer = (None if net.normalizer is None
                      else _Normalizer(net.normalizer.mean, net.normalizer.std))
        self.head = net.arch.head
        self.network_body = _NetworkBody(normalizer, net.body)
        self.action_model = _ActionModel(net)
        self.register_buffer("version_number", torch.tensor([MLAGENTS_EXPORT_VERSION]))
        self.register_buffer("memory_size_vector", torch.tensor([0.0]))
        self.register_buffer("continuous_act_size_vector", torch.tensor([float(net.arch.act_size)]))

    def forward(self, obs_0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.network_body(obs_0)
        dist = self.action_model._continuous_distribution
        mu = dist.mu(hidden)
        if self.head == "sac":
            log_sigma = torch.clamp(dist.log_sigma(hidden), *SAC_LOG_SIGMA_RANGE)
            sampled = torch.tanh(mu + torch.randn_like(mu) * torch.exp(log_sigma))
            # ML-Agents' TanhGaussian deterministic_sample() is the raw mean; kept for Unity parity.
            deterministic = mu
        else:
            log_sigma = mu * 0 + dist.log_sigma
            sampled = torch.clamp(mu + torch.randn_like(mu) * torch.exp(log_sigma),
                                  -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP
            deterministic = torch.clamp(mu, -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP
        return (self.version_number, self.memory_size_vector, sampled,
                self.continuous_act_size_vector, deterministic)


def export_onnx(net: PolicyNet, path: str | Path) -> Path:
    """Write `net` to `path` in ML-Agents' ONNX interface, as float32 (a half-precision net's
    weights are exported as rounded; export `LoadedPolicy.build()` to keep the source weights)."""
    path = Path(path)
    module = MLAgentsExportModule(_float_copy(net)).eval()
    dummy = torch.zeros(1, net.arch.obs_size)
    batch_axes = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (dummy,), str(path), input_names=["obs_0"], output_names=list(OUTPUTS),
            dynamic_axes={"obs_0": batch_axes, "continuous_actions": batch_axes,
                          "deterministic_continuous_actions": batch_axes},
            opset_version=OPSET, do_constant_folding=False, dynamo=False,
        )
    return path


def _float_copy(net: PolicyNet) -> PolicyNet:
    copy = PolicyNet(net.arch)
    copy.load_state_dict({k: v.detach().float().cpu() for k, v in net.state_dict().items()})
    return copy.eval().requires_grad_(False)
