"""HTTP/2 frames written and read back by hand in the tests of our own gRPC ends (RFC 9113
section 4.1: a 24-bit length, type, flags, a 31-bit stream id), independent of the code under
test."""

from __future__ import annotations

import socket
from collections.abc import Callable

Frame = tuple[int, int, int, bytes]
"""(type, flags, stream, payload)"""
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
SETTINGS_INITIAL_WINDOW_SIZE = 4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: a 24-bit length, type, flags, a 31-bit stream id, the payload."""
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big")
            + payload)


def settings_frame(*settings: tuple[int, int]) -> bytes:
    """A SETTINGS frame of (16-bit key, 32-bit value) pairs."""
    return frame(SETTINGS, 0, 0, b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big")
                                         for key, value in settings))


def grpc_message(payload: bytes) -> bytes:
    """One uncompressed gRPC message: flag 0, a 32-bit length, the payload."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


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
