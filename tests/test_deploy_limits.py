"""Each cap of `huggy serve`'s front door (deploy/serving/limits.py, written into HAProxy's
configuration by deploy/serving/haproxy.py, and the replica listener's own), proved on a live
HAProxy in front of a live listener, without Ray: gRPC reaches the listener through HAProxy's
HTTP/2 and a call without its key is refused before its message is read; requests past a
replica's `maxconn` wait in HAProxy's queue (seen in HAProxy's own statistics), then get the
JSON 503; a slow request head is cut at the request timeout while others are answered; an idle
connection is closed; HTTP/2 settings and the glitch threshold; a client that stops sending
mid-request; `maxconn` within the open-file limit; the listener's bound on answers a client
leaves unread. Each test waits on what it checks, with `WAIT_S` as a bound against hanging."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import http.client
import io
import json
import resource
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from h2.errors import ErrorCodes
from hyperframe.frame import ContinuationFrame, DataFrame, Frame, GoAwayFrame, HeadersFrame

from deploy.serving import haproxy
from deploy.serving.haproxy import error_page, real_binary
from deploy.serving.http_server import MAX_UNSENT_BYTES, UnixHttpServer
from deploy.serving.limits import DESCRIPTORS_PER_CONNECTION, DESCRIPTORS_SPARE, ServingLimits
from deploy.serving.server import UNAVAILABLE
from tests.support.processes import free_ports, port_open
from tests.support.serving import KEY, WAIT_S, FrontDoor, Recorder, ray_config

pytestmark = pytest.mark.ray_release
ACT = "/huggy.v1.Policy/Act"


@pytest.fixture
def page(tmp_path: Path) -> Path:
    path = tmp_path / "unavailable.http"
    path.write_bytes(error_page(UNAVAILABLE.status, UNAVAILABLE.headers, UNAVAILABLE.body()))
    return path


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.02)


def stats(door: FrontDoor) -> dict[tuple[str, str], dict[str, str]]:
    """HAProxy's statistics (its stats page as CSV), by (proxy, server)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{door.stats}/stats;csv",
                                timeout=WAIT_S) as answer:
        rows = csv.DictReader(io.StringIO(answer.read().decode().lstrip("# ")))
        return {(row["pxname"], row["svname"]): row for row in rows}


def post(port: int, path: str = "/v1/act", body: bytes = b"{}",
         key: str = KEY) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(f"127.0.0.1:{port}", timeout=WAIT_S)
    try:
        connection.request("POST", path, body=body, headers={"Authorization": key})
        reply = connection.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        connection.close()


class Posting(threading.Thread):
    """`post(port, path)` in a thread of its own; `result` once it ends."""

    def __init__(self, port: int, path: str) -> None:
        super().__init__(daemon=True)
        self.port, self.path = port, path
        self.result: tuple[int, dict[str, str], bytes] | None = None

    def run(self) -> None:
        self.result = post(self.port, self.path)

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        self.join(WAIT_S)
        assert self.result is not None, f"no answer to {self.path}"
        return self.result


