"""Protobuf wire-format pieces shared by the two ends of the ML-Agents exchange: the step path
that encodes actions (`envs.fast_step`) and the stand-in that encodes observations
(`envs.standin.wire`). Plain bytes and ints: no protobuf import."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """The base-128 varint of an integer.

    Args:
        value: a non-negative integer.

    Returns:
        Its varint bytes.
    """
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def varint_size(value: int) -> int:
    """The length of an integer's varint.

    Args:
        value: a non-negative integer.

    Returns:
        Its varint's bytes, at least 1.
    """
    return max(1, -(-value.bit_length() // 7))


def read_varint(data: bytes, offset: int) -> tuple[int, int]:
    """Read one varint.

    Args:
        data: the bytes.
        offset: where the varint starts.

    Returns:
        (value, offset after it).
    """
    value = shift = 0
    while True:
        byte = data[offset]
        value |= (byte & 0x7F) << shift
        offset += 1
        if byte < 0x80:
            return value, offset
        shift += 7


def length_delimited(field: int, payload: bytes) -> bytes:
    """A length-delimited field (message, bytes or string).

    Args:
        field: the field number.
        payload: the field's bytes.

    Returns:
        Its tag, length and payload.
    """
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def packed_floats_header(field: int, count: int) -> bytes:
    """The tag and length of a packed repeated float field; the floats follow.

    Args:
        field: the field number.
        count: how many floats.

    Returns:
        The header bytes.
    """
    return varint(field << 3 | 2) + varint(4 * count)
