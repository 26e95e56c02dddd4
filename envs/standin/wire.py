"""Protobuf wire encoding of the stand-in's messages, straight from numpy arrays.

Building one `AgentInfoProto` per agent through the protobuf API costs a Python call per field;
the stand-in instead writes the bytes of a `UnityMessageProto` directly (field numbers from the
mlagents-envs descriptors, checked against the parsed message in tests) and hands them to gRPC.
Actions come back the same way: `continuous_actions` and `discrete_actions` read a
`ListAgentActionProto` in bulk when its entries share one layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envs.protobuf_wire import length_delimited, read_varint, varint, varint_size

HEADER_OK = bytes([0x0A, 0x03, 0x08, 0xC8, 0x01])  # UnityMessageProto.header = {status: 200}
_VARINT_LIMITS = np.array([1 << 7, 1 << 14, 1 << 21, 1 << 28, 1 << 35], dtype=np.int64)
_SHIFTS = 7 * np.arange(5)
_MORE = [np.where(np.arange(size) < size - 1, 0x80, 0) for size in range(6)]
"""Per varint size, the continuation bit of each of its bytes."""


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each value (non-negative, below 2**35)."""
    return 1 + (values[:, None] >= _VARINT_LIMITS[None, :-1]).sum(axis=1)


def _varint_columns(values: np.ndarray, size: int) -> np.ndarray:
    """(len(values), size) uint8: each value's varint, all of `size` bytes."""
    return ((values[:, None] >> _SHIFTS[:size]) & 0x7F | _MORE[size]).astype(np.uint8)


