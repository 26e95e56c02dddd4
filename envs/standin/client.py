"""The stand-in player: its command line, and Huggy's side of the protocol (`StandIn`, driving
`HuggySim`); the exchange itself is `envs.standin.protocol`.

Started like a Unity player: `FILE --mlagents-port N [-nographics -batchmode] [-logFile PATH]`
(unknown arguments are ignored, as Unity does), plays Huggy; with `--scene soccertwos` the
SoccerTwos scene (`envs.standin.soccer`); with `--behavior-spec JSON` any behaviors
(`envs.standin.spec_client`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from envs.standin import poses
from envs.standin.launcher import SCENES
from envs.standin.protocol import (
    PACKAGE_VERSION,
    apply_parameters,
    handshake_message,
    initialization_output,
    reset_seed,
    run,
)
from envs.standin.sim import ACT_SIZE, OBS_SIZE, HuggySim, SimConfig
from envs.standin.soccer.standin import SoccerStandIn
from envs.standin.spec_client import SpecStandIn, parse_behavior_spec
from envs.standin.wire import ObservationEncoder, continuous_actions

BEHAVIOR = "Huggy?team=0"
PARAMETERS = {"num_agents", "max_steps", "arena_size", "episode_length", "episode_length_step",
              "echo_actions", "seed", poses.RENDER_PARAMETER}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The stand-in's command line, as a Unity player takes it.

    Args:
        argv: the arguments; unknown ones are ignored, as Unity does.

    Returns:
        The parsed arguments.
    """
    parser = argparse.ArgumentParser(prog="huggy-standin", add_help=True)
    parser.add_argument("--mlagents-port", type=int, default=5004)
    parser.add_argument("-logFile", "-logfile", dest="log_file", default=None)
    parser.add_argument("--scene", choices=SCENES, default="huggy",
                        help="the built-in scene to play (default: huggy)")
    parser.add_argument("--behavior-spec", default=None,
                        help="JSON spec of any behavior, or a list of behaviors, to play "
                             "instead of a built-in scene (envs.standin.spec_client)")
    args, _unknown = parser.parse_known_args(list(argv))
    return args


