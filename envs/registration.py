"""Gymnasium registration of `huggy_agent/Huggy-v0` and `huggy_agent/Unity-v0` (done by
`import envs`)."""

from __future__ import annotations

import gymnasium

ENV_ID = "huggy_agent/Huggy-v0"
UNITY_ENV_ID = "huggy_agent/Unity-v0"


def register_envs() -> None:
    """Register `huggy_agent/Huggy-v0` (the Huggy preset: `HuggyEnv` for one agent with
    `gymnasium.make`, `HuggyVectorEnv` for every agent with `gymnasium.make_vec`) and
    `huggy_agent/Unity-v0`, any Unity build or behavior (`UnityEnv`, `UnityVectorEnv`; spaces
    from its BehaviorSpec)."""
    for env_id, single, vector in ((ENV_ID, "HuggyEnv", "HuggyVectorEnv"),
                                   (UNITY_ENV_ID, "UnityEnv", "UnityVectorEnv")):
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=f"envs.single_env:{single}",
                               vector_entry_point=f"envs.vector_env:{vector}")
