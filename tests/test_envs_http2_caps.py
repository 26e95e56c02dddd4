"""The caps of the Unity link's server (`envs.http2.ServerLimits`) and the checks of its client,
each on real sockets on 127.0.0.1: a client that does not read, control frame floods, the
message cap, header block caps, an unknown path, concurrent streams, connections, the handshake
and idle timeouts; and a server that sends the client what HTTP/2 forbids. The server serves in
a thread of its own, on a clock the test moves; each wait is gated by an event the server
thread sets once what the test waits for has happened."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from envs.http2 import (
    MAX_FRAME_SIZE,
    MAX_MESSAGE_BYTES,
    ExchangeError,
    ServerLimits,
    UnaryClient,
    UnaryServer,
)
from tests.support.http2 import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    HEADERS,
    NO_ERROR,
    PING,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    WINDOW_UPDATE,
    Frame,
    client_preface,
    frame,
    goaway_code,
    grpc_message,
    read_frames_until,
    request_block,
    settings_frame,
    trailers_of,
)
from tests.support.processes import free_port

PATH = "/communicator_objects.UnityToExternalProto/Exchange"


def _answer(request: bytes) -> bytes:
    """What the test server answers: the request's digest, then the request reversed."""
    return hashlib.sha256(request).digest() + request[::-1]


class _SteppedClock:
    """The server's clock for its caps and timeouts: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class _Served:
    """A `UnaryServer` with `limits` serving in a thread: each call is answered `_answer` of
    it. `when(condition)` is an event the thread sets once `condition(server)` holds, checked
    between its polls (so the server is read only from its own thread)."""

    def __init__(self, limits: ServerLimits) -> None:
        self.clock = _SteppedClock()
        self.server = UnaryServer("127.0.0.1", 0, PATH, limits, self.clock)
        self.port = self.server.address[1]
        self._conditions: list[tuple[Callable[[UnaryServer], bool], threading.Event]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self.server.poll(0.02):
                self.server.answer(_answer(self.server.receive()))
            for condition, event in list(self._conditions):
                if not event.is_set() and condition(self.server):
                    event.set()

    def when(self, condition: Callable[[UnaryServer], bool]) -> threading.Event:
        event = threading.Event()
        self._conditions.append((condition, event))
        return event

    def wait_for(self, condition: Callable[[UnaryServer], bool]) -> None:
        assert self.when(condition).wait(30), "the server never got there"

    def connect(self, preface: bytes = client_preface()) -> socket.socket:
        """A hand-written client's connection, its `preface` sent."""
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.sendall(preface)
        return sock

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close(linger=0.0)


@pytest.fixture()
def serving(request: pytest.FixtureRequest) -> Iterator[_Served]:
    """A served server with the `ServerLimits` fields of an indirect parameter."""
    served = _Served(ServerLimits(**getattr(request, "param", {})))
    try:
        yield served
    finally:
        served.stop()


def _call_frames(stream: int, request: bytes) -> bytes:
    return (frame(HEADERS, END_HEADERS, stream, request_block(PATH))
            + frame(DATA, END_STREAM, stream, grpc_message(request)))


def _until_closed(sock: socket.socket) -> list[Frame]:
    """Every frame `sock` receives until the server ends the connection."""
    try:
        return read_frames_until(sock, lambda frames: False)
    except ConnectionResetError:  # the frames before the reset are what was read
        return []


def _ended(stream: int) -> Callable[[list[Frame]], bool]:
    return lambda frames: any(f[0] == HEADERS and f[2] == stream and f[1] & END_STREAM
                              for f in frames)


def _stuck(server: UnaryServer) -> bool:
    return any(c.stuck_since is not None for _, c in server._connections.values())


