"""Validation of observations at the policy boundary."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_observation_batch(obs: Any, obs_size: int) -> tuple[np.ndarray, bool]:
    """`obs` as a C-contiguous float32 (N, obs_size) array, and whether it was a single observation.

    Accepts lists, numpy arrays and torch tensors of shape (obs_size,) or (N, obs_size).
    Raises ValueError naming the expected and received shape, or the first non-finite entry.
    """
    if isinstance(obs, tuple) and len(obs) == 2 and isinstance(obs[1], dict):
        raise ValueError("got an (observation, info) tuple, as returned by env.reset(); "
                         "pass the observation alone: obs, info = env.reset()")
    if hasattr(obs, "detach") and hasattr(obs, "cpu"):  # torch.Tensor, without importing torch here
        obs = obs.detach().cpu().numpy()
    try:
        with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, refused below
            array = np.asarray(obs, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise ValueError(f"observation must be numeric with shape ({obs_size},) or "
                         f"(N, {obs_size}); could not convert it: {error}") from error
    if array.ndim not in (1, 2) or array.shape[-1] != obs_size or array.size == 0:
        raise ValueError(f"observation shape mismatch: expected ({obs_size},) or (N, {obs_size}) "
                         f"with N >= 1, received {array.shape}")
    single = array.ndim == 1
    batch = np.ascontiguousarray(array.reshape(-1, obs_size))
    finite = np.isfinite(batch)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise ValueError(f"observation must be finite: received {batch[row, col]} at row {row}, "
                         f"column {col}")
    return batch, single
