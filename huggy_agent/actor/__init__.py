"""ML-Agents' actor networks, module for module, for inference (see `networks`)."""

from huggy_agent.actor.networks import (
    PPO_ACTION_CLIP,
    SAC_LOG_SIGMA_RANGE,
    Actor,
    ActorArchitecture,
    InputArchitecture,
    build_actor,
    expected_keys,
)

__all__ = ["PPO_ACTION_CLIP", "SAC_LOG_SIGMA_RANGE", "Actor", "ActorArchitecture",
           "InputArchitecture", "build_actor", "expected_keys"]