@pytest.mark.parametrize("serving", [{"max_unsent_bytes": 64 << 10}], indirect=True)
def test_a_client_that_does_not_read_stalls_only_itself_and_is_dropped(serving: _Served) -> None:
    """A client (a small receive buffer) that calls and calls (16 MiB, more than the kernel's
    buffers take) and never reads its 256 KiB answers: the server stops reading from it once
    64 KiB wait unsent, so what it holds for it stays bounded (one read's answers past the cap)
    and the client's own sends stall; another client's calls go on meanwhile; once the stall
    timeout passes, the stuck connection is dropped and the other client goes on."""
    calls = b"".join(_call_frames(stream, bytes(256 << 10)) for stream in range(1, 129, 2))
    greedy = socket.socket()
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    greedy.connect(("127.0.0.1", serving.port))
    sent_all = threading.Event()

    def send() -> None:
        try:
            greedy.sendall(client_preface((SETTINGS_INITIAL_WINDOW_SIZE, 2**31 - 1))
                           + frame(WINDOW_UPDATE, 0, 0, (2**31 - 1 - 65_535).to_bytes(4, "big"))
                           + calls)
            sent_all.set()
        except OSError:  # the server dropped the connection
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    serving.wait_for(_stuck)
    other = UnaryClient("127.0.0.1", serving.port, PATH, connect_timeout=10)
    try:
        for k in range(100):  # each a poll that would read the greedy client, were it watched
            assert other.call(bytes([k]) * 5_000) == _answer(bytes([k]) * 5_000)
        bounded = serving.when(lambda server: all(
            len(c.outbound) < (64 << 10) + 2 * (257 << 10)
            for _, c in server._connections.values()) and server.connections == 2)
        assert bounded.wait(30)
        assert not sent_all.is_set()  # the server stopped reading what the greedy client sent
        serving.clock.now += serving.server.limits.send_stall_timeout_s + 1
        serving.wait_for(lambda server: server.connections == 1)
        assert other.call(b"after") == _answer(b"after")
    finally:
        other.close()
        greedy.close()
        sender.join(30)


@pytest.mark.parametrize("serving", [{"control_frames_per_second": 10}], indirect=True)
def test_control_frames_past_the_cap_per_second_end_the_connection(serving: _Served) -> None:
    """A cap of 10 control frames per second: the client's SETTINGS and its acknowledgement
    count, so of 13 PINGs 8 are answered and the 9th ends the connection with GOAWAY
    ENHANCE_YOUR_CALM. Another client sends 10 control frames, and 10 more a second later (the
    clock moved): it is served."""
    with serving.connect(client_preface() + frame(PING, 0, 0, bytes(8)) * 13) as flooding:
        frames = _until_closed(flooding)
    assert goaway_code(frames) == ENHANCE_YOUR_CALM
    assert [f for f in frames if f[0] == PING] == [(PING, ACK, 0, bytes(8))] * 8
    with serving.connect(client_preface() + frame(PING, 0, 0, bytes(8)) * 8) as steady:
        read_frames_until(steady, lambda frames: sum(f[0] == PING for f in frames) == 8)
        serving.clock.now += 1.0
        steady.sendall(frame(PING, 0, 0, bytes(8)) * 10 + _call_frames(1, b"steady"))
        frames = read_frames_until(steady, _ended(1))
        assert trailers_of(frames, 1)[b"grpc-status"] == b"0"
        assert b"".join(f[3] for f in frames if f[0] == DATA) == grpc_message(_answer(b"steady"))


def _mlagents_like_server() -> tuple[grpc.Server, int]:
    """A `grpc` server made as mlagents-envs' `RpcCommunicator.create_server` makes its own
    (the same options), answering `_answer` on `PATH`."""
    server = grpc.server(ThreadPoolExecutor(max_workers=10), options=(("grpc.so_reuseport", 1),))
    service, method = PATH.strip("/").split("/")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(lambda r, c: _answer(r))}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _outcome(port: int, size: int) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}",
                               options=[("grpc.max_receive_message_length", -1)]) as channel:
        try:
            channel.unary_unary(PATH)(bytes(size), timeout=60)
        except grpc.RpcError as error:
            return error.code()
        return grpc.StatusCode.OK


