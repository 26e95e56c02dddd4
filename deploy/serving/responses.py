"""What the policy server answers: the JSON error format (`ApiError`, answered by
`error_response`) and the body of an act route (`act_response`), from `compute_action`'s or a
batch's arrays (`answer_arrays`).

Float32 values are written in their shortest form that reads back to the same float32, so a
client gets exactly the served values.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

from huggy_agent import Actions, HuggyAgent
from huggy_agent_client.http_api import RETRY_AFTER_S

INTERNAL_ERROR_CHARS = 200
"""The most characters of an exception's text in a 500's message."""


class ApiError(Exception):
    """A request the API refuses.

    Args:
        status: the HTTP status.
        kind: a short kind, the JSON error's "error".
        message: what was expected and what came, for the caller.
        headers: headers of the answer (`Retry-After`, `Allow`, ...).
    """

    def __init__(self, status: int, kind: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}

    def body(self) -> bytes:
        """The JSON error document sent back.

        Returns:
            `{"error": kind, "message": message}` as bytes.
        """
        return json.dumps({"error": self.kind, "message": self.message}).encode()


def error_response(error: ApiError) -> Response:
    """The HTTP answer for a refusal.

    Args:
        error: the refusal.

    Returns:
        Its status and headers, its JSON error document.
    """
    return Response(error.body(), status_code=error.status, media_type="application/json",
                    headers=error.headers)


def unavailable(message: str) -> ApiError:
    """The refusal of a server that cannot answer for now (starting, or stopping).

    Args:
        message: why.

    Returns:
        503 with `Retry-After`.
    """
    return ApiError(503, "unavailable", message, {"Retry-After": str(RETRY_AFTER_S)})


def internal_error(error: Exception) -> ApiError:
    """The refusal for a request whose answer failed: a bug of the server's (the replica serves on).
    The message names the error by its `repr` (which escapes what it quotes), cut short: an
    exception's text may quote what a client sent.

    Args:
        error: what failed.

    Returns:
        500.
    """
    described = repr(error)
    if len(described) > INTERNAL_ERROR_CHARS:
        described = (f"{described[:INTERNAL_ERROR_CHARS]}... and "
                     f"{len(described) - INTERNAL_ERROR_CHARS:,} more")
    return ApiError(500, "internal_error", f"the server failed to answer: {described}")


def answer_arrays(agent: HuggyAgent, actions: Any, memory: np.ndarray | None = None
                  ) -> dict[str, np.ndarray]:
    """What an act route answers, by name.

    Args:
        agent: the policy.
        actions: `compute_action`'s result (with the memory in it, for a recurrent policy) or
            `actions_from`'s.
        memory: the next memory, when `actions` is `actions_from`'s.

    Returns:
        `continuous`, `discrete` and `memory` as the policy has them.
    """
    if agent.spec.memory_size and memory is None:
        actions, memory = actions
    if isinstance(actions, Actions):
        arrays = {"continuous": actions.continuous, "discrete": actions.discrete}
    else:
        arrays = {"discrete" if agent.spec.discrete_branches else "continuous": actions}
    if memory is not None:
        arrays["memory"] = memory
    return arrays


def act_response(result: dict[str, np.ndarray], single: bool, fingerprint: str,
                 policy: str | None = None) -> bytes:
    """The body answering an act route.

    Args:
        result: (rows, ...) arrays by name (`continuous`, `discrete`, `memory`).
        single: the request was one row: each array is sent without its row dimension.
        fingerprint: the weights fingerprint, sent as `model`.
        policy: the id of the policy that answered, sent as `policy` when given.

    Returns:
        The JSON body; a continuous-only policy's actions are sent once more as `actions`.
    """
    document: dict[str, Any] = {name: np.ascontiguousarray(array[0] if single else array)
                                for name, array in result.items()}
    if set(result) <= {"continuous", "memory"} and "continuous" in result:
        document["actions"] = document["continuous"]
    document["model"] = fingerprint
    if policy is not None:
        document["policy"] = policy
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
