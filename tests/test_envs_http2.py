"""Both ends of `envs.http2` against real `grpc` peers. The stand-ins' client against a `grpc`
server: answers byte for byte, flow control both ways, refusals, a server that goes away, the
server's pings. The Python side's server against `grpc`'s client (the C core that Unity's
`Grpc.Core` wraps): the same sizes, many calls, a client that reconnects or cancels, a
compressed call refused, pings answered."""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest

from envs.http2 import MAX_STREAM, PREFACE, ExchangeError, UnaryClient, UnaryServer, frame
from envs.spin_wait import DEFAULT_BUDGET_US, ENVIRONMENT_VARIABLE
from tests.support.http2 import frames_of, read_frames_until, request_block
from tests.support.processes import free_port

METHOD = "/test.Echo/Exchange"


@pytest.fixture(params=["polling", "blocking"])
def waits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of waiting (`envs.spin_wait`), for the ends made after it: polling first where
    this machine allows it, or blocking only (`HUGGY_SPIN_WAIT_US=0`)."""
    if request.param == "blocking":
        monkeypatch.setenv(ENVIRONMENT_VARIABLE, "0")
    else:
        monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    return request.param


def _answer(request: bytes) -> bytes:
    """What the test server answers: the request's digest, then the request reversed."""
    return hashlib.sha256(request).digest() + request[::-1]


def _exchange(request: bytes, context: grpc.ServicerContext) -> bytes:
    if request == b"refuse":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused on purpose")
    if request == b"slow":  # a server busy for several keepalive periods
        time.sleep(0.6)
    return _answer(request)


def _server(port: int, options: tuple = ()) -> grpc.Server:
    server = grpc.server(ThreadPoolExecutor(max_workers=2), options=options)
    service, method = METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(_exchange)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


@pytest.fixture()
def connected(request: pytest.FixtureRequest) -> Iterator[tuple[grpc.Server, UnaryClient]]:
    """The test server on a free port (with the server options of an indirect parameter),
    and a client connected to it."""
    port = free_port()
    server = _server(port, getattr(request, "param", ()))
    client = UnaryClient("127.0.0.1", port, METHOD, connect_timeout=10)
    try:
        yield server, client
    finally:
        client.close()
        server.stop(None)


SIZES = (0, 1, 16_379, 16_380, 65_535, 70_000, 1_000_000)


def _request(size: int) -> bytes:
    return bytes(range(256)) * (size // 256) + bytes(size % 256)


def test_answers_are_the_servers_byte_for_byte_at_every_size(waits: str, connected: tuple
                                                             ) -> None:
    """Sizes around HTTP/2's defaults: a 16,384-byte frame, a 65,535-byte window (both ways:
    the request and the reversed answer), and a megabyte; then 300 Huggy-sized calls in a row
    on the same connection (1.8 MB, 28 initial connection windows)."""
    _, client = connected
    assert client._spin.budget_s == (0.0 if waits == "blocking" else DEFAULT_BUDGET_US / 1e6)
    for size in SIZES:
        assert client.call(_request(size)) == _answer(_request(size)), size
    for k in range(300):
        request = k.to_bytes(2, "big") * 3_000
        assert client.call(request) == _answer(request)


def test_a_new_connection_takes_over_when_stream_ids_run_out(connected: tuple) -> None:
    """HTTP/2 stream ids are odd numbers below 2**31 and never reused: the call after the one
    on stream 2**31 - 1 goes out on a new connection."""
    _, client = connected
    client._next_stream = MAX_STREAM
    first = client._socket
    for request in (b"last id", b"new connection"):
        assert client.call(request) == _answer(request)
    assert client._socket is not first and client._next_stream == 3


def test_a_refused_call_raises_and_the_connection_goes_on(connected: tuple) -> None:
    _, client = connected
    with pytest.raises(ExchangeError, match="without an answer"):
        client.call(b"refuse")
    assert client.call(b"next") == _answer(b"next")


def test_a_server_that_went_away_raises_an_os_error(connected: tuple) -> None:
    """The stand-in's loop ends on OSError (ExchangeError is one) as the Python side leaving."""
    server, client = connected
    assert client.call(b"first") == _answer(b"first")
    server.stop(None)
    with pytest.raises(OSError):
        client.call(b"second")


def test_no_server_raises_connection_refused_after_the_timeout() -> None:
    with pytest.raises(ConnectionRefusedError):
        UnaryClient("127.0.0.1", free_port(), METHOD, connect_timeout=0.2)


class _RecordedSocket:
    """A socket whose sent and received bytes are kept, to read the frames back."""

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock
        self.sent = bytearray()
        self.received = bytearray()

    def sendall(self, data: bytes) -> None:
        self.sent += data
        self._socket.sendall(data)

    def recv(self, size: int) -> bytes:
        data = self._socket.recv(size)
        self.received += data
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)


