"""The gRPC ingress: one unary method, `/huggy.v1.Policy/Act`, carrying the same JSON documents as
`POST /v1/act` (no .proto to compile: request and answer are raw bytes). Two paths carry it:

- the replicas' own (`huggy serve --grpc-port`'s default): HAProxy speaks HTTP/2 to the client
  on that port and hands each call to a replica's own listener as HTTP/1.1
  (`deploy.serving.http_server`), which reads gRPC's message framing (this module) and answers
  with the gRPC status in the answer's trailers; HAProxy turns them back into HTTP/2 trailers.
  HAProxy's caps (`deploy.serving.limits`) apply, and no replica parses HTTP/2. Calls reach the
  replicas on the head node, where HAProxy runs, and meet in their batch queues as HTTP
  requests do.
- Serve's gRPC ingress (`GRPC_SERVICER_FUNCTION`, `huggy serve --grpc-ingress serve`): Serve's
  proxy (gRPC's C core) routes to every replica of the cluster, by the `application` metadata.
  A client's call: docs/serving.md.

With an API key, send it as metadata: `("authorization", "Bearer <key>")`; without it (or with
a wrong one) the call ends with UNAUTHENTICATED, checked on the call's headers before its
message is read. Refused requests end with INVALID_ARGUMENT (400, 422), NOT_FOUND (a
`multiplexed_model_id` metadata naming no served policy) or RESOURCE_EXHAUSTED (413: a message
over `max_body_bytes`, refused from its length prefix), the API's JSON error as the details.
"""

from __future__ import annotations

import struct
from typing import Any

import grpc

from huggy_agent_client.http_api import GRPC_SERVICE, GRPC_STATUS_FOR_HTTP

GRPC_SERVICER_FUNCTION = "deploy.serving.grpc_ingress:add_PolicyServicer_to_server"
CONTENT_TYPE = b"application/grpc"
MESSAGE_PREFIX = struct.Struct(">BI")
"""gRPC's 5-byte message prefix: compressed flag, length."""
OK, UNIMPLEMENTED, INTERNAL = 0, 12, 13


def grpc_status(http_status: int) -> int:
    """The gRPC status code of a reply.

    Args:
        http_status: the reply's HTTP status (not 200).

    Returns:
        The code (`GRPC_STATUS_FOR_HTTP`; INVALID_ARGUMENT for a status it does not list).
    """
    return GRPC_STATUS_FOR_HTTP.get(http_status, GRPC_STATUS_FOR_HTTP[400])


def grpc_code(http_status: int) -> grpc.StatusCode:
    """`grpc_status` as grpcio's enum, for Serve's gRPC context.

    Args:
        http_status: the reply's HTTP status (not 200).

    Returns:
        The enum member.
    """
    status = grpc_status(http_status)
    return next(code for code in grpc.StatusCode if code.value[0] == status)


def percent_encoded(details: str) -> bytes:
    """Details as gRPC's `grpc-message` carries them.

    Args:
        details: the status details.

    Returns:
        Their UTF-8, every byte outside printable ASCII and every '%' percent-encoded.
    """
    return "".join(chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}"
                   for byte in details.encode("utf-8")).encode("ascii")


class RawMessage(bytes):
    """An answer's bytes, with the one protobuf method Serve's replica calls on gRPC answers."""

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's naming
        """The answer's bytes, as protobuf's method of that name gives a message's.

        Returns:
            The bytes themselves.
        """
        return bytes(self)


def add_PolicyServicer_to_server(servicer: Any, server: Any) -> None:  # noqa: N802 - gRPC's naming
    """Register the Policy service's methods on a server (called by Serve's gRPC proxy).

    Args:
        servicer: what answers `Act` (Serve's replica handle).
        server: the gRPC server.
    """
    handler = grpc.unary_unary_rpc_method_handler(servicer.Act)  # no (de)serializers: raw bytes
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GRPC_SERVICE,
                                                                          {"Act": handler}),))
