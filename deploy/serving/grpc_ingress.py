"""The gRPC ingress: one unary method, `/huggy.v1.Policy/Act`, carrying the same JSON documents as
`POST /v1/act` (no .proto to compile: request and answer are raw bytes).

    serve.start(grpc_options={"port": 9000,
                              "grpc_servicer_functions": [GRPC_SERVICER_FUNCTION]})
    channel = grpc.insecure_channel("127.0.0.1:9000")
    act = channel.unary_unary(ACT_METHOD)            # bytes in, bytes out
    answer = act(b'{"obs": [...]}', metadata=(("application", "huggy"),))

With an API key, send it as metadata: `("authorization", "Bearer <key>")`; without it (or with
a wrong one) the call ends with UNAUTHENTICATED. Refused requests end with INVALID_ARGUMENT (400,
422), NOT_FOUND (a `multiplexed_model_id` metadata naming no served policy) or RESOURCE_EXHAUSTED
(413) and the API's message as the status details.
"""

from __future__ import annotations

from typing import Any

import grpc

SERVICE = "huggy.v1.Policy"
ACT_METHOD = f"/{SERVICE}/Act"
GRPC_SERVICER_FUNCTION = "deploy.serving.grpc_ingress:add_PolicyServicer_to_server"
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
