"""The gRPC ingress: one unary method, `/huggy.v1.Policy/Act`, carrying the same JSON documents as
`POST /v1/act` (no .proto to compile: request and answer are raw bytes). Two servers carry it:

- the replicas' own (`start_replica_server`, the default of `huggy serve --grpc-port`): each
  replica runs a gRPC server on its event loop, next to its HTTP server, all of a node's
  replicas on one port (SO_REUSEPORT: the kernel spreads the connections over them). It reads
  HTTP/2 as the bytes arrive (`deploy.serving.grpc_server`), so the calls that reach a replica
  together meet in its batch queue as HTTP requests do; a call that finds the replica otherwise
  idle runs alone at once. It reaches the replicas of the node it runs on.
- Serve's gRPC ingress (`GRPC_SERVICER_FUNCTION`, `huggy serve --grpc-ingress serve`): Serve's
  proxy or HAProxy on the head node routes to every replica of the cluster, by the
  `application` metadata.

    channel = grpc.insecure_channel("127.0.0.1:9000")
    act = channel.unary_unary(ACT_METHOD)            # bytes in, bytes out
    answer = act(b'{"obs": [...]}')                  # Serve's: metadata=(("application", "huggy"),)

With an API key, send it as metadata: `("authorization", "Bearer <key>")`; without it (or with
a wrong one) the call ends with UNAUTHENTICATED. Refused requests end with INVALID_ARGUMENT (400,
422), NOT_FOUND (a `multiplexed_model_id` metadata naming no served policy) or RESOURCE_EXHAUSTED
(413) and the API's message as the status details.
"""

from __future__ import annotations

from typing import Any

import grpc

from deploy.serving.grpc_server import Handler, UnaryServer

SERVICE = "huggy.v1.Policy"
ACT_METHOD = f"/{SERVICE}/Act"
GRPC_SERVICER_FUNCTION = "deploy.serving.grpc_ingress:add_PolicyServicer_to_server"
MAX_MESSAGE_BYTES = 64 << 20
"""The largest message the replicas' own server takes in or sends; a request over the served
`max_body_bytes` (at most this) gets RESOURCE_EXHAUSTED with the API's message."""
STATUS_FOR_HTTP = {401: grpc.StatusCode.UNAUTHENTICATED, 404: grpc.StatusCode.NOT_FOUND,
                   413: grpc.StatusCode.RESOURCE_EXHAUSTED}


class RawMessage(bytes):
    """An answer's bytes, with the one protobuf method Serve's replica calls on gRPC answers."""

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's naming
        return bytes(self)


def add_PolicyServicer_to_server(servicer: Any, server: Any) -> None:  # noqa: N802 - gRPC's naming
    """Register the Policy service's methods on `server` (called by Serve's gRPC proxy)."""
    handler = grpc.unary_unary_rpc_method_handler(servicer.Act)  # no (de)serializers: raw bytes
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE,
                                                                          {"Act": handler}),))


def grpc_status(http_status: int) -> grpc.StatusCode:
    """The gRPC status code of a refused request with HTTP status `http_status`."""
    return STATUS_FOR_HTTP.get(http_status, grpc.StatusCode.INVALID_ARGUMENT)


async def start_replica_server(act: Handler, host: str, port: int) -> UnaryServer:
    """Start the replica's own gRPC server (`deploy.serving.grpc_server`) on the running event
    loop, serving `act` as `ACT_METHOD` on `host:port`, that port shared with the other
    processes of this user that bind it the same way (SO_REUSEPORT). Raises RuntimeError if
    the port cannot be bound."""
    server = UnaryServer({ACT_METHOD: act}, MAX_MESSAGE_BYTES)
    try:
        await server.start(host, port, reuse_port=True)
    except OSError as error:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise RuntimeError(f"the gRPC server cannot listen on {address}: {error}") from None
    return server