def test_the_message_cap_takes_what_mlagents_envs_takes(serving: _Served) -> None:
    """By default a request of `MAX_MESSAGE_BYTES` is taken and one byte more refused with
    RESOURCE_EXHAUSTED, as by a `grpc` server made as mlagents-envs makes its own."""
    reference, port = _mlagents_like_server()
    try:
        sizes = (MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 1)
        expected = [_outcome(port, size) for size in sizes]
    finally:
        reference.stop(None)
    assert expected == [grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert [_outcome(serving.port, size) for size in sizes] == expected


@pytest.mark.parametrize("serving", [{"max_message_bytes": 1_000}], indirect=True)
def test_a_message_over_the_cap_is_refused_from_its_prefix(serving: _Served) -> None:
    """A request whose 5-byte prefix declares 1,001 bytes, over a cap of 1,000, is refused
    before any of its body is sent: trailers with RESOURCE_EXHAUSTED, then RST_STREAM NO_ERROR
    asking the client to send no more of it. The connection goes on: a call of 1,000 bytes is
    answered."""
    with serving.connect(client_preface() + frame(HEADERS, END_HEADERS, 1, request_block(PATH))
                         + frame(DATA, 0, 1, b"\x00" + (1_001).to_bytes(4, "big"))) as sock:
        frames = read_frames_until(sock, lambda frames: any(f[0] == RST_STREAM for f in frames))
        trailers = trailers_of(frames, 1)
        assert trailers[b"grpc-status"] == b"8"
        assert trailers[b"grpc-message"] == b"a message of 1001 bytes, over the limit of 1000"
        assert (RST_STREAM, 0, 1, NO_ERROR.to_bytes(4, "big")) in frames
        sock.sendall(_call_frames(3, bytes(1_000)))
        frames = read_frames_until(sock, _ended(3))
        assert b"".join(f[3] for f in frames if f[0] == DATA and f[2] == 3) == grpc_message(
            _answer(bytes(1_000)))


@pytest.mark.parametrize("continuations", [8, 9])
def test_a_header_block_in_more_continuation_frames_than_the_cap_ends_the_connection(
        serving: _Served, continuations: int) -> None:
    """A header block cut into HEADERS and 8 CONTINUATION frames (the cap) is a call; in 9,
    GOAWAY ENHANCE_YOUR_CALM."""
    block = request_block(PATH)
    cut = len(block) // (continuations + 1)
    pieces = [block[k * cut : (k + 1) * cut] for k in range(continuations)] + [
        block[continuations * cut :]]
    sent = frame(HEADERS, 0, 1, pieces[0]) + b"".join(
        frame(CONTINUATION, END_HEADERS if k == continuations else 0, 1, piece)
        for k, piece in enumerate(pieces[1:], start=1))
    with serving.connect(client_preface() + sent
                         + frame(DATA, END_STREAM, 1, grpc_message(b"cut"))) as sock:
        if continuations <= serving.server.limits.max_continuation_frames:
            frames = read_frames_until(sock, _ended(1))
            assert trailers_of(frames, 1)[b"grpc-status"] == b"0"
        else:
            assert goaway_code(_until_closed(sock)) == ENHANCE_YOUR_CALM


def test_a_header_list_over_the_cap_ends_the_connection_and_the_server_goes_on(
        serving: _Served) -> None:
    """A header list of 16 KiB and more (as HPACK counts it: 32 bytes per field besides its
    name and value) in a block of a few KiB: GOAWAY ENHANCE_YOUR_CALM; a client on another
    connection is served."""
    fields = [(f"x-{k}", "v") for k in range(serving.server.limits.max_header_list_bytes // 36)]
    block = request_block(PATH, fields)
    assert len(block) < serving.server.limits.max_header_list_bytes
    with serving.connect(client_preface()
                         + frame(HEADERS, END_HEADERS | END_STREAM, 1, block)) as sock:
        assert goaway_code(_until_closed(sock)) == ENHANCE_YOUR_CALM
    with grpc.insecure_channel(f"127.0.0.1:{serving.port}") as channel:
        assert channel.unary_unary(PATH)(b"next", timeout=30) == _answer(b"next")


def test_a_call_to_another_path_is_unimplemented_and_named_by_a_short_escaped_prefix(
        serving: _Served) -> None:
    """gRPC's client calling another method gets UNIMPLEMENTED naming the path; a long path
    with "%" and non-ASCII is named by its first 32 bytes, escaped (grpc-message is
    percent-decoded by the client); the served path still answers on the same channel."""
    odd = "/ünknown%Service/" + "x" * 300
    with grpc.insecure_channel(f"127.0.0.1:{serving.port}") as channel:
        for path, details in (("/other.Service/Exchange",
                               "unknown method '/other.Service/Exchange'"),
                              (odd, "unknown method '/\\xc3\\xbcnknown%Service/"
                                    + "x" * 14 + "'...")):
            with pytest.raises(grpc.RpcError) as refused:
                channel.unary_unary(path)(b"hello", timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert refused.value.details() == details
        assert channel.unary_unary(PATH)(b"right", timeout=30) == _answer(b"right")


def test_a_stream_past_the_concurrent_streams_cap_is_refused(serving: _Served) -> None:
    """The server advertises 4 concurrent streams; a client opening 5 has the fifth refused
    (RST_STREAM REFUSED_STREAM) and the four answered once their requests end."""
    opened = b"".join(frame(HEADERS, END_HEADERS, s, request_block(PATH)) for s in (1, 3, 5, 7, 9))
    with serving.connect(client_preface() + opened) as sock:
        frames = read_frames_until(sock, lambda frames: any(f[0] == RST_STREAM for f in frames))
        settings = next(f[3] for f in frames if f[0] == SETTINGS and not f[1] & ACK)
        advertised = {int.from_bytes(settings[k : k + 2], "big"):
                      int.from_bytes(settings[k + 2 : k + 6], "big")
                      for k in range(0, len(settings), 6)}
        assert advertised[SETTINGS_MAX_CONCURRENT_STREAMS] == 4
        assert (RST_STREAM, 0, 9, REFUSED_STREAM.to_bytes(4, "big")) in frames
        sock.sendall(b"".join(frame(DATA, END_STREAM, s, grpc_message(bytes([s])))
                              for s in (1, 3, 5, 7)))
        frames += read_frames_until(sock, lambda more: all(_ended(s)(more) for s in (1, 3, 5, 7)))
        for stream in (1, 3, 5, 7):
            assert trailers_of(frames, stream)[b"grpc-status"] == b"0"
        assert not _ended(9)(frames)


@pytest.mark.parametrize("serving", [{"max_connections": 2}], indirect=True)
def test_a_connection_past_the_cap_is_closed_at_once(serving: _Served) -> None:
    """With 2 connections open, a third gets GOAWAY ENHANCE_YOUR_CALM and is closed; the two
    are served on."""
    first = UnaryClient("127.0.0.1", serving.port, PATH, connect_timeout=10)
    second = UnaryClient("127.0.0.1", serving.port, PATH, connect_timeout=10)
    try:
        serving.wait_for(lambda server: server.connections == 2)
        with serving.connect() as third:
            assert goaway_code(_until_closed(third)) == ENHANCE_YOUR_CALM
        for client in (first, second):
            assert client.call(b"on") == _answer(b"on")
    finally:
        first.close()
        second.close()


def test_a_connection_silent_past_the_handshake_timeout_is_closed(serving: _Served) -> None:
    """A client that connects and sends nothing is closed once the handshake timeout has
    passed; one that called is not."""
    silent = socket.create_connection(("127.0.0.1", serving.port))
    client = UnaryClient("127.0.0.1", serving.port, PATH, connect_timeout=10)
    try:
        assert client.call(b"hi") == _answer(b"hi")
        serving.wait_for(lambda server: server.connections == 2)
        serving.clock.now += serving.server.limits.handshake_timeout_s + 1
        serving.wait_for(lambda server: server.connections == 1)
        frames = _until_closed(silent)  # the server's SETTINGS, then the end
        assert frames and frames[0][0] == SETTINGS
        assert client.call(b"still") == _answer(b"still")
    finally:
        silent.close()
        client.close()


def test_a_connection_without_a_call_past_the_idle_timeout_is_closed(serving: _Served) -> None:
    """Past the idle timeout a connection with no call open is closed with GOAWAY NO_ERROR
    (gRPC's client then calls on a new connection), one with a call open is kept; the stand-ins'
    client, whose connection was closed, raises."""
    waiting = serving.connect(client_preface()
                              + frame(HEADERS, END_HEADERS, 1, request_block(PATH)))
    client = UnaryClient("127.0.0.1", serving.port, PATH, connect_timeout=10)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{serving.port}") as channel:
            call = channel.unary_unary(PATH)
            assert call(b"one", timeout=30) == _answer(b"one")
            assert client.call(b"one") == _answer(b"one")
            serving.wait_for(lambda server: server.connections == 3)
            serving.clock.now += serving.server.limits.idle_timeout_s + 1
            serving.wait_for(lambda server: server.connections == 1)
            assert call(b"two", timeout=30, wait_for_ready=True) == _answer(b"two")
        with pytest.raises(OSError):
            client.call(b"two")
        waiting.sendall(frame(DATA, END_STREAM, 1, grpc_message(b"late")))
        frames = read_frames_until(waiting, _ended(1))
        assert b"".join(f[3] for f in frames if f[0] == DATA) == grpc_message(_answer(b"late"))
    finally:
        waiting.close()
        client.close()


# -- the client, against a server that breaks HTTP/2 ------------------------------------------


@pytest.mark.parametrize(("sent", "message"), [
    (settings_frame((SETTINGS_MAX_FRAME_SIZE, 0)), "SETTINGS_MAX_FRAME_SIZE 0, not in"),
    (settings_frame((SETTINGS_INITIAL_WINDOW_SIZE, 2**31)),
     "SETTINGS_INITIAL_WINDOW_SIZE 2147483648"),
    (settings_frame((SETTINGS_ENABLE_PUSH, 1)), "a server enabling push"),
    (frame(SETTINGS, 0, 0, bytes(5)), "not a multiple of 6"),
    (settings_frame() + frame(WINDOW_UPDATE, 0, 0, (2**31 - 1).to_bytes(4, "big")),
     "the connection's window past 2**31 - 1"),
    (settings_frame() + (MAX_FRAME_SIZE + 1).to_bytes(3, "big") + bytes([DATA, 0, 0, 0, 0, 1]),
     f"a frame of {MAX_FRAME_SIZE + 1} bytes"),
    (settings_frame() + frame(HEADERS, END_HEADERS, 1, b"\x88")
     + frame(DATA, 0, 1, b"\x00" + (1_001).to_bytes(4, "big")), "over the limit of 1000"),
], ids=["frame size 0", "window 2**31", "push", "settings length", "window overflow",
        "frame too large", "answer too large"])
def test_the_client_raises_on_a_server_that_breaks_http2(sent: bytes, message: str) -> None:
    """A server that sends `sent` (and then nothing, keeping the connection open): the call
    raises ExchangeError naming what was wrong, rather than wait."""
    with socket.create_server(("127.0.0.1", free_port())) as listener:
        done = threading.Event()

        def serve() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.sendall(sent)
                done.wait(30)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client = UnaryClient("127.0.0.1", listener.getsockname()[1], PATH, connect_timeout=10,
                             max_message_bytes=1_000)
        try:
            with pytest.raises(ExchangeError, match=message.replace("*", r"\*")):
                client.call(b"hello")
        finally:
            done.set()
            client.close()
            thread.join(30)
