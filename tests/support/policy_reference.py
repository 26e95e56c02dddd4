"""Independent float64 references for the policy tests, written from the ML-Agents formats directly.

Nothing here imports huggy_agent: weights come from the raw ONNX initializers or the raw `Policy`
dict of a checkpoint, and the forward pass is plain numpy in float64, written from ML-Agents 1.1's
SimpleActor (normalizer, Swish MLP, action heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

NORMALIZER = "network_body.observation_encoder.processors.0.normalizer."
BODY = "network_body._body_endoder.seq_layers."
DIST = "action_model._continuous_distribution."


def onnx_initializers(path: Path) -> dict[str, np.ndarray]:
    """Every initializer of an ONNX file, as float64 numpy arrays."""
    model = onnx.load(str(path))
    return {init.name: numpy_helper.to_array(init).astype(np.float64)
            for init in model.graph.initializer}


def onnx_normalizer_stats(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) of an ML-Agents export: `running_mean` and the constant-folded `onnx::Div_NN`."""
    initializers = onnx_initializers(path)
    if f"{NORMALIZER}running_mean" not in initializers:
        return None
    (std,) = [value for name, value in initializers.items() if name.startswith("onnx::Div_")]
    return initializers[f"{NORMALIZER}running_mean"], std


def normalizer_observations(stats_source: Path, rows: int, seed: int) -> np.ndarray:
    """(rows, obs) float32 observations `mean + std * N(0, 1)` from an export's normalizer."""
    stats = onnx_normalizer_stats(stats_source)
    assert stats is not None, f"{stats_source} has no normalizer"
    mean, std = stats
    noise = np.random.default_rng(seed).standard_normal((rows, mean.size))
    return (mean + std * noise).astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    return x * 0.5 * (1.0 + np.tanh(0.5 * x))  # x * sigmoid(x), without overflow warnings


@dataclass
class ReferencePolicy:
    """An ML-Agents actor in float64: optional normalizer, SiLU layers, mu, and log sigma
    (PPO: a (1, act) parameter; SAC: a Linear layer of the last hidden state, `sac_layer`)."""

    normalizer: tuple[np.ndarray, np.ndarray] | None
    layers: list[tuple[np.ndarray, np.ndarray]]
    mu: tuple[np.ndarray, np.ndarray]
    log_sigma: np.ndarray | None = None
    sac_layer: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_onnx(cls, path: Path) -> ReferencePolicy:
        """From an ML-Agents ONNX export's initializers (PPO)."""
        init = onnx_initializers(path)
        return cls(onnx_normalizer_stats(path), _layers(init),
                   (init[f"{DIST}mu.weight"], init[f"{DIST}mu.bias"]), init[f"{DIST}log_sigma"])

    @classmethod
    def from_checkpoint_policy(cls, policy: dict) -> ReferencePolicy:
        """From the `Policy` dict of an ML-Agents checkpoint (PPO or SAC head)."""
        raw = {key: value.double().numpy() for key, value in policy.items()}
        normalizer = None
        if f"{NORMALIZER}running_mean" in raw:
            steps = float(raw[f"{NORMALIZER}normalization_steps"])
            normalizer = (raw[f"{NORMALIZER}running_mean"],
                          np.sqrt(raw[f"{NORMALIZER}running_variance"] / steps))
        mu = (raw[f"{DIST}mu.weight"], raw[f"{DIST}mu.bias"])
        if f"{DIST}log_sigma.weight" in raw:
            return cls(normalizer, _layers(raw), mu,
                       sac_layer=(raw[f"{DIST}log_sigma.weight"], raw[f"{DIST}log_sigma.bias"]))
        return cls(normalizer, _layers(raw), mu, raw[f"{DIST}log_sigma"])

    def forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """mu (N, act) and the raw log sigma: (1, act) for PPO, unclamped (N, act) for SAC."""
        x = np.asarray(obs, dtype=np.float64)
        if self.normalizer is not None:
            mean, std = self.normalizer
            x = np.clip((x - mean) / std, -5.0, 5.0)
        for weight, bias in self.layers:
            x = _silu(x @ weight.T + bias)
        mu = x @ self.mu[0].T + self.mu[1]
        if self.sac_layer is not None:
            return mu, x @ self.sac_layer[0].T + self.sac_layer[1]
        assert self.log_sigma is not None
        return mu, self.log_sigma


def _layers(raw: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    layers = []
    while f"{BODY}{2 * len(layers)}.weight" in raw:
        index = 2 * len(layers)
        layers.append((raw[f"{BODY}{index}.weight"], raw[f"{BODY}{index}.bias"]))
    return layers


@dataclass(frozen=True)
class RowsPart:
    """One caller's rows of a shared forward pass, for `HuggyAgent.actions_of_parts`."""

    rows: int
    deterministic: bool = True
    seed: int | None = None
    row_offset: int = 0
    action_mask: np.ndarray | None = None


def ppo_actions(mu: np.ndarray, log_sigma: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
    """`clip(mu [+ z * exp(log_sigma)], -3, 3) / 3` in float64."""
    action = mu if z is None else mu + z.astype(np.float64) * np.exp(log_sigma)
    return np.clip(action, -3.0, 3.0) / 3.0


def sac_actions(mu: np.ndarray, log_sigma: np.ndarray, z: np.ndarray | None = None,
                clamp: bool = True) -> np.ndarray:
    """`tanh(mu [+ z * exp(clamp(log_sigma, -20, 2))])` in float64 (`clamp=False` skips the clamp)."""
    if clamp:
        log_sigma = np.clip(log_sigma, -20.0, 2.0)
    action = mu if z is None else mu + z.astype(np.float64) * np.exp(log_sigma)
    return np.tanh(action)
