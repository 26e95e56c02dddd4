"""The HTTP API of the served policy, version 1: request parsing, validation, responses, OpenAPI.

No Ray and no web framework here: functions take bytes and return bytes or raise `ApiError`, so
the rules are testable on their own and the replica can run them before a request joins a batch
(a bad request never reaches the batch, so it cannot poison it).

    POST /v1/act      {"obs": [59 floats] | [[59 floats], ...], "deterministic": true,
                       "seed": int | null, "row_offset": int}
                      -> {"actions": [21 floats] | [[21 floats], ...], "model": "<fingerprint>"}
    GET  /v1/healthz  -> {"status": "ok", "model": "<fingerprint>"}
    GET  /v1/info     -> architecture, parameters, origin, device, precision, batching, counters
    GET  /v1/openapi.json
    errors            -> {"error": "<kind>", "message": "<what was expected and received>"}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

API_PREFIX = "/v1"
ACT_PATH = f"{API_PREFIX}/act"
HEALTH_PATH = f"{API_PREFIX}/healthz"
INFO_PATH = f"{API_PREFIX}/info"
OPENAPI_PATH = f"{API_PREFIX}/openapi.json"
ROUTES: dict[str, str] = {ACT_PATH: "POST", HEALTH_PATH: "GET", INFO_PATH: "GET",
                          OPENAPI_PATH: "GET"}

ACT_FIELDS = ("obs", "deterministic", "seed", "row_offset")
SEED_LIMIT = 2**64


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
    """A validated `POST /v1/act`: `obs` is (rows, obs_size) float32; `single` if sent as 1-D."""

    obs: np.ndarray
    single: bool
    deterministic: bool
    seed: int | None
    row_offset: int

    @property
    def rows(self) -> int:
        return self.obs.shape[0]


def check_route(path: str, method: str) -> None:
    """Raise 404 for an unknown path and 405 for a known path with the wrong method."""
    expected = ROUTES.get(path.rstrip("/") or "/")
    if expected is None:
        raise ApiError(404, "not_found", f"no route {path!r}; routes: "
                       + ", ".join(f"{m} {p}" for p, m in ROUTES.items()))
    if method != expected:
        raise ApiError(405, "method_not_allowed",
                       f"{path} expects {expected}, received {method}")


def parse_act_request(body: bytes, obs_size: int, max_rows: int) -> ActRequest:
    """Parse and validate the body of `POST /v1/act`.

    Raises ApiError: 400 malformed JSON, 413 more than `max_rows` observations, 422 anything else
    wrong (not an object, unknown or missing field, wrong type, wrong shape, non-finite value).
    """
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = _lenient_json(body)
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", "request body must be a JSON object with an "
                       f"'obs' field, received {type(document).__name__}")
    unknown = sorted(set(document) - set(ACT_FIELDS))
    if unknown:
        raise ApiError(422, "invalid_request", f"unknown field(s) {unknown}; expected only "
                       f"{list(ACT_FIELDS)}")
    if "obs" not in document:
        raise ApiError(422, "invalid_request", "missing field 'obs': expected "
                       f"[{obs_size} numbers] or [[{obs_size} numbers], ...]")
    deterministic = document.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise ApiError(422, "invalid_request", "'deterministic' must be true or false, received "
                       f"{deterministic!r}")
    seed = document.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < SEED_LIMIT):
        raise ApiError(422, "invalid_request", "'seed' must be null or an integer in [0, 2**64), "
                       f"received {seed!r}")
    row_offset = document.get("row_offset", 0)
    if not _is_int(row_offset) or not 0 <= row_offset < SEED_LIMIT:
        raise ApiError(422, "invalid_request", "'row_offset' must be an integer in [0, 2**64), "
                       f"received {row_offset!r}")
    obs, single = _parse_obs(document["obs"], obs_size, max_rows)
    return ActRequest(obs, single, deterministic, seed, row_offset)


def _lenient_json(body: bytes) -> Any:
    """The standard library's reading of a body orjson refused: it accepts NaN and Infinity
    (which then fail as non-finite values, 422) and words its errors well (400)."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(400, "malformed_json", f"request body is not valid JSON: {error}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_obs(obs: Any, obs_size: int, max_rows: int) -> tuple[np.ndarray, bool]:
    expected = f"expected [{obs_size} numbers] or [[{obs_size} numbers], ...]"
    if not isinstance(obs, list) or not obs:
        raise ApiError(422, "invalid_shape", f"'obs' {expected}, received {_describe(obs)}")
    if isinstance(obs[0], list) and len(obs) > max_rows:
        raise ApiError(413, "too_many_rows", f"'obs' has {len(obs)} rows, the limit is "
                       f"{max_rows} per request; split it into several requests")
    try:
        array = np.array(obs)
    except ValueError:  # ragged nesting
        raise ApiError(422, "invalid_shape", f"'obs' {expected}, received rows of different "
                       "lengths") from None
    if array.dtype.kind not in "iuf":
        raise ApiError(422, "invalid_value", f"'obs' must hold only numbers, {expected}")
    if array.ndim not in (1, 2) or array.shape[-1] != obs_size or array.size == 0:
        raise ApiError(422, "invalid_shape", f"'obs' {expected}, received shape "
                       f"{list(array.shape)}")
    with np.errstate(over="ignore"):  # beyond float32's range becomes inf, refused just below
        array = array.astype(np.float32).reshape(-1, obs_size)
    finite = np.isfinite(array)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise ApiError(422, "non_finite", f"'obs' must be finite float32 values, received "
                       f"{array[row, col]} at row {row}, column {col}")
    return array, not isinstance(obs[0], list)


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "an empty list" if not value else f"a list of {len(value)}"
    return f"{type(value).__name__} {value!r}"[:80]


