"""The HTTP API of the served policy, version 1: request parsing, validation, responses, OpenAPI.

No Ray and no web framework here: functions take bytes and return bytes or raise `ApiError`, so
the rules are testable on their own and the replica can run them before a request joins a batch
(a bad request never reaches the batch, so it cannot poison it).

    POST /v1/act      {"obs": row | [rows]            (a single-input policy), or
                       "inputs": {"obs_0": row | [rows], "obs_1": ...}   (any policy),
                       "action_mask": [0/1 or bools] | [[...]]    (discrete actions; 1 = allowed),
                       "memory": [m floats] | [[m floats]]        (recurrent; absent = zeros),
                       "deterministic": true, "seed": int | null, "row_offset": int,
                       "session": "<key>"         (keeps a user on one policy of an A/B split)}
                      -> {"continuous": ..., "discrete": ..., "memory": ...  (as the policy has
                          them, in the rank of the request), "actions": ... (continuous-only
                          policies: the same as "continuous"), "model": "<fingerprint>",
                          "policy": "<id>"}
                      the policy: the `serve_multiplexed_model_id` header's, else the split's,
                      else the default
    POST /v1/models/{id}/act  the same, answered by policy `id` (404 listing the known ids)
    GET  /v1/models   -> the served policies: id, interface, spec, fingerprint, source
    GET  /v1/healthz  -> {"status": "ok", "model": "<fingerprint of the default policy>"}
    GET  /v1/info     -> spec, architecture, parameters, origin, device, precision, batching, counters
    GET  /v1/openapi.json
    errors            -> {"error": "<kind>", "message": "<what was expected and received>"}

With an API key, every route but /v1/healthz requires `Authorization: Bearer <key>` (401
otherwise, with `WWW-Authenticate: Bearer`); the key is compared in constant time and never
appears in an answer or a log.
"""

from __future__ import annotations

import codecs
import hashlib
import hmac
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from deploy.policies import POLICY_ID_HEADER, SESSION_KEY_LIMIT, check_session_key
from huggy_agent.inputs import as_input_batch, as_mask_batch, as_memory_batch
from huggy_agent.spec import ActorSpec

API_PREFIX = "/v1"
ACT_PATH = f"{API_PREFIX}/act"
HEALTH_PATH = f"{API_PREFIX}/healthz"
INFO_PATH = f"{API_PREFIX}/info"
OPENAPI_PATH = f"{API_PREFIX}/openapi.json"
MODELS_PATH = f"{API_PREFIX}/models"
MODEL_ACT_ROUTE = f"{MODELS_PATH}/{{policy}}/act"
"""`POST /v1/models/<policy id>/act`: the id may hold '/' and '@' (`run@step`, `run/Huggy.onnx`)."""
ROUTES: dict[str, str] = {ACT_PATH: "POST", MODELS_PATH: "GET", MODEL_ACT_ROUTE: "POST",
                          HEALTH_PATH: "GET", INFO_PATH: "GET", OPENAPI_PATH: "GET"}

ACT_FIELDS = ("obs", "inputs", "action_mask", "memory", "deterministic", "seed", "row_offset",
              "session")
SEED_LIMIT = 2**64
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
"""The smallest magnitude that rounds to infinity in float32 (halfway past FLOAT32_MAX)."""
API_KEY_ENV = "HUGGY_API_KEY"
OPEN_PATHS = frozenset({HEALTH_PATH})
"""Routes answered without the API key."""


class ApiError(Exception):
    """A request the API refuses: HTTP `status`, a short `kind` and a message for the caller."""

    def __init__(self, status: int, kind: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}

    def body(self) -> bytes:
        """The JSON error document sent back."""
        return json.dumps({"error": self.kind, "message": self.message}).encode()


@dataclass(frozen=True)
class ActRequest:
    """A validated `POST /v1/act`: `inputs` are (rows, *shape) float32 in `obs_i` order,
    `action_mask` (rows, sum of branches) bool or None, `memory` (rows, m) float32 or None (a
    recurrent policy's zeros); `single` if the observations were sent as one row."""

    inputs: list[np.ndarray]
    single: bool
    deterministic: bool
    seed: int | None
    row_offset: int
    action_mask: np.ndarray | None = None
    memory: np.ndarray | None = None
    session: str | None = None
    """The key that keeps a user on one policy of a split (`deploy.policies.Split`)."""

    @property
    def obs(self) -> np.ndarray:
        """The first input (the only one of a single-input policy)."""
        return self.inputs[0]

    @property
    def rows(self) -> int:
        return self.inputs[0].shape[0]


def check_route(path: str, method: str) -> tuple[str, str | None]:
    """The route of `path` (a key of ROUTES) and the policy id it names (None but for
    `/v1/models/{policy}/act`); 404 for an unknown path and 405 (with `Allow`) for a known path
    with the wrong method."""
    route, policy_id = path.rstrip("/") or "/", None
    prefix = f"{MODELS_PATH}/"
    if route.startswith(prefix) and route.endswith("/act") and len(route) > len(prefix) + 4:
        route, policy_id = MODEL_ACT_ROUTE, route[len(prefix):-len("/act")]
    expected = ROUTES.get(route)
    if expected is None:
        raise ApiError(404, "not_found", f"no route {path!r}; routes: "
                       + ", ".join(f"{m} {p}" for p, m in ROUTES.items()))
    if method != expected:
        raise ApiError(405, "method_not_allowed",
                       f"{path} expects {expected}, received {method}", {"Allow": expected})
    return route, policy_id


@dataclass(frozen=True)
class ApiKey:
    """The key a server requires, kept as its SHA-256 digest only (so no copy of the key sits
    in Serve's configuration); `repr` shows nothing of it."""

    digest: bytes = field(repr=False)

    @classmethod
    def of(cls, key: str) -> ApiKey:
        return cls(hashlib.sha256(key.encode()).digest())

    def authorize(self, path: str, authorization: str | None) -> None:
        """Return if `path` is open or `authorization` (the header's value) is
        `Bearer <key>`; raise 401 otherwise. Constant time in the key."""
        if (path.rstrip("/") or "/") in OPEN_PATHS:
            return
        scheme, _, token = (authorization or "").strip().partition(" ")
        if not authorization:
            problem = "no Authorization header"
        elif scheme.lower() != "bearer" or not token.strip():
            problem = f"an Authorization header of scheme {scheme[:20]!r}"
        else:
            given = hashlib.sha256(token.strip().encode()).digest()
            if hmac.compare_digest(given, self.digest):
                return
            problem = "a wrong API key"
        raise ApiError(401, "unauthorized", "this server requires its API key as "
                       f"'Authorization: Bearer <key>', received {problem}",
                       {"WWW-Authenticate": 'Bearer realm="huggy"'})


def load_api_key(path: str | os.PathLike[str] | None = None) -> str | None:
    """The API key: the first line of the file at `path`, else `$HUGGY_API_KEY`, else None.

    Raises ValueError for a file that holds no key (an empty key would let anyone in)."""
    if path is None:
        return os.environ.get(API_KEY_ENV) or None
    lines = Path(path).read_text().strip().splitlines()
    key = lines[0].strip() if lines else ""
    if not key:
        raise ValueError(f"API key file {str(path)!r} is empty; expected the key on its first "
                         "line")
    return key


def parse_act_request(body: bytes, spec: ActorSpec, max_rows: int) -> ActRequest:
    """Parse and validate the body of `POST /v1/act` for a policy of interface `spec`.

    Any body either parses or raises ApiError, never anything else: 400 not UTF-8 JSON (also
    empty, nested too deeply); 413 more than `max_rows` observations; 422 anything else wrong
    (not an object, unknown, repeated or missing field, wrong type, wrong shape, a boolean or
    other non-number in the observations, a value that is not finite in float32, a mask branch
    with no allowed action). Messages name what was expected and what was received.
    """
    return act_from_document(*read_act_document(body), spec, max_rows)


def read_act_document(body: bytes) -> tuple[dict, bool]:
    """The JSON object of an act body and whether it was read exactly (`_exact_json`), before
    any policy's rules: 400 or 422 as `parse_act_request` says. Read first where the policy
    depends on the body (its `"session"`)."""
    try:
        document, exact = orjson.loads(body), False
    except orjson.JSONDecodeError:
        document, exact = _exact_json(body), True
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", "request body must be a JSON object with an "
                       f"'obs' or 'inputs' field, received {_describe(document)}")
    if not exact and _may_hide_values(body, document):
        document, exact = _exact_json(body), True
    return document, exact


def act_from_document(document: dict, exact: bool, spec: ActorSpec, max_rows: int
                      ) -> ActRequest:
    """The request of a `read_act_document` result, validated for a policy of interface `spec`
    (see `parse_act_request`)."""
    unknown = sorted(set(document) - set(ACT_FIELDS))
    if unknown:
        raise ApiError(422, "invalid_request", f"unknown field(s) {unknown}; expected only "
                       f"{list(ACT_FIELDS)}")
    deterministic = document.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise ApiError(422, "invalid_request", "'deterministic' must be true or false, received "
                       f"{_describe(deterministic)}")
    seed = document.get("seed")
    if seed is not None:
        seed = _as_int(seed)
        if seed is None or not 0 <= seed < SEED_LIMIT:
            raise ApiError(422, "invalid_request", "'seed' must be null or an integer in "
                           f"[0, 2**64), received {_describe(document['seed'])}")
    row_offset = _as_int(document.get("row_offset", 0))
    if row_offset is None or not 0 <= row_offset < SEED_LIMIT:
        raise ApiError(422, "invalid_request", "'row_offset' must be an integer in [0, 2**64), "
                       f"received {_describe(document['row_offset'])}")
    try:
        session = check_session_key(document.get("session"))
    except ValueError as error:
        raise ApiError(422, "invalid_request", str(error)) from None
    inputs, single = _parse_inputs(document, spec, max_rows, exact)
    rows = len(inputs[0])
    mask = memory = None
    try:
        if document.get("action_mask") is not None:
            mask = as_mask_batch(_numbers(document["action_mask"], "action_mask", exact,
                                          booleans=True), spec, rows)
        if spec.memory_size:
            memory = as_memory_batch(None if document.get("memory") is None else
                                     _numbers(document["memory"], "memory", exact), spec, rows)
        elif document.get("memory") is not None:
            as_memory_batch(document["memory"], spec, rows)  # raises: no memory here
    except ValueError as error:
        raise ApiError(422, "invalid_value", str(error)) from None
    return ActRequest(inputs, single, deterministic, seed, row_offset, mask, memory, session)


def _parse_inputs(document: dict, spec: ActorSpec, max_rows: int, exact: bool
                  ) -> tuple[list[np.ndarray], bool]:
    """The observation inputs of the request: `obs` (single-input policies) or `inputs`."""
    names = [i.name for i in spec.inputs]
    if ("obs" in document) == ("inputs" in document):
        given = "both" if "obs" in document else "neither"
        single_input = (f"'obs' (its one input, {spec.inputs[0].shape}) or "
                        if len(names) == 1 else "")
        raise ApiError(422, "invalid_request", f"give exactly one of 'obs' and 'inputs', received "
                       f"{given}: expected {single_input}'inputs' {{{', '.join(names)}}}")
    if "obs" in document:
        if len(names) > 1:
            raise ApiError(422, "invalid_request", f"this policy has {len(names)} observation "
                           f"inputs ({spec.describe()}): send 'inputs' {{{', '.join(names)}}} "
                           "instead of 'obs'")
        values = {names[0]: document["obs"]}
    else:
        values = document["inputs"]
        if not isinstance(values, dict) or sorted(values) != sorted(names):
            received = sorted(values) if isinstance(values, dict) else _describe(values)
            raise ApiError(422, "invalid_request", f"'inputs' must be an object with exactly the "
                           f"fields {names}, received {received}")
    parsed = []
    for observation in spec.inputs:
        value = values[observation.name]
        field = "obs" if "obs" in document else f"inputs.{observation.name}"
        if observation.kind == "vector" and len(spec.inputs) == 1:
            parsed.append(_parse_obs(value, observation.shape[0], max_rows, exact, field))
            continue
        array = _numbers(value, field, exact)
        if array.ndim == len(observation.shape) + 1 and len(array) > max_rows:
            raise ApiError(413, "too_many_rows", f"'{field}' has {len(array)} rows, the limit "
                           f"is {max_rows} per request; split it into several requests")
        try:
            parsed.append(as_input_batch(array, observation))
        except ValueError as error:
            kind = "non_finite" if "finite" in str(error) else "invalid_shape"
            raise ApiError(422, kind, f"'{field}': {error}") from None
    batches = [batch for batch, _ in parsed]
    if len({len(b) for b in batches}) != 1 or len({single for _, single in parsed}) != 1:
        raise ApiError(422, "invalid_shape", "every input must have the same number of rows, "
                       f"received {[tuple(b.shape) for b in batches]}")
    return batches, parsed[0][1]


def _numbers(value: Any, field: str, exact: bool, booleans: bool = False) -> np.ndarray:
    """A JSON (nested) list of numbers (or of booleans, where `booleans`) as a numpy array;
    422 naming the first value that is neither, or a ragged nesting."""
    if exact:
        _check_nested(value, field, booleans)
    try:
        with np.errstate(over="ignore"):  # beyond float32's range becomes inf, refused later
            array = np.array(value)
    except (ValueError, TypeError):
        array = None
    if array is None or array.dtype.kind not in ("biuf" if booleans else "iuf") or \
            array.dtype.kind == "b" and not booleans:
        _check_nested(value, field, booleans)  # raises, naming what is wrong
        raise ApiError(422, "invalid_shape", f"'{field}' must be a (nested) list of numbers of "
                       "one shape, received rows of different lengths")
    return array


def _check_nested(value: Any, field: str, booleans: bool, depth: int = 0) -> None:
    """Raise ApiError for the first value of a nested list that is not a number (or a
    boolean, where allowed), or for nesting deeper than any input has."""
    if depth > 5:
        raise ApiError(422, "invalid_shape", f"'{field}' is nested deeper than any observation "
                       "(at most a batch of 3-D rows)")
    if not isinstance(value, list):
        allowed = (int, float, bool) if booleans else (int, float)
        if type(value) not in allowed:
            raise ApiError(422, "invalid_value", f"'{field}' must hold only "
                           f"{'numbers or booleans' if booleans else 'numbers'}; received "
                           f"{_describe(value)}")
        return
    for item in value:
        _check_nested(item, field, booleans, depth + 1)


def _may_hide_values(body: bytes, document: dict) -> bool:
    """Whether orjson's `document` may hide what the API refuses: a repeated key (orjson keeps
    the last) or a true/false inside 'obs' (numpy would read it as 1/0).

    A cheap check of the bytes, for every request: in JSON without backslash escapes every '"'
    delimits a string, and outside strings the letters 'u' and 'a' occur only in the literals
    true, false and null, once each. So when the body holds no more quotes and u/a letters than
    the top level of `document` accounts for, no key repeats and no string or literal sits below
    the top level. Otherwise the body is read again by `_exact_json`, and 'obs' is checked value
    by value.
    """
    if b"\\" in body:
        return True
    strings = [*document, *(value for value in document.values() if isinstance(value, str))]
    literals = sum(value is None or isinstance(value, bool) for value in document.values())
    letters = literals + sum(text.count("u") + text.count("a") for text in strings)
    data = np.frombuffer(body, np.uint8)
    return (int(np.count_nonzero(data == ord('"'))) != 2 * len(strings)
            or int(np.count_nonzero(data == ord("u")) + np.count_nonzero(data == ord("a")))
            != letters)


def _exact_json(body: bytes) -> Any:
    """The standard library's reading of a body orjson refused or that may hide values.

    It accepts NaN and Infinity (which then fail as non-finite values, 422), refuses repeated
    keys (422), reads integers outside [-2**63, 2**64) as floats as orjson does, and words its
    errors well (400). Only UTF-8 is accepted (RFC 8259), not the UTF-16 or UTF-32 that
    `json.loads` would detect in bytes.
    """
    expected = "expected a JSON object such as {\"obs\": [numbers]}"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        if body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            received = "UTF-16 or UTF-32 (the body starts with a byte-order mark)"
        else:
            received = f"byte 0x{body[error.start]:02x} at position {error.start}, not UTF-8"
        raise ApiError(400, "malformed_json", f"request body must be JSON in UTF-8, {expected}; "
                       f"received {received}") from None
    if not text.strip():
        received = f"only whitespace ({len(body)} bytes)" if body else "nothing"
        raise ApiError(400, "malformed_json", f"request body is empty, {expected}; received "
                       f"{received}")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_json_int)
    except json.JSONDecodeError as error:
        raise ApiError(400, "malformed_json", f"request body is not valid JSON, {expected}; "
                       f"received {error}") from None
    except RecursionError:
        raise ApiError(400, "malformed_json", "request body is nested too deeply to read, "
                       f"{expected} (3 levels); received arrays or objects nested deeper than "
                       "the parser's limit of about 1,000 levels") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) < len(pairs):
        keys = [key for key, _ in pairs]
        repeated = next(key for key in keys if keys.count(key) > 1)
        raise ApiError(422, "invalid_request", "each field may appear once in an object, "
                       f"received {repeated!r} {keys.count(repeated)} times")
    return document


