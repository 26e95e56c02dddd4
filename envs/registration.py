"""Gymnasium registration of `huggy_agent/Huggy-v0` (done by `import envs`)."""

from __future__ import annotations

import gymnasium

ENV_ID = "huggy_agent/Huggy-v0"


def register_envs() -> None:
    """Register `huggy_agent/Huggy-v0`: `gymnasium.make` gives `HuggyEnv` (one agent),
    `gymnasium.make_vec` gives `HuggyVectorEnv` over all agents (`vector_entry_point`)."""
    if ENV_ID in gymnasium.registry:
        return
    gymnasium.register(
        id=ENV_ID,
        entry_point="envs.single_env:HuggyEnv",
        vector_entry_point="envs.vector_env:HuggyVectorEnv",
    )
