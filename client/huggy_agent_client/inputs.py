"""Validation at the policy boundary for every policy kind: several observation inputs, action
masks, recurrent memories. Single-vector policies take the fast path in `observations`."""

from __future__ import annotations

from typing import Any

import numpy as np

from huggy_agent_client.observations import as_observation_batch
from huggy_agent_client.spec import ActorSpec, ObservationInput


def _as_float32(value: Any, what: str, expected: str) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    try:
        with np.errstate(over="ignore"):  # beyond float32's range becomes inf, refused later
            return np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what} must be numeric with shape {expected}; could not convert it: "
                         f"{error}") from error


def _check_finite(array: np.ndarray, what: str) -> None:
    finite = np.isfinite(array)
    if not finite.all():
        index = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(f"{what} must be finite: received {array[index]} at index {index}")


def as_input_batch(value: Any, observation: ObservationInput) -> tuple[np.ndarray, bool]:
    """One observation input, validated, as a batch.

    Args:
        value: one row of the input's shape or a batch (N, *shape): a list, a numpy array or a torch
            tensor.
        observation: the input it should be.

    Returns:
        A C-contiguous float32 (N, *shape) array, and whether `value` was a single row.

    Raises:
        ValueError: `value` is not numeric, has another shape, or holds a NaN or an infinity; the
            message names the input, the expected and the received shape.
    """
    if observation.kind == "vector":
        try:
            return as_observation_batch(value, observation.shape[0])
        except ValueError as error:
            raise ValueError(f"{observation.name}: {error}") from None
    shape = observation.shape
    expected = f"{shape} or (N, {', '.join(map(str, shape))})"
    array = _as_float32(value, observation.name, expected)
    if array.shape == shape:
        array, single = array[None], True
    elif array.shape[1:] == shape and array.shape[0] >= 1:
        single = False
    else:
        raise ValueError(f"{observation.name}: observation shape mismatch: expected {expected} "
                         f"({observation.kind}), received {array.shape}")
    _check_finite(array, observation.name)
    return np.ascontiguousarray(array), single


def as_input_batches(obs: Any, spec: ActorSpec) -> tuple[list[np.ndarray], bool]:
    """Every observation input of a policy, validated, as batches of the same N.

    Args:
        obs: one array for a single-input policy; for several inputs a list or tuple in
            `obs_0, obs_1, ...` order, all single rows or all batches of the same N.
        spec: the policy's interface.

    Returns:
        One float32 (N, *shape) array per input, and whether they were single rows.

    Raises:
        ValueError: `obs` is an `(observation, info)` tuple from `env.reset()`, holds another number
            of inputs, inputs of different row counts, or an input that `as_input_batch` refuses.
    """
    if isinstance(obs, tuple) and len(obs) == 2 and isinstance(obs[1], dict):
        raise ValueError("got an (observation, info) tuple, as returned by env.reset(); "
                         "pass the observation alone: obs, info = env.reset()")
    if len(spec.inputs) == 1:
        batch, single = as_input_batch(obs, spec.inputs[0])
        return [batch], single
    names = ", ".join(i.name for i in spec.inputs)
    if not isinstance(obs, (list, tuple)) or len(obs) != len(spec.inputs):
        received = (f"{len(obs)}" if isinstance(obs, (list, tuple))
                    else f"one {type(obs).__name__}")
        raise ValueError(f"expected {len(spec.inputs)} observation inputs ({names}), received "
                         f"{received} (pass a list or tuple in that order)")
    batches = [as_input_batch(value, observation) for value, observation in
               zip(obs, spec.inputs, strict=True)]
    rows = {len(batch) for batch, _ in batches}
    singles = {single for _, single in batches}
    if len(rows) != 1 or len(singles) != 1:
        shapes = [tuple(batch.shape) if not single else "single row"
                  for batch, single in batches]
        raise ValueError(f"inputs must have the same number of rows (all single rows or all "
                         f"batches of one N), received {shapes}")
    return [batch for batch, _ in batches], singles.pop()


