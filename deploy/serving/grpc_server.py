"""A gRPC server of unary methods on the running asyncio event loop: HTTP/2 (RFC 9113, cleartext
with prior knowledge, as gRPC's clients speak it) read and written by an `asyncio.Protocol`.

Why not `grpc.aio`: its server hands calls to the handler one event-loop turn apart (it accepts
a call in one turn and reads its message in another), so calls arriving together never meet in
the replica's batch queue, and its machinery costs ~500 us of CPU per call even for an echo on
a 2-core machine. Here a connection's frames are handled as its bytes arrive: every call that
ends in one turn of the loop (across every connection the loop found readable) starts its
handler in the next, so under load calls meet in the batch queue as HTTP requests do.

What is served: unary calls to the registered paths, request and answer one uncompressed
message of raw bytes each (no protobuf here: the caller's handler reads and writes the bytes).
The request's metadata (its non-pseudo headers, decoded with `hpack`, names lowercase) reaches
the handler through a `CallContext` with the `grpc.aio.ServicerContext` methods handlers use
(`invocation_metadata`, `set_code`, `set_details`). A call ends with the code the handler set
(OK unless set) and its details as `grpc-message`; an exception out of the handler ends it with
INTERNAL. What a peer gets for what it gets wrong:

- an unknown path: UNIMPLEMENTED; a compressed message: UNIMPLEMENTED; a body that is not one
  message: INTERNAL; a message over `max_message_bytes`: RESOURCE_EXHAUSTED (the rest of its
  body is dropped unread);
- more than `MAX_CONCURRENT_STREAMS` calls at once on a connection: that stream refused
  (RST_STREAM REFUSED_STREAM, which gRPC clients retry);
- a frame that breaks HTTP/2 (a bad preface, a frame over `MAX_FRAME_SIZE`, a header block that
  does not decode or exceeds `MAX_HEADER_LIST_BYTES`, a stream id going backwards): GOAWAY with
  the error and the connection closed; calls of other connections are untouched.

Flow control both ways: the windows we grant are topped up as DATA arrives (a request is held
whole in memory, at most `max_message_bytes` per call, `MAX_CONCURRENT_STREAMS` calls per
connection); an answer is sent within the windows the client grants, the rest when it grants
more. A call the client resets has its handler cancelled. `stop(grace)`: no new connections, a
GOAWAY on each, calls in flight answered for up to `grace` seconds, then every connection closed.

The frame layout is written here again rather than shared with the Unity exchange's ends
(`envs.http2`): a home under `huggy_agent` would load torch into the stand-ins, which must stay
light, and importing `envs` here would load mlagents-envs into every replica.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, cast

import hpack

logger = logging.getLogger(__name__)

# HTTP/2 (RFC 9113) and gRPC's message framing, as this server reads and writes them.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
(DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
 CONTINUATION) = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 0x3, 0x4
SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x5, 0x6
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = MAX_STREAM = 2**31 - 1
FRAME_HEADER = struct.Struct(">IBI")
"""A frame's 9-byte header: (24-bit length << 8 | type), flags, stream id."""
MESSAGE_PREFIX = struct.Struct(">BI")
"""gRPC's 5-byte message prefix: compressed flag, length."""
SETTING = struct.Struct(">HI")
WORD = struct.Struct(">I")
MAX_FRAME_SIZE = 1 << 20
"""The largest frame we take (advertised; gRPC's clients send DATA frames up to it)."""
MAX_CONCURRENT_STREAMS = 256
UNCHANGING_BLOCKS_KEPT = 64
"""The most decoded header blocks a connection keeps (see `_Connection._unchanging`)."""
MAX_HEADER_LIST_BYTES = 16 << 10
"""The largest header list we take (advertised), counted as HPACK counts it."""
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
REFUSED_STREAM, COMPRESSION_ERROR = 0x7, 0x9
OK, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 8, 12, 13


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return FRAME_HEADER.pack(len(payload) << 8 | kind, flags, stream) + payload


def settings_frame(*settings: tuple[int, int]) -> bytes:
    """A SETTINGS frame of (key, value) pairs."""
    return frame(SETTINGS, 0, 0, b"".join(SETTING.pack(key, value) for key, value in settings))


