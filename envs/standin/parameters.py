"""The EnvironmentParameters each built-in stand-in applies, checked before it starts.

The stand-ins, like a Unity scene, log and ignore a key they do not have or a value their
configuration refuses (`protocol.apply_parameter_values`), which would leave a typo such as
`num_agent=4` unnoticed. `check_parameters` refuses those at once, naming what is expected.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from envs.instance import MAX_SEED
from envs.standin import client, spec_client
from envs.standin.protocol import configured
from envs.standin.sim import SimConfig
from envs.standin.soccer import standin as soccer
from envs.standin.soccer.sim import SoccerConfig
from envs.standin.spec_sim import SpecSimConfig

STAND_INS: dict[str, tuple[str, Any, frozenset[str]]] = {
    "huggy": ("the Huggy stand-in", SimConfig(), frozenset(client.PARAMETERS)),
    "spec": ("the spec-driven stand-in", SpecSimConfig(), frozenset(spec_client.PARAMETERS)),
    "soccertwos": ("the stand-in SoccerTwos", SoccerConfig(), frozenset(soccer.PARAMETERS)),
}
"""By stand-in ("huggy", "spec": the one playing a policy's own behaviors, or a scene of
`launcher.SCENES`): its name in messages, its default configuration and the keys it applies."""
SEED_PATTERNS = {"soccertwos": (soccer.ARENA_SEED, "arena_seed_K")}
"""Keys that seed a part of a stand-in's scene (SoccerTwos: the next episode of arena K), each
with its name in messages; their values follow the rule of `seed`."""


def check_parameters(stand_in: str, parameters: Iterable[tuple[str, float]]) -> None:
    """Refuse EnvironmentParameters that a stand-in would ignore.

    Args:
        stand_in: a key of `STAND_INS`.
        parameters: (key, value) pairs.

    Raises:
        ValueError: the first pair with a value that is not a finite float32 (the side channel's
            type), a key the stand-in does not take (the message lists those it does), a value its
            configuration refuses, or a seed that is not a whole number in [0, MAX_SEED) (float32
            carries those exactly).
    """
    name, config, allowed = STAND_INS[stand_in]
    pattern, shown = SEED_PATTERNS.get(stand_in, (None, None))
    expected = ", ".join([*sorted(allowed), *([shown] if shown else [])])
    for key, value in parameters:
        with np.errstate(over="ignore"):
            sent = float(np.float32(value))
        if not math.isfinite(sent):
            raise ValueError(f"environment parameter {key}={value:g} is not a finite float32, "
                             "the type the side channel carries")
        if key == "seed" or (pattern is not None and pattern.fullmatch(key)):
            if not (0 <= sent < MAX_SEED and sent == int(sent)):
                raise ValueError(f"environment parameter {key} must be a whole number, 0 to "
                                 f"2**24 - 1, got {value:g}")
        elif key not in allowed:
            raise ValueError(f"environment parameter {key!r} is not one that {name} takes; "
                             f"expected one of {expected}")
        else:
            try:
                configured(config, key, sent)
            except ValueError as error:
                raise ValueError(f"environment parameter {key}={value:g} is refused by {name}: "
                                 f"{error}") from None
