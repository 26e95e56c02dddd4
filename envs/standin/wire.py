"""Protobuf wire encoding of the stand-in's observation messages, straight from numpy arrays.

Building one `AgentInfoProto` per agent through the protobuf API costs a Python call per field;
the stand-in instead writes the bytes of a `UnityMessageProto` directly (field numbers from the
mlagents-envs descriptors, checked against the parsed message in tests) and hands them to gRPC.
"""

from __future__ import annotations

import numpy as np

from envs.protobuf_wire import length_delimited, read_varint, varint, varint_size

HEADER_OK = bytes([0x0A, 0x03, 0x08, 0xC8, 0x01])  # UnityMessageProto.header = {status: 200}


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
        self._tables: dict[tuple[int, int], tuple] = {}  # see `_table`

    def agent_infos(self, agent_id: np.ndarray, reward: np.ndarray, done: np.ndarray,
                    max_step: np.ndarray, obs: np.ndarray) -> bytes:
        """The wire bytes of a `ListAgentInfoProto` with one `AgentInfoProto` per row (arrays of
        equal length). Rows without a done or max-step flag whose ids have varints of one length
        (every step but those where an episode ends) are written as one numpy table."""
        ids = np.asarray(agent_id, dtype=np.int64)
        if len(ids) and not (done.any() or max_step.any()):
            low, high = int(ids.min()), int(ids.max())
            if low >= 0 and varint_size(low) == varint_size(high):
                return self._table(ids, varint_size(high), reward, obs)
        width = 4 * self.obs_size
        floats = np.ascontiguousarray(obs, dtype="<f4").tobytes()
        rewards = np.ascontiguousarray(reward, dtype="<f4").tobytes()
        middle, tail = self._observations_field + self._obs_head, self._obs_tail
        return b"".join(
            length_delimited(1, b"".join((
                b"\x3d", rewards[4 * k : 4 * k + 4],  # reward = 7, fixed32
                b"\x40\x01" if d else b"",  # done = 8
                b"\x48\x01" if m else b"",  # max_step_reached = 9
                b"\x50", varint(i),  # id = 10
                middle, floats[k * width : (k + 1) * width], tail,  # observations = 13
            )))
            for k, (i, d, m) in enumerate(
                zip(ids.tolist(), np.asarray(done).tolist(), np.asarray(max_step).tolist(),
                    strict=True)
            )
        )

    def _table(self, ids: np.ndarray, id_size: int, reward: np.ndarray, obs: np.ndarray) -> bytes:
        """Rows of equal layout (value tag and length, reward, id, observation) as one table,
        whose constant columns are written once per (rows, id size)."""
        key = (len(ids), id_size)
        if key not in self._tables:
            body = (5 + 1 + id_size + len(self._observations_field) + len(self._obs_head)
                    + 4 * self.obs_size + len(self._obs_tail))
            head = b"\x0a" + varint(body) + b"\x3d"  # ListAgentInfoProto.value; reward = 7
            middle = self._observations_field + self._obs_head
            table = np.empty((len(ids), len(head) + body - 1), dtype=np.uint8)
            reward_at = len(head)
            id_at = reward_at + 5  # after the 4 reward bytes and the id tag
            obs_at = id_at + id_size + len(middle)
            table[:, :reward_at] = np.frombuffer(head, np.uint8)
            table[:, reward_at + 4] = 0x50  # id = 10, varint
            table[:, id_at + id_size : obs_at] = np.frombuffer(middle, np.uint8)
            table[:, obs_at + 4 * self.obs_size :] = np.frombuffer(self._obs_tail, np.uint8)
            shifts = 7 * np.arange(id_size)
            more = np.where(np.arange(id_size) < id_size - 1, 0x80, 0)
            self._tables[key] = (table, reward_at, id_at, obs_at, shifts, more)
        table, reward_at, id_at, obs_at, shifts, more = self._tables[key]
        table[:, reward_at : reward_at + 4] = np.asarray(reward, "<f4").view(np.uint8).reshape(
            -1, 4)
        table[:, id_at : id_at + id_size] = (ids[:, None] >> shifts) & 0x7F | more
        table[:, obs_at : obs_at + 4 * self.obs_size] = np.asarray(obs, "<f4").view(
            np.uint8).reshape(len(ids), -1)
        return table.tobytes()

    def message(self, agent_infos: bytes, initialization_output: bytes = b"",
                side_channel: bytes = b"") -> bytes:
        """A `UnityMessageProto` (status 200) whose rl_output holds `agent_infos` (the bytes
        `agent_infos()` gives).

        `initialization_output` is the serialized `UnityRLInitializationOutputProto` to include
        (with the brain parameters) the first time the behavior appears, else empty.
        `side_channel` holds the side-channel records to send (none when empty).
        """
        listing = agent_infos
        entry = length_delimited(1, self.behavior) + length_delimited(2, listing)
        rl_output = length_delimited(2, entry)  # UnityRLOutputProto.agentInfos (map) = 2
        if side_channel:
            rl_output += length_delimited(3, side_channel)  # UnityRLOutputProto.side_channel
        output = length_delimited(1, rl_output)
        if initialization_output:
            output += length_delimited(2, initialization_output)
        return HEADER_OK + length_delimited(2, output)


def continuous_actions(listing: bytes, count: int, width: int) -> np.ndarray | None:
    """The `continuous_actions` of a serialized `ListAgentActionProto` of `count` agents, as a
    (count, width) float32 table, read in bulk when every agent's entry has the layout of the
    first (as mlagents-envs writes them: the deprecated copy and the continuous actions, packed);
    None when they differ or hold no `width` continuous actions (read the message instead)."""
    if count < 1 or len(listing) % count:
        return None
    stride = len(listing) // count
    try:
        if listing[0] != 0x0A:  # ListAgentActionProto.value = 1
            return None
        size, offset = read_varint(listing, 1)
        if offset + size != stride:
            return None
        fixed, start = list(range(offset)), None
        while offset < stride:  # the fields of the first AgentActionProto
            tag, after_tag = read_varint(listing, offset)
            if tag & 7 != 2:  # only length-delimited (packed) fields are expected
                return None
            size, after_size = read_varint(listing, after_tag)
            fixed.extend(range(offset, after_size))
            if tag >> 3 == 6:  # continuous_actions
                if size != 4 * width:
                    return None
                start = after_size
            offset = after_size + size
    except IndexError:
        return None
    if start is None or offset != stride:
        return None
    table = np.frombuffer(listing, np.uint8).reshape(count, stride)
    columns = np.array(fixed)
    if not (table[:, columns] == table[0, columns]).all():  # same tags and sizes in every entry
        return None
    return table[:, start : start + 4 * width].copy().view("<f4").astype(np.float32)


def empty_message() -> bytes:
    """A `UnityMessageProto` with only the status-200 header."""
    return HEADER_OK
