"""HTTP/2 frames (RFC 9113) and gRPC messages as this project's own gRPC ends write them: the
Unity exchange's client and server (`envs.http2`) and the replicas' gRPC server
(`deploy.serving.grpc_server`). No sockets and no state here: constants, frame and message
layouts, and header fields encoded as HPACK literals without indexing (RFC 7541 6.2.2: new
names, no Huffman coding), which a peer decodes whatever its table holds."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
(DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
 CONTINUATION) = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = MAX_STREAM = 2**31 - 1
FRAME_HEADER = struct.Struct(">IBI")
"""A frame's 9-byte header: (24-bit length << 8 | type), flags, stream id."""
MESSAGE_PREFIX = struct.Struct(">BI")
"""gRPC's 5-byte message prefix: compressed flag, length."""
SETTING = struct.Struct(">HI")
WORD = struct.Struct(">I")


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return FRAME_HEADER.pack(len(payload) << 8 | kind, flags, stream) + payload


def settings_frame(*settings: tuple[int, int]) -> bytes:
    """A SETTINGS frame of (key, value) pairs."""
    return frame(SETTINGS, 0, 0, b"".join(SETTING.pack(key, value) for key, value in settings))


def _hpack_integer(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) in a prefix of `prefix_bits`, the bits above it zero."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((value,))
    out = bytearray((limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_string(value: str) -> bytes:
    """An HPACK string literal, not Huffman-coded; `value` must be ASCII."""
    raw = value.encode("ascii")
    return _hpack_integer(len(raw), 7) + raw


def literal(name: str, value: str) -> bytes:
    """A header field as a literal without indexing, with a new name."""
    return b"\x00" + hpack_string(name) + hpack_string(value)


def indexed_name_literal(index: int, value: str) -> bytes:
    """A header field as a literal without indexing, its name from the table's entry `index`."""
    return _hpack_integer(index, 4) + hpack_string(value)


STATUS_200 = b"\x88"  # :status 200, the static table's entry 8
CONTENT_TYPE = indexed_name_literal(31, "application/grpc")  # content-type: static entry 31


def percent_encoded(details: str) -> str:
    """`details` as gRPC's `grpc-message` carries it: UTF-8, every byte outside printable
    ASCII and every '%' percent-encoded."""
    return "".join(chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}"
                   for byte in details.encode("utf-8"))


def status_headers(code: int, message: str = "") -> bytes:
    """The HPACK block of gRPC trailers with status `code` (and `message`, when given, as
    `grpc-message`)."""
    block = literal("grpc-status", str(code))
    return block + literal("grpc-message", percent_encoded(message)) if message else block


def request_headers(authority: str, path: str) -> bytes:
    """The HPACK block of a gRPC request to `path`."""
    return (b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
            + indexed_name_literal(4, path)  # :path
            + indexed_name_literal(1, authority)  # :authority
            + CONTENT_TYPE + literal("te", "trailers"))


def grpc_message(payload: bytes) -> bytes:
    """`payload` as one uncompressed gRPC message (length-prefixed)."""
    return MESSAGE_PREFIX.pack(0, len(payload)) + payload


def one_message(body: bytes | bytearray) -> bytes | None:
    """The payload of `body` when it is exactly one uncompressed gRPC message, else None."""
    if len(body) < 5:
        return None
    compressed, size = MESSAGE_PREFIX.unpack_from(body)
    return bytes(body[5:]) if compressed == 0 and size == len(body) - 5 else None
