"""Validation of observations at the policy boundary."""

from __future__ import annotations

from typing import Any

import numpy as np

_FLOAT32 = np.dtype(np.float32)
_DOT_CHECK_VALUES = 4096
"""Inputs up to this many values are checked for finiteness with one dot product."""
_ZEROS = np.zeros(_DOT_CHECK_VALUES, dtype=np.float32)
_ZERO_ROWS: dict[int, np.ndarray] = {}
"""Zero vectors of observation sizes seen (the slice of `_ZEROS` costs more than the lookup)."""


def _all_finite(values: np.ndarray) -> bool:
    """Whether every value of a 1-D float32 array is finite.

    Up to `_DOT_CHECK_VALUES` values take one dot product with zeros: x * 0 is 0 for every finite
    x and NaN for NaN and +-inf, and a NaN term makes the sum NaN (which is truthy), so the product
    is falsy exactly when all values are finite. One call, where isfinite().all() takes two and a
    temporary (larger inputs take that). `np.vdot`, unlike `dot`, does not warn about inf * 0.
    """
    size = values.shape[0]
    if size <= _DOT_CHECK_VALUES:
        return not np.vdot(values, _ZEROS[:size])
    return bool(np.isfinite(values).all())


def as_observation_batch(obs: Any, obs_size: int) -> tuple[np.ndarray, bool]:
    """Observations of a single-vector policy, validated, as a batch.

    A well-formed float32 C-contiguous numpy array comes back without a copy (a view).

    Args:
        obs: a list, a numpy array or a torch tensor of shape (obs_size,) or (N, obs_size).
        obs_size: the values per observation.

    Returns:
        A C-contiguous float32 (N, obs_size) array, and whether `obs` was a single observation.

    Raises:
        ValueError: `obs` is an `(observation, info)` tuple from `env.reset()`, is not numeric, has
            another shape (named with the expected one), or holds a NaN or an infinity (the first
            one is named).
    """
    if type(obs) is np.ndarray and obs.dtype is _FLOAT32 and obs.flags.c_contiguous:
        # The common case, checked cheaply; anything else (and every error) takes the path below.
        shape = obs.shape
        if len(shape) == 1 and shape[0] == obs_size:
            zeros = _ZERO_ROWS.get(obs_size)
            if zeros is None:
                zeros = _ZERO_ROWS[obs_size] = np.zeros(obs_size, dtype=np.float32)
            if not np.vdot(obs, zeros):  # all finite: see _all_finite
                return obs.reshape(1, obs_size), True
        elif len(shape) == 2 and shape[1] == obs_size and shape[0] and _all_finite(
                obs.reshape(-1)):
            return obs, False
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