def test_grpc_through_haproxy_reaches_the_listener_and_a_call_without_its_key_is_refused_unread(
        tmp_path: Path, page: Path) -> None:
    """A gRPC client (gRPC's C core) calls through HAProxy's HTTP/2 and gets the listener's
    answer; a call without its key, with a message of 3 MB, is refused with UNAUTHENTICATED and
    the listener admitted and read none of it; a message declaring more than the service's
    limit ends with RESOURCE_EXHAUSTED from its prefix; a call naming an app that is not
    served ends with NOT_FOUND."""
    with FrontDoor(tmp_path, page, grpc=True) as door, \
            grpc.insecure_channel(f"127.0.0.1:{door.grpc_port}") as channel:
        act = channel.unary_unary(ACT)
        answer = act(b'{"obs": [1]}', metadata=(("authorization", KEY),
                                                ("multiplexed_model_id", "run@1")),
                     timeout=WAIT_S)
        assert json.loads(answer) == {"route": "/v1/act", "policy": "run@1",
                                      "body": '{"obs": [1]}'}
        with pytest.raises(grpc.RpcError) as refused:
            act(b"x" * (3 << 20), timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert json.loads(refused.value.details())["error"] == "unauthorized"
        with pytest.raises(grpc.RpcError) as too_large:
            act(b"x" * 5000, metadata=(("authorization", KEY),), timeout=WAIT_S)
        assert too_large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert json.loads(too_large.value.details())["message"] == "5000 bytes (declared)"
        with pytest.raises(grpc.RpcError) as no_app:  # never another app than the one named
            act(b"{}", metadata=(("authorization", KEY), ("application", "other")),
                timeout=WAIT_S)
        assert no_app.value.code() == grpc.StatusCode.NOT_FOUND
    assert door.recorder.handed == [("/v1/act", b'{"obs": [1]}')]
    assert len(door.recorder.admitted) == 2  # the first call and the one too large


def test_requests_past_a_replicas_maxconn_wait_in_the_queue_until_it_answers(
        tmp_path: Path, page: Path) -> None:
    """With one request at a time per replica, a second waits in HAProxy's queue (its
    statistics show it there, the listener has not seen it) and is answered once the first
    is."""
    limits = ServingLimits(max_connections_per_replica=1, queue_timeout_s=WAIT_S)
    with FrontDoor(tmp_path, page, limits) as door:
        held = Posting(door.port, "/held")
        held.start()
        wait_for(door.recorder.held.is_set, "the first request in the replica")
        queued = Posting(door.port, "/after")
        queued.start()
        wait_for(lambda: stats(door)[("http-huggy", "BACKEND")]["qcur"] == "1",
                 "the second request in HAProxy's queue")
        assert [route for route, _ in door.recorder.handed] == ["/held"]
        door.release()
        assert (held.answer()[0], queued.answer()[0]) == (200, 200)
    assert [route for route, _ in door.recorder.handed] == ["/held", "/after"]


def test_a_request_queued_past_the_queue_timeout_gets_the_json_503(tmp_path: Path,
                                                                    page: Path) -> None:
    limits = ServingLimits(max_connections_per_replica=1, queue_timeout_s=0.5)
    with FrontDoor(tmp_path, page, limits) as door:
        held = Posting(door.port, "/held")
        held.start()
        wait_for(door.recorder.held.is_set, "the first request in the replica")
        late = Posting(door.port, "/late")
        late.start()
        status, headers, body = late.answer()
        assert (status, headers["retry-after"], json.loads(body)["error"]) == (
            503, "1", "unavailable")
        door.release()
        assert held.answer()[0] == 200
    assert [route for route, _ in door.recorder.handed] == ["/held"]


def test_a_slow_request_head_is_cut_at_the_request_timeout_while_others_are_answered(
        tmp_path: Path, page: Path) -> None:
    limits = ServingLimits(request_timeout_s=0.5)
    with FrontDoor(tmp_path, page, limits) as door, \
            socket.create_connection(("127.0.0.1", door.port), timeout=WAIT_S) as slow:
        slow.sendall(b"POST /v1/act HTTP/1.1\r\nhost: x\r\nx-slow: ")  # and nothing more
        assert post(door.port)[0] == 200  # meanwhile
        answer = b""
        while chunk := slow.recv(65536):  # until HAProxy closes it
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert door.recorder.handed == [("/v1/act", b"{}")]  # the slow one never reached it


def test_a_request_head_past_max_header_bytes_is_refused_by_haproxy(
        tmp_path: Path, page: Path) -> None:
    """Headers of 9 KiB pass HAProxy's default buffer but not one of 8 KiB: refused there,
    the listener never sees the request, and a head that fits is answered."""
    limits = ServingLimits(max_header_bytes=8192)
    with FrontDoor(tmp_path, page, limits) as door, \
            socket.create_connection(("127.0.0.1", door.port), timeout=WAIT_S) as client:
        with contextlib.suppress(OSError):  # HAProxy may answer and close while we write
            client.sendall(b"POST /v1/act HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\n"
                           b"x-filler: " + b"y" * 9216 + b"\r\ncontent-length: 2\r\n\r\n{}")
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                answer += chunk
        assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")), answer[:80]
        assert post(door.port)[0] == 200
    assert door.recorder.handed == [("/v1/act", b"{}")]


def test_an_idle_connection_is_closed_at_the_idle_timeout(tmp_path: Path, page: Path) -> None:
    limits = ServingLimits(idle_timeout_s=0.5)
    with FrontDoor(tmp_path, page, limits) as door, \
            socket.create_connection(("127.0.0.1", door.port), timeout=WAIT_S) as client:
        client.sendall(b"POST /v1/act HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\n"
                       b"content-length: 2\r\n\r\n{}")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            answer += client.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in answer
        assert client.recv(65536) == b""  # kept alive, then closed once idle


def h2_client(port: int) -> tuple[socket.socket, h2.connection.H2Connection]:
    """A connection to `port` with HTTP/2 opened by python-hyper's h2 as a client."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    sock.sendall(connection.data_to_send())
    return sock, connection


def events_until(sock: socket.socket, connection: h2.connection.H2Connection,
                 done: Callable[[list[h2.events.Event]], bool]) -> list[h2.events.Event]:
    """The events the server's frames give until `done(events)` or the server closes."""
    events: list[h2.events.Event] = []
    while not done(events):
        data = sock.recv(65536)
        if not data:
            break
        events += connection.receive_data(data)
        sock.sendall(connection.data_to_send())
    return events


def read_to_the_end(sock: socket.socket) -> bytes:
    """What `sock` receives until the peer closes it (or resets it)."""
    received = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def call_in_pieces(connection: h2.connection.H2Connection, size: int) -> bytes:
    """A gRPC call with the key whose header block comes in `size`-byte pieces: a HEADERS
    frame and CONTINUATION frames, the last with END_HEADERS; then its message."""
    block = connection.encoder.encode([
        (":method", "POST"), (":scheme", "http"), (":path", ACT), (":authority", "x"),
        ("content-type", "application/grpc"), ("authorization", KEY), ("x-pad", "p" * 150)])
    pieces = [block[offset:offset + size] for offset in range(0, len(block), size)]
    headers = HeadersFrame(1)
    headers.data = pieces[0]
    frames = [headers]
    for piece in pieces[1:]:
        continuation = ContinuationFrame(1)
        continuation.data = piece
        frames.append(continuation)
    frames[-1].flags.add("END_HEADERS")
    message = DataFrame(1)
    message.data = b"\x00\x00\x00\x00\x02{}"
    message.flags.add("END_STREAM")
    return b"".join(frame.serialize() for frame in [*frames, message])


@pytest.mark.parametrize("glitches", [5, 100])
def test_a_header_block_in_many_tiny_pieces_counts_against_max_glitches(
        tmp_path: Path, page: Path, glitches: int) -> None:
    """A call whose header block comes in 2-byte pieces (82 frames) is 6 glitches in HAProxy's
    count (one per 16 pieces under 1 KiB): past a threshold of 5 the connection ends with
    GOAWAY ENHANCE_YOUR_CALM and the listener sees nothing; under the default of 100 the same
    call is answered. HAProxy's SETTINGS advertise `max_concurrent_streams`."""
    limits = ServingLimits(max_glitches=glitches, max_concurrent_streams=3)
    with FrontDoor(tmp_path, page, limits, grpc=True) as door:
        sock, connection = h2_client(door.grpc_port)
        with sock:
            settings = events_until(sock, connection, lambda events: any(
                isinstance(e, h2.events.RemoteSettingsChanged) for e in events))
            changed = next(e for e in settings if isinstance(e, h2.events.RemoteSettingsChanged))
            streams = changed.changed_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS]
            assert streams.new_value == 3
            sock.sendall(call_in_pieces(connection, 2))
            if glitches == 5:
                frames = frames_of(read_to_the_end(sock))
                assert [frame.error_code for frame in frames if isinstance(frame, GoAwayFrame)
                        ] == [ErrorCodes.ENHANCE_YOUR_CALM]
            else:  # the answer's frames, read raw: the client's h2 never opened the stream
                received = b""
                while not any(isinstance(frame, HeadersFrame) and "END_STREAM" in frame.flags
                              for frame in frames_of(received)):
                    chunk = sock.recv(65536)
                    assert chunk, "closed before the answer"
                    received += chunk
                blocks = [connection.decoder.decode(frame.data, raw=True)  # in order: HPACK
                          for frame in frames_of(received) if isinstance(frame, HeadersFrame)]
                assert (b"grpc-status", b"0") in [(bytes(n), bytes(v)) for n, v in blocks[-1]]
    assert len(door.recorder.admitted) == (0 if glitches == 5 else 1)


