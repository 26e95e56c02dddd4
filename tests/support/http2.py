"""HTTP/2 frames written and read back by hand in the tests of our own gRPC ends (RFC 9113
section 4.1: a 24-bit length, type, flags, a 31-bit stream id), independent of the code under
test."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import hpack

Frame = tuple[int, int, int, bytes]
"""(type, flags, stream, payload)"""
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
(DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
 CONTINUATION) = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 2, 3, 4
SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 5, 6
# error codes (RFC 9113 section 7)
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0, 1, 3, 5, 6
REFUSED_STREAM, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 7, 9, 11


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


def request_block(path: str, extra: Sequence[tuple[str, str]] = ()) -> bytes:
    """A gRPC request's header block as `hpack`'s encoder writes it (a fresh table: the first
    block of a connection), with the `extra` fields after the usual ones."""
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "localhost"),
                                   ("content-type", "application/grpc"), ("te", "trailers"),
                                   *extra])


def client_preface(*settings: tuple[int, int]) -> bytes:
    """What a client sends first: the preface, its SETTINGS, the acknowledgement of the
    server's SETTINGS."""
    return PREFACE + settings_frame(*settings) + frame(SETTINGS, ACK, 0)


def goaway_code(frames: list[Frame]) -> int | None:
    """The error code of the first GOAWAY among `frames`, None where there is none."""
    return next((int.from_bytes(f[3][4:8], "big") for f in frames if f[0] == GOAWAY), None)


def trailers_of(frames: list[Frame], stream: int) -> dict[bytes, bytes]:
    """The header fields of the HEADERS frame that ends `stream` (decoded by `hpack`)."""
    block = next(f[3] for f in frames if f[0] == HEADERS and f[2] == stream and f[1] & END_STREAM)
    return dict(hpack.Decoder().decode(block, raw=True))


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
