"""The replicas' gRPC server (`deploy.serving.grpc_server`) on an event loop of its own, against
`grpc`'s client (gRPC's C core: HPACK with Huffman codes and a dynamic table, its own SETTINGS,
windows and pings) and against clients written by hand frame by frame. No Ray.

What is checked: answers byte for byte at sizes around HTTP/2's defaults, the metadata of every
call through the client's changing HPACK table, status codes and percent-encoded details, the
refusals (unknown method, compression, a message over the limit, a handler that raises), a call
the client cancels, calls that end in one read meeting in one batch of the batch queue, an
answer held by the client's window, broken HTTP/2 ending one connection only, and a graceful
stop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
import hpack
import pytest
import uvloop

from deploy.serving.batching import BatchQueue
from deploy.serving.grpc_ingress import start_replica_server
from deploy.serving.grpc_server import MAX_FRAME_SIZE, CallContext, UnaryServer
from tests.support.http2 import (
    DATA,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS_INITIAL_WINDOW_SIZE,
    WINDOW_UPDATE,
    Frame,
    frame,
    grpc_message,
    read_frames_until,
    settings_frame,
)

ECHO = "/test.Echo/Echo"
METADATA = "/test.Echo/Metadata"
STATUS = "/test.Echo/Status"
HELD = "/test.Echo/Held"
METADATA_AT_STATIC_PATH = "/index.html"  # the HPACK static table's entry 5
BATCHED = "/test.Echo/Batched"
LIMIT = 1 << 20
WAIT_S = 30
"""The most a test waits for the server (a bound against hanging, not a measurement)."""


def answer_of(request: bytes) -> bytes:
    """What the echo method answers: the request's digest, then the request reversed."""
    return hashlib.sha256(request).digest() + request[::-1]


LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
"""The event loops the server runs on: asyncio's, and uvloop's (Serve's replicas run on it)."""


