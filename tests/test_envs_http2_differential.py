"""The Unity link's server (`envs.http2`) against python-hyper's `h2`, a maintained HTTP/2 state
machine: each byte sequence of the table, sent by a client, is fed to our server connection and
to an `h2` connection configured as a server with the same settings, and both must reach the
same verdict (calls delivered, streams reset with a code, the connection ended with a code).

Where `h2` does not do what RFC 9113 requires, or has no cap where we have one, the case names
`h2`'s own verdict and why; our server is held to the RFC's answer (or to its cap)."""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
import pytest

from envs.http2 import MAX_FRAME_SIZE, ServerLimits, _ServerConnection
from tests.support.http2 import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    client_preface,
    frame,
    frames_of,
    grpc_message,
    request_block,
    settings_frame,
)

PATH = "/communicator_objects.UnityToExternalProto/Exchange"
LIMITS = ServerLimits()
CAP = LIMITS.control_frames_per_second
START = client_preface()


class Verdict(NamedTuple):
    """What a server made of a client's bytes."""

    calls: tuple[tuple[int, bytes], ...] = ()
    """(stream, request message) of each call delivered, in order."""
    resets: tuple[tuple[int, int], ...] = ()
    """(stream, error code) of each RST_STREAM sent."""
    goaway: int | None = None
    """The error code of the GOAWAY sent, None where none was."""
    closed: bool = False
    """Whether the connection ended (with a GOAWAY, or without for a client not speaking
    HTTP/2, as section 3.4 allows)."""


def connection_error(code: int, calls: tuple[tuple[int, bytes], ...] = ()) -> Verdict:
    return Verdict(calls=calls, goaway=code, closed=True)


def word(value: int) -> bytes:
    return value.to_bytes(4, "big")


def call(stream: int, request: bytes = b"hello") -> bytes:
    """A whole call: HEADERS, then one DATA frame that ends the stream."""
    return (frame(HEADERS, END_HEADERS, stream, request_block(PATH))
            + frame(DATA, END_STREAM, stream, grpc_message(request)))


def opened(stream: int) -> bytes:
    """HEADERS that open `stream`, the request still to come."""
    return frame(HEADERS, END_HEADERS, stream, request_block(PATH))


def delivered(*streams: int) -> tuple[tuple[int, bytes], ...]:
    return tuple((stream, b"hello") for stream in streams)


def _fields_block(count: int) -> bytes:
    """A header block of `count` small literal fields (5 bytes each, 34 as HPACK counts)."""
    return request_block(PATH) + b"".join(b"\x00\x01a\x01b" for _ in range(count))


class Case(NamedTuple):
    name: str
    sent: bytes
    expected: Verdict
    """RFC 9113's verdict (or our cap's), which our server must reach."""
    h2_verdict: Verdict | None = None
    """`h2`'s own verdict where it differs from `expected`, None where it is the same."""
    why: str = ""
    """Why `h2` differs."""