class ObservationEncoder:
    """Encodes one behavior's agents of a step into the bytes of a `ListAgentInfoProto`.

    Each agent carries one `ObservationProto` per size in `obs_sizes` (a flat float vector with
    dimension property NONE, named after `sensor_names`), in that order; with `groups`, also
    its multi-agent group id and group reward (POCA).

    Args:
        behavior: the behavior's name as on the wire.
        obs_sizes: the size of each observation (one int for one).
        sensor_names: each observation's sensor name (one name for all).
        groups: whether agents carry a group id and a group reward.

    Raises:
        ValueError: not one sensor name per observation.
    """

    def __init__(self, behavior: str, obs_sizes: int | Sequence[int],
                 sensor_names: str | Sequence[str] = "VectorSensor", groups: bool = False) -> None:
        self.behavior = behavior.encode()
        sizes = (obs_sizes,) if isinstance(obs_sizes, int) else tuple(obs_sizes)
        names = ((sensor_names,) * len(sizes) if isinstance(sensor_names, str)
                 else tuple(sensor_names))
        if len(names) != len(sizes):
            raise ValueError(f"need one sensor name per observation, got {len(names)} names "
                             f"for {len(sizes)} observations")
        self.obs_sizes = sizes
        self.obs_size = sum(sizes)
        self.groups = groups
        # Per observation, the bytes around its floats: AgentInfoProto.observations (13) holding
        # ObservationProto{shape (1, packed), float_data (4) {data (1, packed)},
        # dimension_properties=[NONE=1] (6, packed), name (8)}; compression NONE and type
        # DEFAULT are proto3 defaults and therefore absent.
        self._around: list[tuple[bytes, bytes]] = []
        for size, name in zip(sizes, names, strict=True):
            float_data_head = varint(1 << 3 | 2) + varint(4 * size)
            obs_head = (length_delimited(1, varint(size)) + varint(4 << 3 | 2)
                        + varint(len(float_data_head) + 4 * size) + float_data_head)
            obs_tail = length_delimited(6, varint(1)) + length_delimited(8, name.encode())
            obs_len = len(obs_head) + 4 * size + len(obs_tail)
            self._around.append((varint(13 << 3 | 2) + varint(obs_len) + obs_head, obs_tail))
        self._tables: dict[tuple[int, ...], tuple] = {}  # see `_table`

    def agent_infos(self, agent_id: np.ndarray, reward: np.ndarray, done: np.ndarray,
                    max_step: np.ndarray, obs: np.ndarray, group_id: np.ndarray | None = None,
                    group_reward: np.ndarray | None = None) -> bytes:
        """The wire bytes of a `ListAgentInfoProto` with one `AgentInfoProto` per row, in row order.

        Rows of one layout (flags, and the lengths of the id varints) are written as one numpy table
        whose constant columns are cached per (rows, layout).

        Args:
            agent_id: (rows,) non-negative agent ids.
            reward: (rows,) rewards.
            done: (rows,) episodes that ended.
            max_step: (rows,) of those, the ones the step limit ended.
            obs: (rows, sum of obs_sizes) float32, the observations side by side.
            group_id: (rows,) non-negative group ids; needed with `groups`.
            group_reward: (rows,) group rewards; needed with `groups`.

        Returns:
            The bytes (empty for no rows).

        Raises:
            ValueError: with `groups`, a group id or reward missing; a negative agent or group id.
        """
        ids = np.asarray(agent_id, dtype=np.int64).reshape(-1)
        n = len(ids)
        if n == 0:
            return b""
        done = np.asarray(done, dtype=bool).reshape(n)
        max_step = np.asarray(max_step, dtype=bool).reshape(n)
        if self.groups:
            if group_id is None or group_reward is None:
                raise ValueError("this encoder writes group ids and rewards: pass both")
            groups = np.asarray(group_id, dtype=np.int64).reshape(n)
        else:
            groups = np.zeros(n, dtype=np.int64)
        low, high = (int(ids.min()), int(ids.max()))
        group_low, group_high = (int(groups.min()), int(groups.max()))
        if low < 0 or group_low < 0:
            raise ValueError("agent and group ids must be non-negative")
        floats = np.ascontiguousarray(obs, dtype="<f4").reshape(n, self.obs_size)
        rewards = np.ascontiguousarray(reward, dtype="<f4").reshape(n)
        group_rewards = (np.zeros(n, "<f4") if group_reward is None
                         else np.ascontiguousarray(group_reward, dtype="<f4").reshape(n))
        sizes = [varint_size(value) for value in (low, high, group_low, group_high)]
        if not (done.any() or max_step.any()) and sizes[0] == sizes[1] and sizes[2] == sizes[3]:
            key = 4 * sizes[0] + 32 * sizes[2] * self.groups  # the common case
            return self._table(key, ids, rewards, floats, groups, group_rewards).tobytes()
        keys = (done.astype(np.int64) + 2 * max_step + 4 * _varint_sizes(ids)
                + 32 * _varint_sizes(groups) * self.groups)
        layouts = np.unique(keys)
        if len(layouts) == 1:
            return self._table(int(layouts[0]), ids, rewards, floats, groups,
                               group_rewards).tobytes()
        rows: list[bytes] = [b""] * n
        for key in layouts.tolist():
            (picked,) = np.nonzero(keys == key)
            table = self._table(key, ids[picked], rewards[picked], floats[picked],
                                groups[picked], group_rewards[picked])
            for row, index in zip(table, picked.tolist(), strict=True):
                rows[index] = row.tobytes()
        return b"".join(rows)

    def _table(self, key: int, ids: np.ndarray, rewards: np.ndarray, floats: np.ndarray,
               groups: np.ndarray, group_rewards: np.ndarray) -> np.ndarray:
        """Rows of layout `key` as a (rows, bytes) table: `ListAgentInfoProto.value` tag and
        length, reward (7), done (8) and max_step_reached (9) when set, id (10), the
        observations (13), then group id (14) and group reward (15) with `groups`."""
        done, max_step = key & 1, key >> 1 & 1
        id_size, group_size = key >> 2 & 7, key >> 5
        cache_key = (len(ids), key)
        if cache_key not in self._tables:
            pieces: list[bytes | tuple[str, int]] = [b"\x3d", ("reward", 4)]
            pieces += [b"\x40\x01"] * done + [b"\x48\x01"] * max_step
            pieces += [b"\x50", ("id", id_size)]
            for k, (head, tail) in enumerate(self._around):
                pieces += [head, (f"obs{k}", 4 * self.obs_sizes[k]), tail]
            if self.groups:
                pieces += [b"\x70", ("group", group_size), b"\x7d", ("group_reward", 4)]
            body = sum(len(p) if isinstance(p, bytes) else p[1] for p in pieces)
            head = b"\x0a" + varint(body)  # ListAgentInfoProto.value = 1
            table = np.empty((len(ids), len(head) + body), dtype=np.uint8)
            table[:, : len(head)] = np.frombuffer(head, np.uint8)
            columns: dict[str, int] = {}
            at = len(head)
            for piece in pieces:
                if isinstance(piece, bytes):
                    table[:, at : at + len(piece)] = np.frombuffer(piece, np.uint8)
                    at += len(piece)
                else:
                    columns[piece[0]] = at
                    at += piece[1]
            self._tables[cache_key] = (table, columns)
        table, columns = self._tables[cache_key]
        at = columns["reward"]
        table[:, at : at + 4] = rewards.view(np.uint8).reshape(-1, 4)
        table[:, columns["id"] : columns["id"] + id_size] = _varint_columns(ids, id_size)
        start = 0
        for k, size in enumerate(self.obs_sizes):
            at = columns[f"obs{k}"]
            table[:, at : at + 4 * size] = floats[:, start : start + size].view(np.uint8)
            start += size
        if self.groups:
            at = columns["group"]
            table[:, at : at + group_size] = _varint_columns(groups, group_size)
            at = columns["group_reward"]
            table[:, at : at + 4] = group_rewards.view(np.uint8).reshape(-1, 4)
        return table

    def message(self, agent_infos: bytes, initialization_output: bytes = b"",
                side_channel: bytes = b"") -> bytes:
        """A `UnityMessageProto` (status 200) for this behavior (see `unity_message`).

        Args:
            agent_infos: the bytes `agent_infos()` gives.
            initialization_output: the serialized initialization output to include, or empty.
            side_channel: side-channel records to send, or empty.

        Returns:
            The serialized message.
        """
        return unity_message([(self.behavior, agent_infos)], initialization_output, side_channel)


