"""The HTTP API of the served policy, version 1: request parsing, validation, responses, OpenAPI.

No Ray and no web framework here: functions take bytes and return bytes or raise `ApiError`, so
the rules are testable on their own and the replica can run them before a request joins a batch
(a bad request never reaches the batch, so it cannot poison it).

    POST /v1/act      {"obs": row | [rows]            (a single-input policy), or
                       "inputs": {"obs_0": row | [rows], "obs_1": ...}   (any policy),
                       "action_mask": [0/1 or bools] | [[...]]    (discrete actions; 1 = allowed),
                       "memory": [m floats] | [[m floats]]        (recurrent; absent = zeros),
                       "deterministic": true, "seed": int | null, "row_offset": int}
                      -> {"continuous": ..., "discrete": ..., "memory": ...  (as the policy has
                          them, in the rank of the request), "actions": ... (continuous-only
                          policies: the same as "continuous", as before), "model": "<fingerprint>"}
    GET  /v1/healthz  -> {"status": "ok", "model": "<fingerprint>"}
    GET  /v1/info     -> spec, architecture, parameters, origin, device, precision, batching, counters
    GET  /v1/openapi.json
    errors            -> {"error": "<kind>", "message": "<what was expected and received>"}
"""

from __future__ import annotations

import codecs
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from huggy_agent.inputs import as_input_batch, as_mask_batch, as_memory_batch
from huggy_agent.spec import ActorSpec

API_PREFIX = "/v1"
ACT_PATH = f"{API_PREFIX}/act"
HEALTH_PATH = f"{API_PREFIX}/healthz"
INFO_PATH = f"{API_PREFIX}/info"
OPENAPI_PATH = f"{API_PREFIX}/openapi.json"
ROUTES: dict[str, str] = {ACT_PATH: "POST", HEALTH_PATH: "GET", INFO_PATH: "GET",
                          OPENAPI_PATH: "GET"}

ACT_FIELDS = ("obs", "inputs", "action_mask", "memory", "deterministic", "seed", "row_offset")
SEED_LIMIT = 2**64
FLOAT32_MAX = float(np.finfo(np.float32).max)