def _shape_of(value: Any) -> str:
    """What came, for an error: an array's shape, or the type of what has none."""
    try:
        return f"an array of shape {tuple(np.shape(value))}"
    except ValueError:  # ragged nested lists
        return f"a ragged {type(value).__name__}"


def as_mask_batch(mask: Any, spec: ActorSpec, rows: int) -> np.ndarray | None:
    """An action mask, validated, as one boolean row per observation row.

    Args:
        mask: None (all allowed), or bools or 0/1 (1 = allowed) of shape (sum of branches,),
            broadcast to every row, or (rows, sum of branches).
        spec: the policy's interface.
        rows: the number of observation rows.

    Returns:
        A (rows, sum of branches) bool array, True where allowed; None for None.

    Raises:
        ValueError: the policy has no discrete actions, or the mask has a wrong shape, another row
            count, values other than booleans or 0/1, or a branch with no allowed action in a row.
    """
    if mask is None:
        return None
    size = spec.mask_size
    if not spec.discrete_branches:
        raise ValueError("this policy has no discrete actions, so action_mask must be None (in "
                         f"a request body null or absent), received {_shape_of(mask)}")
    if hasattr(mask, "detach") and hasattr(mask, "cpu"):
        mask = mask.detach().cpu().numpy()
    array = np.asarray(mask)
    if array.shape not in ((size,), (array.shape[0] if array.ndim == 2 else -1, size)):
        raise ValueError(f"action_mask must have shape ({size},) or (N, {size}) (one column per "
                         f"action of branches {spec.discrete_branches}), received {array.shape}")
    if array.dtype != bool:
        if array.dtype.kind not in "iuf":
            raise ValueError("action_mask must hold booleans or 0/1 (1 = allowed), received "
                             f"values of type {array.dtype}")
        other = ~np.isin(array, (0, 1))
        if other.any():
            place = np.unravel_index(int(np.argmax(other)), array.shape)
            where = f"row {place[0]}, column {place[1]}" if array.ndim == 2 else f"column {place[0]}"
            raise ValueError("action_mask must hold booleans or 0/1 (1 = allowed), received "
                             f"{array[place].item()} at {where}")
        array = array.astype(bool)
    if array.ndim == 1:
        array = np.broadcast_to(array, (rows, size))
    elif len(array) != rows:
        raise ValueError(f"action_mask has {len(array)} rows, the observations {rows}")
    start = 0
    for branch, width in enumerate(spec.discrete_branches):
        empty = ~array[:, start:start + width].any(axis=1)
        if empty.any():
            raise ValueError(f"action_mask: branch {branch} (actions {start}-{start + width - 1}) "
                             f"allows no action in row {int(np.argmax(empty))}")
        start += width
    return np.require(array, bool, ["C_CONTIGUOUS", "WRITEABLE"])  # copies only if needed


def as_memory_batch(memory: Any, spec: ActorSpec, rows: int) -> np.ndarray:
    """A recurrent memory, validated, as one row per observation row.

    Args:
        memory: None (zeros: the start of an episode), one row (memory_size,), broadcast to every
            row, or (rows, memory_size).
        spec: the policy's interface.
        rows: the number of observation rows.

    Returns:
        A C-contiguous float32 (rows, memory_size) array.

    Raises:
        ValueError: the policy has no memory, or `memory` is not numeric, has a wrong shape, or
            holds a NaN or an infinity.
    """
    size = spec.memory_size
    if not size:
        raise ValueError("this policy has no recurrent memory, so memory must be None (in a "
                         f"request body null or absent), received {_shape_of(memory)}")
    if memory is None:
        return np.zeros((rows, size), dtype=np.float32)
    array = _as_float32(memory, "memory", f"({size},) or (N, {size})")
    if array.shape == (size,):
        array = np.broadcast_to(array, (rows, size))
    elif array.shape != (rows, size):
        raise ValueError(f"memory must have shape ({size},) or (N, {size}) with N = {rows} "
                         f"rows, received {array.shape}")
    _check_finite(array, "memory")
    return np.ascontiguousarray(array)