def _hpack_string(value: str) -> bytes:
    """An HPACK string literal (RFC 7541 5.2), not Huffman-coded; `value` must be ASCII. Its
    length is an HPACK integer with a 7-bit prefix (5.1)."""
    raw = value.encode("ascii")
    if len(raw) < 127:
        return bytes((len(raw),)) + raw
    length, rest = bytearray((127,)), len(raw) - 127
    while rest >= 128:
        length.append(rest & 0x7F | 0x80)
        rest >>= 7
    length.append(rest)
    return bytes(length) + raw


def _literal(name: str, value: str) -> bytes:
    """A header field as a literal without indexing with a new name (RFC 7541 6.2.2): no table
    state, so the client decodes it whatever its table holds."""
    return b"\x00" + _hpack_string(name) + _hpack_string(value)


def percent_encoded(details: str) -> str:
    """`details` as gRPC's `grpc-message` carries it: UTF-8, every byte outside printable
    ASCII and every '%' percent-encoded."""
    return "".join(chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}"
                   for byte in details.encode("utf-8"))


def status_headers(code: int, details: str = "") -> bytes:
    """The HPACK block of gRPC trailers with status `code` (and `details`, when given, as
    `grpc-message`)."""
    block = _literal("grpc-status", str(code))
    return block + _literal("grpc-message", percent_encoded(details)) if details else block


def grpc_message(payload: bytes) -> bytes:
    """`payload` as one uncompressed gRPC message (length-prefixed)."""
    return MESSAGE_PREFIX.pack(0, len(payload)) + payload


_RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + _hpack_string("application/grpc")
"""`:status 200` (the static table's entry 8), then `content-type` (a literal without indexing
with the static table's name 31, its index as an HPACK integer with a 4-bit prefix)."""
_OK_TRAILERS = status_headers(OK)


class CallContext:
    """What a handler knows of its call and says of its ending, with the methods of
    `grpc.aio.ServicerContext` that handlers use. `set_code` takes a `grpc.StatusCode` or its
    number."""

    __slots__ = ("_metadata", "code", "details")

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata
        self.code = OK
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The call's metadata as (name, value) pairs, names lowercase."""
        return self._metadata

    def set_code(self, code: Any) -> None:
        self.code = code if isinstance(code, int) else code.value[0]

    def set_details(self, details: str) -> None:
        self.details = details


Handler = Callable[[bytes, CallContext], Awaitable[bytes]]


class _CallHeaders(NamedTuple):
    """What a request's header block says: its path, its message encoding, its metadata."""

    path: str
    encoding: str
    metadata: tuple[tuple[str, str], ...]


class _Stream:
    """One call on a connection: its request so far, then its handler's task, then (while
    the client's windows hold it back) the rest of its answer."""

    __slots__ = ("id", "path", "metadata", "body", "send_window", "task", "pending", "tail",
                 "refused")

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.path = ""
        self.metadata: tuple[tuple[str, str], ...] = ()
        self.body = bytearray()
        self.send_window = send_window
        self.task: asyncio.Task[None] | None = None
        self.pending: bytes | None = None
        """The answer's message bytes not yet sent (as DATA, within the windows)."""
        self.tail = b""
        """The trailers' frame, sent once `pending` is all sent."""
        self.refused = False
        """Answered before its request ended; the rest of the request is dropped."""


class _ConnectionError(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY and this error code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def _unpadded(payload: bytes) -> bytes:
    """The content of a PADDED frame's payload (its pad length byte and padding removed)."""
    if not payload or payload[0] >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR, "bad padding")
    return payload[1:len(payload) - payload[0]]