def unity_message(listings: Sequence[tuple[bytes, bytes]], initialization_output: bytes = b"",
                  side_channel: bytes = b"") -> bytes:
    """A `UnityMessageProto` (status 200) whose rl_output maps behaviors to their agents.

    Args:
        listings: (behavior name as bytes, its `ListAgentInfoProto` bytes) pairs.
        initialization_output: the serialized `UnityRLInitializationOutputProto` to include (with
            the brain parameters) the first time the behaviors appear, else empty.
        side_channel: the side-channel records to send (none when empty).

    Returns:
        The serialized message.
    """
    # The listings are large: only their headers are built, and everything is joined once.
    pieces: list[bytes] = []
    for behavior, listing in listings:  # UnityRLOutputProto.agentInfos (map) = 2
        key = length_delimited(1, behavior)
        value_head = varint(2 << 3 | 2) + varint(len(listing))
        entry_length = len(key) + len(value_head) + len(listing)
        pieces += [varint(2 << 3 | 2) + varint(entry_length) + key + value_head, listing]
    if side_channel:
        pieces.append(length_delimited(3, side_channel))  # UnityRLOutputProto.side_channel
    rl_output_length = sum(len(piece) for piece in pieces)
    tail = length_delimited(2, initialization_output) if initialization_output else b""
    rl_output_head = varint(1 << 3 | 2) + varint(rl_output_length)  # UnityOutputProto.rl_output
    output_length = len(rl_output_head) + rl_output_length + len(tail)
    return b"".join([HEADER_OK, varint(2 << 3 | 2), varint(output_length), rl_output_head,
                     *pieces, tail])


def _fixed_field(listing: bytes, count: int, field: int, size: int) -> np.ndarray | None:
    """The bytes of packed field `field` of every `AgentActionProto` in a serialized
    `ListAgentActionProto` of `count` entries, as a (count, size) uint8 table, read in bulk when
    every entry has the layout of the first (the same fields and lengths, as mlagents-envs
    writes them) and the field holds `size` bytes; None otherwise (read the message instead)."""
    if count < 1 or len(listing) % count:
        return None
    stride = len(listing) // count
    try:
        if listing[0] != 0x0A:  # ListAgentActionProto.value = 1
            return None
        length, offset = read_varint(listing, 1)
        if offset + length != stride:
            return None
        fixed, start = list(range(offset)), None
        while offset < stride:  # the fields of the first AgentActionProto
            tag, after_tag = read_varint(listing, offset)
            if tag & 7 != 2:  # only length-delimited (packed) fields are expected
                return None
            length, after_length = read_varint(listing, after_tag)
            fixed.extend(range(offset, after_length))
            if tag >> 3 == field:
                if length != size:
                    return None
                start = after_length
            offset = after_length + length
    except IndexError:
        return None
    if start is None or offset != stride:
        return None
    table = np.frombuffer(listing, np.uint8).reshape(count, stride)
    columns = np.array(fixed)
    if not (table[:, columns] == table[0, columns]).all():  # same tags and sizes in every entry
        return None
    return table[:, start : start + size]


def continuous_actions(listing: bytes, count: int, width: int) -> np.ndarray | None:
    """The `continuous_actions` (field 6) of a serialized `ListAgentActionProto`, read in bulk.

    Args:
        listing: the serialized list.
        count: the agents it holds.
        width: the continuous actions per agent.

    Returns:
        A (count, width) float32 table; None when the entries differ in layout or hold no `width`
            continuous actions (read the message instead).
    """
    table = _fixed_field(listing, count, 6, 4 * width)
    return None if table is None else table.copy().view("<f4").astype(np.float32)


def discrete_actions(listing: bytes, count: int, branches: int) -> np.ndarray | None:
    """The `discrete_actions` (field 7, packed varints) of a serialized `ListAgentActionProto`, read
    in bulk.

    Args:
        listing: the serialized list.
        count: the agents it holds.
        branches: the discrete actions per agent.

    Returns:
        A (count, branches) int64 table when every value takes one byte (0-127, as every branch of
            up to 128 actions gives); None otherwise (read the message instead).
    """
    table = _fixed_field(listing, count, 7, branches)
    if table is None or (table >= 0x80).any():
        return None
    return table.astype(np.int64)


def empty_message() -> bytes:
    """A `UnityMessageProto` with only the status-200 header.

    Returns:
        Its bytes.
    """
    return HEADER_OK
