"""The one way every ingress reaches a replica's policies, in two steps: a request's head, then
its body. Serve's HTTP route and gRPC method (`deploy.serving.replica`), the replica's HTTP
listener for HAProxy (`deploy.serving.http_server`) and its gRPC server
(`deploy.serving.grpc_ingress`) only move bytes and map a `Reply` to their protocol:

    admission = service.admit(method, path, request_head(headers))
    ...read the body, calling service.check_size(bytes_so_far) as it grows...
    reply = await service.reply(admission, body)          # status, headers, JSON bytes

`admit` checks the API key, the route and the declared size on the request's headers, so a
request without its key, to no route, or declared too large is refused before one byte of its
body is read. The body's cap is the replica's live setting `max_body_bytes`, the same for every
ingress.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from deploy.serving.changes import PolicyChange, parse_change
from deploy.serving.responses import ApiError, internal_error
from deploy.serving.routes import ApiKey, check_route
from deploy.serving.runner import PolicyRunner
from huggy_agent_client.http_api import (
    ACT_PATH,
    HEALTH_PATH,
    INFO_PATH,
    MODEL_ACT_ROUTE,
    MODELS_PATH,
    POLICIES_PATH,
    POLICY_ID_HEADER,
)

ACT_ROUTES = frozenset({ACT_PATH, MODEL_ACT_ROUTE})
CLIENT_CLOSED_REQUEST = 499
"""The status of a request whose client left before sending its body (nginx's name for it): it
is counted, not logged as a failure."""
_POLICY_ID_NAMES = (POLICY_ID_HEADER.encode(), POLICY_ID_HEADER.replace("_", "-").encode())
logger = logging.getLogger("ray.serve")


@dataclass(frozen=True, slots=True)
class Reply:
    """What a request is answered: its HTTP status, extra headers and JSON body."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Admission:
    """A request whose head was admitted: its route, and the policy it names (by its path or
    its header; None: none)."""

    route: str
    policy_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestHead:
    """The headers of an HTTP request that the service reads; None where absent."""

    authorization: str | None = None
    content_length: int | None = None
    policy_id: str | None = None


def request_head(headers: list[tuple[bytes, bytes]]) -> RequestHead:
    """The headers the service reads, from an HTTP request's (name, value) pairs with names in
    lowercase (as ASGI and httptools give them), in one pass.

    Args:
        headers: the request's header fields.

    Returns:
        The first `authorization`, the first `content-length` (None where it is not digits:
            the HTTP parser refuses such a request), and the policy id by `POLICY_ID_HEADER`, else
            by its spelling with dashes.
    """
    authorization = length = None
    named: list[str | None] = [None, None]
    for name, value in headers:
        if name == b"authorization":
            if authorization is None:
                authorization = value.decode("latin-1")
        elif name == b"content-length":
            if length is None and value.isdigit():
                length = int(value)
        elif name in _POLICY_ID_NAMES:
            spelling = _POLICY_ID_NAMES.index(name)
            if named[spelling] is None:
                named[spelling] = value.decode("latin-1")
    return RequestHead(authorization, length, named[0] if named[0] is not None else named[1])


ChangePolicies = Callable[[PolicyChange], Awaitable[dict[str, Any]]]
"""Applies a live change of the served policies and returns the served set
(`deploy.serving.changes`)."""


class ActService:
    """A replica's answers to requests of any ingress (see the module docstring).

    Args:
        runner: the replica's policies and forward passes.
        api_key: the key every route but `/v1/healthz` requires; None: no key.
        change_policies: applies `PUT /v1/policies`; None: this replica takes no live changes.
    """

    def __init__(self, runner: PolicyRunner, api_key: ApiKey | None = None,
                 change_policies: ChangePolicies | None = None) -> None:
        self.runner = runner
        self.api_key = api_key
        self.change_policies = change_policies

    @property
    def max_body_bytes(self) -> int:
        """The largest body a request may have, now (a live setting)."""
        return self.runner.settings.max_body_bytes

    def admit(self, method: str, path: str, head: RequestHead) -> Admission:
        """Admit a request by its head, before its body is read.

        Args:
            method: the HTTP method ("POST" for every gRPC call).
            path: the request's path, without the app's route prefix.
            head: its headers that matter here.

        Returns:
            The route and the policy the request names.

        Raises:
            ApiError: 401 without the API key (where the route needs it), 404 for no route,
                405 for the wrong method, 413 for a declared body over `max_body_bytes`.
        """
        if self.api_key is not None:
            self.api_key.authorize(path, head.authorization)
        route, policy_id = check_route(path, method)
        if route in ACT_ROUTES:
            if head.content_length is not None:
                self.check_size(head.content_length, declared=True)
            self.runner.expect_alone()
            if policy_id is None:
                policy_id = head.policy_id
        return Admission(route, policy_id)

    def check_size(self, size: int, declared: bool = False) -> None:
        """Refuse a body of `size` bytes (as declared, or received so far) over the limit.

        Args:
            size: the body's size in bytes.
            declared: whether `size` is the declared Content-Length rather than what arrived so far.

        Raises:
            ApiError: 413 when `size` exceeds `max_body_bytes`.
        """
        limit = self.max_body_bytes
        if size > limit:
            received = (f"is {size} bytes" if declared
                        else f"exceeds it ({size} bytes received so far)")
            raise ApiError(413, "body_too_large", f"the limit of a request body is {limit} "
                           f"bytes; this one {received}; send fewer rows per request")

    async def reply(self, admission: Admission, body: bytes, may_run_alone: bool = True
                    ) -> Reply:
        """The answer to an admitted request with its whole `body`; never raises.

        Args:
            admission: what `admit` returned for the request.
            body: the request's body (empty for the read-only routes).
            may_run_alone: see `PolicyRunner.act`.

        Returns:
            200 with the route's JSON document, or the refusal (4xx) or failure (500) in the
                API's JSON error format.
        """
        route = admission.route
        try:
            if route in ACT_ROUTES:
                return Reply(200, await self.runner.act(body, admission.policy_id,
                                                        may_run_alone))
            if route == HEALTH_PATH:
                document = self.runner.health()
            elif route == INFO_PATH:
                document = self.runner.info()
            elif route == MODELS_PATH:
                document = self.runner.models()
            elif route == POLICIES_PATH:
                document = await self._change(body)
            else:
                document = self.runner.openapi(self.api_key is not None)
            return Reply(200, json.dumps(document).encode())
        except ApiError as error:
            return self.refusal(error)
        except Exception as error:  # answered as JSON; the replica serves on
            logger.exception("request for %s failed", route)
            return self.refusal(internal_error(error))

    async def _change(self, body: bytes) -> dict[str, Any]:
        """`PUT /v1/policies`: only a server with an API key takes live changes (it changes what
        every client gets), and only through a replica that can apply them."""
        if self.api_key is None:
            raise ApiError(403, "forbidden", f"PUT {POLICIES_PATH} changes what this server "
                           "serves, so it needs the server's API key: start huggy serve with "
                           "--api-key-file (or $HUGGY_API_KEY)")
        change = parse_change(body)
        if self.change_policies is None:
            raise ApiError(501, "not_supported", f"this server takes no live changes through "
                           f"PUT {POLICIES_PATH}")
        return await self.change_policies(change)

    def refusal(self, error: ApiError) -> Reply:
        """The reply of a refused (4xx) or failed (5xx) request, counted.

        Args:
            error: the refusal.

        Returns:
            Its status, JSON body and headers.
        """
        if error.status < 500:
            self.runner.metrics.counters["rejected"] += 1
        return Reply(error.status, error.body(), tuple(error.headers.items()))

    def abandoned(self) -> None:
        """A client left before its request's body arrived: counted, not answered."""
        self.runner.metrics.counters["disconnected"] += 1
