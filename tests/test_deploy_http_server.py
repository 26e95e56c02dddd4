"""The replicas' own HTTP/1.1 listener for HAProxy (deploy.serving.http_server), over a real Unix
socket, against answers worked out by hand: requests admitted on their heads (a refusal before
any body byte is read), bodies bounded as they arrive, requests in order per connection,
connections that do not wait for each other, HEAD, Expect, bad requests, a failing service, a
client that leaves, a graceful stop; and gRPC calls as HAProxy hands them over (HTTP/1.1,
chunked, one message, the status in the trailers). The service is a recorder of what it is
handed (`Recorder`); the replica's own service runs through the same listener in
tests/test_deploy_replica.py. Concurrency is gated with events, never with wall-clock bounds."""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from deploy.serving.http_server import MAX_HEAD_BYTES, UnixHttpServer
from deploy.serving.service import RequestHead
from tests.support.serving import KEY, Recorder

LIMIT = 1_000
GRPC_PATH = "/huggy.v1.Policy/Act"


@asynccontextmanager
async def listening(tmp_path: Path, service: Recorder | None = None
                    ) -> AsyncIterator[tuple[UnixHttpServer, Recorder]]:
    recorder = service or Recorder(LIMIT)
    server = UnixHttpServer(recorder, root_path="/app")
    await server.start(tmp_path / "replica.sock")
    try:
        yield server, recorder
    finally:
        await server.stop(grace=5)


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """An HTTP/1.1 answer's status and headers (lower-case names)."""
    status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer: status, headers, body (by its Content-Length)."""
    status, headers = await read_head(reader)
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))


async def read_grpc_answer(reader: asyncio.StreamReader
                           ) -> tuple[dict[str, str], bytes, dict[str, str]]:
    """A gRPC answer over HTTP/1.1 as the listener writes it: headers, the chunked body (here
    at most one chunk), the trailers."""
    status, headers = await read_head(reader)
    assert (status, headers["content-type"], headers["transfer-encoding"]) == (
        200, "application/grpc", "chunked")
    body = b""
    while (size := int(await reader.readline(), 16)) > 0:
        body += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"
    trailers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        trailers[name.strip()] = value.strip()
    return headers, body, trailers


def request(method: str, path: str, body: bytes = b"", *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: replica", f"authorization: {KEY}", *headers]
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def grpc_head(*headers: str, key: str = KEY, path: str = GRPC_PATH) -> bytes:
    """The head of a gRPC call as HAProxy hands it to the replica: HTTP/1.1, chunked."""
    lines = [f"POST {path} HTTP/1.1", "host: replica", "content-type: application/grpc",
             "te: trailers", "transfer-encoding: chunked", *headers]
    if key:
        lines.append(f"authorization: {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def message(payload: bytes, compressed: int = 0, declared: int | None = None) -> bytes:
    """One gRPC message: the compressed flag, a 32-bit length, the payload."""
    size = len(payload) if declared is None else declared
    return bytes((compressed,)) + size.to_bytes(4, "big") + payload


async def connect(server: UnixHttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert server.path is not None
    return await asyncio.open_unix_connection(str(server.path))


def test_requests_on_one_connection_are_handed_over_whole_and_answered_in_order(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            assert stat.S_IMODE(server.path.stat().st_mode) == 0o600  # type: ignore[union-attr]
            reader, writer = await connect(server)
            writer.write(request("POST", "/app/v1/act?x=1", b'{"obs": [1]}',
                                 "serve_multiplexed_model_id: run@7"))
            status, headers, body = await read_answer(reader)
            assert (status, headers["content-type"], headers["x-seen"]) == (
                200, "application/json", "1")
            assert "connection" not in headers  # kept alive
            assert json.loads(body) == {"route": "/v1/act", "policy": "run@7",
                                        "body": '{"obs": [1]}'}
            assert recorder.admitted[0][:2] == ("POST", "/v1/act")  # the root path taken off
            assert recorder.admitted[0][2] == RequestHead(KEY, 12, "run@7")
            # two more in one write (pipelined), the first with a chunked body
            writer.write(b"POST /a HTTP/1.1\r\nauthorization: Bearer k\r\n"
                         b"transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                         + request("GET", "/b"))
            first, second = await read_answer(reader), await read_answer(reader)
            assert json.loads(first[2])["body"] == "abcde" and json.loads(second[2])["route"] == "/b"
            writer.close()

    asyncio.run(run())


def test_a_request_without_its_key_is_refused_on_its_head_before_its_body(
        tmp_path: Path) -> None:
    """The refusal comes while the body has not been sent: the key was read from the headers,
    none of the body was waited for; the connection closes after it."""
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            reader, writer = await connect(server)
            writer.write(b"POST /v1/act HTTP/1.1\r\ncontent-length: 900\r\n\r\n")
            status, headers, body = await read_answer(reader)
            assert (status, headers["connection"]) == (401, "close")
            assert json.loads(body) == {"error": "unauthorized", "message": "no key on /v1/act"}
            assert await reader.read() == b"" and recorder.handed == []
            reader, writer = await connect(server)  # a route refused as well, before its body
            writer.write(request("POST", "/nope", b"x" * 10)[:-10])
            status, headers, _ = await read_answer(reader)
            assert (status, headers["connection"], recorder.refused) == (404, "close", [401, 404])
            writer.close()

    asyncio.run(run())


def test_a_connection_waits_for_its_own_answer_but_not_for_other_connections(
        tmp_path: Path) -> None:
    """What lets requests meet in the replica's batch queue: one per connection at a time, all
    connections at once."""
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            reader, writer = await connect(server)
            writer.write(request("GET", "/held") + request("GET", "/after"))
            await recorder.held.wait()
            other_reader, other_writer = await connect(server)
            other_writer.write(request("GET", "/other"))
            assert json.loads((await read_answer(other_reader))[2])["route"] == "/other"
            assert [route for route, _ in recorder.handed] == ["/held", "/other"]
            recorder.release.set()
            assert json.loads((await read_answer(reader))[2])["route"] == "/held"
            assert json.loads((await read_answer(reader))[2])["route"] == "/after"
            writer.close()
            other_writer.close()

    asyncio.run(run())


def test_head_answers_the_headers_alone_and_expect_gets_its_continue_once_admitted(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as (server, _):
            reader, writer = await connect(server)
            writer.write(request("HEAD", "/v1/healthz") + request("GET", "/next"))
            status, headers = await read_head(reader)
            assert status == 200 and int(headers["content-length"]) > 0
            # no body came: the next bytes are the next answer's
            status, _, body = await read_answer(reader)
            assert (status, json.loads(body)["route"]) == (200, "/next")

            writer.write(b"POST /v1/act HTTP/1.1\r\nauthorization: Bearer k\r\n"
                         b"expect: 100-continue\r\ncontent-length: 2\r\n\r\n")
            assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
            assert await reader.readline() == b"\r\n"
            writer.write(b"{}")
            status, _, body = await read_answer(reader)
            assert (status, json.loads(body)["body"]) == (200, "{}")
            # not admitted: the refusal comes instead of the Continue
            writer.write(b"POST /v1/act HTTP/1.1\r\nexpect: 100-continue\r\n"
                         b"content-length: 2\r\n\r\n")
            assert (await read_answer(reader))[0] == 401
            writer.close()

    asyncio.run(run())


@pytest.mark.parametrize("framing", ["declared", "chunked"])
def test_a_body_over_the_limit_is_not_kept_and_its_connection_closes_after_the_answer(
        tmp_path: Path, framing: str) -> None:
    """Declared too large: refused on the head, no Continue. Chunked: refused once what arrived
    passes the limit; nothing is handed over."""
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            reader, writer = await connect(server)
            if framing == "declared":
                writer.write(b"POST /v1/act HTTP/1.1\r\nauthorization: Bearer k\r\n"
                             b"expect: 100-continue\r\ncontent-length: 5000000\r\n\r\n")
            else:
                writer.write(b"POST /v1/act HTTP/1.1\r\nauthorization: Bearer k\r\n"
                             b"transfer-encoding: chunked\r\n\r\n" + chunk(b"x" * 600) * 4)
            status, headers, body = await read_answer(reader)
            assert (status, headers["connection"]) == (413, "close")
            expected = "5000000 bytes (declared)" if framing == "declared" else \
                "1200 bytes (received)"
            assert json.loads(body)["message"] == expected
            assert await reader.read() == b""  # closed; no 100 Continue came before
            assert recorder.handed == []
            writer.close()

    asyncio.run(run())


def test_a_request_that_is_not_http_gets_the_api_400_and_the_connection_closes(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nbad header line\r\n\r\n")
            status, headers, body = await read_answer(reader)
            assert (status, headers["connection"]) == (400, "close")
            assert json.loads(body)["error"] == "invalid_request"
            assert await reader.read() == b"" and recorder.handed == []

    asyncio.run(run())


def test_a_head_past_its_cap_gets_431_and_the_connection_closes(tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nauthorization: Bearer k\r\n"
                         + b"x-filler: " + b"y" * MAX_HEAD_BYTES + b"\r\n\r\n")
            status, headers, body = await read_answer(reader)
            assert (status, headers["connection"]) == (431, "close")
            assert json.loads(body)["error"] == "headers_too_large"
            assert await reader.read() == b"" and recorder.admitted == []

    asyncio.run(run())


def test_a_failing_service_answer_closes_nothing_and_the_server_serves_on(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as (server, _):
            reader, writer = await connect(server)
            writer.write(request("GET", "/fail") + request("GET", "/fine"))
            status, _, body = await read_answer(reader)
            assert status == 500 and json.loads(body)["error"] == "internal_error"
            assert (await read_answer(reader))[0] == 200
            writer.close()

    asyncio.run(run())


def test_stop_takes_no_new_connection_and_answers_the_request_in_flight(tmp_path: Path) -> None:
    async def run() -> None:
        recorder = Recorder(LIMIT)
        server = UnixHttpServer(recorder)
        path = tmp_path / "replica.sock"
        await server.start(path)
        reader, writer = await connect(server)
        idle_reader, idle_writer = await connect(server)
        writer.write(request("GET", "/held"))
        await recorder.held.wait()
        stopping = asyncio.create_task(server.stop(grace=30))
        await asyncio.sleep(0)
        assert not path.exists()
        with pytest.raises(OSError):
            await asyncio.open_unix_connection(str(path))
        assert await idle_reader.read() == b""  # the idle connection is closed
        recorder.release.set()
        status, headers, _ = await read_answer(reader)
        assert (status, headers["connection"]) == (200, "close")
        assert await reader.read() == b""
        await stopping
        writer.close()
        idle_writer.close()

    asyncio.run(run())


def test_a_client_that_leaves_mid_body_is_counted_once_and_never_handed_over(
        tmp_path: Path) -> None:
    async def run() -> None:
        recorder = Recorder(LIMIT)
        server = UnixHttpServer(recorder)
        await server.start(tmp_path / "replica.sock")
        idle_reader, idle_writer = await connect(server)
        idle_writer.write(request("GET", "/whole"))
        await read_answer(idle_reader)
        idle_writer.close()  # between requests: nobody left anything
        reader, writer = await connect(server)
        writer.write(b"POST /v1/act HTTP/1.1\r\nauthorization: Bearer k\r\n"
                     b"content-length: 100\r\n\r\n" + b"x" * 40)
        await writer.drain()
        writer.close()
        while not recorder.left:  # the listener learns of it in a later turn of the loop
            await asyncio.sleep(0.01)
        await server.stop(grace=5)
        assert ([route for route, _ in recorder.handed], recorder.left) == (["/whole"], 1)

    asyncio.run(run())


# --- gRPC calls, as HAProxy hands them over -------------------------------------------------

def test_a_grpc_call_is_one_message_in_and_out_with_its_status_in_the_trailers(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            reader, writer = await connect(server)
            payload = b'{"obs": [0.5]}'
            framed = message(payload)  # split across chunks as a client's frames may be
            writer.write(grpc_head("multiplexed_model_id: run@3") + chunk(framed[:3])
                         + chunk(framed[3:]) + b"0\r\n\r\n")
            headers, body, trailers = await read_grpc_answer(reader)
            assert "connection" not in headers and trailers == {"grpc-status": "0"}
            assert body[:5] == b"\x00" + (len(body) - 5).to_bytes(4, "big")
            assert json.loads(body[5:]) == {"route": "/v1/act", "policy": "run@3",
                                            "body": payload.decode()}
            assert recorder.admitted[0][:2] == ("POST", "/v1/act")  # the act route's rules
            # the connection goes on: a refusal of the service's, as a gRPC status
            writer.write(grpc_head(key="Bearer wrong") + chunk(message(b"{}")) + b"0\r\n\r\n")
            headers, body, trailers = await read_grpc_answer(reader)
            assert body == b"" and headers["connection"] == "close"
            assert trailers["grpc-status"] == "16"  # UNAUTHENTICATED
            assert json.loads(trailers["grpc-message"])["error"] == "unauthorized"
            writer.close()

    asyncio.run(run())


@pytest.mark.parametrize(("sent", "status", "details"), [
    # a message declaring more than the limit: refused from its 5-byte prefix alone
    (chunk(message(b"", declared=LIMIT + 1)), "8", "1001 bytes (declared)"),
    (chunk(message(b"{}", compressed=1)), "12", "compressed messages are not supported"),
    (chunk(message(b"{}") + message(b"{}")) + b"0\r\n\r\n", "13", "expected one message, "
     "received more"),
    (chunk(message(b"{}")[:3]) + b"0\r\n\r\n", "13", "expected exactly one message"),
])
def test_a_grpc_call_that_breaks_its_framing_ends_with_its_status_and_nothing_handed_over(
        tmp_path: Path, sent: bytes, status: str, details: str) -> None:
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            reader, writer = await connect(server)
            writer.write(grpc_head() + sent)
            headers, body, trailers = await read_grpc_answer(reader)
            assert (body, headers["connection"], trailers["grpc-status"]) == (b"", "close", status)
            assert details in trailers["grpc-message"]
            assert recorder.handed == []
            writer.close()

    asyncio.run(run())


def test_a_grpc_call_to_another_method_is_unimplemented_and_quotes_a_short_prefix(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as (server, recorder):
            reader, writer = await connect(server)
            long_path = "/huggy.v1.Policy/" + "N" * 4000
            writer.write(grpc_head(path=long_path))  # refused on its head: no body sent
            _, body, trailers = await read_grpc_answer(reader)
            assert (body, trailers["grpc-status"]) == (b"", "12")
            assert len(trailers["grpc-message"]) < 200
            assert trailers["grpc-message"].endswith("NNN'... and 3,953 more")
            assert recorder.admitted == []
            writer.close()

    asyncio.run(run())