def test_a_header_block_that_never_ends_is_cut_at_the_request_timeout(
        tmp_path: Path, page: Path) -> None:
    """HEADERS without END_HEADERS, then empty CONTINUATION frames: HAProxy takes them out of
    its buffer as they come (its memory stays bounded) and counts no glitch until a block ends,
    so what bounds the flood is time: at `request_timeout_s` the connection ends (GOAWAY, then
    closed) while other clients are answered; the listener never sees the call."""
    limits = ServingLimits(request_timeout_s=1.0)
    with FrontDoor(tmp_path, page, limits, grpc=True) as door:
        sock, connection = h2_client(door.grpc_port)
        with sock:
            headers = HeadersFrame(1)
            headers.data = connection.encoder.encode(
                [(":method", "POST"), (":scheme", "http"), (":path", ACT),
                 (":authority", "x"), ("content-type", "application/grpc")])
            with contextlib.suppress(OSError):
                sock.sendall(headers.serialize() + ContinuationFrame(1).serialize() * 10_000)
            assert post(door.port)[0] == 200  # meanwhile
            assert GoAwayFrame.type in [frame.type for frame in frames_of(read_to_the_end(sock))]
    assert door.recorder.handed == [("/v1/act", b"{}")]


def frames_of(data: bytes) -> list[Frame]:
    """The whole HTTP/2 frames in `data`, read by hyperframe."""
    frames, offset = [], 0
    while len(data) - offset >= 9:
        frame, length = Frame.parse_frame_header(memoryview(data[offset:offset + 9]))
        if len(data) - offset - 9 < length:
            break
        frame.parse_body(memoryview(data[offset + 9:offset + 9 + length]))
        frames.append(frame)
        offset += 9 + length
    return frames


