"""Huggy's Unity environment from Python: Gymnasium envs over mlagents-envs and a built-in stand-in.

Importing `envs` makes mlagents-envs 1.1.0 work on the installed protobuf/numpy (see
`envs.compat`) and registers the Gymnasium id `huggy_agent/Huggy-v0`. Everything that speaks to
Unity lives in this package; mlagents-envs is imported nowhere else.
"""

from __future__ import annotations

from envs import compat

compat.apply()

from envs.registration import register_envs  # noqa: E402
from envs.rollout import EpisodeResult, RolloutInterrupted, RolloutResult, rollout  # noqa: E402
from envs.single_env import HuggyEnv  # noqa: E402
from envs.standin.launcher import builtin_huggy_path  # noqa: E402
from envs.vector_env import HuggyVectorEnv  # noqa: E402

register_envs()

__all__ = [
    "EpisodeResult",
    "HuggyEnv",
    "HuggyVectorEnv",
    "RolloutInterrupted",
    "RolloutResult",
    "builtin_huggy_path",
    "rollout",
]
