"""The stand-in's Unity side of the ML-Agents protocol: a gRPC client driving `HuggySim`.

Started like a Unity player: `FILE --mlagents-port N [-nographics -batchmode] [-logFile PATH]`
(unknown arguments are ignored, as Unity does). Exchange sequence (communication 1.5.0):
initialization output -> initialization input (seed); empty message -> first command; then one
observation message per command (RESET or STEP) until Python answers with status 400 or QUIT.
It exits by itself when the Python side disappears: a failed call, or its parent process gone.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from envs.standin.sim import ACT_SIZE, OBS_SIZE, HuggySim, SimConfig
from envs.standin.wire import ObservationEncoder, continuous_actions, empty_message

BEHAVIOR = "Huggy?team=0"
COMMUNICATION_VERSION = "1.5.0"
PACKAGE_VERSION = "2.2.1-exp.1"
ENVIRONMENT_PARAMETERS_CHANNEL = uuid.UUID("534c891e-810f-11ea-a9d0-822485860400")
EXCHANGE = "/communicator_objects.UnityToExternalProto/Exchange"
CONNECT_TIMEOUT_S = 60.0
PARAMETERS = {"num_agents", "max_steps", "arena_size", "episode_length", "episode_length_step",
              "echo_actions", "seed"}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="huggy-standin", add_help=True)
    parser.add_argument("--mlagents-port", type=int, default=5004)
    parser.add_argument("-logFile", "-logfile", dest="log_file", default=None)
    parser.add_argument("--behavior-spec", default=None,
                        help="JSON spec of any behavior to play instead of Huggy "
                             "(envs.standin.spec_client)")
    args, _unknown = parser.parse_known_args(list(argv))
    return args


def parse_environment_parameters(side_channel: bytes) -> dict[str, float]:
    """Float parameters sent on the EnvironmentParameters channel; other channels are skipped."""
    values: dict[str, float] = {}
    offset = 0
    while offset + 20 <= len(side_channel):
        channel = uuid.UUID(bytes_le=side_channel[offset : offset + 16])
        (length,) = struct.unpack_from("<i", side_channel, offset + 16)
        payload = side_channel[offset + 20 : offset + 20 + length]
        offset += 20 + length
        if channel != ENVIRONMENT_PARAMETERS_CHANNEL:
            continue
        (key_len,) = struct.unpack_from("<i", payload, 0)
        key = payload[4 : 4 + key_len].decode("ascii")
        (kind,) = struct.unpack_from("<i", payload, 4 + key_len)
        if kind == 0:  # FLOAT; samplers are not supported by the stand-in
            (values[key],) = struct.unpack_from("<f", payload, 8 + key_len)
    return values


def apply_parameters(stand_in: Any, side_channel: bytes, allowed: set[str]) -> None:
    """Apply the EnvironmentParameters in `side_channel` to `stand_in` (a `StandIn` or a
    `spec_client.SpecStandIn`): `seed` is kept for the next reset, the others replace fields of
    its `config` (a dataclass with `validated()`), effective at the next reset; unknown keys and
    invalid values are logged and ignored, as Unity would."""
    for key, value in parse_environment_parameters(side_channel).items():
        if key not in allowed:
            stand_in.log.write(f"ignoring unknown environment parameter {key}={value}\n")
        elif key == "seed":
            stand_in.pending_seed = int(value)
        else:
            candidate = type(stand_in.config)(**{**vars(stand_in.config), key: value})
            try:
                stand_in.config = candidate.validated()
            except ValueError as error:  # keep the previous value, as Unity would
                stand_in.log.write(f"ignoring environment parameter {key}={value}: {error}\n")


def initialization_output(name: str, behavior: str | None, continuous: int,
                          branches: tuple[int, ...] = ()) -> Any:
    """The `UnityRLInitializationOutputProto` a Unity player named `name` sends, with the
    behavior's brain parameters (its action spec) when `behavior` is given."""
    from mlagents_envs.communicator_objects.unity_rl_initialization_output_pb2 import (
        UnityRLInitializationOutputProto,
    )

    out = UnityRLInitializationOutputProto(
        name=name, communication_version=COMMUNICATION_VERSION, package_version=PACKAGE_VERSION)
    caps = out.capabilities
    caps.baseRLCapabilities = caps.concatenatedPngObservations = True
    caps.compressedChannelMapping = caps.hybridActions = caps.trainingAnalytics = True
    caps.variableLengthObservation = caps.multiAgentGroups = True
    if behavior is not None:
        brain = out.brain_parameters.add()
        brain.brain_name = behavior
        brain.is_training = True
        brain.action_spec.num_continuous_actions = continuous
        if branches:
            brain.action_spec.num_discrete_actions = len(branches)
            brain.action_spec.discrete_branch_sizes.extend(branches)
    return out


def handshake_message(name: str) -> bytes:
    """The first message of a Unity player named `name`: its initialization output alone."""
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    message = UnityMessageProto()
    message.header.status = 200
    message.unity_output.rl_initialization_output.CopyFrom(initialization_output(name, None, 0))
    return message.SerializeToString()


