"""Both ends of the Unity exchange as gRPC over HTTP/2 frames written straight onto TCP sockets
(RFC 9113, cleartext with prior knowledge, as gRPC's own clients connect to a local server):
`UnaryClient`, the stand-ins' end, and `UnaryServer`, the Python side's.

A Unity player calls one unary method (`Exchange`: the handshake, then once per step) on the
Python side's gRPC server. Python's `grpc` package costs several times more CPU per call than
these two (docs/benchmarks.md, "Environments"), and so does an exchange through python-hyper's
`h2` state machine; every step of an environment makes one. These do what one lockstep call
needs: one stream per call, our headers encoded once as literals, flow control both ways,
answers to the peer's SETTINGS and PINGs. Both poll their sockets for a while before they
block, where a CPU is free (`envs.spin_wait`).

The server checks what a client sends as RFC 9113 requires and holds each client to the caps of
`ServerLimits` (what a client gets for each fault is listed above `_ServerConnection`). It never
blocks on a client: past `max_unsent_bytes` unread it stops reading from that connection, as
grpcio does, and drops it after `send_stall_timeout_s`. The client checks what its server sends
the same way and raises `ExchangeError` rather than wait on a broken peer. The tests hold the
server's verdicts to `h2`'s, or to RFC 9113's where `h2` departs from it.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields

import hpack

from envs.spin_wait import SpinWait

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
(DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
 CONTINUATION) = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
SETTINGS_MAX_HEADER_LIST_SIZE, SETTINGS_ENABLE_CONNECT_PROTOCOL = 0x6, 0x8
(NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED,
 FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, CONNECT_ERROR,
 ENHANCE_YOUR_CALM) = range(12)
GRPC_OK, GRPC_RESOURCE_EXHAUSTED, GRPC_UNIMPLEMENTED, GRPC_INTERNAL = 0, 8, 12, 13
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
LARGEST_MAX_FRAME = 2**24 - 1
MAX_WINDOW = MAX_STREAM = 2**31 - 1
MAX_FRAME_SIZE = 1 << 20
"""The largest frame either end takes (advertised): a request of a megabyte in one DATA frame,
where the default (16,384 bytes) would take 64."""
MAX_MESSAGE_BYTES = 4 << 20
"""The largest message either end takes by default: gRPC's default `max_receive_message_length`
(4 MiB), which mlagents-envs' own server keeps (its `RpcCommunicator` passes no size option to
`grpc.server`), so a player's call that mlagents-envs accepts is accepted here too."""
RECEIVE_CHUNK = 1 << 18
PATH_ECHO_BYTES = 32
"""The most bytes of an unknown path that the refusal's message echoes (escaped)."""
UNCHANGING_BLOCKS_KEPT = 64
"""The most decoded header blocks a server connection remembers (see `_decode_path`)."""
_FRAME_HEADER = struct.Struct(">IBI")  # (24-bit length << 8 | type), flags, stream id
_MESSAGE_PREFIX = struct.Struct(">BI")  # gRPC's: compressed flag, length
_SETTING = struct.Struct(">HI")
_WORD = struct.Struct(">I")
_GOAWAY = struct.Struct(">II")  # last stream id, error code
_SELF_DEPENDENT = 0x100
"""Not a frame flag (those are 8 bits): marks a header block whose priority names its own
stream, for the stream error once the block is decoded."""


@dataclass(frozen=True)
class ServerLimits:
    """The caps of a `UnaryServer`, each bounding what one client can make the server hold or
    do. The defaults suit a server that one Unity player calls in lockstep (one call at a time
    on one connection) and that any local process can reach.

    Raises:
        ValueError: a cap that is not a positive number (naming it and what it held).
    """

    max_message_bytes: int = MAX_MESSAGE_BYTES
    """The largest request message taken (`MAX_MESSAGE_BYTES`): a larger one is refused with
    RESOURCE_EXHAUSTED from its length prefix, before its body is buffered."""
    max_unsent_bytes: int = 1 << 20
    """How many bytes a connection may have waiting for its client to read before the server
    stops reading from it (1 MiB): far more than a lockstep answer, which a client reads before
    it calls again; a client that pipelines calls without reading reaches it."""
    send_stall_timeout_s: float = 10.0
    """How long a connection may stay over `max_unsent_bytes` before it is dropped: a player
    that reads its answers drains far sooner (the kernel's buffers take what it has not read
    yet), so one stuck this long does not read at all."""
    control_frames_per_second: int = 1_000
    """How many frames that carry no call a connection may send per second (PING, SETTINGS,
    RST_STREAM, PRIORITY, empty DATA, unknown types); past it GOAWAY ENHANCE_YOUR_CALM. gRPC's
    clients send a few per second (keepalive and bandwidth-probe PINGs, a SETTINGS update); the
    floods of CVE-2019-9512/9514/9515/9518 send tens of thousands."""
    max_header_list_bytes: int = 16 << 10
    """The largest header list taken (advertised as SETTINGS_MAX_HEADER_LIST_SIZE), counted as
    HPACK counts it, and the most header block bytes buffered (16 KiB, hyper's default): a gRPC
    call's headers take a few hundred bytes."""
    max_continuation_frames: int = 8
    """The most CONTINUATION frames after one HEADERS (nghttp2's default): a gRPC client's
    header block fits one HEADERS frame of `MAX_FRAME_SIZE`."""
    max_concurrent_streams: int = 4
    """The most calls open at once on a connection (advertised); past it REFUSED_STREAM. A
    Unity player has one call open at a time; each open call may hold a request of
    `max_message_bytes`."""
    max_connections: int = 8
    """The most connections at once; a connection past it is closed at once (GOAWAY
    ENHANCE_YOUR_CALM). A player holds one, a reconnecting player briefly two."""
    handshake_timeout_s: float = 10.0
    """How long a new connection may take to send the client preface and its first SETTINGS:
    gRPC's clients send both as soon as they connect."""
    idle_timeout_s: float = 300.0
    """How long a connection may go without an open call before it is closed (GOAWAY NO_ERROR,
    after which gRPC's clients reconnect for their next call). A Unity player calls again as
    soon as it has its answer, and mlagents-envs gives up on a player silent for its
    `timeout_wait` (60 s by default) anyway; a connection idle this long holds a slot for no
    player."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ServerLimits.{field.name} must be a positive number, "
                                 f"got {value!r}")


class ExchangeError(ConnectionError):
    """The call did not end with an answer: the peer refused it, broke HTTP/2 or went away."""


class _ProtocolError(Exception):
    """The peer broke HTTP/2: on `stream` 0 the connection ends with GOAWAY `code`, on another
    stream that stream ends with RST_STREAM `code`. `goaway` False: the peer did not speak
    HTTP/2 at all, and the connection just closes."""

    def __init__(self, code: int, reason: str, stream: int = 0, goaway: bool = True) -> None:
        super().__init__(reason)
        self.code, self.stream, self.goaway = code, stream, goaway


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame.

    Args:
        kind: the frame type.
        flags: its flags.
        stream: its stream id.
        payload: its payload.

    Returns:
        The frame's bytes: the 9-byte header, then `payload`.
    """
    return _FRAME_HEADER.pack(len(payload) << 8 | kind, flags, stream) + payload