def open_calls(connection: h2.connection.H2Connection, count: int) -> None:
    """`count` gRPC calls with the key whose headers are sent and their messages never are."""
    for stream in range(1, 2 * count, 2):
        connection.send_headers(stream, [(":method", "POST"), (":scheme", "http"),
                                         (":path", ACT), (":authority", "x"),
                                         ("content-type", "application/grpc"),
                                         ("authorization", KEY)])


def test_a_client_that_stops_sending_mid_request_is_cut_at_the_client_timeout(
        tmp_path: Path, page: Path) -> None:
    """A gRPC call's headers then nothing: HAProxy holds it (the listener never sees it) and
    ends the stream at the client timeout."""
    limits = ServingLimits(client_timeout_s=0.5)
    with FrontDoor(tmp_path, page, limits, grpc=True) as door:
        sock, connection = h2_client(door.grpc_port)
        with sock:
            open_calls(connection, 1)
            sock.sendall(connection.data_to_send())
            ended = (h2.events.StreamReset, h2.events.ConnectionTerminated, h2.events.StreamEnded)
            events = events_until(sock, connection, lambda events: any(isinstance(e, ended)
                                                                       for e in events))
            assert any(isinstance(e, ended) for e in events)
    assert door.recorder.admitted == [] and door.recorder.handed == []


def test_requests_whose_bodies_do_not_come_hold_no_replica_slot(tmp_path: Path,
                                                                  page: Path) -> None:
    """With one request at a time per replica, 3 gRPC calls that send their headers and no
    message and an HTTP/1.1 request whose body stops short stay in HAProxy (the replica's
    server has no session in its statistics, the listener has seen none of them), and an
    ordinary request is answered meanwhile rather than queued behind them until the queue
    timeout (0.5 s) answers it 503; the timeouts that would end them are an hour."""
    limits = ServingLimits(max_connections_per_replica=1, queue_timeout_s=0.5,
                           request_timeout_s=3600, client_timeout_s=3600)
    with FrontDoor(tmp_path, page, limits, grpc=True) as door, \
            socket.create_connection(("127.0.0.1", door.port), timeout=WAIT_S) as short:
        sock, connection = h2_client(door.grpc_port)
        with sock:
            open_calls(connection, 3)
            sock.sendall(connection.data_to_send())
            short.sendall(b"POST /v1/act HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\n"
                          b"content-length: 100\r\n\r\n{\"obs\": ")
            wait_for(lambda: int(stats(door)[(f"{haproxy.GRPC_FRONTEND}", "FRONTEND")]["scur"])
                     >= 1 and int(stats(door)[("http_frontend", "FRONTEND")]["scur"]) >= 1,
                     "the calls and the request in HAProxy")
            assert post(door.port)[0] == 200
            replica = next(row for (proxy, server), row in stats(door).items()
                           if proxy == "http-huggy" and server.startswith("SERVE_REPLICA"))
            assert replica["scur"] == "0"
    assert door.recorder.handed == [("/v1/act", b"{}")]
    assert [path for _, path, _ in door.recorder.admitted] == ["/v1/act"]