CASES = [
    # calls, whole and in pieces
    Case("a call", START + call(1), Verdict(calls=delivered(1))),
    Case("two calls", START + call(1) + call(3, b"again"),
         Verdict(calls=((1, b"hello"), (3, b"again")))),
    Case("a call in pieces: CONTINUATION, padded DATA, empty DATA, DATA in two",
         START + frame(HEADERS, 0, 1, request_block(PATH)[:5])
         + frame(CONTINUATION, END_HEADERS, 1, request_block(PATH)[5:])
         + frame(DATA, PADDED, 1, b"\x03" + grpc_message(b"hello")[:4] + b"\x00" * 3)
         + frame(DATA, 0, 1, b"") + frame(DATA, END_STREAM, 1, grpc_message(b"hello")[4:]),
         Verdict(calls=delivered(1))),
    Case("an unknown frame type and an unknown setting are ignored",
         START + frame(0x20, 0, 0, b"abc") + settings_frame((0x99, 5)) + call(1),
         Verdict(calls=delivered(1))),
    Case("the largest frame size allowed", START + settings_frame(
        (SETTINGS_MAX_FRAME_SIZE, 2**24 - 1)) + call(1), Verdict(calls=delivered(1))),
    # the preface
    Case("not HTTP/2 at all", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Verdict(closed=True)),
    Case("the preface not followed by SETTINGS", PREFACE + frame(PING, 0, 0, b"\x00" * 8),
         connection_error(PROTOCOL_ERROR), Verdict(),
         "h2 does not check that the client's preface goes on with SETTINGS (section 3.4)"),
    # SETTINGS (section 6.5)
    Case("SETTINGS_MAX_FRAME_SIZE 0", START + settings_frame((SETTINGS_MAX_FRAME_SIZE, 0)),
         connection_error(PROTOCOL_ERROR)),
    Case("SETTINGS_MAX_FRAME_SIZE 16,383",
         START + settings_frame((SETTINGS_MAX_FRAME_SIZE, 16_383)),
         connection_error(PROTOCOL_ERROR)),
    Case("SETTINGS_MAX_FRAME_SIZE 2**24",
         START + settings_frame((SETTINGS_MAX_FRAME_SIZE, 2**24)),
         connection_error(PROTOCOL_ERROR)),
    Case("SETTINGS_INITIAL_WINDOW_SIZE 2**31",
         START + settings_frame((SETTINGS_INITIAL_WINDOW_SIZE, 2**31)),
         connection_error(FLOW_CONTROL_ERROR)),
    Case("SETTINGS_INITIAL_WINDOW_SIZE pushing an open stream's window past 2**31 - 1",
         START + opened(1) + frame(WINDOW_UPDATE, 0, 1, word(2**31 - 1 - 65_535))
         + settings_frame((SETTINGS_INITIAL_WINDOW_SIZE, 65_536)),
         connection_error(FLOW_CONTROL_ERROR)),
    Case("SETTINGS_ENABLE_PUSH 2", START + settings_frame((SETTINGS_ENABLE_PUSH, 2)),
         connection_error(PROTOCOL_ERROR)),
    Case("a SETTINGS payload of 7 bytes", START + frame(SETTINGS, 0, 0, b"\x00" * 7),
         connection_error(FRAME_SIZE_ERROR)),
    Case("a SETTINGS acknowledgement with a payload",
         START + frame(SETTINGS, ACK, 0, b"\x00" * 6), connection_error(FRAME_SIZE_ERROR),
         connection_error(PROTOCOL_ERROR),
         "h2 answers PROTOCOL_ERROR where section 6.5 names FRAME_SIZE_ERROR"),
    Case("SETTINGS on a stream", START + frame(SETTINGS, 0, 1), connection_error(PROTOCOL_ERROR)),
    # WINDOW_UPDATE (section 6.9)
    Case("WINDOW_UPDATE of 0 on the connection", START + frame(WINDOW_UPDATE, 0, 0, word(0)),
         connection_error(PROTOCOL_ERROR)),
    Case("WINDOW_UPDATE of 0 on a stream", START + opened(1) + frame(WINDOW_UPDATE, 0, 1, word(0)),
         Verdict(resets=((1, PROTOCOL_ERROR),)), connection_error(PROTOCOL_ERROR),
         "h2 ends the connection where section 6.9 names a stream error"),
    Case("the connection's window past 2**31 - 1",
         START + frame(WINDOW_UPDATE, 0, 0, word(2**31 - 1)),
         connection_error(FLOW_CONTROL_ERROR)),
    Case("a stream's window past 2**31 - 1",
         START + opened(1) + frame(WINDOW_UPDATE, 0, 1, word(2**31 - 1)),
         Verdict(resets=((1, FLOW_CONTROL_ERROR),))),
    Case("a WINDOW_UPDATE of 3 bytes", START + frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"),
         connection_error(FRAME_SIZE_ERROR)),
    Case("WINDOW_UPDATE on an idle stream", START + frame(WINDOW_UPDATE, 0, 5, word(1)),
         connection_error(PROTOCOL_ERROR)),
    # frame sizes, PING, RST_STREAM, DATA, HEADERS
    Case("a frame over the advertised size",
         START + opened(1) + frame(DATA, 0, 1, bytes(MAX_FRAME_SIZE + 1)),
         connection_error(FRAME_SIZE_ERROR)),
    Case("PING on a stream", START + frame(PING, 0, 1, b"\x00" * 8),
         connection_error(PROTOCOL_ERROR)),
    Case("a PING of 7 bytes", START + frame(PING, 0, 0, b"\x00" * 7),
         connection_error(FRAME_SIZE_ERROR)),
    Case("RST_STREAM on an idle stream", START + frame(RST_STREAM, 0, 1, word(8)),
         connection_error(PROTOCOL_ERROR)),
    Case("RST_STREAM on stream 0", START + frame(RST_STREAM, 0, 0, word(8)),
         connection_error(PROTOCOL_ERROR)),
    Case("an RST_STREAM of 3 bytes", START + opened(1) + frame(RST_STREAM, 0, 1, b"\x00\x00\x08"),
         connection_error(FRAME_SIZE_ERROR)),
    Case("DATA on stream 0", START + frame(DATA, 0, 0, b"abc"), connection_error(PROTOCOL_ERROR)),
    Case("DATA on an idle stream", START + frame(DATA, 0, 1, b"abc"),
         connection_error(PROTOCOL_ERROR)),
    Case("DATA padded past its end", START + opened(1) + frame(DATA, PADDED, 1, b"\x05ab"),
         connection_error(PROTOCOL_ERROR)),
    Case("DATA after the request ended", START + call(1) + frame(DATA, 0, 1, b"abc"),
         Verdict(calls=delivered(1), resets=((1, STREAM_CLOSED),))),
    Case("HEADERS after the request ended", START + call(1)
         + frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack.Encoder().encode([("x", "y")])),
         Verdict(calls=delivered(1), resets=((1, STREAM_CLOSED),))),
    Case("trailers that do not end the request",
         START + opened(1) + frame(DATA, 0, 1, grpc_message(b"hello"))
         + frame(HEADERS, END_HEADERS, 1, hpack.Encoder().encode([("x", "y")])),
         Verdict(resets=((1, PROTOCOL_ERROR),)), connection_error(PROTOCOL_ERROR),
         "h2 ends the connection where section 8.1.1 names a stream error (a malformed request)"),
    Case("HEADERS on an even stream", START + opened(2), connection_error(PROTOCOL_ERROR)),
    Case("HEADERS on stream 0", START + opened(0), connection_error(PROTOCOL_ERROR)),
    Case("a stream id going backwards", START + call(3) + call(1),
         connection_error(PROTOCOL_ERROR, delivered(3))),
    Case("a fifth stream open at once", START + b"".join(opened(s) for s in (1, 3, 5, 7, 9)),
         Verdict(resets=((9, REFUSED_STREAM),)), connection_error(PROTOCOL_ERROR),
         "h2 ends the connection where section 5.1.2 names a stream error (PROTOCOL_ERROR or "
         "REFUSED_STREAM, which gRPC's clients retry)"),
    Case("PUSH_PROMISE from a client", START + frame(PUSH_PROMISE, END_HEADERS, 1, word(2)),
         connection_error(PROTOCOL_ERROR)),
    Case("a GOAWAY of 4 bytes", START + frame(GOAWAY, 0, 0, word(0)),
         connection_error(FRAME_SIZE_ERROR)),
    Case("GOAWAY on a stream", START + frame(GOAWAY, 0, 1, word(0) + word(0)),
         connection_error(PROTOCOL_ERROR)),
    # PRIORITY (section 6.3; 5.3.1)
    Case("PRIORITY on stream 0", START + frame(PRIORITY, 0, 0, b"\x00" * 5),
         connection_error(PROTOCOL_ERROR)),
    Case("a PRIORITY of 4 bytes on an open stream",
         START + opened(1) + frame(PRIORITY, 0, 1, b"\x00" * 4),
         Verdict(resets=((1, FRAME_SIZE_ERROR),)), connection_error(FRAME_SIZE_ERROR),
         "h2 ends the connection where section 6.3 names a stream error"),
    Case("a stream depending on itself", START + opened(1) + frame(PRIORITY, 0, 1, word(1) + b"\x10"),
         Verdict(resets=((1, PROTOCOL_ERROR),)), connection_error(PROTOCOL_ERROR),
         "h2 ends the connection where section 5.3.1 names a stream error"),
    # header blocks (section 6.10; 4.3) and their caps
    Case("CONTINUATION without HEADERS", START + frame(CONTINUATION, END_HEADERS, 1, b""),
         connection_error(PROTOCOL_ERROR)),
    Case("CONTINUATION on another stream", START + frame(HEADERS, 0, 1, request_block(PATH))
         + frame(CONTINUATION, END_HEADERS, 3, b""), connection_error(PROTOCOL_ERROR)),
    Case("a PING inside a header block", START + frame(HEADERS, 0, 1, request_block(PATH))
         + frame(PING, 0, 0, b"\x00" * 8), connection_error(PROTOCOL_ERROR)),
    Case("a header block that does not decode", START + frame(HEADERS, END_HEADERS, 1, b"\xff" * 5),
         connection_error(COMPRESSION_ERROR), connection_error(PROTOCOL_ERROR),
         "h2 answers PROTOCOL_ERROR where section 4.3 names COMPRESSION_ERROR"),
    Case("a header list over the cap in a small block",
         START + frame(HEADERS, END_HEADERS | END_STREAM, 1, _fields_block(
             LIMITS.max_header_list_bytes // 34 + 1)), connection_error(ENHANCE_YOUR_CALM)),
    Case("a header block over the cap", START + frame(HEADERS, END_HEADERS | END_STREAM, 1,
                                                      request_block(PATH, [("x-big", "a" * (
                                                          LIMITS.max_header_list_bytes))])),
         connection_error(ENHANCE_YOUR_CALM)),
    Case("CONTINUATION frames up to the cap",
         START + frame(HEADERS, 0, 1, request_block(PATH))
         + frame(CONTINUATION, 0, 1, b"") * (LIMITS.max_continuation_frames - 1)
         + frame(CONTINUATION, END_HEADERS, 1, b"")
         + frame(DATA, END_STREAM, 1, grpc_message(b"hello")), Verdict(calls=delivered(1))),
    Case("CONTINUATION frames a few past the cap",
         START + frame(HEADERS, 0, 1, request_block(PATH))
         + frame(CONTINUATION, 0, 1, b"") * (LIMITS.max_continuation_frames + 3),
         connection_error(ENHANCE_YOUR_CALM), Verdict(),
         "h2 allows 63 CONTINUATION frames per block"),
    Case("a CONTINUATION flood", START + frame(HEADERS, 0, 1, request_block(PATH))
         + frame(CONTINUATION, 0, 1, b"") * 70, connection_error(ENHANCE_YOUR_CALM),
         connection_error(PROTOCOL_ERROR),
         "h2 caps CONTINUATION frames too, with PROTOCOL_ERROR; RFC 9113 names no code for a "
         "cap, and ENHANCE_YOUR_CALM is its code for a peer generating excessive load"),
    # control frame floods, cut to a few frames over the cap per second
    Case("control frames up to the cap, then a call",
         START + frame(PING, 0, 0, b"\x00" * 8) * (CAP - 2) + call(1),
         Verdict(calls=delivered(1))),
    *[Case(f"a flood of {name}", START + flood * (CAP + 3), connection_error(ENHANCE_YOUR_CALM),
           Verdict(), "h2 leaves flood caps to its caller (section 10.5)") for name, flood in [
        ("PINGs", frame(PING, 0, 0, b"\x00" * 8)),
        ("SETTINGS", settings_frame()),
        ("PRIORITY frames", frame(PRIORITY, 0, 1, word(0) + b"\x10")),
        ("unknown frames", frame(0x20, 0, 0))]],
    Case("a flood of opened and reset streams",
         START + b"".join(opened(s) + frame(RST_STREAM, 0, s, word(8))
                          for s in range(1, 2 * CAP + 6, 2)),
         connection_error(ENHANCE_YOUR_CALM), Verdict(),
         "h2 leaves flood caps to its caller (section 10.5)"),
    Case("a flood of empty DATA frames",
         START + opened(1) + frame(DATA, 0, 1, b"") * (CAP + 3),
         connection_error(ENHANCE_YOUR_CALM), Verdict(),
         "h2 leaves flood caps to its caller (section 10.5)"),
]


class _RecordedCalls(deque):
    """The server's call queue, keeping every call ever delivered in `delivered`."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered: list[tuple[int, bytes]] = []

    def append(self, call: Any) -> None:
        self.delivered.append((call[1], call[2]))
        super().append(call)


def _verdict_of_sent(calls: list[tuple[int, bytes]], sent: bytes, closed: bool) -> Verdict:
    frames = frames_of(sent)
    goaways = [int.from_bytes(f[3][4:8], "big") for f in frames if f[0] == GOAWAY]
    return Verdict(calls=tuple(calls),
                   resets=tuple((f[2], int.from_bytes(f[3], "big"))
                                for f in frames if f[0] == RST_STREAM),
                   goaway=goaways[0] if goaways else None, closed=closed)


def ours(sent: bytes) -> Verdict:
    """Our server connection's verdict on `sent` (a clock that stands still: every frame
    arrives within the same second)."""
    calls = _RecordedCalls()
    connection = _ServerConnection(PATH.encode(), LIMITS, calls, lambda: 0.0)
    connection.outbound.clear()  # its own SETTINGS
    connection.receive(sent)
    return _verdict_of_sent(calls.delivered, connection.outbound, connection.error is not None)


def _pieces(sent: bytes) -> list[bytes]:
    """`sent` cut into the preface and each frame: `h2` raises on a frame that breaks HTTP/2 and
    drops the events of the frames before it in the same batch."""
    pieces, offset = [sent[: len(PREFACE)]], len(PREFACE)
    while offset < len(sent):
        end = offset + 9 + int.from_bytes(sent[offset : offset + 3], "big")
        pieces.append(sent[offset:end])
        offset = end
    return pieces


def theirs(sent: bytes) -> Verdict:
    """`h2`'s verdict on `sent`, as a server advertising our settings (set as its initial
    local settings: `h2` reads the frame size and header list cap from them when made)."""
    connection = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None))
    codes = h2.settings.SettingCodes
    connection.local_settings = h2.settings.Settings(client=False, initial_values={
        codes.MAX_CONCURRENT_STREAMS: LIMITS.max_concurrent_streams,
        codes.INITIAL_WINDOW_SIZE: 2**31 - 1, codes.MAX_FRAME_SIZE: MAX_FRAME_SIZE,
        codes.MAX_HEADER_LIST_SIZE: LIMITS.max_header_list_bytes})
    connection.max_inbound_frame_size = MAX_FRAME_SIZE
    connection.decoder.max_header_list_size = LIMITS.max_header_list_bytes
    connection.initiate_connection()
    connection.data_to_send()
    bodies: dict[int, bytes] = {}
    calls = []
    ended = False
    try:
        for event in (event for piece in _pieces(sent) for event in connection.receive_data(piece)):
            if isinstance(event, h2.events.RequestReceived):
                bodies[event.stream_id] = b""
            elif isinstance(event, h2.events.DataReceived):
                bodies[event.stream_id] += event.data
            elif isinstance(event, h2.events.StreamEnded):
                body = bodies.pop(event.stream_id)
                assert body[:5] == grpc_message(b"")[:1] + (len(body) - 5).to_bytes(4, "big")
                calls.append((event.stream_id, body[5:]))
    except h2.exceptions.ProtocolError:
        ended = True
    return _verdict_of_sent(calls, connection.data_to_send(), ended)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_our_server_reaches_the_verdict_of_h2_or_of_rfc_9113(case: Case) -> None:
    assert ours(case.sent) == case.expected
    assert theirs(case.sent) == (case.h2_verdict or case.expected), case.why


def test_every_difference_from_h2_is_explained() -> None:
    assert all(case.why for case in CASES if case.h2_verdict is not None)
    assert not [case.name for case in CASES if case.why and case.h2_verdict is None]