def _hpack_integer(value: int, prefix_bits: int, first: int) -> bytes:
    """`value` as an HPACK integer (RFC 7541 5.1) after the bits `first` holds."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out, value = bytearray((first | limit,)), value - limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_string(value: str) -> bytes:
    """An HPACK string literal of ASCII `value`, not Huffman-coded (RFC 7541 5.2)."""
    raw = value.encode("ascii")
    return _hpack_integer(len(raw), 7, 0) + raw


def _percent_encoded(text: str) -> str:
    """`text` as gRPC's grpc-message carries it: bytes outside printable ASCII and "%" as %XX."""
    return "".join(chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}"
                   for byte in text.encode("utf-8"))


_CONTENT_TYPE = b"\x0f\x10" + _hpack_string("application/grpc")  # static name 31, not indexed
_RESPONSE_HEAD = b"\x88" + _CONTENT_TYPE  # :status 200 (static table entry 8), content-type


def request_headers(authority: str, path: str) -> bytes:
    """The HPACK block of a gRPC request, literals without indexing (no table state).

    Args:
        authority: the :authority (host:port).
        path: the :path, "/service/method".

    Returns:
        The header block's bytes.
    """
    return (b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
            + b"\x04" + _hpack_string(path)  # :path (static name 4)
            + b"\x01" + _hpack_string(authority)  # :authority (static name 1)
            + _CONTENT_TYPE + b"\x00" + _hpack_string("te") + _hpack_string("trailers"))


def status_headers(code: int, message: str = "") -> bytes:
    """The HPACK block of gRPC trailers with status `code`.

    Args:
        code: the grpc-status.
        message: the grpc-message, none when empty; percent-encoded here.

    Returns:
        The header block's bytes.
    """
    block = b"\x00" + _hpack_string("grpc-status") + _hpack_string(str(code))
    return block + (b"\x00" + _hpack_string("grpc-message")
                    + _hpack_string(_percent_encoded(message)) if message else b"")


def grpc_message(payload: bytes) -> bytes:
    """A payload framed as one uncompressed gRPC message.

    Args:
        payload: the serialized message.

    Returns:
        Its 5-byte length prefix, then `payload`.
    """
    return _MESSAGE_PREFIX.pack(0, len(payload)) + payload


def _one_message(body: bytes | bytearray) -> bytes | None:
    """The payload of `body` when it is exactly one uncompressed gRPC message, else None."""
    if len(body) < 5:
        return None
    compressed, size = _MESSAGE_PREFIX.unpack_from(body)
    return bytes(body[5:]) if compressed == 0 and size == len(body) - 5 else None


def _unpadded(payload: bytes) -> bytes:
    """The content of a PADDED frame's payload: its pad length byte and padding removed."""
    if not payload or payload[0] >= len(payload):
        raise _ProtocolError(PROTOCOL_ERROR, "padding as long as the frame or longer")
    return payload[1 : len(payload) - payload[0]]


def _opening(*settings: tuple[int, int]) -> bytes:
    """An end's SETTINGS (`settings`, then every stream window and the frame size at ours) and
    the connection window opened as wide."""
    pairs = (*settings, (SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW),
             (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_SIZE))
    return (frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(*pair) for pair in pairs))
            + frame(WINDOW_UPDATE, 0, 0, _WORD.pack(MAX_WINDOW - DEFAULT_WINDOW)))


class _Queued:
    """A message waiting for window: its body, how much of it went out, the frames after it."""

    __slots__ = ("body", "sent", "tail")

    def __init__(self, body: bytes, tail: bytes) -> None:
        self.body, self.sent, self.tail = body, 0, tail


