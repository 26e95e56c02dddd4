"""The replica's own HTTP/1.1 listener, on a Unix socket that `huggy serve`'s HAProxy routes to
(`deploy.serving.haproxy`): requests parsed by `httptools` (llhttp, the parser uvicorn uses) and
handed to the replica's service (`deploy.serving.service`) as bytes, answered as bytes. HAProxy
sends it HTTP requests and gRPC calls alike, the calls as HTTP/1.1 requests whose body is one
gRPC message (`content-type: application/grpc`), answered with the gRPC status in the answer's
chunked trailers.

Each request is admitted on its head, as its headers end: one without its key, to no route or
declaring a body over the limit is answered at once, none of its body read, and its connection
closed after the answer. An admitted request's body is kept up to the service's
`max_body_bytes` (413, or RESOURCE_EXHAUSTED from a gRPC message's length prefix, past it, and
the connection closed); `Expect: 100-continue` is answered once it is admitted. Requests are
answered in order, one at a time per connection (HAProxy keeps a connection per request in
flight, so requests of many connections still meet in the replica's batch queue). A request
that is not HTTP/1.1 is answered 400, one whose URL and headers exceed `MAX_HEAD_BYTES` 431,
both in the API's JSON, and the connection closed. A request whose connection closes before its
body is whole (its client left) is not answered; the service counts it.

Only HAProxy reaches the socket, and a burst never overflows its backlog (`UnixHttpServer.start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import os
from collections import deque
from pathlib import Path
from typing import NamedTuple, Protocol, cast

import httptools

from deploy.serving.grpc_ingress import (
    CONTENT_TYPE,
    INTERNAL,
    MESSAGE_PREFIX,
    OK,
    UNIMPLEMENTED,
    grpc_status,
    percent_encoded,
)
from deploy.serving.limits import MAX_HEADER_BYTES
from deploy.serving.responses import ApiError
from deploy.serving.service import Admission, Reply, RequestHead, request_head
from huggy_agent_client.http_api import (
    ACT_PATH,
    GRPC_ACT_METHOD,
    GRPC_POLICY_METADATA,
    shown,
)

LISTEN_BACKLOG = 1024
"""Connections waiting to be accepted: more than HAProxy opens to one replica at once."""
MAX_HEAD_BYTES = MAX_HEADER_BYTES
"""The longest URL and headers of a request: the largest that HAProxy's `max_header_bytes`
lets through (HAProxy refuses a longer head first)."""
MAX_UNSENT_BYTES = 1 << 20
"""Answer bytes waiting for HAProxy to read them; past it the connection is not read."""
_STATUS_LINES = {status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode()
                 for status in http.HTTPStatus}
_GRPC_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n"
              b"transfer-encoding: chunked\r\n")


class HttpService(Protocol):
    """What the listener needs of the replica's service (`deploy.serving.service.ActService`)."""

    def admit(self, method: str, path: str, head: RequestHead) -> Admission:
        """Admit a request by its head (`ActService.admit`).

        Args:
            method: the HTTP method.
            path: the request's path, without the app's route prefix.
            head: its headers that matter here.

        Returns:
            The route and the policy the request names.

        Raises:
            ApiError: the request is refused on its head.
        """
        ...

    def check_size(self, size: int, declared: bool = False) -> None:
        """Refuse a body over the limit (`ActService.check_size`).

        Args:
            size: the body's size in bytes.
            declared: whether `size` is the declared Content-Length.

        Raises:
            ApiError: 413 over `max_body_bytes`.
        """
        ...

    async def reply(self, admission: Admission, body: bytes,
                    may_run_alone: bool = True) -> Reply:
        """The answer to an admitted request (`ActService.reply`); never raises.

        Args:
            admission: what `admit` returned.
            body: the request's whole body.
            may_run_alone: see `PolicyRunner.act`.

        Returns:
            The reply.
        """
        ...

    def refusal(self, error: ApiError) -> Reply:
        """The reply of a refused or failed request, counted (`ActService.refusal`).

        Args:
            error: the refusal.

        Returns:
            The reply.
        """
        ...

    def abandoned(self) -> None:
        """Count a request whose client left before its body arrived."""
        ...


class GrpcEnd(NamedTuple):
    """How a gRPC call ends: its status code and details."""

    code: int
    details: str


class _Answer(NamedTuple):
    """A request to answer, in order: what answers it, its body, whether its connection stays
    open after it, and its form ("http", "head": HTTP without the body, or "grpc")."""

    answer: Admission | Reply | GrpcEnd
    body: bytes
    keep_alive: bool
    form: str


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Status\r\n".encode()


def grpc_answer(message: bytes | None, end: GrpcEnd, close: bool) -> bytes:
    """A gRPC call's answer as HTTP/1.1: the message in one chunk, then the status as trailers.

    Args:
        message: the answer's message; None for none.
        end: the call's status code and details.
        close: the connection closes after it.

    Returns:
        The answer's bytes.
    """
    parts = [_GRPC_HEAD, b"connection: close\r\n\r\n" if close else b"\r\n"]
    if message is not None:
        framed = MESSAGE_PREFIX.pack(0, len(message)) + message
        parts += (b"%x\r\n" % len(framed), framed, b"\r\n")
    parts += (b"0\r\ngrpc-status: %d\r\n" % end.code,
              b"grpc-message: %s\r\n" % percent_encoded(end.details) if end.details else b"",
              b"\r\n")
    return b"".join(parts)


class _Request:
    """A request being read: its head, then its body."""

    __slots__ = ("url", "headers", "head_bytes", "chunks", "size", "admission", "in_body",
                 "grpc", "declared")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.admission: Admission | None = None
        self.in_body = False
        """Its head is admitted, its body not yet whole."""
        self.grpc = False
        self.declared: int | None = None
        """A gRPC message's length, from its prefix."""


class _Connection(asyncio.Protocol):
    """One client connection (HAProxy's): parses requests and answers them in order."""

    def __init__(self, server: UnixHttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.reading = _Request()
        self.pending: deque[_Answer] = deque()
        self.task: asyncio.Task[None] | None = None
        self.discarding = False
        """Nothing more is read: the connection closes after the answers queued."""
        self.unread = False
        """More than `MAX_UNSENT_BYTES` of answers wait for the client: nothing is read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=MAX_UNSENT_BYTES)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        if self.reading.in_body:
            self.reading.in_body = False
            self.server.service.abandoned()

    def pause_writing(self) -> None:
        self.unread = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.unread = False
        self._resume_reading()

    def _resume_reading(self) -> None:
        """Read again, unless the connection ends or its client leaves answers unread."""
        if self.transport is not None and not self.discarding and not self.unread:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.discarding:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(ApiError(400, "invalid_request",
                                  "upgrades (such as WebSocket) are not served here"))
        except httptools.HttpParserError as error:
            if not self.discarding:  # else a callback refused the request already
                self._refuse(ApiError(400, "invalid_request",
                                      f"the request is not valid HTTP/1.1: {str(error)[:80]}"))

    def _refuse(self, refusal: ApiError | GrpcEnd) -> None:
        """Answer the request being read with `refusal` after the requests queued, read
        nothing more, then close."""
        request = self.reading
        request.in_body = False
        if isinstance(refusal, ApiError):
            reply = self.server.service.refusal(refusal)
            if request.grpc:
                refusal = GrpcEnd(grpc_status(reply.status), reply.body.decode())
            else:
                self._queue(reply, b"", keep_alive=False)
                return
        self._queue(refusal, b"", keep_alive=False)

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self.reading = _Request()

    def on_url(self, url: bytes) -> None:
        self.reading.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.reading.headers.append((name.lower(), value))
        self._count_head(len(name) + len(value))

    def _count_head(self, size: int) -> None:
        """Count `size` bytes of the request's head; past `MAX_HEAD_BYTES`, refuse it (431) and
        stop the parser."""
        request = self.reading
        request.head_bytes += size
        if request.head_bytes > MAX_HEAD_BYTES and not self.discarding:
            self._refuse(ApiError(431, "headers_too_large", "the request's URL and headers "
                                  f"exceed {MAX_HEAD_BYTES} bytes"))
            raise httptools.HttpParserCallbackError("headers too large")

    def on_headers_complete(self) -> None:
        if self.discarding:
            return
        request = self.reading
        path = request.url.partition(b"?")[0].decode("latin-1")
        method = self.parser.get_method().decode("latin-1")
        head = request_head(request.headers)
        headers = dict(request.headers)
        request.grpc = headers.get(b"content-type", b"").startswith(CONTENT_TYPE)
        if request.grpc:
            if method != "POST" or path != GRPC_ACT_METHOD:
                self._refuse(GrpcEnd(UNIMPLEMENTED, f"unknown method {shown(path)}"))
                return
            if headers.get(b"grpc-encoding", b"identity") != b"identity":
                self._refuse(GrpcEnd(UNIMPLEMENTED, "compressed messages are not supported; "
                                     "send uncompressed ones"))
                return
            named = headers.get(GRPC_POLICY_METADATA.encode())
            method, path = "POST", ACT_PATH
            head = RequestHead(head.authorization, None,
                               None if not named else named.decode("latin-1"))
        elif self.server.root_path and path.startswith(self.server.root_path):
            path = path[len(self.server.root_path):]
        try:
            request.admission = self.server.service.admit(method, path, head)
        except ApiError as error:
            self._refuse(error)
            return
        request.in_body = True
        if (b"expect", b"100-continue") in request.headers:
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        request = self.reading
        if not request.in_body:
            return
        request.chunks.append(body)
        request.size += len(body)
        try:
            if not request.grpc:
                self.server.service.check_size(request.size)
            elif request.declared is None and request.size >= MESSAGE_PREFIX.size:
                compressed, request.declared = MESSAGE_PREFIX.unpack_from(
                    b"".join(request.chunks))
                if compressed:
                    self._refuse(GrpcEnd(UNIMPLEMENTED, "compressed messages are not "
                                         "supported; send uncompressed ones"))
                    return
                self.server.service.check_size(request.declared, declared=True)
        except ApiError as error:
            self._refuse(error)
            return
        if request.declared is not None and request.size > MESSAGE_PREFIX.size + request.declared:
            self._refuse(GrpcEnd(INTERNAL, "expected one message, received more"))

    def on_message_complete(self) -> None:
        request = self.reading
        if not request.in_body:
            return
        request.in_body = False
        body = b"".join(request.chunks)
        keep_alive = self.parser.should_keep_alive()
        if not request.grpc:
            self._queue(cast(Admission, request.admission), body, keep_alive)
        elif request.declared is None or len(body) != MESSAGE_PREFIX.size + request.declared:
            self._refuse(GrpcEnd(INTERNAL, "expected exactly one message"))
        else:
            self._queue(cast(Admission, request.admission), body[MESSAGE_PREFIX.size:],
                        keep_alive)

    def _queue(self, answer: Admission | Reply | GrpcEnd, body: bytes, keep_alive: bool
               ) -> None:
        """Queue a request's answer; one that ends the connection stops its reading."""
        form = ("grpc" if self.reading.grpc
                else "head" if self.parser.get_method() == b"HEAD" else "http")
        self.pending.append(_Answer(answer, body, keep_alive, form))
        if not keep_alive:
            self.discarding = True
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._answer_pending())
            self.server.tasks.add(self.task)
        if (self.discarding or len(self.pending) > 1) and self.transport is not None:
            self.transport.pause_reading()  # a client that pipelines waits for its answers

    async def _answer_pending(self) -> None:
        try:
            while self.pending:
                answer, body, keep_alive, form = self.pending.popleft()
                if isinstance(answer, Admission):
                    answer = await self.server.service.reply(answer, body)
                close = not keep_alive or self.server.stopping
                if form == "grpc":
                    self._write(self._grpc_answer(answer, close))
                else:
                    self._write(self._http_answer(cast(Reply, answer), form == "head", close))
                if close:
                    self.close()
                    return
                self._resume_reading()
        finally:
            if self.task is not None:
                self.server.tasks.discard(self.task)
            self.task = None
            if self.server.stopping:
                self.close()

    @staticmethod
    def _http_answer(reply: Reply, head_only: bool, close: bool) -> bytes:
        parts = [_status_line(reply.status), b"content-type: application/json\r\n",
                 b"content-length: %d\r\n" % len(reply.body)]
        for name, value in reply.headers:
            parts.append(f"{name}: {value}\r\n".encode("latin-1"))
        if close:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if not head_only:
            parts.append(reply.body)
        return b"".join(parts)

    @staticmethod
    def _grpc_answer(answer: Reply | GrpcEnd, close: bool) -> bytes:
        if isinstance(answer, GrpcEnd):
            return grpc_answer(None, answer, close)
        if answer.status == 200:
            return grpc_answer(answer.body, GrpcEnd(OK, ""), close)
        return grpc_answer(None, GrpcEnd(grpc_status(answer.status), answer.body.decode()),
                           close)

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
    """Serves `service` over HTTP/1.1 on a Unix socket, on the running event loop.

    Args:
        service: the replica's service.
        root_path: the app's route prefix, which the HTTP requests' paths keep (as under
            Serve); gRPC paths have none.
    """

    def __init__(self, service: HttpService, root_path: str = "") -> None:
        self.service = service
        self.root_path = root_path
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.path: Path | None = None
        self._server: asyncio.Server | None = None

    async def start(self, path: Path) -> None:
        """Listen on a Unix socket (a file left there is replaced).

        Only HAProxy, as the same user, reaches the socket: it lies in a folder only this user can
        enter (`deploy.serving.haproxy.private_folder`), and its mode is 600. The listen backlog
        holds every connection that HAProxy may open to one replica (its `maxconn` per server), so
        a burst never overflows it.

        Args:
            path: the socket's path.

        Raises:
            OSError: the socket cannot be created.
        """
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), str(path),
                                                     backlog=LISTEN_BACKLOG)
        os.chmod(path, 0o600)
        self.path = path

    async def stop(self, grace: float) -> None:
        """Stop listening (the socket file goes), let the requests in flight be answered for up to
        `grace` seconds, then close every connection; their answers say `connection: close`.

        Args:
            grace: seconds the requests in flight get.
        """
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
