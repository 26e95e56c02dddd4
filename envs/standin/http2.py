"""The stand-in's end of the exchange: a gRPC client of one unary method, written straight onto
a TCP socket as HTTP/2 frames (RFC 9113, cleartext with prior knowledge, as gRPC's own clients
connect to `127.0.0.1`).

A Unity player calls `Exchange` on the Python side's gRPC server once per step. Python's
`grpc` client spent 230-300 us of CPU per call on a 2-core machine (its channel, completion
queue and call objects), a third of the stand-in's step; this client spends 70-90 us
(`bench/bench_grpc_floor.py`), doing what one call needs and no more: one stream per call, the
request's headers encoded once, flow control both ways, and answers to the server's SETTINGS
and PINGs. Response headers are not decoded (no HPACK table is kept): a call succeeds when its
stream ends after exactly one message, which is how a gRPC server ends an OK unary call; any
other ending (trailers only, RST_STREAM, GOAWAY, a closed socket) raises `ExchangeError`.
"""

from __future__ import annotations

import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x2, 0x4, 0x5
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = MAX_STREAM = 2**31 - 1
RECEIVE_CHUNK = 1 << 18
_FRAME_HEADER = struct.Struct(">IBI")  # (24-bit length << 8 | type), flags, stream id


class ExchangeError(ConnectionError):
    """The call did not end with an answer: the server refused it or went away."""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return _FRAME_HEADER.pack(len(payload) << 8 | kind, flags, stream) + payload


def _hpack_string(value: str) -> bytes:
    """An HPACK string literal, not Huffman-coded (all ours are shorter than 127 bytes)."""
    raw = value.encode("ascii")
    if len(raw) >= 127:
        raise ValueError(f"header value too long for this client: {value!r}")
    return bytes((len(raw),)) + raw


def request_headers(authority: str, path: str) -> bytes:
    """The HPACK block of a gRPC request, literals without indexing (no table state)."""
    return (b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
            + b"\x04" + _hpack_string(path)  # :path (static name 4)
            + b"\x01" + _hpack_string(authority)  # :authority (static name 1)
            + b"\x0f\x10" + _hpack_string("application/grpc")  # content-type (static name 31)
            + b"\x00" + _hpack_string("te") + _hpack_string("trailers"))