def _json_int(text: str) -> int | float:
    if len(text) <= 20:  # 2**64 has 20 digits
        value = int(text)
        if -2**63 <= value < 2**64:
            return value
    return float(text)  # inf beyond float64's range: never int() of thousands of digits


def _as_int(value: Any) -> int | None:
    """`value` as an integer if JSON Schema counts it as one (an integer, or a number with no
    fraction such as 7.0), else None."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_obs(obs: Any, obs_size: int, max_rows: int, exact: bool, field: str = "obs"
               ) -> tuple[np.ndarray, bool]:
    """`obs` as a (rows, obs_size) float32 array, and whether it was sent as one row (the fast
    path of a single vector input; `field` names it in messages).

    `exact`: `obs` may hold booleans (see `_may_hide_values`), so its values are checked one by
    one; otherwise numpy reads it at once and is asked why only if that fails.
    """
    expected = f"expected [{obs_size} numbers] or [[{obs_size} numbers], ...]"
    if not isinstance(obs, list) or not obs:
        raise ApiError(422, "invalid_shape", f"'{field}' {expected}, received {_describe(obs)}")
    single = not isinstance(obs[0], list)
    if not single and len(obs) > max_rows:
        raise ApiError(413, "too_many_rows", f"'{field}' has {len(obs)} rows, the limit is "
                       f"{max_rows} per request; split it into several requests")
    if exact:
        _check_values(obs, single, obs_size, expected, field)
    try:
        with np.errstate(over="ignore"):  # beyond float32's range becomes inf, refused below
            array = np.array(obs, dtype=np.float32)
    except (ValueError, TypeError):  # ragged, nested too deeply, or not numbers
        array = None
    if array is None or array.shape != ((obs_size,) if single else (len(obs), obs_size)):
        _check_values(obs, single, obs_size, expected, field)  # raises, naming what is wrong
    array = array.reshape(-1, obs_size)
    finite = np.isfinite(array)
    if not finite.all():
        row, col = (int(i) for i in np.argwhere(~finite)[0])
        raise ApiError(422, "non_finite", f"'{field}' must hold finite float32 values (magnitude "
                       f"at most {FLOAT32_MAX:.8g}), received "
                       f"{_describe((obs if single else obs[row])[col])} at row {row}, column {col}")
    return array, single


def _check_values(obs: list, single: bool, obs_size: int, expected: str,
                  field: str = "obs") -> None:
    """Raise ApiError for the first value or row of `obs` that is not a number or a row of
    `obs_size` numbers; return if there is none."""
    for row_index, row in enumerate([obs] if single else obs):
        if not isinstance(row, list):
            raise ApiError(422, "invalid_shape", f"'{field}' {expected}, received "
                           f"{_describe(row)} as row {row_index}")
        for col, value in enumerate(row):
            if type(value) not in (int, float):  # bool is a subclass of int
                kind = "invalid_shape" if isinstance(value, list) else "invalid_value"
                raise ApiError(422, kind, f"'{field}' must hold only numbers, {expected}; "
                               f"received {_describe(value)} at row {row_index}, column {col}")
        if len(row) != obs_size:
            where = "" if single else f" as row {row_index}"
            raise ApiError(422, "invalid_shape", f"'{field}' {expected}, received a list of "
                           f"{len(row)} numbers{where}")


def _describe(value: Any) -> str:
    """`value`, as read from JSON, in JSON's words and short enough for a message."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}Infinity or a number beyond float64's range"
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return "an empty list" if not value else f"a list of {len(value)}"
    return f"an object with {len(value)} field(s)"  # the only other type JSON gives


def act_response(result: dict[str, np.ndarray], single: bool, fingerprint: str,
                 policy: str | None = None) -> bytes:
    """The body answering `/v1/act`, from (rows, ...) arrays by name (`continuous`, `discrete`,
    `memory`): each in the rank the request was sent in, and a continuous-only policy's actions
    once more as `actions`; `model` is the weights `fingerprint` and `policy` the id of the
    policy that answered. Float32 values are written in their shortest form that reads back
    to the same float32, so a client gets exactly the served values."""
    document: dict[str, Any] = {name: np.ascontiguousarray(array[0] if single else array)
                                for name, array in result.items()}
    if set(result) <= {"continuous", "memory"} and "continuous" in result:
        document["actions"] = document["continuous"]
    document["model"] = fingerprint
    if policy is not None:
        document["policy"] = policy
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def _array_schema(shape: tuple[int, ...], items: dict) -> dict:
    """JSON schema of one row of `shape` (nested arrays)."""
    schema = items
    for size in reversed(shape):
        schema = {"type": "array", "items": schema, "minItems": size, "maxItems": size}
    return schema


