"""The stand-ins' gRPC client (`envs.standin.http2`) against a real `grpc` server: answers byte
for byte, flow control both ways, refusals, a server that goes away, the server's pings."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from envs.standin.http2 import MAX_STREAM, ExchangeError, UnaryClient
from tests.support.processes import free_port

METHOD = "/test.Echo/Exchange"


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


def test_answers_are_the_servers_byte_for_byte_at_every_size(connected: tuple) -> None:
    """Sizes around HTTP/2's defaults: a 16,384-byte frame, a 65,535-byte window (both ways:
    the request and the reversed answer), and a megabyte; then 300 Huggy-sized calls in a row
    on the same connection (1.8 MB, 28 initial connection windows)."""
    _, client = connected
    for size in (0, 1, 16_379, 16_380, 65_535, 70_000, 1_000_000):
        request = bytes(range(256)) * (size // 256) + bytes(size % 256)
        assert client.call(request) == _answer(request), size
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


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of the HTTP/2 frames in `data`, read by hand (RFC 9113
    section 4.1: a 24-bit length, type, flags, a 31-bit stream id)."""
    frames, offset = [], 0
    while offset < len(data):
        size = int.from_bytes(data[offset : offset + 3], "big")
        stream = int.from_bytes(data[offset + 5 : offset + 9], "big") & 0x7FFF_FFFF
        frames.append((data[offset + 3], data[offset + 4], stream,
                       bytes(data[offset + 9 : offset + 9 + size])))
        offset += 9 + size
    return frames


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
    pings = {payload for kind, flags, _, payload in _frames(recorded.received)
             if kind == 6 and not flags & 1}
    acks = [f for f in _frames(recorded.sent) if f[0] == 6]
    assert len(acks) >= 2
    assert all(flags == 1 and stream == 0 and payload in pings
               for _, flags, stream, payload in acks)
