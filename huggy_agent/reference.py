"""Independent references for checking the policy: float64 numpy forward, canonical inputs."""

from __future__ import annotations

import numpy as np

from huggy_agent.formats import LoadedPolicy
from huggy_agent.network import NORMALIZER_CLIP, PPO_ACTION_CLIP, SAC_LOG_SIGMA_RANGE


def canonical_observations(loaded: LoadedPolicy, count: int = 256, seed: int = 0) -> np.ndarray:
    """(count, obs) float32 observations drawn from the normalizer's own statistics
    (mean + std * N(0, 1)); unit normal without a normalizer. Row 0 is all zeros."""
    z = np.random.default_rng(seed).standard_normal((count, loaded.arch.obs_size))
    if loaded.arch.normalize:
        z = loaded.tensors["normalizer.mean"].double().numpy() + \
            loaded.tensors["normalizer.std"].double().numpy() * z
    z[0] = 0.0
    return z.astype(np.float32)


def float64_mu(loaded: LoadedPolicy, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mu, log_sigma) in float64, straight from the loaded tensors with numpy."""
    t = {k: v.double().numpy() for k, v in loaded.tensors.items()}
    x = np.asarray(obs, dtype=np.float64).reshape(-1, loaded.arch.obs_size)
    if loaded.arch.normalize:
        x = np.clip((x - t["normalizer.mean"]) / t["normalizer.std"], -NORMALIZER_CLIP,
                    NORMALIZER_CLIP)
    for index in range(len(loaded.arch.hidden_sizes)):
        x = x @ t[f"body.{2 * index}.weight"].T + t[f"body.{2 * index}.bias"]
        x = x / (1.0 + np.exp(-x))
    mu = x @ t["mu.weight"].T + t["mu.bias"]
    if loaded.arch.head == "sac":
        log_sigma = np.clip(x @ t["log_sigma.weight"].T + t["log_sigma.bias"], *SAC_LOG_SIGMA_RANGE)
    else:
        log_sigma = np.broadcast_to(t["log_sigma"], mu.shape)
    return mu, log_sigma


def float64_actions(loaded: LoadedPolicy, obs: np.ndarray, noise: np.ndarray | None = None
                    ) -> np.ndarray:
    """The policy's actions in float64; deterministic unless standard-normal `noise` is given."""
    mu, log_sigma = float64_mu(loaded, obs)
    if noise is not None:
        mu = mu + noise.astype(np.float64) * np.exp(log_sigma)
    if loaded.arch.head == "sac":
        return np.tanh(mu)
    return np.clip(mu, -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP
