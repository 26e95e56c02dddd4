"""The HTTP contract of a served policy (`huggy serve`), version 1, with no server in it: paths,
headers, limits, the API key, and which policy answers a request. The server (`deploy.serving`)
and the client (`huggy_agent_client.remote.RemoteAgent`) both follow it.

    POST /v1/act              actions; the policy: the `serve_multiplexed_model_id` header's,
                              else the split's (by the body's "session"), else the default
    POST /v1/models/{id}/act  the same, answered by policy `id`
    GET  /v1/models           the served policies, the default and the split
    GET  /v1/healthz          liveness (open without the API key)
    GET  /v1/info             the default policy's description, batching, counters
    GET  /v1/openapi.json     the OpenAPI 3.1 document of this server
    PUT  /v1/policies         change the served policies, the default and the split (needs the
                              API key; applied by `huggy serve`'s own process; not in the
                              OpenAPI document, which describes what clients call)

Errors are `{"error": "<kind>", "message": "<what was expected and what came>"}`; 503 with
`Retry-After` while no replica can answer. gRPC carries the act route as `GRPC_ACT_METHOD`, its
errors as `GRPC_STATUS_FOR_HTTP` says. A/B splits: `Split.assign(session)` is the same pure rule
on every machine (BLAKE2b of the session key).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

API_PREFIX = "/v1"
ACT_PATH = f"{API_PREFIX}/act"
HEALTH_PATH = f"{API_PREFIX}/healthz"
INFO_PATH = f"{API_PREFIX}/info"
OPENAPI_PATH = f"{API_PREFIX}/openapi.json"
MODELS_PATH = f"{API_PREFIX}/models"
MODEL_ACT_ROUTE = f"{MODELS_PATH}/{{policy}}/act"
"""`POST /v1/models/<policy id>/act`: the id may hold '/' and '@' (`run@step`, `run/Huggy.onnx`)."""
POLICIES_PATH = f"{API_PREFIX}/policies"
"""`PUT /v1/policies`: a live change of the served policies (`deploy.serving.changes`)."""
ROUTES: dict[str, str] = {ACT_PATH: "POST", MODELS_PATH: "GET", MODEL_ACT_ROUTE: "POST",
                          HEALTH_PATH: "GET", INFO_PATH: "GET", OPENAPI_PATH: "GET",
                          POLICIES_PATH: "PUT"}
"""Each route and its one method."""
OPEN_PATHS = frozenset({HEALTH_PATH})
"""Routes answered without the API key."""

POLICY_ID_HEADER = "serve_multiplexed_model_id"
"""The request header that names the policy to answer (Ray Serve's multiplexed model id)."""
API_KEY_ENV = "HUGGY_API_KEY"
"""Where servers and clients read the API key when no key file is given."""
SEED_LIMIT = 2**64
"""Seeds and row offsets are integers in [0, SEED_LIMIT)."""
SESSION_KEY_LIMIT = 256
"""Longest accepted `"session"` key, in characters."""
RETRY_AFTER_S = 1
"""The `Retry-After` of a 503: seconds until a retry may find the server answering."""
ECHO_CHARS = 64
"""The most characters of what a client sent that a server's error message quotes."""

GRPC_SERVICE = "huggy.v1.Policy"
GRPC_ACT_METHOD = f"/{GRPC_SERVICE}/Act"
"""The one gRPC method (`huggy serve --grpc-port`): unary, the request and the answer the same
JSON documents as `POST /v1/act`, as raw bytes (no .proto)."""
GRPC_POLICY_METADATA = "multiplexed_model_id"
"""The gRPC metadata that names the policy to answer (Ray Serve's multiplexed model id)."""
GRPC_STATUS_FOR_HTTP = {400: 3, 401: 16, 404: 5, 413: 8, 422: 3, 500: 13, 503: 14}
"""The gRPC status code that ends a call the HTTP API would answer with each status
(grpc/doc/statuscodes.md): INVALID_ARGUMENT, UNAUTHENTICATED, NOT_FOUND, RESOURCE_EXHAUSTED,
INTERNAL, UNAVAILABLE; the details are the API's JSON error."""

_HASH_PERSON = b"huggy-split"


def model_act_path(policy_id: str) -> str:
    """The act path of one served policy.

    Args:
        policy_id: the policy's id.

    Returns:
        `/v1/models/{policy_id}/act`, the id quoted for a URL ('@' and '/' kept).
    """
    return f"{MODELS_PATH}/{quote(policy_id, safe='@/')}/act"


def load_api_key(path: str | os.PathLike[str] | None = None) -> str | None:
    """The API key a server or client uses.

    Args:
        path: a file whose first line is the key; None reads `$HUGGY_API_KEY`.

    Returns:
        The key; None when `path` is None and `$HUGGY_API_KEY` is unset or empty.

    Raises:
        ValueError: the file cannot be read or holds no key (an empty key would let anyone in),
            naming the file and what is wrong.
    """
    if path is None:
        return os.environ.get(API_KEY_ENV) or None
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ValueError(f"API key file {os.fspath(path)!r} cannot be read: {reason}; expected "
                         "a readable text file with the key on its first line") from None
    lines = text.strip().splitlines()
    key = lines[0].strip() if lines else ""
    if not key:
        raise ValueError(f"API key file {os.fspath(path)!r} is empty; expected the key on its "
                         "first line")
    return key


def check_session_key(session: Any) -> str | None:
    """A request's `"session"` value, validated.

    Args:
        session: the value read from the request's JSON body.

    Returns:
        `session`: None, or a string of 1 to `SESSION_KEY_LIMIT` characters.

    Raises:
        ValueError: anything else, or a string with a lone UTF-16 surrogate (which JSON's escapes
            can write: it has no UTF-8 form to hash), naming what came.
    """
    if session is None:
        return None
    if not isinstance(session, str) or not 1 <= len(session) <= SESSION_KEY_LIMIT:
        shown = (f"a string of {len(session)} characters" if isinstance(session, str)
                 else json_kind(session))
        raise ValueError(f"'session' must be a string of 1 to {SESSION_KEY_LIMIT} characters "
                         f"(the key that keeps a user on one policy of the split), received "
                         f"{shown}")
    try:
        session.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"'session' must be a string of Unicode characters, received a lone "
                         f"UTF-16 surrogate {session[error.start]!r} at character "
                         f"{error.start}") from None
    return session


def json_kind(value: Any) -> str:
    """What a value read from JSON is, in JSON's words, for error messages.

    Args:
        value: a value decoded from JSON.

    Returns:
        "null", "a boolean", "an integer", "a number", "a string", "an array", "an object", or
            "a <type name>" for anything else.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = {int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def shown(sent: str | bytes, limit: int = ECHO_CHARS) -> str:
    """What a client sent, as an error message may quote it: escaped and short.

    Args:
        sent: text or bytes that came from a client (a path, a field name, an id).
        limit: the most characters (or bytes) quoted.

    Returns:
        Python's `repr` of the first `limit` characters, followed by how many more there were
            ("'/x/yyyy...' and 4,032 more") when `sent` is longer.
    """
    if len(sent) <= limit:
        return repr(sent)
    return f"{sent[:limit]!r}... and {len(sent) - limit:,} more"


def unknown_policy_message(policy_id: str, known: Iterable[str]) -> str:
    """What a request for a policy that is not served is told.

    Args:
        policy_id: the id asked for (quoted short and escaped, by `shown`).
        known: the served ids.

    Returns:
        The message, naming the id and the known ones.
    """
    return f"no policy {shown(policy_id)} is served here; known policies: {', '.join(known)}"


def session_point(key: str) -> float:
    """Where a session key falls in [0, 1), the same on every machine, process and Python version.

    Args:
        key: the session key.

    Returns:
        The first 8 bytes of the key's BLAKE2b hash (of its UTF-8), as a fraction of 2**64.
    """
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=_HASH_PERSON).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True)
class Split:
    """Traffic split over policies: `ids` with relative `weights` (any positive total).

    Raises:
        ValueError: no ids, not one weight per id, an id given twice, a weight that is not a finite
            number >= 0, or weights that are all zero.
    """

    ids: tuple[str, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("a split needs at least one policy")
        if len(self.ids) != len(self.weights):
            raise ValueError(f"a split needs one weight per policy, received {len(self.ids)} "
                             f"ids and {len(self.weights)} weights")
        repeated = sorted({i for i in self.ids if self.ids.count(i) > 1})
        if repeated:
            raise ValueError(f"each policy may appear once in a split, received {repeated} "
                             "more than once")
        for policy_id, weight in zip(self.ids, self.weights, strict=True):
            if isinstance(weight, bool) or not isinstance(weight, int | float) \
                    or not math.isfinite(weight) or weight < 0:
                raise ValueError(f"split weight of {policy_id!r} must be a finite number >= 0, "
                                 f"received {weight!r}")
        if not sum(self.weights) > 0:
            raise ValueError(f"split weights must not all be zero, received {self.as_dict()}")

    @classmethod
    def parse(cls, text: str, known: Sequence[str] | None = None) -> Split:
        """A split from its command-line form.

        Args:
            text: `ID=WEIGHT,ID=WEIGHT,...` (such as `a@100=0.9,b@200=0.1`; an id may itself hold '=':
                the last one separates the weight).
            known: the served ids that every id must be one of; None accepts any.

        Returns:
            The split.

        Raises:
            ValueError: `text` is not of that form, a weight is not a finite number >= 0, an id
                repeats, the weights are all zero, or an id is not known; naming what was expected and
                what came.
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"--split expects ID=WEIGHT,ID=WEIGHT,..., received {text!r}")
        ids, weights = [], []
        for part in text.split(","):
            policy_id, equals, weight_text = part.strip().rpartition("=")
            if not equals or not policy_id:
                raise ValueError(f"--split expects ID=WEIGHT,ID=WEIGHT,..., received {part!r} "
                                 f"in {text!r}")
            try:
                weight = float(weight_text)
            except ValueError:
                raise ValueError(f"--split: the weight of {policy_id!r} must be a number, "
                                 f"received {weight_text!r}") from None
            ids.append(policy_id)
            weights.append(weight)
        return cls.from_weights(cls(tuple(ids), tuple(weights)), known)

    @classmethod
    def from_weights(cls, weights: Mapping[str, float] | Split,
                     known: Sequence[str] | None = None) -> Split:
        """A split from `{id: weight}` (a server config's form).

        Args:
            weights: `{id: weight}`, or a split to check.
            known: the served ids that every id must be one of; None accepts any.

        Returns:
            The split.

        Raises:
            ValueError: the weights do not make a split (see `Split`), or an id is not known (listing
                the known ids).
        """
        split = weights if isinstance(weights, Split) else cls(tuple(weights),
                                                              tuple(weights.values()))
        if known is not None:
            unknown = [policy_id for policy_id in split.ids if policy_id not in known]
            if unknown:
                raise ValueError(f"split names policies that are not served: {unknown}; known "
                                 f"policies: {', '.join(known)}")
        return split

    def as_dict(self) -> dict[str, float]:
        """The split as given.

        Returns:
            `{id: weight}`.
        """
        return dict(zip(self.ids, self.weights, strict=True))

    def shares(self) -> dict[str, float]:
        """Each policy's share of the traffic.

        Returns:
            `{id: weight / total}`.
        """
        total = sum(self.weights)
        return {policy_id: weight / total
                for policy_id, weight in zip(self.ids, self.weights, strict=True)}

    def pick(self, point: float) -> str:
        """The policy whose share of [0, 1) holds a point.

        Args:
            point: a number in [0, 1); the shares lie in the order of `ids`.

        Returns:
            Its id; never a policy of weight 0.
        """
        total, running, bounds = sum(self.weights), 0.0, []
        for weight in self.weights:
            running += weight
            bounds.append(running / total)
        index = min(bisect.bisect_right(bounds, point), len(self.ids) - 1)
        while self.weights[index] == 0:  # a zero-weight policy owns no point
            index -= 1
        return self.ids[index]

    def assign(self, session: str | None, rng: random.Random | None = None) -> str:
        """The policy for a request.

        Args:
            session: the request's session key: the policy is picked at `session_point(session)`, the
                same every time; None picks at random by weight.
            rng: the generator for a request without a session; None: the `random` module's.

        Returns:
            The policy's id.
        """
        point = session_point(session) if session is not None else (rng or random).random()
        return self.pick(point)
