"""HTTP/2 frames read back by hand in the tests of our own gRPC ends (RFC 9113 section 4.1: a
24-bit length, type, flags, a 31-bit stream id), independent of the code under test."""

from __future__ import annotations

import socket
from collections.abc import Callable

Frame = tuple[int, int, int, bytes]
"""(type, flags, stream, payload)"""


def frames_of(data: bytes | bytearray) -> list[Frame]:
    """The HTTP/2 frames in `data` (the last one possibly cut short)."""
    frames, offset = [], 0
    while offset < len(data):
        size = int.from_bytes(data[offset : offset + 3], "big")
        stream = int.from_bytes(data[offset + 5 : offset + 9], "big") & 0x7FFF_FFFF
        frames.append((data[offset + 3], data[offset + 4], stream,
                       bytes(data[offset + 9 : offset + 9 + size])))
        offset += 9 + size
    return frames


def read_frames_until(sock: socket.socket, done: Callable[[list[Frame]], bool]) -> list[Frame]:
    """The frames `sock` receives until `done(frames)` or the peer closes the connection."""
    received = bytearray()
    sock.settimeout(30)
    while not done(frames_of(received)):
        chunk = sock.recv(65_536)
        if not chunk:
            break
        received += chunk
    return frames_of(received)