class Served:
    """A `UnaryServer` of the test methods on an event loop (of kind `loop`) in a thread.
    `held` calls wait for `release` (and set `held_started` / `held_cancelled`); `batched`
    calls go through a batch queue whose batches are recorded."""

    def __init__(self, loop: str = "asyncio", max_message_bytes: int = LIMIT) -> None:
        self.loop = LOOPS[loop]()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.held_started = threading.Event()
        self.held_cancelled = threading.Event()
        self.batches: list[list[bytes]] = []
        self.release: asyncio.Event = self.run(self._event())
        self.queue: BatchQueue[bytes, bytes] = self.run(self._queue())
        methods: dict[str, Callable[[bytes, CallContext], Awaitable[bytes]]] = {
            ECHO: self._echo, METADATA: self._metadata, METADATA_AT_STATIC_PATH: self._metadata,
            STATUS: self._status,
            HELD: self._held, BATCHED: self._batched}
        self.server = UnaryServer(methods, max_message_bytes)
        self.run(self.server.start("127.0.0.1", 0))
        host, port = self.server.address
        self.address = f"{host}:{port}"

    def run(self, coroutine: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(WAIT_S)

    @staticmethod
    async def _event() -> asyncio.Event:
        return asyncio.Event()

    async def _queue(self) -> BatchQueue[bytes, bytes]:
        async def run(calls: list[bytes]) -> list[bytes]:
            self.batches.append(calls)
            return [answer_of(call) for call in calls]

        return BatchQueue(run, lambda call: 1, 64)

    @staticmethod
    async def _echo(request: bytes, context: CallContext) -> bytes:
        return answer_of(request)

    @staticmethod
    async def _metadata(request: bytes, context: CallContext) -> bytes:
        return json.dumps(list(context.invocation_metadata())).encode()

    @staticmethod
    async def _status(request: bytes, context: CallContext) -> bytes:
        if request == b"raise":
            raise RuntimeError("the handler failed")
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details(request.decode())
        return b""

    async def _held(self, request: bytes, context: CallContext) -> bytes:
        self.held_started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.held_cancelled.set()
            raise
        return answer_of(request)

    async def _batched(self, request: bytes, context: CallContext) -> bytes:
        return await self.queue.submit(request)

    def stop(self, grace: float = 0.0) -> None:
        self.run(self.server.stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)


@pytest.fixture(params=list(LOOPS))
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    served = Served(request.param)
    try:
        yield served
    finally:
        served.stop()


def channel(served: Served) -> grpc.Channel:
    size = 64 << 20
    return grpc.insecure_channel(served.address, options=[
        ("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)])


def payload(size: int) -> bytes:
    return bytes(range(256)) * (size // 256) + bytes(size % 256)


def test_answers_byte_for_byte_at_every_size(served: Served) -> None:
    """Sizes around HTTP/2's defaults both ways (a 16,384-byte frame, a 65,535-byte window),
    up to the server's limit; then 300 calls in a row on one connection."""
    with channel(served) as ch:
        echo = ch.unary_unary(ECHO)
        for size in (0, 1, 16_379, 16_380, 65_535, 70_000, LIMIT):
            assert echo(payload(size), timeout=WAIT_S) == answer_of(payload(size)), size
        for k in range(300):
            request = k.to_bytes(2, "big") * 3_000
            assert echo(request, timeout=WAIT_S) == answer_of(request)


def test_every_call_gets_its_own_metadata_as_the_clients_table_changes(served: Served) -> None:
    """gRPC's client indexes header values in its HPACK table: repeated values come as table
    indexes, new ones as literals that change the table. Each call sees its own."""
    with channel(served) as ch:
        metadata = ch.unary_unary(METADATA)
        for k in [0, 1, 0, 1, *range(2, 12), 0, 5, 11, 11]:
            sent = (("multiplexed_model_id", f"policy-{k}"), ("authorization", f"Bearer {k % 3}"))
            received = [tuple(pair) for pair in json.loads(metadata(b"", metadata=sent,
                                                                    timeout=WAIT_S))]
            assert all(pair in received for pair in sent), (sent, received)
            assert not any(name.startswith(":") for name, _ in received)


def test_status_codes_and_details_reach_the_client(served: Served) -> None:
    """A code and details the handler set (details with '%' and non-ASCII text travel
    percent-encoded); a handler that raises ends its call with INTERNAL; the connection goes
    on serving after both."""
    details = 'no policy "nope@1" (100% sure): Hündchen 犬'
    with channel(served) as ch:
        status = ch.unary_unary(STATUS)
        with pytest.raises(grpc.RpcError) as refused:
            status(details.encode(), timeout=WAIT_S)
        with pytest.raises(grpc.RpcError) as failed:
            status(b"raise", timeout=WAIT_S)
        assert ch.unary_unary(ECHO)(b"after", timeout=WAIT_S) == answer_of(b"after")
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.NOT_FOUND, details)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert failed.value.details() == "RuntimeError: the handler failed"


def test_details_travel_percent_encoded(served: Served) -> None:
    """gRPC's `grpc-message` is percent-encoded UTF-8: every byte outside printable ASCII, and
    '%' itself (the expected encoding written out by hand)."""
    with hand_connection(served) as sock:
        sock.sendall(call_frames(1, STATUS, "100% Hündchen 犬".encode()))
        frames = read_frames_until(sock, lambda got: 1 in trailers_by_stream(got))
    trailers = trailers_by_stream(frames)[1]
    assert trailers["grpc-status"] == "5"  # NOT_FOUND
    assert trailers["grpc-message"] == "100%25 H%C3%BCndchen %E7%8A%AC"


@pytest.mark.parametrize("rest", [b"", b"\x00\x03app\x05huggy", b"\x10\x03app\x05huggy"],
                         ids=["indexes only", "a literal not indexed", "a literal never indexed"])
@pytest.mark.parametrize("table_bytes", [b"", b"\x3f\x09"], ids=["4096-byte table", "40-byte"])
def test_a_block_that_leaves_the_table_means_what_the_table_holds_now(
        served: Served, rest: bytes, table_bytes: bytes) -> None:
    """The same header block bytes, which leave the table as it was (table indexes, then
    `rest`: nothing, or `app: huggy` as a literal that is not added to the table, the shape of
    gRPC's clients' custom metadata), before and after the table changed: entry 62 is
    `x-id: a` for the second call and `x-id: b` for the fourth (the block's other fields come
    from the static table: `:path /index.html` is its entry 5). With the table cut to 40 bytes
    (a size update opening the first block, RFC 7541 6.3) it holds one such entry (32 bytes +
    name + value): adding `x-id: b` evicts `x-id: a`, so the table keeps its length."""
    def with_indexing(name: str, value: str) -> bytes:  # RFC 7541 6.2.1, new name
        return b"\x40" + bytes((len(name),)) + name.encode() + bytes((len(value),)) + value.encode()

    unchanging = b"\x83\x86\x85\xbe" + rest  # :method POST, :scheme http, :path, entry 62
    blocks = [table_bytes + b"\x83\x86\x85" + with_indexing("x-id", "a"), unchanging,
              b"\x83\x86\x85" + with_indexing("x-id", "b"), unchanging]
    with hand_connection(served) as sock:
        sock.sendall(b"".join(frame(HEADERS, 0x4, 2 * k + 1, block)
                              + frame(DATA, 0x1, 2 * k + 1, grpc_message(b""))
                              for k, block in enumerate(blocks)))
        frames = read_frames_until(sock, lambda got: len(answers_by_stream(got)) == 4)
    seen = {stream: json.loads(message) for stream, (message, _) in
            answers_by_stream(frames).items()}
    app = [["app", "huggy"]] if rest else []
    assert seen == {1: [["x-id", "a"]], 3: [["x-id", "a"], *app], 5: [["x-id", "b"]],
                    7: [["x-id", "b"], *app]}


def test_refusals_name_what_was_wrong_and_the_connection_goes_on(served: Served) -> None:
    with channel(served) as ch:
        with pytest.raises(grpc.RpcError) as unknown:
            ch.unary_unary("/test.Echo/Nope")(b"x", timeout=WAIT_S)
        with pytest.raises(grpc.RpcError) as compressed:
            ch.unary_unary(ECHO)(b"x" * 1000, compression=grpc.Compression.Gzip, timeout=WAIT_S)
        with pytest.raises(grpc.RpcError) as too_large:
            ch.unary_unary(ECHO)(payload(LIMIT + 1), timeout=WAIT_S)
        assert ch.unary_unary(ECHO)(b"after", timeout=WAIT_S) == answer_of(b"after")
    assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "unknown method /test.Echo/Nope" in unknown.value.details()
    assert compressed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "uncompressed" in compressed.value.details()
    assert too_large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"the limit of {LIMIT} bytes" in too_large.value.details()


def test_a_call_the_client_cancels_cancels_its_handler(served: Served) -> None:
    with channel(served) as ch:
        call = ch.unary_unary(HELD).future(b"held", timeout=WAIT_S)
        assert served.held_started.wait(WAIT_S)
        call.cancel()
        assert served.held_cancelled.wait(WAIT_S)
        assert ch.unary_unary(ECHO)(b"after", timeout=WAIT_S) == answer_of(b"after")


def hand_connection(served: Served, *settings: tuple[int, int]) -> socket.socket:
    """A client written by hand, connected, its preface and SETTINGS (`settings`) sent."""
    host, port = served.server.address
    sock = socket.create_connection((host, port))
    sock.sendall(PREFACE + settings_frame(*settings))
    return sock


def call_frames(stream: int, path: str, request: bytes) -> bytes:
    """A whole unary call on `stream`: HEADERS (`:method POST`, `:scheme http` from the HPACK
    static table, `:path` as a literal with the static table's name 4), then the message in one
    DATA frame ending the stream."""
    block = b"\x83\x86\x04" + bytes((len(path),)) + path.encode()
    return frame(HEADERS, 0x4, stream, block) + frame(DATA, 0x1, stream, grpc_message(request))


def trailers_by_stream(frames: list[Frame]) -> dict[int, dict[str, str]]:
    """The trailers of each stream whose answer ended, decoded with `hpack`."""
    decoder = hpack.Decoder()
    return {stream: dict(decoder.decode(data)) for kind, flags, stream, data in frames
            if kind == HEADERS and flags & 0x1}


def answers_by_stream(frames: list[Frame]) -> dict[int, tuple[bytes, str]]:
    """(message, grpc-status) of each stream whose answer ended, read by hand: the DATA after
    the 5-byte message prefix, and the trailers' status."""
    bodies: dict[int, bytes] = {}
    for kind, _, stream, data in frames:
        if kind == DATA:
            bodies[stream] = bodies.get(stream, b"") + data
    return {stream: (bodies.get(stream, b"")[5:], trailers["grpc-status"])
            for stream, trailers in trailers_by_stream(frames).items()}


def test_calls_that_end_in_one_read_meet_in_one_batch(served: Served) -> None:
    """Eight calls written in one go reach the server in one read; their handlers start in the
    same turn of the loop and the batch queue takes all eight as one batch."""
    requests = {2 * k + 1: f"call {k}".encode() for k in range(8)}
    with hand_connection(served) as sock:
        sock.sendall(b"".join(call_frames(stream, BATCHED, request)
                              for stream, request in requests.items()))
        frames = read_frames_until(sock, lambda got: len(answers_by_stream(got)) == 8)
    assert served.batches == [list(requests.values())]
    assert answers_by_stream(frames) == {stream: (answer_of(request), "0")
                                         for stream, request in requests.items()}


@pytest.mark.parametrize("then", ["window update", "reset"])
def test_an_answer_waits_for_the_clients_window(served: Served, then: str) -> None:
    """A client granting 10 bytes per stream gets the answer's first 10 bytes; a WINDOW_UPDATE
    lets the rest and the trailers through; a RST_STREAM instead ends the call with nothing
    more sent on it, and the next call is answered."""
    request = payload(100)
    with hand_connection(served, (SETTINGS_INITIAL_WINDOW_SIZE, 10)) as sock:
        sock.sendall(call_frames(1, ECHO, request))
        first = read_frames_until(sock, lambda got: any(f[0] == 0 for f in got))
        sent = b"".join(f[3] for f in first if f[0] == 0 and f[2] == 1)
        whole = grpc_message(answer_of(request))
        assert sent == whole[:10]
        if then == "reset":
            sock.sendall(frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big"))
                         + call_frames(3, ECHO, b"next")
                         + frame(WINDOW_UPDATE, 0, 1, (1_000).to_bytes(4, "big"))
                         + frame(WINDOW_UPDATE, 0, 3, (1_000).to_bytes(4, "big")))
            frames = read_frames_until(sock, lambda got: 3 in answers_by_stream(got))
            assert not [f for f in frames if f[2] == 1]  # nothing more on the reset stream
            assert answers_by_stream(frames)[3] == (answer_of(b"next"), "0")
            return
        sock.sendall(frame(WINDOW_UPDATE, 0, 1, (1_000).to_bytes(4, "big")))
        frames = first + read_frames_until(sock, lambda got: any(
            f[0] == HEADERS and f[1] & 0x1 for f in got))
    assert answers_by_stream(frames)[1] == (answer_of(request), "0")


def test_broken_http2_ends_that_connection_only(served: Served) -> None:
    """A PING is acknowledged with its payload; a frame over the advertised maximum ends the
    connection with GOAWAY FRAME_SIZE_ERROR, a bad preface with PROTOCOL_ERROR; meanwhile a
    `grpc` client on another connection is served."""
    with channel(served) as ch:
        echo = ch.unary_unary(ECHO)
        with hand_connection(served) as sock:
            sock.sendall(frame(PING, 0, 0, b"12345678"))
            pings = read_frames_until(sock, lambda got: any(f[0] == PING for f in got))
            assert [(f[1], f[3]) for f in pings if f[0] == PING] == [(1, b"12345678")]
            sock.sendall((MAX_FRAME_SIZE + 1).to_bytes(3, "big") + b"\x00\x00" + bytes(4))
            closed = read_frames_until(sock, lambda got: False)
        goaway = [f for f in closed if f[0] == GOAWAY]
        assert len(goaway) == 1 and goaway[0][3][4:8] == (0x6).to_bytes(4, "big")
        assert echo(b"between", timeout=WAIT_S) == answer_of(b"between")
        host, port = served.server.address
        with socket.create_connection((host, port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            closed = read_frames_until(sock, lambda got: False)
        goaway = [f for f in closed if f[0] == GOAWAY]
        assert len(goaway) == 1 and goaway[0][3][4:8] == (0x1).to_bytes(4, "big")
        assert echo(b"after", timeout=WAIT_S) == answer_of(b"after")


@pytest.mark.parametrize("loop", list(LOOPS))
def test_stop_answers_the_calls_in_flight_then_closes(loop: str) -> None:
    """`stop(grace)` while a call is held: no new connection is taken, the held call is
    answered once released, and then the port is closed."""
    served = Served(loop)
    address = served.server.address
    with channel(served) as ch:
        call = ch.unary_unary(HELD).future(b"held", timeout=WAIT_S)
        assert served.held_started.wait(WAIT_S)
        stopping = asyncio.run_coroutine_threadsafe(served.server.stop(WAIT_S), served.loop)
        served.loop.call_soon_threadsafe(served.release.set)
        assert call.result(WAIT_S) == answer_of(b"held")
        stopping.result(WAIT_S)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=WAIT_S)
    served.stop()


def test_replicas_share_a_port_that_no_one_else_holds() -> None:
    """Two replicas' servers bind one port (SO_REUSEPORT) and both answer; a port held by a
    socket without SO_REUSEPORT is refused with the address in the message."""
    async def scenario() -> tuple[bytes, str]:
        first = await start_replica_server(Served._echo, "127.0.0.1", 0)
        port = first.address[1]
        second = await start_replica_server(Served._echo, "127.0.0.1", port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            answer = await ch.unary_unary("/huggy.v1.Policy/Act")(b"shared", timeout=WAIT_S)
        await first.stop(0)
        await second.stop(0)
        with socket.create_server(("127.0.0.1", 0)) as busy:
            try:
                await start_replica_server(Served._echo, "127.0.0.1", busy.getsockname()[1])
            except RuntimeError as error:
                return answer, str(error)
        return answer, "no error"

    answer, refusal = asyncio.run(scenario())
    assert answer == answer_of(b"shared")
    assert refusal.startswith("the gRPC server cannot listen on 127.0.0.1:")
