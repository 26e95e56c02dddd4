"""ML-Agents' actor networks, module for module, for inference (see `networks`)."""

from huggy_agent.actor.networks import (
    PPO_ACTION_CLIP,
    SAC_LOG_SIGMA_RANGE,
    Actor,
    ActorArchitecture,
    InputArchitecture,
    MlpPolicy,
    build_actor,
    expected_keys,
    mlp_policy,
)

__all__ = ["PPO_ACTION_CLIP", "SAC_LOG_SIGMA_RANGE", "Actor", "ActorArchitecture",
           "InputArchitecture", "MlpPolicy", "build_actor", "expected_keys", "mlp_policy"]