def reset_seed(stand_in: Any, seed: int) -> int:
    """The seed of this reset of `stand_in`: one sent as an environment parameter since the last
    reset (the simulation is reseeded with it), else `seed` (the handshake's)."""
    if stand_in.pending_seed is not None:
        seed, stand_in.pending_seed = stand_in.pending_seed, None
        if stand_in.sim is not None:
            stand_in.sim.reseed(seed)
    return seed


class StandIn:
    """Protocol state: the simulation, the agents awaiting decisions, pending parameters.
    `port` is only reported in observations with `SimConfig.echo_actions`."""

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
        return initialization_output("Huggy", BEHAVIOR if with_brain else None,
                                     ACT_SIZE).SerializeToString()

    def handshake_message(self) -> bytes:
        return handshake_message("Huggy")

    def apply_parameters(self, side_channel: bytes) -> None:
        apply_parameters(self, side_channel, PARAMETERS)

    def reset(self, seed: int) -> bytes:
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
                             self._echo(obs))

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
        sim = self.sim
        assert sim is not None
        r = sim.step(actions)
        self.last_actions = actions
        r.obs, r.new_obs = self._echo(r.obs), self._echo(r.new_obs)
        if not r.done.any():
            self.order = np.arange(sim.num_agents)
            return self._message(r.agent_id, r.reward, r.done, r.max_step_reached, r.obs)
        # A finished agent reports its terminal step, and its successor (a new id, as Unity
        # gives every episode) asks for its first decision in the same message.
        fresh = np.flatnonzero(r.done)
        self.order = np.concatenate([np.flatnonzero(~r.done), fresh])
        return self._message(
            np.concatenate([r.agent_id, r.new_agent_id[fresh]]),
            np.concatenate([r.reward, np.zeros(len(fresh), np.float32)]),
            np.concatenate([r.done, np.zeros(len(fresh), bool)]),
            np.concatenate([r.max_step_reached, np.zeros(len(fresh), bool)]),
            np.concatenate([r.obs, r.new_obs[fresh]]),
        )

    def _message(self, ids: np.ndarray, reward: np.ndarray, done: np.ndarray,
                 max_step: np.ndarray, obs: np.ndarray) -> bytes:
        infos = self.encoder.agent_infos(ids, reward, done, max_step, obs)
        init = b""
        if not self.announced:
            init, self.announced = self.initialization_output(True), True
        return self.encoder.message(infos, init)

    def actions_from(self, rl_input: object) -> np.ndarray:
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
        if len(rows) != n or any(len(row) != ACT_SIZE for row in rows):
            self.log.write(f"unexpected actions: {len(rows)} rows for {n} agents; using zeros\n")
            return actions
        # Python answers in the order of the decision agents it received (`self.order`).
        actions[self.order] = np.asarray(rows, dtype=np.float32)
        return actions


def _watch_parent(parent: int) -> None:
    """Exit when the process that started us is gone (Python side killed without closing)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(3)


def run(port: int, log: TextIO, behavior_spec: str | None = None) -> int:
    """Connect to the Python trainer on 127.0.0.1:`port` and serve until told to stop: as Huggy,
    or with `behavior_spec` (JSON) as that behavior (`envs.standin.spec_client`)."""
    import grpc
    from mlagents_envs.communicator_objects.command_pb2 import QUIT, RESET
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    standin: Any = StandIn(log, port)
    if behavior_spec is not None:
        from envs.standin.spec_client import SpecStandIn, parse_behavior_spec

        standin = SpecStandIn(log, *parse_behavior_spec(behavior_spec))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    exchange = channel.unary_unary(EXCHANGE, response_deserializer=UnityMessageProto.FromString)
    try:
        reply = exchange(standin.handshake_message(), wait_for_ready=True,
                         timeout=CONNECT_TIMEOUT_S)
        seed = reply.unity_input.rl_initialization_input.seed
        log.write(f"connected on port {port}, seed {seed}\n")
        reply = exchange(empty_message())
        while True:
            if reply.header.status != 200:
                log.write(f"closing: status {reply.header.status}\n")
                return 0
            rl_input = reply.unity_input.rl_input
            if rl_input.command == QUIT:
                log.write("closing: QUIT\n")
                return 0
            standin.apply_parameters(rl_input.side_channel)
            if rl_input.command == RESET or standin.sim is None:
                out = standin.reset(seed)
            else:
                out = standin.step(standin.actions_from(rl_input))
            reply = exchange(out)
    except grpc.RpcError as error:
        log.write(f"exiting: the Python side is gone ({error.code().name})\n")
        return 1
    finally:
        channel.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.log_file:
        os.makedirs(os.path.dirname(os.path.abspath(args.log_file)), exist_ok=True)
        log: TextIO = open(args.log_file, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    else:
        log = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
    with log:
        log.write(f"Huggy stand-in {PACKAGE_VERSION} (pid {os.getpid()})\n")
        return run(args.mlagents_port, log, args.behavior_spec)