def act_response(actions: np.ndarray, single: bool, fingerprint: str) -> bytes:
    """The body answering `/v1/act`. Float32 actions are written in their shortest form that
    reads back to the same float32, so a client gets exactly the served values."""
    rows = actions[0] if single else actions
    return orjson.dumps({"actions": np.ascontiguousarray(rows), "model": fingerprint},
                        option=orjson.OPT_SERIALIZE_NUMPY)


def openapi_document(obs_size: int, act_size: int, max_rows: int, max_body_bytes: int) -> dict:
    """The OpenAPI 3.1 description of this API for one loaded policy."""
    obs_row = {"type": "array", "items": {"type": "number"}, "minItems": obs_size,
               "maxItems": obs_size}
    act_row = {"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1},
               "minItems": act_size, "maxItems": act_size}
    error = {"$ref": "#/components/schemas/Error"}

    def reply(description: str, schema: dict) -> dict:
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    errors = {
        "400": reply("malformed JSON", error),
        "413": reply(f"body over {max_body_bytes} bytes or more than {max_rows} rows", error),
        "422": reply("wrong field, type, shape or a non-finite value", error),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "huggy-agent policy server", "version": "1"},
        "paths": {
            ACT_PATH: {"post": {
                "summary": "Actions for one observation or a batch of observations",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/ActRequest"}}}},
                "responses": {"200": reply("actions, in the rank of `obs`",
                                           {"$ref": "#/components/schemas/ActResponse"}),
                              **errors},
            }},
            HEALTH_PATH: {"get": {"summary": "Liveness", "responses": {"200": reply(
                "the replica is up", {"type": "object"})}}},
            INFO_PATH: {"get": {"summary": "Policy, device, batching settings and counters",
                                "responses": {"200": reply("description", {"type": "object"})}}},
        },
        "components": {"schemas": {
            "ActRequest": {
                "type": "object", "required": ["obs"], "additionalProperties": False,
                "properties": {
                    "obs": {"oneOf": [obs_row, {"type": "array", "items": obs_row,
                                                "minItems": 1, "maxItems": max_rows}]},
                    "deterministic": {"type": "boolean", "default": True},
                    "seed": {"type": ["integer", "null"], "minimum": 0,
                             "description": "drives the noise of this request's rows only"},
                    "row_offset": {"type": "integer", "minimum": 0, "default": 0,
                                   "description": "row i gets the noise of row row_offset + i"},
                },
            },
            "ActResponse": {
                "type": "object", "required": ["actions", "model"],
                "properties": {"actions": {"oneOf": [act_row, {"type": "array",
                                                               "items": act_row}]},
                               "model": {"type": "string", "description": "weights fingerprint"}},
            },
            "Error": {"type": "object", "required": ["error", "message"],
                      "properties": {"error": {"type": "string"},
                                     "message": {"type": "string"}}},
        }},
    }
