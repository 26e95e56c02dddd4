"""The EnvironmentParameters each built-in stand-in applies, checked before it starts.

The stand-ins, like a Unity scene, log and ignore a key they do not have or a value their
configuration refuses (`protocol.apply_parameter_values`), which would leave a typo such as
`num_agent=4` unnoticed. `check_parameters` refuses those at once, naming what is expected.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from envs.standin import client, spec_client
from envs.standin.sim import SimConfig
from envs.standin.soccer import standin as soccer
from envs.standin.soccer.sim import SoccerConfig
from envs.standin.spec_sim import SpecSimConfig

SEED_LIMIT = 2**24
"""Seeds travel as float32 on the side channel: whole numbers below 2**24 are exact."""
STAND_INS: dict[str, tuple[str, Any, frozenset[str]]] = {
    "huggy": ("the Huggy stand-in", SimConfig(), frozenset(client.PARAMETERS)),
    "spec": ("the spec-driven stand-in", SpecSimConfig(), frozenset(spec_client.PARAMETERS)),
    "soccertwos": ("the stand-in SoccerTwos", SoccerConfig(), frozenset(soccer.PARAMETERS)),
}
"""By stand-in ("huggy", "spec": the one playing a policy's own behaviors, or a scene of
`launcher.SCENES`): its name in messages, its default configuration and the keys it applies."""


def check_parameters(stand_in: str, parameters: Iterable[tuple[str, float]]) -> None:
    """ValueError naming the first of `parameters` that `stand_in` (a key of `STAND_INS`) would
    ignore: a key it does not take (the message lists those it does), a value its
    configuration refuses, or a seed that is not a whole number in [0, 2**24)."""
    name, config, allowed = STAND_INS[stand_in]
    for key, value in parameters:
        if key not in allowed:
            raise ValueError(f"environment parameter {key!r} is not one that {name} takes; "
                             f"expected one of {', '.join(sorted(allowed))}")
        if key == "seed":
            if not (0 <= value < SEED_LIMIT and value == int(value)):
                raise ValueError("environment parameter seed must be a whole number, 0 to "
                                 f"2**24 - 1, got {value:g}")
            continue
        try:
            replace(config, **{key: value}).validated()
        except (ValueError, OverflowError) as error:  # int() of NaN or an infinity
            raise ValueError(f"environment parameter {key}={value:g} is refused by {name}: "
                             f"{error}") from None