def _rows(row: dict, low: int, high: int) -> dict:
    """JSON schema of a batch of `low` to `high` rows."""
    return {"type": "array", "items": row, "minItems": low, "maxItems": high}


def _mask_row(spec: ActorSpec) -> dict:
    """One action-mask row: 0/1 or booleans, and in every branch at least one allowed action."""
    allowed = {"enum": [1, True]}
    branches, start = [], 0
    for width in spec.discrete_branches:
        branches.append({"anyOf": [{"prefixItems": [{}] * column + [allowed]}
                                   for column in range(start, start + width)]})
        start += width
    return {**_array_schema((spec.mask_size,), {"enum": [0, 1, False, True]}),
            "allOf": branches,
            "description": "1/true = allowed, one column per action of branches "
                           f"{list(spec.discrete_branches)}, at least one allowed per branch"}


def _request_schemas(spec: ActorSpec, max_rows: int, suffix: str = "") -> dict[str, dict]:
    """The request's schemas: `ActRequest` and the row and option schemas it refers to; the
    names of those that depend on the interface end with `suffix` (one per interface where
    policies of several are served).

    Every field that carries rows (each input, `action_mask`, `memory`) must have the same rows
    as the others, the inputs also the same form (one row, or a list of rows); a mask or memory
    of one row applies to every row. JSON Schema cannot compare lengths, so where a policy has
    more than one such field the request is described once per row count.
    """
    ref = "#/components/schemas/"
    float32 = {"type": "number", "exclusiveMinimum": -FLOAT32_OVERFLOW,
               "exclusiveMaximum": FLOAT32_OVERFLOW,
               "description": "finite in float32 (rounded to the nearest float32)"}
    schemas: dict[str, dict] = {
        "Deterministic": {"type": "boolean", "default": True},
        "Seed": {"type": ["integer", "null"], "minimum": 0, "maximum": SEED_LIMIT - 1,
                 "description": "drives the noise of this request's rows only"},
        "RowOffset": {"type": "integer", "minimum": 0, "maximum": SEED_LIMIT - 1, "default": 0,
                      "description": "row i gets the noise of row row_offset + i"},
        "Session": {"type": ["string", "null"], "minLength": 1,
                    "maxLength": SESSION_KEY_LIMIT,
                    "description": "keeps a user on one policy of an A/B split of /v1/act: "
                                   "the same key, the same policy"},
    }
    rows_fields: dict[str, dict] = {}  # per input: the row schema
    for observation in spec.inputs:
        schemas[f"Row_{observation.name}{suffix}"] = _array_schema(observation.shape, float32)
        rows_fields[observation.name] = {"$ref": f"{ref}Row_{observation.name}{suffix}"}
    options: dict[str, dict] = {"deterministic": {"$ref": f"{ref}Deterministic"},
                                "seed": {"$ref": f"{ref}Seed"},
                                "row_offset": {"$ref": f"{ref}RowOffset"},
                                "session": {"$ref": f"{ref}Session"}}
    extras: dict[str, tuple[dict, str]] = {}  # action_mask / memory: row schema, description
    if spec.discrete_branches:
        schemas[f"Row_action_mask{suffix}"] = _mask_row(spec)
        extras["action_mask"] = ({"$ref": f"{ref}Row_action_mask{suffix}"},
                                 "one row for every observation row, or a list of rows")
    else:
        options["action_mask"] = {"type": "null", "description": "no discrete actions"}
    if spec.memory_size:
        schemas[f"Row_memory{suffix}"] = _array_schema((spec.memory_size,), float32)
        extras["memory"] = ({"$ref": f"{ref}Row_memory{suffix}"}, "absent or null: zeros (an "
                            "episode's start); one row for every observation row, or a list")
    else:
        options["memory"] = {"type": "null", "description": "no recurrent memory"}

    def request(forms: dict[str, dict], count: tuple[int, int] | None) -> list[dict]:
        """The request with inputs of `forms` (row schemas, or batch schemas) and extras of
        `count` rows (None: one row), as 'obs' (one input) and as 'inputs'."""
        properties = dict(options)
        for name, (row, description) in extras.items():
            batch = [_rows(row, *count)] if count else [_rows(row, 1, 1)]
            properties[name] = {"anyOf": [{"type": "null"}, row, *batch],
                                "description": description}
        variants = [{"type": "object", "additionalProperties": False, "required": ["inputs"],
                     "properties": {**properties, "inputs": {
                         "type": "object", "additionalProperties": False,
                         "required": list(forms), "properties": forms,
                         "description": "every observation input by name, all with the same "
                                        "rows"}}}]
        if len(forms) == 1:
            (only,) = forms.values()
            variants.append({"type": "object", "additionalProperties": False,
                             "required": ["obs"], "properties": {**properties, "obs": {
                                 **only, "description": "the one observation input (instead "
                                                        "of 'inputs')"}}})
        return variants

    if len(rows_fields) == 1 and not extras:
        (row,) = rows_fields.values()
        forms = {name: {"oneOf": [row, _rows(row, 1, max_rows)]} for name in rows_fields}
        variants = request(forms, None)
    else:
        variants = request(rows_fields, None)
        for count in range(1, max_rows + 1):
            variants += request({name: _rows(row, count, count)
                                 for name, row in rows_fields.items()}, (count, count))
    schemas[f"ActRequest{suffix}"] = {"oneOf": variants, "description": (
        "exactly one of 'obs' (a policy with one observation input) and 'inputs'; each input "
        "is one row or a list of 1 to max_rows rows")}
    return schemas


