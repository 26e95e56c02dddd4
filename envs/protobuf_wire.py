"""Protobuf wire-format pieces shared by the two ends of the ML-Agents exchange: the step path
that encodes actions (`envs.fast_step`) and the stand-in that encodes observations
(`envs.standin.wire`). Plain bytes and ints: no protobuf import."""

from __future__ import annotations


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


def varint_size(value: int) -> int:
    """Bytes of the varint of a non-negative integer."""
    return max(1, -(-value.bit_length() // 7))


def read_varint(data: bytes, offset: int) -> tuple[int, int]:
    """(value, offset after it) of the varint at `offset` of `data`."""
    value = shift = 0
    while True:
        byte = data[offset]
        value |= (byte & 0x7F) << shift
        offset += 1
        if byte < 0x80:
            return value, offset
        shift += 7


def length_delimited(field: int, payload: bytes) -> bytes:
    """Tag, length and payload of a message, bytes or string field."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def packed_floats_header(field: int, count: int) -> bytes:
    """Tag and length of a packed repeated float field of `count` values."""
    return varint(field << 3 | 2) + varint(4 * count)
