"""The replicas' own HTTP/1.1 listener for HAProxy (deploy.serving.http_server), over a real Unix
socket, against answers worked out by hand: requests in order per connection, connections that
do not wait for each other, HEAD, Expect, bodies over the limit, bad requests, a failing
handler, and a graceful stop. Concurrency is gated with events, never with wall-clock bounds."""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.responses import Response

from deploy.serving.http_server import UnixHttpServer

LIMIT = 1_000
Handler = Callable[[dict[str, Any], bytes], Awaitable[Response]]


async def echo(scope: dict[str, Any], body: bytes) -> Response:
    """Answers what it was handed: the scope's request line and headers, and the body."""
    document = {"method": scope["method"], "path": scope["path"], "root": scope["root_path"],
                "query": scope["query_string"].decode(), "body": body.decode("latin-1"),
                "headers": [[name.decode(), value.decode()] for name, value in scope["headers"]]}
    return Response(json.dumps(document).encode(), media_type="application/json")


@asynccontextmanager
async def listening(tmp_path: Path, handler: Handler = echo) -> AsyncIterator[UnixHttpServer]:
    server = UnixHttpServer(handler, LIMIT, root_path="/app")
    await server.start(tmp_path / "replica.sock")
    try:
        yield server
    finally:
        await server.stop(grace=5)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer: status, headers (lower-case names), body (by its Content-Length)."""
    status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    return int(status_line.split()[1]), headers, await reader.readexactly(length)


def request(method: str, path: str, body: bytes = b"", *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: replica", *headers]
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def connect(server: UnixHttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert server.path is not None
    return await asyncio.open_unix_connection(str(server.path))


def test_requests_on_one_connection_are_handed_over_whole_and_answered_in_order(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as server:
            assert stat.S_IMODE(server.path.stat().st_mode) == 0o600  # type: ignore[union-attr]
            reader, writer = await connect(server)
            writer.write(request("POST", "/app/v1/act?x=1", b'{"obs": [1]}',
                                 "Authorization: Bearer k"))
            status, headers, body = await read_answer(reader)
            assert (status, headers["content-type"]) == (200, "application/json")
            assert "connection" not in headers  # kept alive
            seen = json.loads(body)
            assert seen == {"method": "POST", "path": "/app/v1/act", "root": "/app", "query": "x=1",
                            "body": '{"obs": [1]}',
                            "headers": [["host", "replica"], ["authorization", "Bearer k"],
                                        ["content-length", "12"]]}
            # two more in one write (pipelined), the first with a chunked body
            writer.write(b"POST /a HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n" + request("GET", "/b"))
            first, second = await read_answer(reader), await read_answer(reader)
            assert (json.loads(first[2])["path"], json.loads(first[2])["body"]) == ("/a", "abcde")
            assert (json.loads(second[2])["path"], json.loads(second[2])["body"]) == ("/b", "")
            writer.close()

    asyncio.run(run())


def test_a_connection_waits_for_its_own_answer_but_not_for_other_connections(
        tmp_path: Path) -> None:
    """What lets requests meet in the replica's batch queue: one per connection at a time, all
    connections at once."""
    release = asyncio.Event()
    order: list[str] = []

    async def held(scope: dict[str, Any], body: bytes) -> Response:
        order.append(scope["path"])
        if scope["path"] == "/held":
            await release.wait()
        return Response(scope["path"].encode())

    async def run() -> None:
        async with listening(tmp_path, held) as server:
            reader, writer = await connect(server)
            writer.write(request("GET", "/held") + request("GET", "/after"))
            other_reader, other_writer = await connect(server)
            other_writer.write(request("GET", "/other"))
            assert (await read_answer(other_reader))[2] == b"/other"  # while /held waits
            assert order == ["/held", "/other"]  # /after waits for /held's answer
            release.set()
            assert (await read_answer(reader))[2] == b"/held"
            assert (await read_answer(reader))[2] == b"/after"
            assert order == ["/held", "/other", "/after"]
            writer.close()
            other_writer.close()

    asyncio.run(run())


def test_head_answers_the_headers_alone_and_expect_gets_its_continue_first(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with listening(tmp_path) as server:
            reader, writer = await connect(server)
            writer.write(request("HEAD", "/v1/healthz") + request("GET", "/next"))
            assert await reader.readline() == b"HTTP/1.1 200 OK\r\n"
            head_headers = []
            while (line := await reader.readline()) != b"\r\n":
                head_headers.append(line)
            assert any(line.lower().startswith(b"content-length: ") for line in head_headers)
            # no body came: the next bytes are the next answer's
            status, _, body = await read_answer(reader)
            assert (status, json.loads(body)["path"]) == (200, "/next")

            writer.write(b"POST /v1/act HTTP/1.1\r\nexpect: 100-continue\r\n"
                         b"content-length: 2\r\n\r\n")
            assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
            assert await reader.readline() == b"\r\n"
            writer.write(b"{}")
            status, _, body = await read_answer(reader)
            assert (status, json.loads(body)["body"]) == (200, "{}")
            writer.close()

    asyncio.run(run())


@pytest.mark.parametrize("framing", ["declared", "chunked"])
def test_a_body_over_the_limit_is_not_kept_and_its_connection_closes_after_the_answer(
        tmp_path: Path, framing: str) -> None:
    """The handler (the replica, which answers 413) gets the declared length and no body, or
    the first bytes past the limit of a chunked one; the rest is never read into memory."""
    handed: list[tuple[list[tuple[bytes, bytes]], bytes]] = []

    async def refuse(scope: dict[str, Any], body: bytes) -> Response:
        handed.append((scope["headers"], body))
        return Response(b'{"error": "body_too_large"}', status_code=413)

    async def run() -> None:
        async with listening(tmp_path, refuse) as server:
            reader, writer = await connect(server)
            if framing == "declared":
                writer.write(b"POST /v1/act HTTP/1.1\r\nexpect: 100-continue\r\n"
                             b"content-length: 5000000\r\n\r\n" + b"x" * 4096)
            else:
                chunk = b"x" * 600
                writer.write(b"POST /v1/act HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
                             + (b"258\r\n" + chunk + b"\r\n") * 4)
            status, headers, _ = await read_answer(reader)
            assert (status, headers["connection"]) == (413, "close")
            assert await reader.read() == b""  # closed; no 100 Continue came before
            headers_handed, body = handed[0]
            if framing == "declared":
                assert (b"content-length", b"5000000") in headers_handed and body == b""
            else:
                assert body == b"x" * 1200  # the two chunks that crossed LIMIT, no more
            writer.close()

    asyncio.run(run())


def test_a_request_that_is_not_http_gets_the_api_400_and_the_connection_closes(
        tmp_path: Path) -> None:
    handed: list[str] = []

    async def record(scope: dict[str, Any], body: bytes) -> Response:
        handed.append(scope["path"])
        return Response(b"")

    async def run() -> None:
        async with listening(tmp_path, record) as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nbad header line\r\n\r\n")
            status, headers, body = await read_answer(reader)
            assert (status, headers["connection"]) == (400, "close")
            assert json.loads(body)["error"] == "invalid_request"
            assert await reader.read() == b"" and handed == []

    asyncio.run(run())


def test_a_handler_that_raises_gets_a_500_and_the_server_serves_on(tmp_path: Path) -> None:
    async def failing(scope: dict[str, Any], body: bytes) -> Response:
        if scope["path"] == "/fail":
            raise ValueError("broken")
        return await echo(scope, body)

    async def run() -> None:
        async with listening(tmp_path, failing) as server:
            reader, writer = await connect(server)
            writer.write(request("GET", "/fail"))
            status, headers, body = await read_answer(reader)
            assert (status, headers["connection"]) == (500, "close")
            assert json.loads(body)["error"] == "internal_error"
            assert "broken" in json.loads(body)["message"]
            reader, writer = await connect(server)
            writer.write(request("GET", "/fine"))
            assert (await read_answer(reader))[0] == 200
            writer.close()

    asyncio.run(run())


def test_stop_takes_no_new_connection_and_answers_the_request_in_flight(tmp_path: Path) -> None:
    release, arrived = asyncio.Event(), asyncio.Event()

    async def held(scope: dict[str, Any], body: bytes) -> Response:
        arrived.set()
        await release.wait()
        return Response(b"done")

    async def run() -> None:
        server = UnixHttpServer(held, LIMIT)
        path = tmp_path / "replica.sock"
        await server.start(path)
        reader, writer = await connect(server)
        idle_reader, idle_writer = await connect(server)
        writer.write(request("GET", "/held"))
        await arrived.wait()
        stopping = asyncio.create_task(server.stop(grace=30))
        await asyncio.sleep(0)
        assert not path.exists()
        with pytest.raises(OSError):
            await asyncio.open_unix_connection(str(path))
        assert await idle_reader.read() == b""  # the idle connection is closed
        release.set()
        status, headers, body = await read_answer(reader)
        assert (status, headers["connection"], body) == (200, "close", b"done")
        assert await reader.read() == b""
        await stopping
        writer.close()
        idle_writer.close()

    asyncio.run(run())


def test_a_client_that_leaves_mid_body_is_reported_once_and_never_handed_over(
        tmp_path: Path) -> None:
    handed: list[str] = []
    left = asyncio.Event()
    abandoned: list[int] = []

    async def record(scope: dict[str, Any], body: bytes) -> Response:
        handed.append(scope["path"])
        return Response(b"")

    def leave() -> None:
        abandoned.append(len(handed))
        left.set()

    async def run() -> None:
        server = UnixHttpServer(record, LIMIT, abandoned=leave)
        await server.start(tmp_path / "replica.sock")
        idle_reader, idle_writer = await connect(server)
        idle_writer.write(request("GET", "/whole"))
        await read_answer(idle_reader)
        idle_writer.close()  # between requests: nobody left anything
        reader, writer = await connect(server)
        writer.write(b"POST /v1/act HTTP/1.1\r\ncontent-length: 100\r\n\r\n" + b"x" * 40)
        await writer.drain()
        writer.close()
        await left.wait()
        await server.stop(grace=5)
        assert (handed, abandoned) == (["/whole"], [1])

    asyncio.run(run())
