"""SoccerTwos' side of the ML-Agents protocol (`SoccerStandIn`, driving `SoccerSim`); the
exchange itself is `envs.standin.protocol`.

Two behaviors as mlagents-envs sees them, `SoccerTwos?team=0` (blue) and `SoccerTwos?team=1`
(purple), each announced with its brain parameters (3 discrete branches of 3) in the first
message. Each agent reports its two stacked ray observations (264 and 72 floats, named as Unity
names them), its individual reward, its multi-agent group (one per team per arena) and group
reward; messages are written straight to wire bytes (`envs.standin.wire`). Environment
parameters: `num_arenas`, `max_environment_steps`, `ball_touch` (`SoccerConfig`), `seed`, and
`arena_seed_K`, the seed of the next episode to start in arena K (a match's seed; sent as a
float, so exact up to 2**24).
"""

from __future__ import annotations

import re
from typing import Any, TextIO

import numpy as np

from envs.standin.protocol import (
    apply_parameter_values,
    handshake_message,
    initialization_output,
    parse_environment_parameters,
    reset_seed,
)
from envs.standin.soccer.rays import BACKWARD_SIZE, FORWARD_SIZE, SENSOR_NAMES
from envs.standin.soccer.sim import BRANCHES, SoccerConfig, SoccerReport, SoccerSim
from envs.standin.wire import ObservationEncoder, discrete_actions, unity_message

NAME = "SoccerTwos"
BEHAVIORS = (f"{NAME}?team=0", f"{NAME}?team=1")
"""The two teams' behaviors on the wire: blue (team 0), purple (team 1)."""
TEAM_NAMES = ("Blue", "Purple")
PARAMETERS = {"num_arenas", "max_environment_steps", "ball_touch", "seed"}
ARENA_SEED = re.compile(r"arena_seed_(\d+)")
"""`arena_seed_K`: the seed of the next episode to start in arena K (see `SoccerSim`)."""


class SoccerStandIn:
    """Protocol state: the simulation, the agents awaiting decisions, pending parameters (the
    interface `envs.standin.protocol.run` drives).

    Args:
        log: where to write what happens.
    """

    def __init__(self, log: TextIO) -> None:
        self.log = log
        self.sim: SoccerSim | None = None
        self.config = SoccerConfig()
        self.pending_seed: int | None = None
        self.arena_seeds: dict[int, int] = {}  # for arenas' next episodes, before the sim exists
        self.encoders = [
            ObservationEncoder(behavior, (FORWARD_SIZE, BACKWARD_SIZE),
                               [name.format(team=team) for name in SENSOR_NAMES], groups=True)
            for behavior, team in zip(BEHAVIORS, TEAM_NAMES, strict=True)]
        self.announced = False
        # Per behavior, the slot of each deciding agent in message order: Python answers in it.
        self.order = [np.zeros(0, dtype=np.int64) for _ in BEHAVIORS]

    def handshake_message(self) -> bytes:
        """The player's first message.

        Returns:
            The serialized `UnityMessageProto`.
        """
        return handshake_message(NAME)

    def apply_parameters(self, side_channel: bytes) -> None:
        """Apply the EnvironmentParameters of a message: `arena_seed_K` seeds arena K's next episode
        (a seed that is not a whole number >= 0 is logged and ignored); the others as
        `protocol.apply_parameter_values` applies them.

        Args:
            side_channel: the message's side-channel bytes.
        """
        values = parse_environment_parameters(side_channel)
        for key in [key for key in values if ARENA_SEED.fullmatch(key)]:
            arena, value = int(key.rsplit("_", 1)[1]), values.pop(key)
            if not (value >= 0 and value == int(value)):
                self.log.write(f"ignoring environment parameter {key}={value}: a seed must be "
                               "a non-negative integer\n")
            elif self.sim is None:
                self.arena_seeds[arena] = int(value)
            else:
                self.sim.seed_next_episode(arena, int(value))
        apply_parameter_values(self, values, PARAMETERS)

    def reset(self, seed: int) -> bytes:
        """Reset the simulation (made on the first reset) and report every agent's first decision.

        Args:
            seed: the handshake's seed (a seed sent as a parameter takes its place).

        Returns:
            The serialized observation message.
        """
        seed = reset_seed(self, seed)
        if self.sim is None:
            self.sim = SoccerSim(self.config, seed, self.arena_seeds)
            report = self.sim.opening
        else:
            report = self.sim.reset(self.config)
        self.log.write(f"reset: {self.config}\n")
        return self._message(report)

    def step(self, actions: np.ndarray) -> bytes:
        """Step the simulation.

        Args:
            actions: (slots, 3) discrete actions by slot.

        Returns:
            The serialized observation message.
        """
        assert self.sim is not None
        return self._message(self.sim.step(actions))

    def _message(self, report: SoccerReport) -> bytes:
        team = report.team
        listings = []
        for index, (behavior, encoder) in enumerate(zip(BEHAVIORS, self.encoders, strict=True)):
            rows = np.flatnonzero(team == index)
            listings.append((behavior.encode(), encoder.agent_infos(
                report.agent_id[rows], report.reward[rows], report.done[rows],
                report.interrupted[rows], report.obs[rows], report.group_id[rows],
                report.group_reward[rows])))
            self.order[index] = report.slot[rows][~report.done[rows]]
        init = b""
        if not self.announced:
            init = initialization_output(NAME, [(behavior, 0, BRANCHES) for behavior in
                                                BEHAVIORS]).SerializeToString()
            self.announced = True
        return unity_message(listings, init)

    def actions_from(self, rl_input: Any) -> np.ndarray:
        """The step's actions of a message from Python, by slot.

        Args:
            rl_input: the message's `UnityRLInputProto`.

        Returns:
            (slots, 3) discrete actions: each behavior's answers in the order of its deciding agents;
                zeros (no move) for a missing or malformed answer (logged).
        """
        sim = self.sim
        assert sim is not None
        actions = np.zeros((sim.num_agents, len(BRANCHES)), dtype=np.int64)
        for behavior, order in zip(BEHAVIORS, self.order, strict=True):
            listing = rl_input.agent_actions.get(behavior)
            if listing is None or len(listing.value) == 0:
                if len(order):
                    self.log.write(f"no actions for {behavior}'s {len(order)} agents; "
                                   "using zeros\n")
                continue
            rows: Any = discrete_actions(listing.SerializeToString(), len(listing.value),
                                         len(BRANCHES))
            if rows is None:  # another layout: field by field
                rows = [list(a.discrete_actions) for a in listing.value]
            if len(rows) != len(order) or not isinstance(rows, np.ndarray) and any(
                    len(row) != len(BRANCHES) for row in rows):
                self.log.write(f"unexpected actions for {behavior}: {len(rows)} rows for "
                               f"{len(order)} agents; using zeros\n")
                continue
            actions[order] = np.asarray(rows, dtype=np.int64)
        return actions
