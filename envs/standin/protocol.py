"""The Unity side of the ML-Agents protocol (communication 1.5.0), shared by every stand-in mode:
the handshake, environment parameters, seeds, and the exchange loop that drives a stand-in.

Started like a Unity player: `FILE --mlagents-port N [-nographics -batchmode] [-logFile PATH]`
(unknown arguments are ignored, as Unity does). Exchange sequence: initialization output ->
initialization input (seed); empty message -> first command; then one observation message per
command (RESET or STEP) until Python answers with status 400 or QUIT. The process exits by itself
when the Python side disappears: a failed call, or its parent process gone.

A stand-in (`client.StandIn` for Huggy, `soccer.standin.SoccerStandIn` for SoccerTwos,
`spec_client.SpecStandIn` for any behaviors) has
`handshake_message()`, `apply_parameters(side_channel)`, `reset(seed)`, `step(actions)`,
`actions_from(rl_input)` and a `sim` that is None until the first reset.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TextIO

from envs.http2 import UnaryClient
from envs.lockstep import EXCHANGE_PATH
from envs.standin.wire import empty_message

COMMUNICATION_VERSION = "1.5.0"
PACKAGE_VERSION = "2.2.1-exp.1"
ENVIRONMENT_PARAMETERS_CHANNEL = uuid.UUID("534c891e-810f-11ea-a9d0-822485860400")
CONNECT_TIMEOUT_S = 60.0


def parse_environment_parameters(side_channel: bytes) -> dict[str, float]:
    """The float parameters sent on the EnvironmentParameters channel.

    Args:
        side_channel: a message's side-channel bytes; other channels, and samplers, are skipped.

    Returns:
        {key: value}.
    """
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
    """Apply the EnvironmentParameters in a message's side channel to a stand-in (see
    `apply_parameter_values`).

    Args:
        stand_in: the stand-in.
        side_channel: the message's side-channel bytes.
        allowed: the keys it takes.
    """
    apply_parameter_values(stand_in, parse_environment_parameters(side_channel), allowed)


def apply_parameter_values(stand_in: Any, values: dict[str, float], allowed: set[str]) -> None:
    """Apply environment parameters to a stand-in, effective at its next reset.

    `seed` is kept for the next reset; the others replace fields of its `config` (a dataclass with
    `validated()`). Unknown keys and invalid values are logged and ignored, as Unity would.

    Args:
        stand_in: a `StandIn`, `SoccerStandIn` or `spec_client.SpecStandIn`.
        values: {key: value}.
        allowed: the keys it takes.
    """
    for key, value in values.items():
        if key not in allowed:
            stand_in.log.write(f"ignoring unknown environment parameter {key}={value}\n")
        elif key == "seed":
            stand_in.pending_seed = int(value)
        else:
            try:
                stand_in.config = configured(stand_in.config, key, value)
            except ValueError as error:  # keep the previous value, as Unity would
                stand_in.log.write(f"ignoring environment parameter {key}={value}: {error}\n")


def configured(config: Any, key: str, value: float) -> Any:
    """A stand-in's configuration with one field set, validated.

    Args:
        config: a dataclass with `validated()`.
        key: the field.
        value: its new value.

    Returns:
        The new configuration.

    Raises:
        ValueError: the value is refused (naming the field), an integer field given an infinite
            value included.
    """
    try:
        return replace(config, **{key: value}).validated()
    except OverflowError as error:  # int() of an infinity
        raise ValueError(str(error)) from None


def initialization_output(name: str, brains: Sequence[tuple[str, int, tuple[int, ...]]] = ()
                          ) -> Any:
    """The `UnityRLInitializationOutputProto` a Unity player sends.

    Args:
        name: the player's name.
        brains: (behavior name as on the wire, continuous actions, discrete branch sizes) of each
            behavior.

    Returns:
        The message, with ML-Agents' capabilities and each behavior's action spec.
    """
    from mlagents_envs.communicator_objects.unity_rl_initialization_output_pb2 import (
        UnityRLInitializationOutputProto,
    )

    out = UnityRLInitializationOutputProto(
        name=name, communication_version=COMMUNICATION_VERSION, package_version=PACKAGE_VERSION)
    caps = out.capabilities
    caps.baseRLCapabilities = caps.concatenatedPngObservations = True
    caps.compressedChannelMapping = caps.hybridActions = caps.trainingAnalytics = True
    caps.variableLengthObservation = caps.multiAgentGroups = True
    for behavior, continuous, branches in brains:
        brain = out.brain_parameters.add()
        brain.brain_name = behavior
        brain.is_training = True
        brain.action_spec.num_continuous_actions = continuous
        if branches:
            brain.action_spec.num_discrete_actions = len(branches)
            brain.action_spec.discrete_branch_sizes.extend(branches)
    return out


def handshake_message(name: str) -> bytes:
    """The first message of a Unity player: its initialization output alone.

    Args:
        name: the player's name.

    Returns:
        The serialized `UnityMessageProto`.
    """
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    message = UnityMessageProto()
    message.header.status = 200
    message.unity_output.rl_initialization_output.CopyFrom(initialization_output(name))
    return message.SerializeToString()


def reset_seed(stand_in: Any, seed: int) -> int:
    """The seed of a stand-in's reset.

    Args:
        stand_in: the stand-in; a seed sent as an environment parameter since its last reset is
            taken (and its simulation reseeded with it).
        seed: the handshake's seed.

    Returns:
        The pending seed, else `seed`.
    """
    if stand_in.pending_seed is not None:
        seed, stand_in.pending_seed = stand_in.pending_seed, None
        if stand_in.sim is not None:
            stand_in.sim.reseed(seed)
    return seed


def _watch_parent(parent: int) -> None:
    """Exit when the process that started us is gone (Python side killed without closing)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(3)


def run(standin: Any, port: int, log: TextIO, connect: Callable[[int], Any] | None = None) -> int:
    """Connect to the Python side on 127.0.0.1 and serve it with a stand-in until told to stop.

    Args:
        standin: the stand-in.
        port: the Python side's port.
        log: where to write what happens.
        connect: opens the connection instead (`connect(port)`: an object with
            `call(bytes) -> bytes` and `close()`); None: the stand-ins' own `UnaryClient`.

    Returns:
        The exit code: 0 when closed by Python, 1 when Python is gone or never answered.
    """
    from mlagents_envs.communicator_objects.command_pb2 import QUIT, RESET
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    try:
        client = (connect(port) if connect is not None
                  else UnaryClient("127.0.0.1", port, EXCHANGE_PATH, CONNECT_TIMEOUT_S))
    except OSError as error:
        log.write(f"exiting: no Python side on port {port} ({error})\n")
        return 1

    def exchange(message: bytes) -> Any:
        return UnityMessageProto.FromString(client.call(message))

    try:
        reply = exchange(standin.handshake_message())
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
    except OSError as error:  # ExchangeError among them
        log.write(f"exiting: the Python side is gone ({error})\n")
        return 1
    finally:
        client.close()


