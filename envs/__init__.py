"""Huggy's Unity environment from Python: Gymnasium envs over mlagents-envs and a built-in stand-in.

Importing `envs` makes mlagents-envs 1.1.0 work on the installed protobuf/numpy (see
`envs.compat`) and registers the Gymnasium ids `huggy_agent/Huggy-v0` (Huggy) and
`huggy_agent/Unity-v0` (any behavior). Everything that speaks to
Unity lives in this package; mlagents-envs is imported nowhere else. `HuggyVectorEnv` drives one
Unity process in this process (`envs.instance`), or several, each from a worker process
(`envs.workers`).
"""

from __future__ import annotations

from envs import compat

compat.apply()

from envs.instance import instance_seed  # noqa: E402
from envs.registration import register_envs  # noqa: E402
from envs.rollout import (  # noqa: E402
    EpisodeResult,
    RolloutInterrupted,
    RolloutResult,
    rollout,
    rollout_per_instance,
)
from envs.single_env import HuggyEnv, UnityEnv  # noqa: E402
from envs.standin.launcher import builtin_huggy_path  # noqa: E402
from envs.vector_env import HuggyVectorEnv, UnityVectorEnv  # noqa: E402
from envs.workers import InstanceError  # noqa: E402

register_envs()

__all__ = [
    "EpisodeResult",
    "HuggyEnv",
    "HuggyVectorEnv",
    "InstanceError",
    "RolloutInterrupted",
    "RolloutResult",
    "UnityEnv",
    "UnityVectorEnv",
    "builtin_huggy_path",
    "instance_seed",
    "rollout",
    "rollout_per_instance",
]
