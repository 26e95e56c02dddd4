"""Both ends of the Unity exchange as gRPC over HTTP/2 frames written straight onto TCP sockets
(RFC 9113, cleartext with prior knowledge, as gRPC's own clients connect to a local server):
`UnaryClient`, the stand-ins' end, and `UnaryServer`, the Python side's.

A Unity player calls one unary method (`Initialize`, then `Exchange` once per step) on the
Python side's gRPC server. Python's `grpc` package spent 230-300 us of CPU per call on a
2-core machine in the stand-ins' client, and mlagents-envs' server another 400-570 us in its
threads (a polling thread and a pool thread per call, then a handoff to the main thread). These
two do what one lockstep call needs and no more: one stream per call, headers encoded once as
literals, flow control both ways, answers to the peer's SETTINGS and PINGs. Neither decodes the
peer's headers (no HPACK table is kept; the message is the same for every method): the client
takes a stream that ends after exactly one message as an answer, which is how a gRPC server
ends an OK unary call, and raises `ExchangeError` on any other ending; the server takes a stream
that ends after exactly one uncompressed message as a call. Both poll their sockets for a while
before they block, where a CPU is free (`envs.spin_wait`).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable

from envs.spin_wait import SpinWait

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x2, 0x4, 0x5
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = MAX_STREAM = 2**31 - 1
RECEIVE_CHUNK = 1 << 18
_FRAME_HEADER = struct.Struct(">IBI")  # (24-bit length << 8 | type), flags, stream id
_MESSAGE_PREFIX = struct.Struct(">BI")  # gRPC's: compressed flag, length


class ExchangeError(ConnectionError):
    """The call did not end with an answer: the peer refused it or went away."""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return _FRAME_HEADER.pack(len(payload) << 8 | kind, flags, stream) + payload


def _hpack_string(value: str) -> bytes:
    """An HPACK string literal, not Huffman-coded (all ours are shorter than 127 bytes)."""
    raw = value.encode("ascii")
    if len(raw) >= 127:
        raise ValueError(f"header value too long for this endpoint: {value!r}")
    return bytes((len(raw),)) + raw


_CONTENT_TYPE = b"\x0f\x10" + _hpack_string("application/grpc")  # static name 31, not indexed
_STATUS_200 = b"\x88"  # static table entry 8


def request_headers(authority: str, path: str) -> bytes:
    """The HPACK block of a gRPC request, literals without indexing (no table state)."""
    return (b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
            + b"\x04" + _hpack_string(path)  # :path (static name 4)
            + b"\x01" + _hpack_string(authority)  # :authority (static name 1)
            + _CONTENT_TYPE + b"\x00" + _hpack_string("te") + _hpack_string("trailers"))


def status_headers(code: int, message: str = "") -> bytes:
    """The HPACK block of gRPC trailers with status `code` (and `message` when given)."""
    block = b"\x00" + _hpack_string("grpc-status") + _hpack_string(str(code))
    return block + (b"\x00" + _hpack_string("grpc-message") + _hpack_string(message)
                    if message else b"")


def grpc_message(payload: bytes) -> bytes:
    """`payload` as one uncompressed gRPC message (length-prefixed)."""
    return _MESSAGE_PREFIX.pack(0, len(payload)) + payload


def _one_message(body: bytes | bytearray) -> bytes | None:
    """The payload of `body` when it is exactly one uncompressed gRPC message, else None."""
    if len(body) < 5:
        return None
    compressed, size = _MESSAGE_PREFIX.unpack_from(body)
    return bytes(body[5:]) if compressed == 0 and size == len(body) - 5 else None


class _Endpoint:
    """One HTTP/2 connection's frame handling shared by both ends: reading whole frames,
    SETTINGS, PINGs and both directions of flow control. Subclasses handle stream frames
    (`_on_stream_frame`); `_send_windows` holds the send window of each open stream."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket = sock
        self._buffer = bytearray()
        self._send_window = DEFAULT_WINDOW  # the connection's, as the peer grants it
        self._send_windows: dict[int, int] = {}
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._received = 0  # DATA bytes not yet given back to the peer's send window
        self._awaiting_window = False

    @staticmethod
    def _opening(settings: bytes) -> bytes:
        """Our SETTINGS (`settings` plus every stream window at its widest) and the connection
        window opened as wide."""
        settings += struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
        return frame(SETTINGS, 0, 0, settings) + frame(
            WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW))

    def fileno(self) -> int:
        return self._socket.fileno()

    def _receive(self) -> None:
        """Append what the socket has (waiting for something) to the buffer."""
        chunk = self._socket.recv(RECEIVE_CHUNK)
        if not chunk:
            raise ExchangeError("the peer closed the connection")
        self._buffer += chunk

    def _handle_frames(self) -> bool:
        """Handle the buffer's whole frames in order; True as soon as one ends the current
        wait (the rest stay buffered)."""
        buffer = self._buffer
        offset = 0
        try:
            while len(buffer) - offset >= 9:
                size_kind, flags, stream_id = _FRAME_HEADER.unpack_from(buffer, offset)
                end = offset + 9 + (size_kind >> 8)
                if end > len(buffer):
                    break
                payload = bytes(buffer[offset + 9 : end])
                offset = end
                if self._handle(size_kind & 0xFF, flags, stream_id & MAX_STREAM, payload):
                    return True
            return False
        finally:
            del buffer[:offset]

    def _wait(self) -> None:
        """Read and handle frames until one ends the current wait."""
        while not self._handle_frames():
            self._receive()

    def _handle(self, kind: int, flags: int, stream_id: int, payload: bytes) -> bool:
        """Handle one frame: the connection's here, each stream's in `_on_stream_frame`."""
        if kind == SETTINGS:
            if not flags & ACK:
                self._apply_settings(payload)
            return False
        if kind == PING:
            if not flags & ACK:
                self._socket.sendall(frame(PING, ACK, 0, payload))
            return False
        if kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & MAX_WINDOW
            if stream_id == 0:
                self._send_window += increment
            elif stream_id in self._send_windows:
                self._send_windows[stream_id] += increment
            return self._awaiting_window
        if kind == DATA:
            self._give_back(len(payload))
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
        return self._on_stream_frame(kind, flags, stream_id, payload)

    def _on_stream_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> bool:
        raise NotImplementedError

    def _apply_settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                for stream in self._send_windows:
                    self._send_windows[stream] += value - self._peer_initial_window
                self._peer_initial_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self._peer_max_frame = value
        self._socket.sendall(frame(SETTINGS, ACK, 0))

    def _give_back(self, size: int) -> None:
        """Count received DATA against the connection window; top it up past half of it."""
        self._received += size
        if self._received > MAX_WINDOW // 2:
            self._socket.sendall(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
            self._received = 0

    def _send_message(self, stream: int, head: bytes, message: bytes, tail: bytes) -> None:
        """Send `head` (frames), `message` as one gRPC message in DATA frames within the peer's
        windows, then `tail` (frames); with no `tail` the last DATA frame ends the stream.
        Nothing more once the peer resets the stream."""
        body = grpc_message(message)
        pending = [head]
        sent = 0
        while sent < len(body):
            if stream not in self._send_windows:  # the peer reset the stream meanwhile
                return
            room = min(self._send_window, self._send_windows[stream], self._peer_max_frame)
            if room <= 0:  # out of window: send what is ready, wait for WINDOW_UPDATE
                self._socket.sendall(b"".join(pending))
                pending = []
                self._awaiting_window = True
                try:
                    self._wait()
                finally:
                    self._awaiting_window = False
                continue
            size = min(room, len(body) - sent)
            last = sent + size == len(body)
            pending.append(frame(DATA, END_STREAM if last and not tail else 0, stream,
                                 body[sent : sent + size]))
            sent += size
            self._send_window -= size
            self._send_windows[stream] -= size
        pending.append(tail)
        self._socket.sendall(b"".join(pending))

    def close(self) -> None:
        self._socket.close()


class UnaryClient(_Endpoint):
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
                sock = socket.create_connection(self._address, timeout=timeout)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        super().__init__(sock)
        self._spin = SpinWait()
        self._timed = timeout is not None
        self._next_stream = 1
        self._answer: bytearray | None = None
        self._socket.sendall(PREFACE + self._opening(struct.pack(">HI", SETTINGS_ENABLE_PUSH, 0)))

    def call(self, request: bytes) -> bytes:
        """The response to `request`; ExchangeError or OSError when there is none."""
        if self._next_stream > MAX_STREAM:  # stream ids run out after a billion calls
            self._socket.close()
            self._connect(None)
        stream = self._next_stream
        self._next_stream += 2
        self._send_windows = {stream: self._peer_initial_window}
        self._answer = None
        self._send_message(stream, frame(HEADERS, END_HEADERS, stream, self._headers), request,
                           b"")
        self._answer = bytearray()
        with self._spin.waiting(self._readable):
            self._wait()
        if self._timed:  # the first answer came: from now on wait as long as the server takes
            self._socket.settimeout(None)
            self._timed = False
        answer = _one_message(self._answer)
        if answer is None:
            raise ExchangeError("the call ended without an answer (the server refused it)")
        return answer

    def _readable(self) -> bool:
        """Whether the socket has something to read now (never waits)."""
        return bool(select.select([self._socket], [], [], 0)[0])

    def _on_stream_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> bool:
        if kind == GOAWAY:
            raise ExchangeError("the server is going away")
        if stream_id not in self._send_windows:
            return False
        if kind == RST_STREAM:
            raise ExchangeError(f"the server reset the call (error {payload[:4].hex()})")
        if kind == DATA and self._answer is not None:
            self._answer += payload
        if flags & END_STREAM and kind in (DATA, HEADERS):
            if self._answer is None:
                raise ExchangeError("the server ended the call before reading the request")
            return True
        return False


class UnaryServer:
    """A gRPC server of one unary method, served in the calling thread, one call at a time:
    `poll` waits for a call, `receive` takes its request (serialized bytes), `answer` answers
    the call taken last. Clients may connect (and reconnect) at any time; a connection's
    SETTINGS, PINGs and windows are handled whenever its socket is read, that is while the
    caller polls, receives or answers. Listens on `host`:`port` (SO_REUSEADDR, no
    SO_REUSEPORT: a port in use raises OSError)."""

    def __init__(self, host: str, port: int) -> None:
        self._listener = socket.create_server((host, port))
        self._connections: list[_ServerConnection] = []
        self._calls: deque[tuple[_ServerConnection, int, bytes]] = deque()
        self._taken: tuple[_ServerConnection, int] | None = None
        self._spin = SpinWait()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on: the port the system chose for port 0."""
        host, port = self._listener.getsockname()[:2]
        return host, port

    def poll(self, timeout: float | None) -> bool:
        """True once a call is waiting to be received; False after `timeout` seconds without
        one (None: wait as long as it takes). A wait polls first (`envs.spin_wait`)."""
        if self._calls or timeout == 0:
            return self._poll(timeout)
        with self._spin.waiting(self._readable):
            return self._poll(timeout)

    def _readable(self) -> bool:
        """Whether the listener or a connection has something to read now (never waits)."""
        descriptors = [self._listener.fileno(), *(c.fileno() for c in self._connections)]
        return bool(select.select(descriptors, [], [], 0)[0])

    def _poll(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._calls:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            by_descriptor = {connection.fileno(): connection for connection in self._connections}
            listener = self._listener.fileno()
            readable, _, _ = select.select([listener, *by_descriptor], [], [], remaining)
            for descriptor in readable:
                if descriptor == listener:
                    # a client that left before its connection was set up is forgotten
                    with contextlib.suppress(OSError):
                        self._connections.append(_ServerConnection(self._listener.accept()[0],
                                                                   self._calls.append))
                    continue
                connection = by_descriptor[descriptor]
                try:
                    connection.read()
                except OSError:  # ExchangeError among them: the client is gone
                    self._drop(connection)
            if not readable and remaining == 0.0:
                return False
        return True

    def receive(self) -> bytes:
        """The next call's request (waiting for one as long as it takes); `answer` answers it."""
        self.poll(None)
        connection, stream, request = self._calls.popleft()
        self._taken = (connection, stream)
        return request

    def answer(self, response: bytes) -> None:
        """Answer the call taken last with `response` (serialized); nothing when there is none,
        or when its client reset it or went away."""
        if self._taken is None:
            return
        connection, stream = self._taken
        self._taken = None
        try:
            connection.answer(stream, response)
        except OSError:
            self._drop(connection)

    def _drop(self, connection: _ServerConnection) -> None:
        connection.close()
        self._connections.remove(connection)
        for call in [call for call in self._calls if call[0] is connection]:
            self._calls.remove(call)

    def close(self, linger: float = 1.0) -> None:
        """Stop listening; end each connection after what was sent reaches the client, waiting
        up to `linger` seconds in all for clients to close their ends."""
        self._listener.close()
        deadline = time.monotonic() + linger
        for connection in self._connections:
            connection.finish(max(deadline - time.monotonic(), 0.0))
        self._connections = []


class _ServerConnection(_Endpoint):
    """One client's connection to `UnaryServer`: hands each complete call to `deliver` as
    (self, stream, request)."""

    def __init__(self, sock: socket.socket, deliver: Callable[[tuple], None]) -> None:
        super().__init__(sock)
        self._deliver = deliver
        self._bodies: dict[int, bytearray] = {}  # the requests of open streams, so far
        self._preface = False
        self._socket.sendall(self._opening(b""))

    def read(self) -> None:
        """Read what the socket has and handle its whole frames."""
        self._receive()
        if not self._preface:
            if len(self._buffer) < len(PREFACE):
                return
            if self._buffer[: len(PREFACE)] != PREFACE:
                raise ExchangeError("the client did not speak HTTP/2")
            del self._buffer[: len(PREFACE)]
            self._preface = True
        self._handle_frames()

    def _on_stream_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> bool:
        if kind == HEADERS and stream_id not in self._bodies:  # a new call
            self._bodies[stream_id] = bytearray()
            self._send_windows[stream_id] = self._peer_initial_window
        elif kind == DATA and stream_id in self._bodies:
            self._bodies[stream_id] += payload
        elif kind == RST_STREAM:  # the client gave the call up: an answer waiting for window ends
            self._bodies.pop(stream_id, None)
            self._send_windows.pop(stream_id, None)
            return self._awaiting_window
        if flags & END_STREAM and kind in (DATA, HEADERS) and stream_id in self._bodies:
            request = _one_message(self._bodies.pop(stream_id))
            if request is None:
                self._refuse(stream_id)
            else:
                self._deliver((self, stream_id, request))
        return False

    def _refuse(self, stream: int) -> None:
        """End the call on `stream` with INTERNAL: its body was not one uncompressed message."""
        self._send_windows.pop(stream, None)
        self._socket.sendall(frame(HEADERS, END_HEADERS | END_STREAM, stream,
                                   _STATUS_200 + _CONTENT_TYPE + status_headers(
                                       13, "expected one uncompressed message")))

    def answer(self, stream: int, response: bytes) -> None:
        """Answer the call on `stream` (nothing when the client reset it)."""
        if stream not in self._send_windows:
            return
        self._send_message(stream, frame(HEADERS, END_HEADERS, stream, _STATUS_200 + _CONTENT_TYPE),
                           response, frame(HEADERS, END_HEADERS | END_STREAM, stream,
                                           status_headers(0)))
        self._send_windows.pop(stream, None)

    def finish(self, linger: float) -> None:
        """Close after the client has read what was sent: our side's end first, then up to
        `linger` seconds for the client to close (closing with unread data would reset the
        connection, which can discard what the client has not read yet)."""
        try:
            self._socket.shutdown(socket.SHUT_WR)
            self._socket.settimeout(linger)
            while self._socket.recv(RECEIVE_CHUNK):
                pass
        except OSError:
            pass
        self.close()