class StandIn:
    """Huggy's side of the protocol: the simulation, the agents awaiting decisions, pending
    parameters.

    Args:
        log: where to write what happens.
        port: reported in observations only with `SimConfig.echo_actions`.
    """

    def __init__(self, log: TextIO, port: int = 0) -> None:
        self.log = log
        self.port = port
        self.last_actions = np.zeros((0, ACT_SIZE), dtype=np.float32)  # per slot, for echo
        self.sim: HuggySim | None = None
        self.config = SimConfig()
        self.pending_seed: int | None = None
        self.encoder = ObservationEncoder(BEHAVIOR, OBS_SIZE)
        self.announced = False
        self.order = np.zeros(0, dtype=np.int64)  # slot of each decision row, in message order

    def initialization_output(self, with_brain: bool) -> bytes:
        """The serialized initialization output of the Huggy player.

        Args:
            with_brain: include the behavior's brain parameters (the first time it appears).

        Returns:
            The serialized `UnityRLInitializationOutputProto`.
        """
        brains = [(BEHAVIOR, ACT_SIZE, ())] if with_brain else []
        return initialization_output("Huggy", brains).SerializeToString()

    def handshake_message(self) -> bytes:
        """The player's first message.

        Returns:
            The serialized `UnityMessageProto`.
        """
        return handshake_message("Huggy")

    def apply_parameters(self, side_channel: bytes) -> None:
        """Apply the EnvironmentParameters of a message (`protocol.apply_parameter_values`).

        Args:
            side_channel: the message's side-channel bytes.
        """
        apply_parameters(self, side_channel, PARAMETERS)

    def reset(self, seed: int) -> bytes:
        """Reset the simulation (made on the first reset) and report every agent's first decision.

        Args:
            seed: the handshake's seed (a seed sent as a parameter takes its place).

        Returns:
            The serialized observation message.
        """
        seed = reset_seed(self, seed)
        config = self.config
        if self.sim is None:
            self.sim = HuggySim(config, seed)
            obs = self.sim.observe()
        else:
            obs = self.sim.reset(config)
        self.log.write(f"reset: {config}\n")
        zeros = np.zeros(self.sim.num_agents)
        self.order = np.arange(self.sim.num_agents)
        self.last_actions = np.zeros((self.sim.num_agents, ACT_SIZE), dtype=np.float32)
        return self._message(self.sim.agent_id, zeros, zeros.astype(bool), zeros.astype(bool),
                             self._echo(obs), self._poses(np.zeros(0, np.int64)))

    def _echo(self, obs: np.ndarray) -> np.ndarray:
        """`obs` (one row per slot) with the echo columns of `SimConfig.echo_actions`."""
        if not self.config.echo_actions:
            return obs
        obs = obs.copy()
        obs[:, :ACT_SIZE] = self.last_actions
        obs[:, ACT_SIZE] = np.arange(len(obs))
        obs[:, ACT_SIZE + 1] = self.port
        return obs

    def step(self, actions: np.ndarray) -> bytes:
        """Step the simulation with one action row per slot.

        A finished agent reports its terminal step, and its successor (a new id, as Unity gives every
        episode) asks for its first decision in the same message.

        Args:
            actions: (agents, ACT_SIZE) float32, by slot.

        Returns:
            The serialized observation message.
        """
        sim = self.sim
        assert sim is not None
        r = sim.step(actions)
        self.last_actions = actions
        r.obs, r.new_obs = self._echo(r.obs), self._echo(r.new_obs)
        side_channel = self._poses(r.agent_id[r.done])
        if not r.done.any():
            self.order = np.arange(sim.num_agents)
            return self._message(r.agent_id, r.reward, r.done, r.max_step_reached, r.obs,
                                 side_channel)
        # A finished agent reports its terminal step, and its successor (a new id, as Unity
        # gives every episode) asks for its first decision in the same message.
        fresh = np.flatnonzero(r.done)
        self.order = np.concatenate([np.flatnonzero(~r.done), fresh])
        return self._message(
            np.concatenate([r.agent_id, r.new_agent_id[fresh]]),
            np.concatenate([r.reward, np.zeros(len(fresh), np.float32)]),
            np.concatenate([r.done, np.zeros(len(fresh), bool)]),
            np.concatenate([r.max_step_reached, np.zeros(len(fresh), bool)]),
            np.concatenate([r.obs, r.new_obs[fresh]]), side_channel,
        )

    def _poses(self, finished_ids: np.ndarray) -> bytes:
        """The render side channel's record (every dog's pose, and the last poses of the agents
        `finished_ids`), or nothing unless the `render` parameter is on."""
        sim = self.sim
        if sim is None or not sim.config.render:
            return b""
        return poses.encode_record(sim.agent_id, sim.poses(), finished_ids, sim.final_poses)

    def _message(self, ids: np.ndarray, reward: np.ndarray, done: np.ndarray,
                 max_step: np.ndarray, obs: np.ndarray, side_channel: bytes = b"") -> bytes:
        infos = self.encoder.agent_infos(ids, reward, done, max_step, obs)
        init = b""
        if not self.announced:
            init, self.announced = self.initialization_output(True), True
        return self.encoder.message(infos, init, side_channel)

    def actions_from(self, rl_input: object) -> np.ndarray:
        """The step's actions of a message from Python, by slot.

        Args:
            rl_input: the message's `UnityRLInputProto`.

        Returns:
            (agents, ACT_SIZE) float32; zeros where Python sent none, or a number of rows other than
                the agents' (logged).
        """
        sim = self.sim
        assert sim is not None
        n = sim.num_agents
        listing = rl_input.agent_actions.get(BEHAVIOR)  # type: ignore[attr-defined]
        actions = np.zeros((n, ACT_SIZE), dtype=np.float32)
        if listing is None or len(listing.value) == 0:
            return actions
        rows: np.ndarray | list[list[float]] | None = continuous_actions(
            listing.SerializeToString(), len(listing.value), ACT_SIZE)
        if rows is None:  # another layout: field by field
            rows = [list(a.continuous_actions) for a in listing.value]
        if len(rows) != n or not isinstance(rows, np.ndarray) and any(
                len(row) != ACT_SIZE for row in rows):
            self.log.write(f"unexpected actions: {len(rows)} rows for {n} agents; using zeros\n")
            return actions
        # Python answers in the order of the decision agents it received (`self.order`).
        actions[self.order] = np.asarray(rows, dtype=np.float32)
        return actions


def main(argv: Sequence[str] | None = None) -> int:
    """The stand-in player: Huggy, the `--scene` it names, or with `--behavior-spec` the behaviors it
    describes.

    Args:
        argv: the command line without the program name; None reads `sys.argv`.

    Returns:
        The exit code of `protocol.run`.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.log_file:
        os.makedirs(os.path.dirname(os.path.abspath(args.log_file)), exist_ok=True)
        log: TextIO = open(args.log_file, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    else:
        log = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
    with log:
        log.write(f"stand-in {PACKAGE_VERSION}, scene {args.scene} (pid {os.getpid()})\n")
        standin: Any
        if args.behavior_spec is not None:
            standin = SpecStandIn(log, parse_behavior_spec(args.behavior_spec))
        elif args.scene == "soccertwos":
            standin = SoccerStandIn(log)
        else:
            standin = StandIn(log, args.mlagents_port)
        return run(standin, args.mlagents_port, log)