def _response_schema(spec: ActorSpec, max_rows: int, policy_ids: list[str] | None) -> dict:
    """The answer of an act route for a policy of interface `spec`, answered by one of
    `policy_ids` (None: no `policy` field, the form of a document for an interface alone)."""
    row_of = {"type": "number"}
    response: dict[str, Any] = {"model": {"type": "string", "description": "weights fingerprint"}}
    if policy_ids is not None:
        response["policy"] = {"type": "string", "enum": policy_ids,
                              "description": "the id of the policy that answered"}

    def row_or_rows(row: dict) -> dict:
        return {"oneOf": [row, _rows(row, 1, max_rows)]}

    if spec.continuous_size:
        row = _array_schema((spec.continuous_size,), {"type": "number", "minimum": -1,
                                                      "maximum": 1})
        response["continuous"] = row_or_rows(row)
        if not spec.discrete_branches:
            response["actions"] = {**row_or_rows(row), "description": "the same as 'continuous'"}
    if spec.discrete_branches:
        response["discrete"] = row_or_rows(
            _array_schema((len(spec.discrete_branches),), {"type": "integer", "minimum": 0}))
    if spec.memory_size:
        response["memory"] = row_or_rows(_array_schema((spec.memory_size,), row_of))
    return {"type": "object", "required": list(response), "properties": response,
            "additionalProperties": False}