class _Connection(asyncio.Protocol):
    """One client connection of `UnaryServer`."""

    def __init__(self, server: UnaryServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._preface = False
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST_BYTES)
        self._unchanging: dict[bytes, _CallHeaders] = {}
        """Decoded header blocks whose decoding left the HPACK table as it was (table indexes
        and literals not indexed, as gRPC's clients send every call after the first): the
        same bytes decode the same way until a block changes the table, which clears this."""
        self._block: tuple[int, int, bytearray] | None = None  # (stream, flags, fragments)
        self._streams: dict[int, _Stream] = {}
        self._last_stream = 0
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._received = 0
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's (Serve's replicas run on uvloop, whose transports are not
        # asyncio.Transport subclasses but have its methods)
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server.connections.add(self)
        settings = settings_frame((SETTINGS_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS),
                                  (SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW),
                                  (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_SIZE),
                                  (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST_BYTES))
        self._transport.write(settings + frame(WINDOW_UPDATE, 0, 0,
                                               WORD.pack(MAX_WINDOW - DEFAULT_WINDOW)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._server.connections.discard(self)
        for stream in self._streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self._streams.clear()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        buffer = self._buffer
        buffer += data
        offset = 0
        try:
            if not self._preface:
                if len(buffer) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buffer)):
                        raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 client")
                    return
                if buffer[:len(PREFACE)] != PREFACE:
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 client")
                self._preface = True
                offset = len(PREFACE)
            while len(buffer) - offset >= 9:
                size_kind, flags, stream_id = FRAME_HEADER.unpack_from(buffer, offset)
                size = size_kind >> 8
                if size > MAX_FRAME_SIZE:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {size} bytes")
                end = offset + 9 + size
                if end > len(buffer):
                    break
                payload = bytes(buffer[offset + 9:end])
                offset = end
                self._handle(size_kind & 0xFF, flags, stream_id & MAX_STREAM, payload)
                if self.closing:
                    return
        except _ConnectionError as error:
            logger.warning("gRPC connection closed: %s", error)
            self.go_away(error.code, str(error))
            self.close()
            return
        del buffer[:offset]

    def _handle(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            if self._block is None or self._block[0] != stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self._block[2].extend(payload)
            if len(self._block[2]) > MAX_HEADER_LIST_BYTES:
                raise _ConnectionError(COMPRESSION_ERROR, "the header block is too large")
            if flags & END_HEADERS:
                block_stream, first_flags, block = self._block
                self._block = None
                self._on_header_block(block_stream, first_flags, bytes(block))
        elif kind == RST_STREAM:
            stream = self._streams.pop(stream_id, None)
            if stream is not None and stream.task is not None:
                stream.task.cancel()
        elif kind == SETTINGS:
            if not flags & ACK:
                self._apply_settings(payload)
        elif kind == PING:
            if len(payload) != 8:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a PING of the wrong size")
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == GOAWAY:
            self._server.forget_idle(self)
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.3.2, 4.1)

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._received += len(payload)
        if self._received >= MAX_WINDOW // 2:  # top the connection's window up
            self._write(frame(WINDOW_UPDATE, 0, 0, WORD.pack(self._received)))
            self._received = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.task is not None or stream.refused:
            if stream_id == 0 or stream_id > self._last_stream:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if stream is not None and stream.refused and flags & END_STREAM:
                self._forget(stream)
            return  # a stream reset or answered already: its data is dropped
        if flags & PADDED:
            payload = _unpadded(payload)
        stream.body += payload
        if len(stream.body) > self._server.max_message_bytes + 5:
            size = len(stream.body) - 5
            stream.body = bytearray()
            self._refuse(stream, RESOURCE_EXHAUSTED, f"message larger than the limit of "
                         f"{self._server.max_message_bytes} bytes (received {size} so far)",
                         ended=bool(flags & END_STREAM))
            return
        if flags & END_STREAM:
            self._start_call(stream)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & PADDED:
            payload = _unpadded(payload)
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._on_header_block(stream_id, flags, payload)
        else:
            self._block = (stream_id, flags, bytearray(payload))

    def _decode(self, block: bytes) -> _CallHeaders:
        known = self._unchanging.get(block)
        if known is not None:
            return known
        table = self._decoder.header_table
        entries, size = table.dynamic_entries, table.maxsize
        count, newest = len(entries), entries[0] if entries else None
        try:
            fields = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as error:
            raise _ConnectionError(COMPRESSION_ERROR, f"header block: {error}") from None
        path, encoding, metadata = "", "identity", []
        for raw_name, raw_value in fields:
            name, value = bytes(raw_name), bytes(raw_value).decode("utf-8", "replace")
            if name == b":path":
                path = value
            elif name == b"grpc-encoding":
                encoding = value
            elif not name.startswith(b":"):
                metadata.append((name.decode("latin-1"), value))
        headers = _CallHeaders(path, encoding, tuple(metadata))
        # Every entry added is a new tuple at the front, and `newest` is held here, so an
        # unchanged front, count and size mean an unchanged table.
        unchanged = (len(entries) == count and table.maxsize == size
                     and (entries[0] is newest if entries else newest is None))
        if not unchanged or len(self._unchanging) >= UNCHANGING_BLOCKS_KEPT:
            self._unchanging.clear()
        if unchanged:
            self._unchanging[block] = headers
        return headers

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)  # always: the table must follow every block
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers of a request: its end
            if flags & END_STREAM and stream.task is None and not stream.refused:
                self._start_call(stream)
            elif flags & END_STREAM and stream.refused:
                self._forget(stream)
            return
        if stream_id % 2 == 0 or stream_id <= self._last_stream:
            if stream_id == 0 or stream_id % 2 == 0 or not flags & END_STREAM:
                raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
            return  # trailers of a call we already forgot (reset, or answered and done)
        self._last_stream = stream_id
        if self._server.stopping or len(self._streams) >= MAX_CONCURRENT_STREAMS:
            self._write(frame(RST_STREAM, 0, stream_id, WORD.pack(REFUSED_STREAM)))
            return
        stream = _Stream(stream_id, self._peer_initial_window)
        self._streams[stream_id] = stream
        stream.path, stream.metadata = headers.path, headers.metadata
        ended = bool(flags & END_STREAM)
        if stream.path not in self._server.methods:
            self._refuse(stream, UNIMPLEMENTED, f"unknown method {stream.path}", ended)
        elif headers.encoding != "identity":
            self._refuse(stream, UNIMPLEMENTED, f"compression ({headers.encoding}) is not "
                         "supported; send uncompressed messages", ended)
        elif ended:
            self._start_call(stream)

    def _start_call(self, stream: _Stream) -> None:
        body = stream.body
        if len(body) < 5 or MESSAGE_PREFIX.unpack_from(body)[1] != len(body) - 5:
            self._refuse(stream, INTERNAL, "expected exactly one message", ended=True)
            return
        if body[0]:
            self._refuse(stream, UNIMPLEMENTED, "compressed messages are not supported; send "
                         "uncompressed ones", ended=True)
            return
        request = bytes(body[5:])
        stream.body = bytearray()
        stream.task = asyncio.get_running_loop().create_task(self._run(stream, request))
        self._server.calls.add(stream.task)
        stream.task.add_done_callback(self._server.calls.discard)

    async def _run(self, stream: _Stream, request: bytes) -> None:
        handler = self._server.methods[stream.path]
        context = CallContext(stream.metadata)
        try:
            answer = await handler(request, context)
        except asyncio.CancelledError:  # the client reset the call, or went away
            return
        except Exception as error:  # the call ends with INTERNAL; the server serves on
            logger.exception("gRPC call %s failed", stream.path)
            context.set_code(INTERNAL)
            context.set_details(f"{type(error).__name__}: {error}")
            answer = b""
        if self.closing or self._streams.get(stream.id) is not stream:
            return
        if context.code != OK:
            self._refuse(stream, context.code, context.details, ended=True)
            return
        self._answer(stream, answer, status_headers(OK, context.details) if context.details
                     else _OK_TRAILERS)

    def _answer(self, stream: _Stream, answer: bytes, trailers: bytes) -> None:
        """Headers, the answer as one message within the client's windows, then trailers;
        what the windows hold back waits in `stream.pending` for WINDOW_UPDATEs."""
        body = grpc_message(answer)
        head = frame(HEADERS, END_HEADERS, stream.id, _RESPONSE_HEADERS)
        tail = frame(HEADERS, END_HEADERS | END_STREAM, stream.id, trailers)
        if len(body) <= min(self._send_window, stream.send_window, self._peer_max_frame):
            self._send_window -= len(body)
            self._write(head + frame(DATA, 0, stream.id, body) + tail)
            self._forget(stream)
            return
        self._write(head)
        stream.pending, stream.tail = body, tail
        self._flush(stream)

    def _flush(self, stream: _Stream) -> None:
        """Send as much of `stream`'s pending answer as the windows allow; the trailers once
        it is all sent."""
        body = stream.pending
        assert body is not None
        frames = []
        sent = 0
        while sent < len(body):
            room = min(self._send_window, stream.send_window, self._peer_max_frame,
                       len(body) - sent)
            if room <= 0:
                break
            frames.append(frame(DATA, 0, stream.id, body[sent:sent + room]))
            sent += room
            self._send_window -= room
            stream.send_window -= room
        stream.pending = body[sent:]
        if not stream.pending:
            frames.append(stream.tail)
            stream.pending = None
            self._forget(stream)
        if frames:
            self._write(b"".join(frames))

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE of the wrong size")
        increment = WORD.unpack(payload)[0] & MAX_WINDOW
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "the connection window overflowed")
            self._flush_waiting()
            return
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.send_window += increment
            if stream.pending is not None:
                self._flush(stream)

    def _apply_settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame of the wrong size")
        for offset in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "initial window too large")
                for stream in self._streams.values():
                    stream.send_window += value - self._peer_initial_window
                self._peer_initial_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value < 1 << 24:
                    raise _ConnectionError(PROTOCOL_ERROR, f"max frame size {value}")
                self._peer_max_frame = value
            # the header table size bounds the peer's decoder: ours sends no indexed fields
        self._write(frame(SETTINGS, ACK, 0))
        self._flush_waiting()

    def _flush_waiting(self) -> None:
        """Send what the windows now allow of every answer they held back."""
        for stream in [s for s in self._streams.values() if s.pending is not None]:
            if self._send_window <= 0:
                break
            self._flush(stream)

    def _refuse(self, stream: _Stream, code: int, details: str, ended: bool) -> None:
        """End `stream`'s call with `code` and `details` (trailers only); when its request
        has not ended, the rest of it is dropped as it comes."""
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        self._write(frame(HEADERS, END_HEADERS | END_STREAM, stream.id,
                          _RESPONSE_HEADERS + status_headers(code, details)))
        if ended:
            self._forget(stream)
        else:
            stream.refused = True
            stream.task = None

    def _forget(self, stream: _Stream) -> None:
        self._streams.pop(stream.id, None)
        if not self._streams:
            self._server.forget_idle(self)

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self.closing:
            self._transport.write(data)

    def go_away(self, code: int = NO_ERROR, reason: str = "") -> None:
        """Tell the client that no call after the last one taken will be (GOAWAY with `code`,
        `reason` as its debug data)."""
        self._write(frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream, code)
                          + reason.encode("utf-8", "replace")[:256]))

    @property
    def idle(self) -> bool:
        return not self._streams

    def close(self) -> None:
        self.closing = True
        if self._transport is not None:
            self._transport.close()


class UnaryServer:
    """Serves `methods` (path -> handler) on the running event loop; see the module's
    docstring. `max_message_bytes` bounds each request."""

    def __init__(self, methods: Mapping[str, Handler], max_message_bytes: int) -> None:
        self.methods = dict(methods)
        self.max_message_bytes = max_message_bytes
        self.connections: set[_Connection] = set()
        self.calls: set[asyncio.Task[None]] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, reuse_port: bool = False) -> None:
        """Listen on `host:port` (port 0: one the system picks), sharing the port with other
        sockets of this user that bind it the same way where `reuse_port`. OSError if the
        port cannot be bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port,
                                                reuse_port=reuse_port or None)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on."""
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    def forget_idle(self, connection: _Connection) -> None:
        """While stopping, a connection whose calls are all answered is closed."""
        if self.stopping and connection.idle:
            connection.close()

    async def stop(self, grace: float) -> None:
        """Stop listening, send each connection a GOAWAY, let the calls in flight finish for
        up to `grace` seconds, then close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away()
            self.forget_idle(connection)
        if self.calls:
            await asyncio.wait(set(self.calls), timeout=grace)
        for connection in list(self.connections):
            connection.close()
        await asyncio.sleep(0)  # the transports close in the next turn