class ApiError(Exception):
    """A request the API refuses: HTTP `status`, a short `kind` and a message for the caller."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message

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

    @property
    def obs(self) -> np.ndarray:
        """The first input (the only one of a single-input policy)."""
        return self.inputs[0]

    @property
    def rows(self) -> int:
        return self.inputs[0].shape[0]


def check_route(path: str, method: str) -> None:
    """Raise 404 for an unknown path and 405 for a known path with the wrong method."""
    expected = ROUTES.get(path.rstrip("/") or "/")
    if expected is None:
        raise ApiError(404, "not_found", f"no route {path!r}; routes: "
                       + ", ".join(f"{m} {p}" for p, m in ROUTES.items()))
    if method != expected:
        raise ApiError(405, "method_not_allowed",
                       f"{path} expects {expected}, received {method}")


def parse_act_request(body: bytes, spec: ActorSpec, max_rows: int) -> ActRequest:
    """Parse and validate the body of `POST /v1/act` for a policy of interface `spec`.

    Any body either parses or raises ApiError, never anything else: 400 not UTF-8 JSON (also
    empty, nested too deeply); 413 more than `max_rows` observations; 422 anything else wrong
    (not an object, unknown, repeated or missing field, wrong type, wrong shape, a boolean or
    other non-number in the observations, a value that is not finite in float32, a mask branch
    with no allowed action). Messages name what was expected and what was received.
    """
    try:
        document, exact = orjson.loads(body), False
    except orjson.JSONDecodeError:
        document, exact = _exact_json(body), True
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", "request body must be a JSON object with an "
                       f"'obs' or 'inputs' field, received {_describe(document)}")
    if not exact and _may_hide_values(body, document):
        document, exact = _exact_json(body), True
    unknown = sorted(set(document) - set(ACT_FIELDS))
    if unknown:
        raise ApiError(422, "invalid_request", f"unknown field(s) {unknown}; expected only "
                       f"{list(ACT_FIELDS)}")
    deterministic = document.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise ApiError(422, "invalid_request", "'deterministic' must be true or false, received "
                       f"{_describe(deterministic)}")
    seed = document.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < SEED_LIMIT):
        raise ApiError(422, "invalid_request", "'seed' must be null or an integer in [0, 2**64), "
                       f"received {_describe(seed)}")
    row_offset = document.get("row_offset", 0)
    if not _is_int(row_offset) or not 0 <= row_offset < SEED_LIMIT:
        raise ApiError(422, "invalid_request", "'row_offset' must be an integer in [0, 2**64), "
                       f"received {_describe(row_offset)}")
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
    return ActRequest(inputs, single, deterministic, seed, row_offset, mask, memory)


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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


def act_response(result: dict[str, np.ndarray], single: bool, fingerprint: str) -> bytes:
    """The body answering `/v1/act`, from (rows, ...) arrays by name (`continuous`, `discrete`,
    `memory`): each in the rank the request was sent in, and a continuous-only policy's actions
    once more as `actions`. Float32 values are written in their shortest form that reads back
    to the same float32, so a client gets exactly the served values."""
    document: dict[str, Any] = {name: np.ascontiguousarray(array[0] if single else array)
                                for name, array in result.items()}
    if set(result) <= {"continuous", "memory"} and "continuous" in result:
        document["actions"] = document["continuous"]
    document["model"] = fingerprint
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def _array_schema(shape: tuple[int, ...], items: dict) -> dict:
    """JSON schema of one row of `shape` (nested arrays)."""
    schema = items
    for size in reversed(shape):
        schema = {"type": "array", "items": schema, "minItems": size, "maxItems": size}
    return schema


def _row_or_rows(row: dict, max_rows: int) -> dict:
    return {"oneOf": [row, {"type": "array", "items": row, "minItems": 1, "maxItems": max_rows}]}


def openapi_document(spec: ActorSpec, max_rows: int, max_body_bytes: int) -> dict:
    """The OpenAPI 3.1 description of this API for a policy of interface `spec`."""
    number = {"type": "number"}
    inputs = {i.name: _row_or_rows(_array_schema(i.shape, number), max_rows) for i in spec.inputs}
    request: dict[str, Any] = {
        "inputs": {"type": "object", "properties": inputs, "required": list(inputs),
                   "additionalProperties": False,
                   "description": "every observation input by name, all with the same rows"},
        "deterministic": {"type": "boolean", "default": True},
        "seed": {"type": ["integer", "null"], "minimum": 0,
                 "description": "drives the noise of this request's rows only"},
        "row_offset": {"type": "integer", "minimum": 0, "default": 0,
                       "description": "row i gets the noise of row row_offset + i"},
    }
    if len(spec.inputs) == 1:
        request["obs"] = {**inputs[spec.inputs[0].name],
                          "description": "the one observation input (instead of 'inputs')"}
    response: dict[str, Any] = {"model": {"type": "string", "description": "weights fingerprint"}}
    if spec.continuous_size:
        row = _array_schema((spec.continuous_size,), {"type": "number", "minimum": -1,
                                                      "maximum": 1})
        response["continuous"] = _row_or_rows(row, max_rows)
        if not spec.discrete_branches:
            response["actions"] = {**_row_or_rows(row, max_rows),
                                   "description": "the same as 'continuous'"}
    if spec.discrete_branches:
        request["action_mask"] = _row_or_rows(
            _array_schema((spec.mask_size,), {"type": ["boolean", "integer"]}), max_rows)
        request["action_mask"]["description"] = ("1/true = allowed, one column per action of "
                                                 f"branches {list(spec.discrete_branches)}")
        response["discrete"] = _row_or_rows(
            _array_schema((len(spec.discrete_branches),), {"type": "integer", "minimum": 0}),
            max_rows)
    if spec.memory_size:
        memory = _row_or_rows(_array_schema((spec.memory_size,), number), max_rows)
        request["memory"] = {**memory, "description": "absent or null: zeros (an episode's start)"}
        response["memory"] = memory
    error = {"$ref": "#/components/schemas/Error"}

    def reply(description: str, schema: dict) -> dict:
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    errors = {
        "400": reply("malformed JSON", error),
        "413": reply(f"body over {max_body_bytes} bytes or more than {max_rows} rows", error),
        "422": reply("wrong field, type, shape, a non-finite value or a mask that allows no "
                     "action in a branch", error),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "huggy-agent policy server", "version": "1",
                 "description": f"policy: {spec.describe()}"},
        "paths": {
            ACT_PATH: {"post": {
                "summary": "Actions for one observation or a batch of observations",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/ActRequest"}}}},
                "responses": {"200": reply("actions, in the rank of the observations",
                                           {"$ref": "#/components/schemas/ActResponse"}),
                              **errors},
            }},
            HEALTH_PATH: {"get": {"summary": "Liveness", "responses": {"200": reply(
                "the replica is up", {"type": "object"})}}},
            INFO_PATH: {"get": {"summary": "Policy spec, device, batching settings and counters",
                                "responses": {"200": reply("description", {"type": "object"})}}},
        },
        "components": {"schemas": {
            "ActRequest": {"type": "object", "properties": request, "additionalProperties": False},
            "ActResponse": {"type": "object", "required": list(response), "properties": response},
            "Error": {"type": "object", "required": ["error", "message"],
                      "properties": {"error": {"type": "string"},
                                     "message": {"type": "string"}}},
        }},
    }