def openapi_document(spec: ActorSpec, max_rows: int, max_body_bytes: int,
                     api_key: bool = False, policies: dict[str, ActorSpec] | None = None,
                     act_policies: list[str] | None = None) -> dict:
    """The OpenAPI 3.1 description of this API for a policy of interface `spec`: what the server
    accepts and answers, with the bearer key required on every route but the health check when
    `api_key`.

    `policies` (id -> interface) are the served policies: each gets its own
    `/v1/models/{id}/act` route with its own interface, and `GET /v1/models` lists them.
    `act_policies` are the ids `/v1/act` may answer with (the default, or the split's), whose
    interface is `spec`; the `serve_multiplexed_model_id` header may name any policy of that
    interface. None: one policy of interface `spec`, no ids.
    """
    served = dict(policies or {})
    interfaces = list(dict.fromkeys([spec, *served.values()]))

    def suffix(interface: ActorSpec) -> str:
        index = interfaces.index(interface)
        return f"_{index + 1}" if index else ""

    ids_of = {interface: [i for i, s in served.items() if s == interface]
              for interface in interfaces}
    act_ids = list(act_policies or [])
    act_interfaces = list(dict.fromkeys(served[i] for i in act_ids)) if act_ids else [spec]
    ref = "#/components/schemas/"

    def one_of(kind: str, kinds: list[ActorSpec]) -> dict:
        refs = [{"$ref": f"{ref}{kind}{suffix(k)}"} for k in kinds]
        return refs[0] if len(refs) == 1 else {"anyOf": refs}

    schemas: dict[str, dict] = {}
    for interface in interfaces:
        schemas.update(_request_schemas(interface, max_rows, suffix(interface)))
        schemas[f"ActResponse{suffix(interface)}"] = _response_schema(
            interface, max_rows, ids_of[interface] if served else None)
    error = {"$ref": "#/components/schemas/Error"}

    def reply(description: str, schema: dict, headers: dict | None = None) -> dict:
        answer = {"description": description,
                  "content": {"application/json": {"schema": schema}}}
        if headers:
            answer["headers"] = {name: {"required": True, "schema": {"type": "string"},
                                        "description": text}
                                 for name, text in headers.items()}
        return answer

    unauthorized = {"401": {"$ref": "#/components/responses/Unauthorized"}} if api_key else {}
    act_errors = {
        "400": reply("malformed JSON", error),
        **unauthorized,
        "413": reply(f"body over {max_body_bytes} bytes or more than {max_rows} rows", error),
        "422": reply("wrong field, type, shape, a non-finite value or a mask that allows no "
                     "action in a branch", error),
    }
    info_schema = {"type": "object", "required": ["spec", "fingerprint", "batching", "counters"]}

    def act_route(summary: str, kinds: list[ActorSpec], errors: dict) -> dict:
        return {"post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": one_of("ActRequest", kinds)}}},
            "responses": {"200": reply("actions, in the rank of the observations",
                                       one_of("ActResponse", kinds)), **errors}}}

    default_act = act_route("Actions for one observation or a batch of observations"
                            + (" (the default policy, or the split's)" if served else ""),
                            act_interfaces, act_errors)
    named = ids_of[spec] if served and len(act_interfaces) == 1 else []
    if named:
        default_act["post"]["parameters"] = [{
            "name": POLICY_ID_HEADER, "in": "header", "required": False,
            "schema": {"type": "string", "enum": named},
            "description": "the policy to answer (Ray Serve's multiplexed model id)"}]
        default_act["post"]["responses"]["404"] = reply("the header names no served policy",
                                                        error)
    paths: dict[str, Any] = {ACT_PATH: default_act}
    if served:
        models = {"type": "object", "required": ["default", "split", "models"]}
        paths[MODELS_PATH] = {"get": {"summary": "The served policies: id, interface, spec, "
                                                 "fingerprint, source",
                                      "responses": {"200": reply("the policies", models),
                                                    **unauthorized}}}
        for policy_id, interface in served.items():
            path = f"{MODELS_PATH}/{quote(policy_id, safe='@/')}/act"
            paths[path] = act_route(f"Actions of policy {policy_id}", [interface], act_errors)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "huggy-agent policy server", "version": "1",
                 "description": (f"policy: {spec.describe()}" if not served else
                                 f"{len(served)} policies; /v1/act: {spec.describe()}")
                                + ". A method a route does not have is answered 405 with an "
                                  "Allow header (MethodNotAllowed)."},
        "paths": {
            **paths,
            HEALTH_PATH: {"get": {"summary": "Liveness (open without the API key)",
                                  "security": [],
                                  "responses": {"200": reply("the replica is up", {
                                      "type": "object", "required": ["status", "model"],
                                      "properties": {"status": {"const": "ok"},
                                                     "model": {"type": "string"}}})}}},
            INFO_PATH: {"get": {"summary": "Policy spec, device, batching settings and counters",
                                "responses": {"200": reply("description", info_schema),
                                              **unauthorized}}},
            OPENAPI_PATH: {"get": {"summary": "This document",
                                   "responses": {"200": reply("OpenAPI 3.1", {"type": "object"}),
                                                 **unauthorized}}},
        },
        "components": {
            "schemas": {
                **schemas,
                "Error": {"type": "object", "required": ["error", "message"],
                          "properties": {"error": {"type": "string"},
                                         "message": {"type": "string"}},
                          "additionalProperties": False},
            },
            "responses": {
                "MethodNotAllowed": reply("the route exists with another method", error,
                                          {"Allow": "the route's method"}),
            },
        },
    }
    if api_key:
        document["components"]["securitySchemes"] = {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": f"the server's API key (huggy serve --api-key-file, or "
                           f"${API_KEY_ENV}) as 'Authorization: Bearer <key>'"}}
        document["components"]["responses"]["Unauthorized"] = reply(
            "no API key, or a wrong one", error,
            {"WWW-Authenticate": "the scheme to use: Bearer"})
        document["security"] = [{"bearer": []}]
    return document
