"""What a policy answers: `compute_action`'s return types (for `HuggyAgent` and `RemoteAgent`
alike) and `split_memory`, which takes a recurrent policy's answer apart.
"""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

import numpy as np


class Actions(NamedTuple):
    """A hybrid policy's actions: float32 continuous and int64 discrete, same rows."""

    continuous: np.ndarray
    discrete: np.ndarray


PolicyActions: TypeAlias = np.ndarray | Actions
"""A policy's actions by its kind: float32 (N, c) for continuous-only policies, int64
(N, branches) for discrete-only ones, `Actions` for hybrid ones; a single row without N."""

ActionResult: TypeAlias = PolicyActions | tuple[PolicyActions, np.ndarray]
"""What `compute_action` returns: `PolicyActions`, or for a recurrent policy the pair
(`PolicyActions`, the next memory: float32 (N, memory_size), a single row without N)."""


def split_memory(result: ActionResult) -> tuple[PolicyActions, np.ndarray | None]:
    """A `compute_action` result taken apart.

    Args:
        result: what `compute_action` returned.

    Returns:
        (actions, next memory); the memory is None for a policy without one.
    """
    if isinstance(result, tuple) and not isinstance(result, Actions):
        actions, memory = result
        return actions, memory
    return result, None