def test_maxconn_stays_within_the_open_file_limit_haproxy_inherits(tmp_path: Path,
                                                                   page: Path) -> None:
    """Under a hard limit of 1,024 open files HAProxy refuses Ray's own `maxconn` (4,096 or,
    before Ray 2.60, 20,000: it cannot raise its limit that far) but starts through huggy's
    wrapper, which lowers `maxconn` to (1,024 - spare) / descriptors per connection."""
    port, replica, fallback, metrics, stats_port = free_ports(5)
    config = tmp_path / "haproxy.cfg"
    text = ray_config(tmp_path, port, replica, fallback, metrics=metrics, stats=stats_port)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    assert any(line.split() in (["maxconn", "4096"], ["maxconn", "20000"])
               for line in text.splitlines())
    config.write_text(text)
    ray_own = subprocess.run([real_binary(), "-db", "-f", str(config)], capture_output=True,
                             text=True, timeout=WAIT_S, preexec_fn=limited)
    assert ray_own.returncode != 0 and "Cannot raise FD limit" in ray_own.stderr
    wrapper = haproxy.install(tmp_path, page.read_bytes(), str(real_binary()))
    started = subprocess.Popen([str(wrapper), "-db", "-f", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               preexec_fn=limited)
    try:
        wait_for(lambda: port_open(port) or started.poll() is not None, "HAProxy to start")
        assert started.poll() is None, started.stderr.read()  # type: ignore[union-attr]
        expected = (1024 - DESCRIPTORS_SPARE) // DESCRIPTORS_PER_CONNECTION
        assert f"    maxconn {expected}\n" in config.read_text()
    finally:
        started.terminate()
        started.wait(timeout=WAIT_S)


def test_the_listener_stops_reading_a_client_that_leaves_its_answers_unread(
        tmp_path: Path) -> None:
    """40 pipelined requests of 100 KB, their answers (the body echoed) left unread: the
    listener answers until more than `MAX_UNSENT_BYTES` wait, then reads no more requests, so
    it holds at most that plus what the kernel's socket buffers took; once the client reads,
    every request is answered. The client is a plain socket: its writer and its reader are
    threads, the reader started only once the listener has stopped."""
    size, count = 100_000, 40
    body = b"y" * size
    request = (b"POST /v1/act HTTP/1.1\r\nauthorization: Bearer k\r\n"
               b"content-length: %d\r\n\r\n" % size + body)
    answer_body = json.dumps({"route": "/v1/act", "policy": None, "body": body.decode()})
    client = socket.socket(socket.AF_UNIX)
    received = bytearray()

    def read_all() -> None:
        while received.count(answer_body.encode()) < count:
            chunk = client.recv(1 << 20)
            if not chunk:
                return
            received.extend(chunk)

    async def run() -> int:
        recorder = Recorder(limit=size)
        server = UnixHttpServer(recorder)
        await server.start(tmp_path / "replica.sock")
        await asyncio.to_thread(client.connect, str(server.path))
        writer = threading.Thread(target=client.sendall, args=(request * count,), daemon=True)
        writer.start()
        deadline = time.monotonic() + WAIT_S
        while not server.connections:
            await asyncio.sleep(0.01)
        (connection,) = server.connections
        while connection.transport.is_reading() or not connection.idle:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the listener never stopped reading"
            await asyncio.sleep(0.01)
        stopped_at = len(recorder.handed)
        reader = threading.Thread(target=read_all, daemon=True)
        reader.start()
        await asyncio.to_thread(reader.join, WAIT_S)
        await asyncio.to_thread(writer.join, WAIT_S)
        client.close()
        await server.stop(grace=5)
        return stopped_at

    stopped_at = asyncio.run(run())
    buffers = 2 * int(Path("/proc/sys/net/core/wmem_max").read_text())  # both ends, at most
    assert stopped_at < count and (stopped_at - 1) * size <= MAX_UNSENT_BYTES + buffers
    assert received.count(answer_body.encode()) == count