class _Connection:
    """One HTTP/2 connection's frames, shared by both ends and free of I/O: bytes in through
    `_buffer` and `_handle_frames`, bytes out appended to `outbound`. Handles SETTINGS, PINGs,
    WINDOW_UPDATEs, PRIORITY, padding and header block reassembly, and sends messages within
    the peer's windows; each end handles its streams (`_on_data`, `_on_header_block`,
    `_on_reset`, `_on_goaway`, `_is_idle`, `_sent`). `_windows` holds the send window of each
    stream we may still send on, `_queued` what waits for window."""

    def __init__(self, control_frames_per_second: int, max_header_block: int,
                 max_continuations: int, clock: Callable[[], float]) -> None:
        self.outbound = bytearray()
        self._buffer = bytearray()
        self._send_window = DEFAULT_WINDOW  # the connection's, as the peer grants it
        self._windows: dict[int, int] = {}
        self._queued: dict[int, _Queued] = {}
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._received = 0  # DATA bytes not yet given back to the peer's send window
        self._block: list | None = None  # a header block in parts: [stream, flags, bytes, frames]
        self._control_limit = control_frames_per_second
        self._control_frames = 0
        self._control_since = 0.0
        self._max_header_block = max_header_block
        self._max_continuations = max_continuations
        self._clock = clock

    def _handle_frames(self) -> bool:
        """Handle the buffer's whole frames in order; True as soon as one ends the current
        wait (the rest stay buffered). A stream error resets that stream and goes on; a
        connection error raises `_ProtocolError`."""
        buffer = self._buffer
        offset = 0
        try:
            while len(buffer) - offset >= 9:
                size_kind, flags, stream_id = _FRAME_HEADER.unpack_from(buffer, offset)
                size = size_kind >> 8
                if size > MAX_FRAME_SIZE:  # refused before it is buffered
                    raise _ProtocolError(FRAME_SIZE_ERROR, f"a frame of {size} bytes, over the "
                                         f"{MAX_FRAME_SIZE} advertised")
                end = offset + 9 + size
                if end > len(buffer):
                    break
                payload = bytes(buffer[offset + 9 : end])
                offset = end
                try:
                    if self._handle(size_kind & 0xFF, flags, stream_id & MAX_STREAM, payload):
                        return True
                except _ProtocolError as error:
                    if not error.stream:
                        raise
                    self._on_stream_error(error)
            return False
        finally:
            del buffer[:offset]

    def _handle(self, kind: int, flags: int, stream_id: int, payload: bytes) -> bool:
        """Handle one frame; True when it ends the current wait."""
        if self._block is not None and kind != CONTINUATION:
            raise _ProtocolError(PROTOCOL_ERROR, f"a frame of type {kind} inside a header block")
        if kind == DATA:
            if stream_id == 0:
                raise _ProtocolError(PROTOCOL_ERROR, "DATA on stream 0")
            self._give_back(len(payload))
            if flags & PADDED:
                payload = _unpadded(payload)
            return self._on_data(flags, stream_id, payload)
        if kind == HEADERS:
            return self._on_headers(flags, stream_id, payload)
        if kind == CONTINUATION:
            return self._on_continuation(flags, stream_id, payload)
        if kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == PING:
            if stream_id:
                raise _ProtocolError(PROTOCOL_ERROR, f"PING on stream {stream_id}")
            if len(payload) != 8:
                raise _ProtocolError(FRAME_SIZE_ERROR, f"a PING of {len(payload)} bytes, not 8")
            self._count_control()
            if not flags & ACK:
                self.outbound += frame(PING, ACK, 0, payload)
        elif kind == RST_STREAM:
            if stream_id == 0:
                raise _ProtocolError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
            if len(payload) != 4:
                raise _ProtocolError(FRAME_SIZE_ERROR,
                                     f"an RST_STREAM of {len(payload)} bytes, not 4")
            if self._is_idle(stream_id):
                raise _ProtocolError(PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
            self._count_control()
            return self._on_reset(stream_id, _WORD.unpack(payload)[0])
        elif kind == PRIORITY:
            self._on_priority(stream_id, payload)
        elif kind == GOAWAY:
            if stream_id:
                raise _ProtocolError(PROTOCOL_ERROR, f"GOAWAY on stream {stream_id}")
            if len(payload) < 8:
                raise _ProtocolError(FRAME_SIZE_ERROR, f"a GOAWAY of {len(payload)} bytes")
            last, code = _GOAWAY.unpack_from(payload)
            return self._on_goaway(last & MAX_STREAM, code)
        elif kind == PUSH_PROMISE:
            raise _ProtocolError(PROTOCOL_ERROR, "PUSH_PROMISE where push is off")
        else:  # an unknown type is ignored (RFC 9113 section 4.1), and counted
            self._count_control()
        return False

    def _count_control(self) -> None:
        """Count a frame that carries no call; past the cap per second, ENHANCE_YOUR_CALM."""
        self._control_frames += 1
        if self._control_frames == 1:
            self._control_since = self._clock()
        elif self._control_frames > self._control_limit:
            now = self._clock()
            if now - self._control_since < 1.0:
                raise _ProtocolError(ENHANCE_YOUR_CALM, f"over {self._control_limit} control "
                                     "frames in a second")
            self._control_frames, self._control_since = 1, now

    def _on_priority(self, stream_id: int, payload: bytes) -> None:
        """Check a PRIORITY frame (its signal itself is ignored, as RFC 9113 allows). Its
        errors are stream errors (section 6.3), but connection errors on an idle stream, where
        RST_STREAM may not be sent (section 6.4)."""
        if stream_id == 0:
            raise _ProtocolError(PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._count_control()
        errant = 0 if self._is_idle(stream_id) else stream_id
        if len(payload) != 5:
            raise _ProtocolError(FRAME_SIZE_ERROR, f"a PRIORITY of {len(payload)} bytes, not 5",
                                 errant)
        if _WORD.unpack_from(payload)[0] & MAX_STREAM == stream_id:
            raise _ProtocolError(PROTOCOL_ERROR, "a stream depending on itself", errant)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        """Validate the peer's SETTINGS (RFC 9113 section 6.5.2), apply them, acknowledge."""
        if stream_id:
            raise _ProtocolError(PROTOCOL_ERROR, f"SETTINGS on stream {stream_id}")
        if flags & ACK:
            if payload:
                raise _ProtocolError(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            self._count_control()
            return
        if len(payload) % 6:
            raise _ProtocolError(FRAME_SIZE_ERROR, f"a SETTINGS payload of {len(payload)} bytes, "
                                 "not a multiple of 6")
        self._count_control()
        self._on_peer_settings()
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ProtocolError(FLOW_CONTROL_ERROR,
                                         f"SETTINGS_INITIAL_WINDOW_SIZE {value} > 2**31 - 1")
                change = value - self._peer_initial_window
                for stream, window in self._windows.items():
                    if window + change > MAX_WINDOW:
                        raise _ProtocolError(FLOW_CONTROL_ERROR, f"stream {stream}'s window "
                                             "past 2**31 - 1 by SETTINGS_INITIAL_WINDOW_SIZE")
                    self._windows[stream] = window + change
                self._peer_initial_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= LARGEST_MAX_FRAME:
                    raise _ProtocolError(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}, not "
                                         f"in [{DEFAULT_MAX_FRAME}, {LARGEST_MAX_FRAME}]")
                self._peer_max_frame = value
            elif key in (SETTINGS_ENABLE_PUSH, SETTINGS_ENABLE_CONNECT_PROTOCOL) and value > 1:
                raise _ProtocolError(PROTOCOL_ERROR, f"setting {key} = {value}, not 0 or 1")
            else:
                self._check_setting(key, value)
        self.outbound += frame(SETTINGS, ACK, 0)
        self._release()

    def _on_peer_settings(self) -> None:
        """Called on each SETTINGS the peer sends (not on acknowledgements)."""

    def _check_setting(self, key: int, value: int) -> None:
        """A setting the shared code does not know: each end's own checks."""

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ProtocolError(FRAME_SIZE_ERROR, f"a WINDOW_UPDATE of {len(payload)} bytes, "
                                 "not 4")
        increment = _WORD.unpack(payload)[0] & MAX_WINDOW
        if stream_id == 0:
            if increment == 0:
                raise _ProtocolError(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise _ProtocolError(FLOW_CONTROL_ERROR, "the connection's window past 2**31 - 1")
        elif stream_id in self._windows:
            if increment == 0:
                raise _ProtocolError(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0", stream_id)
            window = self._windows[stream_id] + increment
            if window > MAX_WINDOW:
                raise _ProtocolError(FLOW_CONTROL_ERROR, "the window past 2**31 - 1", stream_id)
            self._windows[stream_id] = window
        elif self._is_idle(stream_id):
            raise _ProtocolError(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
        else:  # a stream we are done sending on: nothing to do
            return
        if self._queued:
            self._release()

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> bool:
        if stream_id == 0:
            raise _ProtocolError(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = _unpadded(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise _ProtocolError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if _WORD.unpack_from(payload)[0] & MAX_STREAM == stream_id:
                flags |= _SELF_DEPENDENT
            payload = payload[5:]
        if len(payload) > self._max_header_block:
            raise _ProtocolError(ENHANCE_YOUR_CALM, f"a header block over "
                                 f"{self._max_header_block} bytes")
        if flags & END_HEADERS:
            return self._on_header_block(stream_id, flags, payload)
        self._block = [stream_id, flags, bytearray(payload), 0]
        return False

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> bool:
        block = self._block
        if block is None or block[0] != stream_id:
            raise _ProtocolError(PROTOCOL_ERROR, f"CONTINUATION on stream {stream_id} after no "
                                 "HEADERS of its own")
        block[3] += 1
        if block[3] > self._max_continuations:
            raise _ProtocolError(ENHANCE_YOUR_CALM, f"a header block in over "
                                 f"{self._max_continuations} CONTINUATION frames")
        block[2] += payload
        if len(block[2]) > self._max_header_block:
            raise _ProtocolError(ENHANCE_YOUR_CALM, f"a header block over "
                                 f"{self._max_header_block} bytes")
        if not flags & END_HEADERS:
            return False
        self._block = None
        return self._on_header_block(stream_id, block[1], bytes(block[2]))

    def _give_back(self, size: int) -> None:
        """Count received DATA against the connection window; top it up past half of it."""
        self._received += size
        if self._received > MAX_WINDOW // 2:
            self.outbound += frame(WINDOW_UPDATE, 0, 0, _WORD.pack(self._received))
            self._received = 0

    def _send(self, stream: int, head: bytes, body: bytes, tail: bytes) -> None:
        """Send `head` (frames), `body` in DATA frames within the peer's windows, then `tail`
        (frames); with no `tail` the last DATA frame ends the stream. What the windows hold
        back waits in `_queued` for WINDOW_UPDATEs."""
        window = self._windows[stream]
        size = len(body)
        if size <= self._send_window and size <= window and size <= self._peer_max_frame:
            self._send_window -= size  # all of it at once: a lockstep message, usually
            self._windows[stream] = window - size
            self.outbound += head
            self.outbound += _FRAME_HEADER.pack(size << 8, 0 if tail else END_STREAM, stream)
            self.outbound += body
            self.outbound += tail
            self._sent(stream)
            return
        self.outbound += head
        queued = self._queued[stream] = _Queued(body, tail)
        self._push(stream, queued)

    def _push(self, stream: int, queued: _Queued) -> None:
        """Send what the windows allow of `stream`'s queued message."""
        body, sent, outbound = queued.body, queued.sent, self.outbound
        while sent < len(body):
            size = min(self._send_window, self._windows[stream], self._peer_max_frame,
                       len(body) - sent)
            if size <= 0:
                break
            end = sent + size
            outbound += _FRAME_HEADER.pack(size << 8, END_STREAM if end == len(body)
                                           and not queued.tail else 0, stream)
            outbound += body[sent:end]
            sent = end
            self._send_window -= size
            self._windows[stream] -= size
        queued.sent = sent
        if sent == len(body):
            outbound += queued.tail
            del self._queued[stream]
            self._sent(stream)

    def _release(self) -> None:
        """Send what the windows now allow of every queued message."""
        for stream, queued in list(self._queued.items()):
            if stream in self._queued:
                self._push(stream, queued)

    def _on_stream_error(self, error: _ProtocolError) -> None:
        """The peer broke HTTP/2 on one stream: it ends with RST_STREAM."""
        self._reset(error.stream, error.code)

    def _reset(self, stream: int, code: int) -> None:
        """End `stream` with RST_STREAM `code`."""
        self.outbound += frame(RST_STREAM, 0, stream, _WORD.pack(code))
        self._forget(stream)

    def _forget(self, stream: int) -> None:
        """Nothing more is sent on `stream`."""
        self._windows.pop(stream, None)
        self._queued.pop(stream, None)

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> bool:
        raise NotImplementedError

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> bool:
        raise NotImplementedError

    def _on_reset(self, stream_id: int, code: int) -> bool:
        raise NotImplementedError

    def _on_goaway(self, last_stream: int, code: int) -> bool:
        raise NotImplementedError

    def _is_idle(self, stream_id: int) -> bool:
        """Whether `stream_id` was never opened (RFC 9113 section 5.1)."""
        raise NotImplementedError

    def _sent(self, stream: int) -> None:
        """Called once `stream`'s message and tail are all in `outbound`."""


class UnaryClient(_Connection):
    """Calls `path` on the gRPC server at `host`:`port` with serialized request bytes and
    returns the serialized response bytes. One call at a time (the exchange is lockstep). It
    does not decode the server's headers (it keeps no HPACK table): a stream that ends after
    exactly one message is an answer, which is how a gRPC server ends an OK unary call.

    Args:
        host: the server's address.
        port: its port.
        path: the method's path, "/service/method".
        connect_timeout: how long to retry a refused connection and to wait for the first
            answer (the handshake); later calls wait as long as the server takes, until it
            closes the connection.
        max_message_bytes: the largest answer taken (`MAX_MESSAGE_BYTES`); a larger one ends
            the call with `ExchangeError`.

    Raises:
        ConnectionRefusedError: no server listened for `connect_timeout` seconds.
        OSError: the connection failed otherwise.
    """

    def __init__(self, host: str, port: int, path: str, connect_timeout: float,
                 max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._address = (host, port)
        self._headers = request_headers(f"{host}:{port}", path)
        self._max_message = max_message_bytes
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
        limits = ServerLimits()  # the server's default caps hold for what a server sends too
        super().__init__(limits.control_frames_per_second, limits.max_header_list_bytes,
                         limits.max_continuation_frames, time.monotonic)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket = sock
        self._spin = SpinWait()
        self._timed = timeout is not None
        self._next_stream = 1
        self._current = 0  # the stream of the call in progress, 0 between calls
        self._answer = bytearray()
        self._going_away = False
        self._broken = ""
        self.outbound += PREFACE + _opening((SETTINGS_ENABLE_PUSH, 0))
        self._flush()

    def call(self, request: bytes) -> bytes:
        """The response to `request`.

        Args:
            request: the serialized request message.

        Returns:
            The serialized response message.

        Raises:
            ExchangeError: the server refused the call, broke HTTP/2 or went away.
            OSError: the connection failed.
        """
        if self._broken:
            raise ExchangeError(self._broken)
        if self._next_stream > MAX_STREAM or self._going_away:  # a fresh connection
            self._socket.close()
            self._connect(None)
        stream = self._current = self._next_stream
        self._next_stream += 2
        self._windows = {stream: self._peer_initial_window}
        self._answer = bytearray()
        try:
            self._send(stream, frame(HEADERS, END_HEADERS, stream, self._headers),
                       grpc_message(request), b"")
            self._flush()
            with self._spin.waiting(self._readable):
                self._wait()
        except _ProtocolError as error:
            self._fail(error)
        finally:
            self._current = 0
        if self._timed:  # the first answer came: from now on wait as long as the server takes
            self._socket.settimeout(None)
            self._timed = False
        answer = _one_message(self._answer)
        if answer is None:
            raise ExchangeError("the call ended without an answer (the server refused it)")
        return answer

    def _fail(self, error: _ProtocolError) -> None:
        """End the call on connection error `error`: GOAWAY, and the connection closed (later
        calls raise too). Raises ExchangeError."""
        self._broken = f"the server broke HTTP/2: {error} (error {error.code})"
        with contextlib.suppress(OSError):
            self._socket.sendall(frame(GOAWAY, 0, 0, _GOAWAY.pack(0, error.code)))
        self._socket.close()
        raise ExchangeError(self._broken) from None

    def _on_stream_error(self, error: _ProtocolError) -> None:
        """The server broke HTTP/2 on a stream: reset it; on the call's, the call fails."""
        self._reset(error.stream, error.code)
        if error.stream == self._current:
            self._flush()
            raise ExchangeError(f"the call failed: {error} (error {error.code})")

    def _wait(self) -> None:
        """Read and handle frames until the call ends."""
        while not self._handle_frames():
            self._flush()
            chunk = self._socket.recv(RECEIVE_CHUNK)
            if not chunk:
                raise ExchangeError("the peer closed the connection")
            self._buffer += chunk
        self._flush()

    def _flush(self) -> None:
        if self.outbound:
            self._socket.sendall(self.outbound)
            self.outbound.clear()

    def _readable(self) -> bool:
        """Whether the socket has something to read now (never waits)."""
        return bool(select.select([self._socket], [], [], 0)[0])

    def _is_idle(self, stream_id: int) -> bool:
        return stream_id % 2 == 0 or stream_id >= self._next_stream

    def _check_setting(self, key: int, value: int) -> None:
        if key == SETTINGS_ENABLE_PUSH and value == 1:
            raise _ProtocolError(PROTOCOL_ERROR, "a server enabling push")

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> bool:
        if stream_id != self._current:
            if self._is_idle(stream_id):
                raise _ProtocolError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return False  # an earlier call's, reset by us
        answer = self._answer
        answer += payload
        if len(answer) >= 5 and _MESSAGE_PREFIX.unpack_from(answer)[1] > self._max_message:
            raise _ProtocolError(CANCEL, f"an answer of {_MESSAGE_PREFIX.unpack_from(answer)[1]}"
                                 f" bytes, over the limit of {self._max_message}", stream_id)
        return self._end(flags)

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> bool:
        if stream_id != self._current:
            if self._is_idle(stream_id):
                raise _ProtocolError(PROTOCOL_ERROR, f"HEADERS on idle stream {stream_id}")
            return False
        return self._end(flags)

    def _end(self, flags: int) -> bool:
        """Whether the answer's stream ended: with the request sent, the call is over."""
        if not flags & END_STREAM:
            return False
        if self._current in self._queued:
            raise ExchangeError("the server ended the call before reading the request")
        return True

    def _on_reset(self, stream_id: int, code: int) -> bool:
        if stream_id == self._current:
            raise ExchangeError(f"the server reset the call (error {code})")
        return False

    def _on_goaway(self, last_stream: int, code: int) -> bool:
        """The server goes away: the call in progress is answered when the server took it (the
        next call goes on a new connection), and fails otherwise."""
        self._going_away = True
        if code != NO_ERROR or last_stream < self._current:
            raise ExchangeError(f"the server is going away (error {code})")
        return False

    def close(self) -> None:
        """Close the connection."""
        self._socket.close()


class _Stream:
    """A call on a server connection: its request so far, the length its prefix declares (-1
    before), whether the client has ended it, and the call handed to the server (if so)."""

    __slots__ = ("body", "expected", "ended", "call")

    def __init__(self) -> None:
        self.body = bytearray()
        self.expected = -1
        self.ended = False
        self.call: tuple | None = None


# What a client gets for what it gets wrong:
# - a frame that breaks HTTP/2 (a frame over `MAX_FRAME_SIZE`, a bad SETTINGS value, a window
#   pushed past 2**31 - 1 on the connection, DATA or RST_STREAM on a stream never opened, a
#   stream id going backwards, a header block that does not decode): GOAWAY with the error code
#   RFC 9113 names, and the connection closed; one that breaks a stream only (a WINDOW_UPDATE of
#   zero or past 2**31 - 1 on a stream, DATA after the request ended): RST_STREAM on it;
# - more control frames than `ServerLimits.control_frames_per_second`, a header block over
#   `max_header_list_bytes` or in more than `max_continuation_frames` CONTINUATION frames:
#   GOAWAY ENHANCE_YOUR_CALM, the connection closed;
# - more than `max_concurrent_streams` calls at once on a connection: RST_STREAM REFUSED_STREAM
#   (gRPC clients retry it);
# - a call to another path: grpc-status UNIMPLEMENTED; a message over `max_message_bytes`
#   (seen from gRPC's 5-byte length prefix, before the body is taken): RESOURCE_EXHAUSTED; a body
#   that is not one uncompressed message: INTERNAL. The rest of such a request is dropped unread
#   (RST_STREAM NO_ERROR asks the client to stop sending it).
# What a client has not read waits in its connection's buffer (the sockets do not block), and the
# other connections and the call in hand go on while one is stalled.
class _ServerConnection(_Connection):
    """One client's connection to `UnaryServer`, free of I/O: bytes in through `receive`,
    bytes out in `outbound`. Appends each complete call to `calls` as (self, stream, request),
    and takes it out again when the client resets it first. Stays usable after a connection
    error: `error` is set, the GOAWAY is in `outbound`, and nothing more is read."""

    def __init__(self, path: bytes, limits: ServerLimits, calls: deque,
                 clock: Callable[[], float]) -> None:
        super().__init__(limits.control_frames_per_second, limits.max_header_list_bytes,
                         limits.max_continuation_frames, clock)
        self._path = path
        self._limits = limits
        self._max_message = limits.max_message_bytes
        self._calls = calls
        self._streams: dict[int, _Stream] = {}
        self._last_stream = 0
        self._decoder = hpack.Decoder(max_header_list_size=limits.max_header_list_bytes)
        self._unchanging: dict[bytes, bytes] = {}
        """The paths of decoded header blocks whose decoding left the HPACK table as it was
        (table indexes and literals not indexed, as gRPC's clients send every call after the
        first): the same bytes decode the same way until a block changes the table."""
        self._preface = False
        self.handshaken = False
        self.error: _ProtocolError | None = None
        self.deadline: float | None = clock() + limits.handshake_timeout_s
        """When this connection is to be closed unless something happens: the end of the
        handshake timeout, then of the idle timeout while no call is open; None with calls."""
        self.stuck_since: float | None = None  # kept by the server: over max_unsent_bytes since
        self.descriptor = -1  # kept by the server: its socket's
        self.outbound += _opening(
            (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
            (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_bytes))

    def receive(self, data: bytes) -> None:
        """Handle `data` from the client. A connection error leaves GOAWAY in `outbound` (none
        for a client that does not speak HTTP/2) and sets `error`; data after it is ignored."""
        if self.error is not None:
            return
        buffer = self._buffer
        buffer += data
        try:
            if not self.handshaken:
                if not self._preface:
                    if len(buffer) < len(PREFACE):
                        if not PREFACE.startswith(bytes(buffer)):
                            raise _ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 client",
                                                 goaway=False)
                        return
                    if buffer[: len(PREFACE)] != PREFACE:
                        raise _ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 client", goaway=False)
                    del buffer[: len(PREFACE)]
                    self._preface = True
                if len(buffer) >= 9 and (buffer[3] != SETTINGS or buffer[4] & ACK):
                    raise _ProtocolError(PROTOCOL_ERROR, "the client's preface did not go on "
                                         "with SETTINGS")
            self._handle_frames()
        except _ProtocolError as error:
            self.error = error
            if error.goaway:
                self.outbound += frame(GOAWAY, 0, 0, _GOAWAY.pack(self._last_stream, error.code)
                                       + str(error).encode("ascii", "replace")[:128])
            self._forget_calls()

    def _on_peer_settings(self) -> None:
        if not self.handshaken:
            self.handshaken = True
            self.deadline = self._clock() + self._limits.idle_timeout_s

    def _is_idle(self, stream_id: int) -> bool:
        return stream_id % 2 == 0 or stream_id > self._last_stream

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> bool:
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._is_idle(stream_id):
                raise _ProtocolError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if not payload and not flags & END_STREAM:
                self._count_control()
            return False  # a stream refused, reset or answered: its data is dropped
        if stream.ended:
            raise _ProtocolError(STREAM_CLOSED, "DATA after the request ended", stream_id)
        if not payload and not flags & END_STREAM:
            self._count_control()
        body = stream.body
        body += payload
        if stream.expected < 0 and len(body) >= 5:
            declared = _MESSAGE_PREFIX.unpack_from(body)[1]
            if declared > self._max_message:
                self._refuse(stream_id, bool(flags & END_STREAM), GRPC_RESOURCE_EXHAUSTED,
                             f"a message of {declared} bytes, over the limit of "
                             f"{self._max_message}")
                return False
            stream.expected = 5 + declared
        if len(body) > stream.expected >= 0:
            self._refuse(stream_id, bool(flags & END_STREAM), GRPC_INTERNAL,
                         "expected one uncompressed message")
            return False
        if flags & END_STREAM:
            self._end_request(stream_id, stream)
        return False

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> bool:
        path = self._decode_path(block)  # always: the table must follow every block
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers of a request
            if stream.ended:
                raise _ProtocolError(STREAM_CLOSED, "HEADERS after the request ended", stream_id)
            if not flags & END_STREAM:
                raise _ProtocolError(PROTOCOL_ERROR, "trailers that do not end the request",
                                     stream_id)
            self._end_request(stream_id, stream)
            return False
        if stream_id % 2 == 0:
            raise _ProtocolError(PROTOCOL_ERROR, f"HEADERS on even stream {stream_id} (a client's "
                                 "streams are odd)")
        if stream_id <= self._last_stream:
            raise _ProtocolError(PROTOCOL_ERROR, f"HEADERS on stream {stream_id} after stream "
                                 f"{self._last_stream} (stream ids only go up)")
        self._last_stream = stream_id
        if flags & _SELF_DEPENDENT:
            raise _ProtocolError(PROTOCOL_ERROR, "a stream depending on itself", stream_id)
        if len(self._streams) >= self._limits.max_concurrent_streams:
            self.outbound += frame(RST_STREAM, 0, stream_id, _WORD.pack(REFUSED_STREAM))
            return False
        ended = bool(flags & END_STREAM)
        if path != self._path:
            self._refuse(stream_id, ended, GRPC_UNIMPLEMENTED, f"unknown method {_echo(path)}")
            return False
        stream = self._streams[stream_id] = _Stream()
        self._windows[stream_id] = self._peer_initial_window
        self.deadline = None
        if ended:
            self._end_request(stream_id, stream)
        return False

    def _decode_path(self, block: bytes) -> bytes:
        """The :path of header block `block` (empty when it has none), decoded with the
        connection's HPACK table (COMPRESSION_ERROR when it does not decode, ENHANCE_YOUR_CALM
        when its header list is over the cap). A block whose decoding left the table as it was
        is remembered, and the same bytes are not decoded again."""
        known = self._unchanging.get(block)
        if known is not None:
            return known
        table = self._decoder.header_table
        entries, size = table.dynamic_entries, table.maxsize
        count, newest = len(entries), entries[0] if entries else None
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.OversizedHeaderListError:
            raise _ProtocolError(ENHANCE_YOUR_CALM, "a header list over "
                                 f"{self._limits.max_header_list_bytes} bytes") from None
        except (hpack.HPACKError, IndexError, TypeError) as error:
            raise _ProtocolError(COMPRESSION_ERROR,
                                 f"a header block that does not decode ({type(error).__name__})"
                                 ) from None
        path = next((bytes(value) for name, value in headers if name == b":path"), b"")
        # Every entry added is a new tuple at the front, and `newest` is held here, so an
        # unchanged front, count and size mean an unchanged table.
        unchanged = (len(entries) == count and table.maxsize == size
                     and (entries[0] is newest if entries else newest is None))
        if not unchanged or len(self._unchanging) >= UNCHANGING_BLOCKS_KEPT:
            self._unchanging.clear()
        if unchanged:
            self._unchanging[block] = path
        return path

    def _end_request(self, stream_id: int, stream: _Stream) -> None:
        """The client ended the request on `stream_id`: a call when it is one uncompressed
        message, refused with INTERNAL otherwise."""
        request = _one_message(stream.body)
        if request is None:
            self._refuse(stream_id, True, GRPC_INTERNAL, "expected one uncompressed message")
            return
        stream.ended = True
        stream.body = bytearray()
        stream.call = (self, stream_id, request)
        self._calls.append(stream.call)

    def _refuse(self, stream_id: int, ended: bool, code: int, message: str) -> None:
        """End the call on `stream_id` with grpc-status `code` (trailers only); where the
        client has not ended the request (`ended`), RST_STREAM NO_ERROR asks it to stop."""
        self.outbound += frame(HEADERS, END_HEADERS | END_STREAM, stream_id,
                               _RESPONSE_HEAD + status_headers(code, message))
        if not ended:
            self.outbound += frame(RST_STREAM, 0, stream_id, _WORD.pack(NO_ERROR))
        self._forget(stream_id)

    def _on_reset(self, stream_id: int, code: int) -> bool:
        self._forget(stream_id)
        return False

    def _on_goaway(self, last_stream: int, code: int) -> bool:
        return False  # the client opens no more calls; those open are still answered

    def _forget(self, stream: int) -> None:
        super()._forget(stream)
        forgotten = self._streams.pop(stream, None)
        if forgotten is not None and forgotten.call is not None:  # not taken yet
            self._calls.remove(forgotten.call)
        if not self._streams and self.handshaken:
            self.deadline = self._clock() + self._limits.idle_timeout_s

    def _forget_calls(self) -> None:
        """Take this connection's calls out of the server's queue (the connection is over)."""
        for stream in list(self._streams):
            self._forget(stream)

    def take(self, stream: int) -> None:
        """The server took the call on `stream` out of its queue."""
        self._streams[stream].call = None

    def answer(self, stream: int, response: bytes) -> None:
        """Answer the call on `stream` with `response` (nothing when it is gone)."""
        if stream not in self._windows or self.error is not None:
            return
        self._send(stream, frame(HEADERS, END_HEADERS, stream, _RESPONSE_HEAD),
                   grpc_message(response), _ok_trailers(stream))

    def _sent(self, stream: int) -> None:
        self._forget(stream)

    def go_away(self) -> None:
        """Queue GOAWAY NO_ERROR: the client is to open no more calls here."""
        if self.error is None:
            self.outbound += frame(GOAWAY, 0, 0, _GOAWAY.pack(self._last_stream, NO_ERROR))

    @property
    def sending(self) -> bool:
        """Whether an answer still waits for window."""
        return bool(self._queued)


_OK_TRAILERS = status_headers(GRPC_OK)


def _ok_trailers(stream: int) -> bytes:
    """The trailers frame of an OK call on `stream`."""
    return _FRAME_HEADER.pack(len(_OK_TRAILERS) << 8 | HEADERS, END_HEADERS | END_STREAM,
                              stream) + _OK_TRAILERS


def _echo(path: bytes) -> str:
    """A short escaped prefix of a client's `path`, to name it in a message."""
    shown = ascii(path[:PATH_ECHO_BYTES].decode("latin-1"))
    return shown + ("..." if len(path) > PATH_ECHO_BYTES else "")


class UnaryServer:
    """A gRPC server of one unary method, served in the calling thread, one call at a time:
    `poll` waits for a call, `receive` takes its request (serialized bytes), `answer` answers
    the call taken last. Clients may connect (and reconnect) at any time; their frames are
    handled whenever the caller polls, receives or answers. Listens on `host`:`port`
    (SO_REUSEADDR, no SO_REUSEPORT).

    Args:
        host: the address to listen on.
        port: the port (0: one the system chooses, see `address`).
        path: the method served, "/service/method"; a call to another ends with UNIMPLEMENTED.
        limits: the caps on what a client may make the server hold or do.
        clock: seconds, for the connections' timeouts and control frame rate (`poll`'s own
            timeout is in real seconds).

    Raises:
        OSError: the port is in use.
    """

    def __init__(self, host: str, port: int, path: str, limits: ServerLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._listener = socket.create_server((host, port))
        self._listener.setblocking(False)
        self._path = path.encode("ascii")
        self.limits = limits if limits is not None else ServerLimits()
        self._clock = clock
        self._connections: dict[int, tuple[socket.socket, _ServerConnection]] = {}
        self._readers: list[int] = []  # the descriptors read: listener, connections not stuck
        self._unsent: dict[int, tuple[socket.socket, _ServerConnection]] = {}
        self._calls: deque[tuple[_ServerConnection, int, bytes]] = deque()
        self._taken: tuple[_ServerConnection, int] | None = None
        self._spin = SpinWait()
        self._watch()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on: the port the system chose for port 0."""
        host, port = self._listener.getsockname()[:2]
        return host, port

    @property
    def connections(self) -> int:
        """How many client connections are open."""
        return len(self._connections)

    def poll(self, timeout: float | None) -> bool:
        """Whether a call is waiting to be received, waiting up to `timeout` seconds for one
        (None: as long as it takes). A wait polls first (`envs.spin_wait`).

        Args:
            timeout: the longest wait in seconds, None for no limit.

        Returns:
            True once a call waits, False after `timeout` seconds without one.
        """
        if self._calls or timeout == 0:
            return self._poll(timeout)
        with self._spin.waiting(self._readable):
            return self._poll(timeout)

    def _readable(self) -> bool:
        """Whether the listener or a connection has something to read now (never waits)."""
        return bool(select.select(self._readers, [], [], 0)[0])

    def _watch(self) -> None:
        """The descriptors to read: the listener and every connection under its unsent cap."""
        cap = self.limits.max_unsent_bytes
        self._readers = [self._listener.fileno(), *(
            descriptor for descriptor, (_, connection) in self._connections.items()
            if len(connection.outbound) <= cap)]

    def _poll(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        listener = self._readers[0]
        while not self._calls:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            timer = self._next_timer()
            if timer is not None:
                due = max(timer - self._clock(), 0.0)
                wait = due if wait is None else min(wait, due)
            readable, writable, _ = select.select(self._readers, list(self._unsent), [], wait)
            for descriptor in readable:
                if descriptor == listener:
                    self._accept()
                elif descriptor in self._connections:
                    self._read(descriptor)
            for descriptor in writable:
                if descriptor in self._unsent:
                    self._flush(descriptor)
            if timer is not None and self._clock() >= timer:
                self._expire()
            if deadline is not None and not self._calls and time.monotonic() >= deadline:
                return False
        return True

    def _next_timer(self) -> float | None:
        """The earliest time a connection is to be closed unless something happens."""
        earliest = None
        for _, connection in self._connections.values():
            due = connection.deadline
            if connection.stuck_since is not None:
                stalled = connection.stuck_since + self.limits.send_stall_timeout_s
                due = stalled if due is None else min(due, stalled)
            if due is not None and (earliest is None or due < earliest):
                earliest = due
        return earliest

    def _expire(self) -> None:
        """Close the connections whose handshake, idle or stall timeout has passed."""
        now = self._clock()
        stall = self.limits.send_stall_timeout_s
        for descriptor, (_, connection) in list(self._connections.items()):
            if connection.stuck_since is not None and now >= connection.stuck_since + stall:
                self._drop(descriptor)
            elif connection.deadline is not None and now >= connection.deadline:
                connection.go_away()
                self._drop(descriptor)

    def _accept(self) -> None:
        """Take a new connection; past `max_connections` it is closed at once."""
        try:
            sock, _ = self._listener.accept()
        except OSError:  # a client that left before its connection was set up
            return
        sock.setblocking(False)
        if len(self._connections) >= self.limits.max_connections:
            with contextlib.suppress(OSError):
                sock.send(_opening() + frame(GOAWAY, 0, 0, _GOAWAY.pack(0, ENHANCE_YOUR_CALM)
                                             + b"too many connections"))
            _close_after_sending(sock)
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _ServerConnection(self._path, self.limits, self._calls, self._clock)
        connection.descriptor = sock.fileno()
        self._connections[connection.descriptor] = (sock, connection)
        self._watch()
        self._flush(sock.fileno())

    def _read(self, descriptor: int) -> None:
        """Read what connection `descriptor` has and handle it; drop it when its client left
        or broke HTTP/2."""
        sock, connection = self._connections[descriptor]
        try:
            data = sock.recv(RECEIVE_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(descriptor)
            return
        connection.receive(data)
        self._flush(descriptor)
        if connection.error is not None:
            self._drop(descriptor)

    def _flush(self, descriptor: int) -> None:
        """Send what connection `descriptor` has unsent, as much as its socket takes now; keep
        track of whether it is over its cap (and since when)."""
        entry = self._connections.get(descriptor)
        if entry is None:
            return
        sock, connection = entry
        outbound = connection.outbound
        if outbound:
            try:
                sent = sock.send(outbound)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # the client is gone
                self._drop(descriptor)
                return
            del outbound[:sent]
        if outbound:
            self._unsent[descriptor] = entry
        else:
            self._unsent.pop(descriptor, None)
        stuck = len(outbound) > self.limits.max_unsent_bytes
        if stuck != (connection.stuck_since is not None):
            connection.stuck_since = self._clock() if stuck else None
            self._watch()

    def receive(self) -> bytes:
        """The next call's request, waiting for one as long as it takes; `answer` answers it.

        Returns:
            The serialized request message.
        """
        self.poll(None)
        connection, stream, request = self._calls.popleft()
        connection.take(stream)
        self._taken = (connection, stream)
        return request

    def answer(self, response: bytes) -> None:
        """Answer the call taken last; nothing when there is none, or when its client reset it
        or went away. What the client's windows or socket do not take now is sent as the
        server polls.

        Args:
            response: the serialized response message.
        """
        if self._taken is None:
            return
        connection, stream = self._taken
        self._taken = None
        connection.answer(stream, response)
        if connection.error is None:
            self._flush(connection.descriptor)

    def _drop(self, descriptor: int) -> None:
        """Close connection `descriptor` after sending what its socket takes now (a GOAWAY
        among it); its calls not taken yet are forgotten."""
        sock, connection = self._connections.pop(descriptor)
        self._unsent.pop(descriptor, None)
        connection.error = connection.error or _ProtocolError(NO_ERROR, "closed")
        connection._forget_calls()
        with contextlib.suppress(OSError):
            sock.send(connection.outbound)
        _close_after_sending(sock)
        self._watch()

    def close(self, linger: float = 1.0) -> None:
        """Stop listening; end each connection (GOAWAY NO_ERROR) after what was sent, answers
        waiting for window included, reaches the client, waiting up to `linger` seconds in all
        for clients to read it and close their ends.

        Args:
            linger: the longest wait in seconds.
        """
        self._listener.close()
        deadline = time.monotonic() + linger
        for _, connection in self._connections.values():
            connection.go_away()
        while self._connections:
            for descriptor in list(self._connections):
                self._flush(descriptor)
            pending = [descriptor for descriptor, (_, connection) in self._connections.items()
                       if connection.outbound or connection.sending]
            remaining = deadline - time.monotonic()
            if not pending or remaining <= 0:
                break
            readable, _, _ = select.select(pending, list(self._unsent), [], remaining)
            for descriptor in readable:  # a WINDOW_UPDATE may let an answer through
                if descriptor in self._connections:
                    self._read(descriptor)
        for sock, _ in list(self._connections.values()):
            sock.setblocking(True)
            _finish(sock, max(deadline - time.monotonic(), 0.0))
        self._connections.clear()
        self._unsent.clear()


def _close_after_sending(sock: socket.socket) -> None:
    """Close `sock` after what was sent: our end first, then whatever the client sent and we
    did not read is discarded (closing with unread data would reset the connection, which can
    discard what the client has not read yet)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(RECEIVE_CHUNK):
            pass
    sock.close()


def _finish(sock: socket.socket, linger: float) -> None:
    """Close `sock` after the client has read what was sent: our end first, then up to `linger`
    seconds for the client to close."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(linger)
        while sock.recv(RECEIVE_CHUNK):
            pass
    except OSError:
        pass
    sock.close()
