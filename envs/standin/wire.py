"""Protobuf wire encoding of the stand-in's observation messages, straight from numpy arrays.

Building one `AgentInfoProto` per agent through the protobuf API costs ~10 µs per field access;
the stand-in instead writes the bytes of a `UnityMessageProto` directly (field numbers from the
mlagents-envs descriptors, checked against the parsed message in tests) and hands them to gRPC.
"""

from __future__ import annotations

import numpy as np

HEADER_OK = bytes([0x0A, 0x03, 0x08, 0xC8, 0x01])  # UnityMessageProto.header = {status: 200}


def varint(value: int) -> bytes:
    """Base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def length_delimited(field: int, payload: bytes) -> bytes:
    """Tag, length and payload of a message/bytes/string field."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


class ObservationEncoder:
    """Encodes a step's agents into a complete `UnityMessageProto` for one behavior."""

    def __init__(self, behavior: str, obs_size: int, sensor_name: str = "VectorSensor") -> None:
        self.behavior = behavior.encode()
        # ObservationProto: shape=[obs_size] (1, packed), float_data (4) {data (1, packed)},
        # dimension_properties=[NONE=1] (6, packed), name (8); compression NONE and type DEFAULT
        # are proto3 defaults and therefore absent.
        float_data_head = varint(1 << 3 | 2) + varint(4 * obs_size)
        float_data_len = len(float_data_head) + 4 * obs_size
        self._obs_head = (
            length_delimited(1, varint(obs_size))
            + varint(4 << 3 | 2)
            + varint(float_data_len)
            + float_data_head
        )
        self._obs_tail = length_delimited(6, varint(1)) + length_delimited(8, sensor_name.encode())
        obs_len = len(self._obs_head) + 4 * obs_size + len(self._obs_tail)
        self._observations_field = varint(13 << 3 | 2) + varint(obs_len)  # AgentInfoProto.obs
        self.obs_size = obs_size

    def agent_infos(self, agent_id: np.ndarray, reward: np.ndarray, done: np.ndarray,
                    max_step: np.ndarray, obs: np.ndarray) -> list[bytes]:
        """The wire bytes of one `AgentInfoProto` per row (arrays of equal length)."""
        width = 4 * self.obs_size
        floats = np.ascontiguousarray(obs, dtype="<f4").tobytes()
        rewards = np.ascontiguousarray(reward, dtype="<f4").tobytes()
        middle, tail = self._observations_field + self._obs_head, self._obs_tail
        return [
            b"".join((
                b"\x3d", rewards[4 * k : 4 * k + 4],  # reward = 7, fixed32
                b"\x40\x01" if d else b"",  # done = 8
                b"\x48\x01" if m else b"",  # max_step_reached = 9
                b"\x50", varint(i),  # id = 10
                middle, floats[k * width : (k + 1) * width], tail,  # observations = 13
            ))
            for k, (i, d, m) in enumerate(
                zip(agent_id.tolist(), done.tolist(), max_step.tolist(), strict=True)
            )
        ]

    def message(self, agent_infos: list[bytes], initialization_output: bytes = b"") -> bytes:
        """A `UnityMessageProto` (status 200) whose rl_output holds `agent_infos`.

        `initialization_output` is the serialized `UnityRLInitializationOutputProto` to include
        (with the brain parameters) the first time the behavior appears, else empty.
        """
        listing = b"".join(length_delimited(1, info) for info in agent_infos)
        entry = length_delimited(1, self.behavior) + length_delimited(2, listing)
        rl_output = length_delimited(2, entry)  # UnityRLOutputProto.agentInfos (map) = 2
        output = length_delimited(1, rl_output)
        if initialization_output:
            output += length_delimited(2, initialization_output)
        return HEADER_OK + length_delimited(2, output)


def empty_message() -> bytes:
    """A `UnityMessageProto` with only the status-200 header."""
    return HEADER_OK
