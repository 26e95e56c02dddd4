"""The replica's own HTTP/1.1 listener, on a Unix socket that `huggy serve`'s HAProxy routes to
(`deploy.serving.haproxy`): the same ASGI requests and answers as through Serve's HTTP server in
the replica, without uvicorn's and Serve's per-request layers.

Each request is parsed (`httptools`, the parser uvicorn uses), handed to the replica as an ASGI
scope and its whole body, and answered with the starlette `Response` the replica returns, in
order, one request at a time per connection (HAProxy keeps a connection per request in flight,
so requests of many connections still meet in the replica's batch queue). A body larger than
`max_body_bytes` is not kept: the handler gets its first `max_body_bytes + 1` bytes (and the
declared Content-Length, which it refuses with 413), and the connection closes after that
answer. `Expect: 100-continue` is answered once the headers are read. A request that cannot be
parsed is answered 400 in the API's JSON, and its connection closed. A request whose connection
closes before its body is whole (its client left) is not handed over; `abandoned` is called.

Only HAProxy, as the same user, reaches the socket: it lies in a folder only this user can
enter (`deploy.serving.haproxy.private_folder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httptools
from starlette.responses import Response

from deploy.serving.responses import ApiError, error_response, internal_error

Handler = Callable[[dict[str, Any], bytes], Awaitable[Response]]
"""The replica's side: (ASGI scope, body) -> the answer. Expected never to raise; an exception
is answered 500 in the API's JSON."""
_STATUS_LINES = {status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode()
                 for status in http.HTTPStatus}
logger = logging.getLogger("ray.serve")


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Status\r\n".encode()


class _Request:
    """A request being read: its scope's parts and body."""

    __slots__ = ("url", "headers", "chunks", "size", "oversized", "in_body")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.oversized = False
        self.in_body = False
        """Its headers are read, its body not yet whole."""


class _Connection(asyncio.Protocol):
    """One client connection (HAProxy's): parses requests and answers them in order."""

    def __init__(self, server: UnixHttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.reading = _Request()
        self.pending: deque[tuple[dict[str, Any], bytes, bool]] = deque()
        self.task: asyncio.Task[None] | None = None
        self.discarding = False
        """The rest of an oversized body (the connection closes after its answer)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        if self.reading.in_body and not self.reading.oversized:
            self.reading.in_body = False
            self.server.abandoned()

    def data_received(self, data: bytes) -> None:
        if self.discarding:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse("upgrades (such as WebSocket) are not served here")
        except httptools.HttpParserError as error:
            self._refuse(f"the request is not valid HTTP/1.1: {error}")

    def _refuse(self, message: str) -> None:
        self._respond(error_response(ApiError(400, "invalid_request", message)), head=False,
                      keep_alive=False)
        self.close()

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self.reading = _Request()

    def on_url(self, url: bytes) -> None:
        self.reading.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.reading.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        declared = next((int(value) for name, value in self.reading.headers
                         if name == b"content-length" and value.isdigit()), None)
        self.reading.in_body = True
        if declared is not None and declared > self.server.max_body_bytes:
            self.reading.oversized = True
            self._dispatch()  # the handler refuses it by its Content-Length
        elif (b"expect", b"100-continue") in self.reading.headers:
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        request = self.reading
        if request.oversized:
            return
        request.chunks.append(body)
        request.size += len(body)
        if request.size > self.server.max_body_bytes:
            request.oversized = True
            self._dispatch()

    def on_message_complete(self) -> None:
        self.reading.in_body = False
        if not self.reading.oversized:
            self._dispatch()

    def _dispatch(self) -> None:
        """Queue the request read so far for an answer; an oversized one ends the connection."""
        request = self.reading
        path, _, query = request.url.partition(b"?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": self.parser.get_method().decode("latin-1"),
                 "scheme": "http", "path": path.decode("latin-1"), "raw_path": path,
                 "query_string": query, "root_path": self.server.root_path,
                 "headers": request.headers,
                 "client": None, "server": None}
        keep_alive = not request.oversized and self.parser.should_keep_alive()
        body = b"".join(request.chunks)
        if request.oversized:
            self.discarding = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        self.pending.append((scope, body, keep_alive))
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._answer_pending())
            self.server.tasks.add(self.task)
        elif len(self.pending) > 1 and self.transport is not None:
            self.transport.pause_reading()  # a client that pipelines waits for its answers

    async def _answer_pending(self) -> None:
        try:
            while self.pending:
                scope, body, keep_alive = self.pending.popleft()
                try:
                    response = await self.server.handler(scope, body)
                except Exception as error:  # the replica serves on; the request gets a 500
                    logger.exception("request %s %s failed", scope["method"], scope["path"])
                    response = error_response(internal_error(error))
                    keep_alive = False
                self._respond(response, scope["method"] == "HEAD", keep_alive)
                if not keep_alive:
                    self.close()
                    return
                if self.transport is not None and not self.discarding:
                    self.transport.resume_reading()
        finally:
            if self.task is not None:
                self.server.tasks.discard(self.task)
            self.task = None
            if self.server.stopping:
                self.close()

    def _respond(self, response: Response, head: bool, keep_alive: bool) -> None:
        parts = [_status_line(response.status_code)]
        for name, value in response.raw_headers:
            parts += (name, b": ", value, b"\r\n")
        if not keep_alive or self.server.stopping:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if not head:
            parts.append(bytes(response.body))
        self._write(b"".join(parts))

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    @property
    def idle(self) -> bool:
        return self.task is None


class UnixHttpServer:
    """Serves `handler` over HTTP/1.1 on a Unix socket, on the running event loop, with
    `root_path` in each scope; calls `abandoned` for each request whose client left before its
    body was whole."""

    def __init__(self, handler: Handler, max_body_bytes: int,
                 abandoned: Callable[[], None] = lambda: None, root_path: str = "") -> None:
        self.handler = handler
        self.abandoned = abandoned
        self.root_path = root_path
        """The scopes' `root_path`: the app's route prefix (paths keep it, as under Serve)."""
        self.max_body_bytes = max_body_bytes
        """The largest body kept; the replica updates it when its settings change."""
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.path: Path | None = None
        self._server: asyncio.Server | None = None

    async def start(self, path: Path) -> None:
        """Listen on the Unix socket `path` (a file left there is replaced). OSError if it
        cannot be created."""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), str(path))
        os.chmod(path, 0o600)
        self.path = path

    async def stop(self, grace: float) -> None:
        """Stop listening (the socket file goes), let the requests in flight be answered for up
        to `grace` seconds, then close every connection; their answers say `connection: close`."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for connection in list(self.connections):
            if connection.idle:
                connection.close()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=grace)
        for connection in list(self.connections):
            connection.close()
        await asyncio.sleep(0)  # the transports close in the next turn