@pytest.mark.parametrize("connected", [(
    ("grpc.keepalive_time_ms", 50), ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.http2.max_pings_without_data", 0))], indirect=True)
def test_the_servers_pings_are_acknowledged_and_read_past(connected: tuple) -> None:
    """A server that pings every 50 ms while it takes 0.6 s per answer: the answers arrive
    intact, and the client answered the pings with PING ACKs (type 6, flag 1, stream 0) that
    echo their 8-byte payloads (RFC 9113 section 6.7)."""
    _, client = connected
    recorded = client._socket = _RecordedSocket(client._socket)
    for _ in range(2):
        assert client.call(b"slow") == _answer(b"slow")
    pings = {payload for kind, flags, _, payload in frames_of(recorded.received)
             if kind == 6 and not flags & 1}
    acks = [f for f in frames_of(recorded.sent) if f[0] == 6]
    assert len(acks) >= 2
    assert all(flags == 1 and stream == 0 and payload in pings
               for _, flags, stream, payload in acks)


# -- the Python side's server, called by grpc's client ---------------------------------------


class _Served:
    """A `UnaryServer` on a free port, serving in a thread of its own as the Python side does in
    its main thread: wait for a call, take it, answer `_answer` of it. A request b"hold" is
    answered once `release` is set, after `held` is."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server = UnaryServer("127.0.0.1", self.port, METHOD)
        self.held, self.release, self._stop = threading.Event(), threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self.server.poll(0.05):
                request = self.server.receive()
                if request == b"hold":
                    self.held.set()
                    self.release.wait()
                self.server.answer(_answer(request))

    def channel(self, options: tuple = ()) -> grpc.Channel:
        return grpc.insecure_channel(f"127.0.0.1:{self.port}", options=options)

    def stop(self) -> None:
        self._stop.set()
        self.release.set()
        self._thread.join()
        self.server.close(linger=0.0)


@pytest.fixture()
def served() -> Iterator[_Served]:
    serving = _Served()
    try:
        yield serving
    finally:
        serving.stop()


def test_the_server_answers_grpc_byte_for_byte_at_every_size(waits: str, served: _Served
                                                             ) -> None:
    """grpc's client gets each answer whole, at the client's sizes both ways, then 300
    Huggy-sized calls on one channel; a second channel (a new connection) is served too."""
    assert served.server._spin.budget_s == (0.0 if waits == "blocking"
                                            else DEFAULT_BUDGET_US / 1e6)
    with served.channel() as channel:
        call = channel.unary_unary(METHOD)
        for size in SIZES:
            assert call(_request(size), timeout=30) == _answer(_request(size)), size
        for k in range(300):
            request = k.to_bytes(2, "big") * 3_000
            assert call(request, timeout=30) == _answer(request)
    with served.channel() as channel:
        assert channel.unary_unary(METHOD)(b"again", timeout=30) == _answer(b"again")


def test_a_call_the_client_cancelled_is_answered_into_the_void(served: _Served) -> None:
    """A call cancelled while the server holds it: the server's answer goes nowhere, and the
    next call on the channel gets its own answer."""
    with served.channel() as channel:
        call = channel.unary_unary(METHOD)
        pending = call.future(b"hold", timeout=30)
        assert served.held.wait(30)
        pending.cancel()
        served.release.set()
        assert pending.cancelled()
        assert call(b"next", timeout=30) == _answer(b"next")


def test_a_compressed_call_is_refused_and_the_server_goes_on(served: _Served) -> None:
    with served.channel() as channel:
        call = channel.unary_unary(METHOD)
        with pytest.raises(grpc.RpcError) as refused:
            call(b"z" * 4_000, timeout=30, compression=grpc.Compression.Gzip)
        assert refused.value.code() == grpc.StatusCode.INTERNAL
        assert "uncompressed" in refused.value.details()
        assert call(b"plain", timeout=30) == _answer(b"plain")


def test_poll_gives_up_after_its_timeout_and_a_taken_port_is_refused() -> None:
    server = UnaryServer("127.0.0.1", free_port(), METHOD)
    try:
        assert server.poll(0.05) is False
        with pytest.raises(OSError):
            UnaryServer("127.0.0.1", server.address[1], METHOD)
    finally:
        server.close()


def test_the_clients_settings_and_pings_are_acknowledged() -> None:
    """A client's SETTINGS and PINGs, written by hand: the server answers with its own
    SETTINGS, a SETTINGS ACK (type 4, flag 1) and PING ACKs (type 6, flag 1, stream 0) echoing
    each 8-byte payload (RFC 9113 sections 6.5 and 6.7), all while it waits for a call."""
    server = UnaryServer("127.0.0.1", free_port(), METHOD)
    pings = [bytes([k]) * 8 for k in range(1, 4)]
    try:
        with socket.create_connection(server.address) as sock:
            sock.sendall(PREFACE + frame(4, 0, 0) + b"".join(frame(6, 0, 0, p) for p in pings))
            assert server.poll(0.5) is False  # no call came, but the frames were handled
            sock.settimeout(5)
            received = bytearray()
            while len(frames_of(received)) < 6 or len(received) < sum(
                    9 + len(f[3]) for f in frames_of(received)):
                received += sock.recv(4096)
        frames = frames_of(received)
        assert frames[0][0] == 4 and frames[0][1] == 0  # the server's own SETTINGS
        assert (4, 1, 0, b"") in frames
        assert [f for f in frames if f[0] == 6] == [(6, 1, 0, p) for p in pings]
    finally:
        server.close()


# -- mlagents-envs over the server, with Unity's client ---------------------------------------


class _GrpcPlayer:
    """A Unity player's end as ML-Agents' `RpcCommunicator.cs` makes it with `Grpc.Core`
    (gRPC's C core): a channel to "localhost:PORT" with default options, and every call,
    the handshake included, to `Exchange`."""

    def __init__(self, port: int) -> None:
        self._channel = grpc.insecure_channel(f"localhost:{port}")
        self._exchange = self._channel.unary_unary(
            "/communicator_objects.UnityToExternalProto/Exchange")

    def call(self, request: bytes) -> bytes:
        return self._exchange(request, wait_for_ready=True, timeout=60)

    def close(self) -> None:
        self._channel.close()


def _huggy_through_mlagents(connect: Any) -> tuple[list[np.ndarray], int, str]:
    """20 steps of the Huggy stand-in, played in a thread with the client `connect` makes,
    through mlagents-envs' `UnityEnvironment` (editor mode: it waits for a player on its
    port): the deciding agents' observations at each step, the stand-in's exit code, its log."""
    from mlagents_envs.base_env import ActionTuple
    from mlagents_envs.environment import UnityEnvironment

    from envs.standin.client import StandIn
    from envs.standin.protocol import run

    port, log, ended = free_port(), io.StringIO(), []
    player = threading.Thread(target=lambda: ended.append(run(StandIn(log, port), port, log,
                                                                  connect)))
    player.start()
    env = UnityEnvironment(file_name=None, base_port=port, seed=3, timeout_wait=60)
    seen = []
    try:
        assert type(env._communicator).__name__ == "LockstepCommunicator"
        env.reset()
        (behavior,) = env.behavior_specs
        for k in range(20):
            decision, _ = env.get_steps(behavior)
            seen.append(decision.obs[0].copy())
            env.set_actions(behavior, ActionTuple(continuous=np.full(
                (len(decision), 21), 0.25 * (k % 5 - 2), np.float32)))
            env.step()
    finally:
        env.close()
        player.join(30)
    return seen, ended[0], log.getvalue()


def test_mlagents_envs_serves_unitys_grpc_client_as_it_serves_the_stand_ins() -> None:
    """The server under mlagents-envs (`envs.lockstep`, the default communicator) with the
    client of a real Unity player (gRPC's C core: HPACK with Huffman coding and a dynamic table,
    its own SETTINGS, window updates and pings) and with the stand-ins' client: the handshake,
    the same seeded observations exactly (the same simulation, seed and actions), and status
    400 delivered at close (the player exits 0)."""
    ours, ours_code, ours_log = _huggy_through_mlagents(None)
    theirs, theirs_code, theirs_log = _huggy_through_mlagents(_GrpcPlayer)
    assert (ours_code, theirs_code) == (0, 0), (ours_log, theirs_log)
    assert "closing: status 400" in theirs_log
    assert len(theirs) == len(ours) == 20 and all(len(obs) for obs in theirs)
    for step, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_array_equal(mine, other, err_msg=f"step {step}")


def _hand_client_call(server: UnaryServer, window: int) -> socket.socket:
    """A client written by hand that grants `window` bytes per stream and has called once
    (request b"call"); the server has taken the call."""
    sock = socket.create_connection(server.address)
    settings = (4).to_bytes(2, "big") + window.to_bytes(4, "big")  # SETTINGS_INITIAL_WINDOW_SIZE
    sock.sendall(PREFACE + frame(4, 0, 0, settings) + frame(1, 4, 1, request_block(METHOD))
                 + frame(0, 1, 1, b"\x00" + (4).to_bytes(4, "big") + b"call"))  # DATA, END_STREAM
    assert server.receive() == b"call"
    return sock


@pytest.mark.parametrize("then", ["window update", "reset"])
def test_an_answer_waits_for_the_clients_window_without_holding_the_server(then: str) -> None:
    """A client granting 10 bytes per stream: `answer` returns at once, the answer's first 10
    bytes sent; as the server polls, a WINDOW_UPDATE lets the rest through (the whole answer,
    then trailers ending the stream), and after a RST_STREAM nothing more is sent on it."""
    server = UnaryServer("127.0.0.1", free_port(), METHOD)
    answer = bytes(range(100))
    prefix = b"\x00" + (100).to_bytes(4, "big")  # one uncompressed 100-byte message
    try:
        with _hand_client_call(server, window=10) as sock:
            server.answer(answer)
            first = read_frames_until(sock, lambda frames: any(f[0] == 0 for f in frames))
            assert b"".join(f[3] for f in first if f[0] == 0) == prefix + answer[:5]
            if then == "reset":
                sock.sendall(frame(3, 0, 1, (8).to_bytes(4, "big")))  # RST_STREAM, CANCEL
                assert server.poll(0.2) is False
                server.close(linger=0.0)
                rest = read_frames_until(sock, lambda frames: False)  # until the server closes
                assert not [f for f in rest if f[2] == 1]  # nothing more on the reset stream
                return
            sock.sendall(frame(8, 0, 1, (1_000).to_bytes(4, "big")))  # WINDOW_UPDATE, stream 1
            assert server.poll(0.2) is False  # no call came, but the window update was read
            frames = first + read_frames_until(
                sock, lambda frames: any(f[0] == 1 and f[1] & 1 for f in frames))
            body = b"".join(f[3] for f in frames if f[0] == 0 and f[2] == 1)
            assert body == prefix + answer
    finally:
        server.close(linger=0.0)