class UnaryClient:
    """Calls `path` on the gRPC server at `host`:`port` with serialized request bytes and
    returns the serialized response bytes. One call at a time (the exchange is lockstep).

    `connect_timeout`: how long to retry a refused connection and to wait for the first answer
    (the handshake); later calls wait as long as the server takes, until it closes the
    connection."""

    def __init__(self, host: str, port: int, path: str, connect_timeout: float) -> None:
        self._address = (host, port)
        self._headers = request_headers(f"{host}:{port}", path)
        self._connect(connect_timeout)

    def _connect(self, timeout: float | None) -> None:
        """A new connection (the first, or one with fresh stream ids), its settings sent; a
        refused connection is retried for `timeout` seconds, and `timeout` bounds the wait for
        the first answer on it."""
        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            try:
                self._socket = socket.create_connection(self._address, timeout=timeout)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timed = timeout is not None
        self._next_stream = 1
        self._buffer = bytearray()
        self._send_window = DEFAULT_WINDOW  # the connection's, as the server grants it
        self._stream_window = 0  # the current call's
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._received = 0  # DATA bytes not yet given back to the server's send window
        settings = struct.pack(">HIHI", SETTINGS_ENABLE_PUSH, 0,
                               SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
        self._socket.sendall(PREFACE + frame(SETTINGS, 0, 0, settings) + frame(
            WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)))

    def call(self, request: bytes) -> bytes:
        """The response to `request`; ExchangeError or OSError when there is none."""
        if self._next_stream > MAX_STREAM:  # stream ids run out after a billion calls
            self._socket.close()
            self._connect(None)
        stream = self._next_stream
        self._next_stream += 2
        self._stream_window = self._peer_initial_window
        body = b"\x00" + struct.pack(">I", len(request)) + request  # gRPC message, uncompressed
        pending = [frame(HEADERS, END_HEADERS, stream, self._headers)]
        sent = 0
        while True:
            remaining = len(body) - sent
            room = min(self._send_window, self._stream_window, self._peer_max_frame)
            if room <= 0:  # out of window: send what is ready, wait for WINDOW_UPDATE
                self._socket.sendall(b"".join(pending))
                pending = []
                self._read_frames(stream, None)
                continue
            size = min(room, remaining)
            pending.append(frame(DATA, END_STREAM if size == remaining else 0, stream,
                                 body[sent : sent + size]))
            sent += size
            self._send_window -= size
            self._stream_window -= size
            if sent == len(body):
                break
        self._socket.sendall(b"".join(pending))
        answer = bytearray()
        self._read_frames(stream, answer)
        if self._timed:  # the first answer came: from now on wait as long as the server takes
            self._socket.settimeout(None)
            self._timed = False
        if len(answer) < 5 or answer[0] != 0 or struct.unpack_from(">I", answer, 1)[0] != len(
                answer) - 5:
            raise ExchangeError("the call ended without an answer (the server refused it)")
        return bytes(answer[5:])

    def _read_frames(self, stream: int, answer: bytearray | None) -> None:
        """Read and handle frames until `stream` ends (`answer` collects its DATA), or with
        `answer` None until the send window grows."""
        buffer = self._buffer
        offset = 0
        try:
            while True:
                while len(buffer) - offset < 9 or len(buffer) - offset < 9 + int.from_bytes(
                        buffer[offset : offset + 3], "big"):
                    if offset:
                        del buffer[:offset]
                        offset = 0
                    chunk = self._socket.recv(RECEIVE_CHUNK)
                    if not chunk:
                        raise ExchangeError("the server closed the connection")
                    buffer += chunk
                size_kind, flags, stream_id = _FRAME_HEADER.unpack_from(buffer, offset)
                size, kind = size_kind >> 8, size_kind & 0xFF
                stream_id &= MAX_STREAM  # the reserved top bit cleared
                payload = bytes(buffer[offset + 9 : offset + 9 + size])
                offset += 9 + size
                if self._handle(kind, flags, stream_id, payload, stream, answer):
                    return
        finally:
            del buffer[:offset]

    def _handle(self, kind: int, flags: int, stream_id: int, payload: bytes, stream: int,
                answer: bytearray | None) -> bool:
        """Handle one frame; True when the wait of `_read_frames` is over."""
        if kind == DATA:
            self._give_back(len(payload))
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if stream_id == stream and answer is not None:
                answer += payload
        elif kind == SETTINGS and not flags & ACK:
            for offset in range(0, len(payload) - 5, 6):
                key, value = struct.unpack_from(">HI", payload, offset)
                if key == SETTINGS_INITIAL_WINDOW_SIZE:
                    self._stream_window += value - self._peer_initial_window
                    self._peer_initial_window = value
                elif key == SETTINGS_MAX_FRAME_SIZE:
                    self._peer_max_frame = value
            self._socket.sendall(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self._socket.sendall(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & MAX_WINDOW
            if stream_id == 0:
                self._send_window += increment
            elif stream_id == stream:
                self._stream_window += increment
            return answer is None
        elif kind == GOAWAY:
            raise ExchangeError("the server is going away")
        elif kind == RST_STREAM and stream_id == stream:
            raise ExchangeError(f"the server reset the call (error {payload[:4].hex()})")
        if stream_id == stream and flags & END_STREAM and kind in (DATA, HEADERS):
            if answer is None:
                raise ExchangeError("the server ended the call before reading the request")
            return True
        return False

    def _give_back(self, size: int) -> None:
        """Count received DATA against the connection window; top it up past half of it."""
        self._received += size
        if self._received > MAX_WINDOW // 2:
            self._socket.sendall(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
            self._received = 0

    def close(self) -> None:
        """Close the connection (no GOAWAY: the server sees the socket close)."""
        self._socket.close()
