"""GrpcRemoteAgent: a `RemoteAgent` whose actions come over gRPC (`huggy serve --grpc-port`).

    agent = GrpcRemoteAgent("http://127.0.0.1:8000", "127.0.0.1:9000")
    actions = agent.compute_action(obs, deterministic=True)   # same contract as HuggyAgent

The act calls go to `GRPC_ACT_METHOD` at the gRPC address, with the same JSON bodies as HTTP;
the policy's spec, the served policies and health come from the HTTP address, as for
`RemoteAgent`. Needs grpcio (`huggy-agent-client[grpc]`).
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from huggy_agent_client.http_api import (
    GRPC_ACT_METHOD,
    GRPC_POLICY_METADATA,
    GRPC_STATUS_FOR_HTTP,
    RETRY_AFTER_S,
)
from huggy_agent_client.remote import RemoteAgent, RemoteRequestError, RemoteServerError, read_json

MAX_ANSWER_BYTES = 64 << 20
"""The largest answer this client takes (gRPC's default is 4 MiB, less than the answer to a
large batch)."""
HTTP_FOR_GRPC_STATUS = {code: status for status, code in GRPC_STATUS_FOR_HTTP.items()
                        if status not in (422, 500, 503)}
"""The HTTP status a refused call's `RemoteRequestError` carries, by gRPC status code:
INVALID_ARGUMENT 400 (HTTP's 400 and 422), UNAUTHENTICATED 401, NOT_FOUND 404,
RESOURCE_EXHAUSTED 413."""
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
"""Codes tried again: the server cannot be reached or answer for now, or the call timed out."""


class GrpcRemoteAgent(RemoteAgent):
    """A served policy with the `compute_action` of `HuggyAgent`, its actions over gRPC.

    Args:
        url: the server's HTTP base URL, e.g. `http://127.0.0.1:8000` (the spec, the policies).
        grpc_target: the server's gRPC address, `host:port` (`huggy serve --grpc-port`).
        credentials: TLS credentials for the channel (`grpc.ssl_channel_credentials()`); None:
            a plaintext channel, as `huggy serve` listens.
        **options: `RemoteAgent`'s (`timeout`, `retries`, `backoff`, `api_key`, `policy`,
            `session`), with the same meaning over gRPC: the key as `authorization` metadata,
            the policy as `multiplexed_model_id` metadata.

    Raises:
        ValueError: `retries` is negative or `timeout` is not positive.
        RemoteServerError: the server's HTTP address cannot be reached.
        RemoteRequestError: the server requires a key this client does not have (401), or does not
            serve `policy` (404, listing the served ids).
    """

    def __init__(self, url: str, grpc_target: str,
                 credentials: grpc.ChannelCredentials | None = None, **options: Any) -> None:
        super().__init__(url, **options)
        self.grpc_target = grpc_target
        settings = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
        self._channel = (grpc.insecure_channel(grpc_target, options=settings)
                         if credentials is None
                         else grpc.secure_channel(grpc_target, credentials, options=settings))
        self._call = self._channel.unary_unary(GRPC_ACT_METHOD)
        metadata = [(name.lower(), value) for name, value in self._session.headers.items()
                    if name.lower() == "authorization"]
        if options.get("policy") is not None:
            metadata.append((GRPC_POLICY_METADATA, self.policy_id))
        self._metadata = tuple(metadata)

    def close(self) -> None:
        """Close the gRPC channel and the HTTP connections."""
        self._channel.close()
        super().close()

    def _act(self, body: bytes) -> dict[str, Any]:
        failure: grpc.RpcError | None = None
        wait = self.backoff
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(wait)
                wait *= 2
            try:
                answer = self._call(body, metadata=self._metadata, timeout=self.timeout)
            except grpc.RpcError as error:
                failure = error
                if error.code() not in RETRIED:
                    raise _refusal(self.grpc_target, error) from error
                if _api_error(error) is not None:  # the server itself: not answering for now
                    wait = max(wait, RETRY_AFTER_S)
                continue
            return dict(read_json(answer))
        raise RemoteServerError(
            f"{GRPC_ACT_METHOD} at {self.grpc_target} failed after {self.retries + 1} "
            f"attempt(s): {failure.code().name if failure else ''} "
            f"{failure.details() if failure else ''}") from failure


def _api_error(error: grpc.RpcError) -> tuple[str, str] | None:
    """(kind, message) of the API's JSON error in a call's details; None for other details."""
    try:
        document = read_json(error.details() or "")
    except ValueError:
        return None
    if isinstance(document, dict) and "message" in document:
        return str(document.get("error", "error")), str(document["message"])
    return None


def _refusal(target: str, error: grpc.RpcError) -> Exception:
    """The exception for a call that ended with a code that is not tried again."""
    kind, message = _api_error(error) or ("error", str(error.details()))
    status = HTTP_FOR_GRPC_STATUS.get(error.code().value[0])
    if status is not None:
        return RemoteRequestError(status, kind, message)
    return RemoteServerError(f"{GRPC_ACT_METHOD} at {target} ended with "
                             f"{error.code().name} {kind}: {message}")
