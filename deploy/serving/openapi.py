"""The OpenAPI 3.1 document of the policy server: what it accepts and answers for the policies
it serves, with the bearer key required on every route but the health check when it has one.
It stays small at any `max_rows` (see `_request_schemas`)."""

from __future__ import annotations

from typing import Any

from deploy.serving.parsing import FLOAT32_OVERFLOW
from huggy_agent_client.http_api import (
    ACT_PATH,
    API_KEY_ENV,
    HEALTH_PATH,
    INFO_PATH,
    MODELS_PATH,
    OPENAPI_PATH,
    POLICY_ID_HEADER,
    SEED_LIMIT,
    SESSION_KEY_LIMIT,
    model_act_path,
)
from huggy_agent_client.spec import ActorSpec


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

    Every variant's row constraint is structural, so the document has the same size at any
    `max_rows`: `obs` / `inputs` carry one row, or, for a policy whose only row-carrying field
    is its one input, a list of rows; `instances` carries a list of rows, each an object with
    its own row of every field. (Columnar batches of several fields, all with the same rows,
    are accepted too, but JSON Schema cannot say "the same length", so they are described in
    words only.)
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
    rows_fields: dict[str, dict] = {}  # every row-carrying field: its row schema
    for observation in spec.inputs:
        schemas[f"Row_{observation.name}{suffix}"] = _array_schema(observation.shape, float32)
        rows_fields[observation.name] = {"$ref": f"{ref}Row_{observation.name}{suffix}"}
    options: dict[str, dict] = {"deterministic": {"$ref": f"{ref}Deterministic"},
                                "seed": {"$ref": f"{ref}Seed"},
                                "row_offset": {"$ref": f"{ref}RowOffset"},
                                "session": {"$ref": f"{ref}Session"}}
    extras: dict[str, dict] = {}  # action_mask / memory: their row schema
    if spec.discrete_branches:
        schemas[f"Row_action_mask{suffix}"] = _mask_row(spec)
        extras["action_mask"] = {"$ref": f"{ref}Row_action_mask{suffix}"}
    else:
        options["action_mask"] = {"type": "null", "description": "no discrete actions"}
    if spec.memory_size:
        schemas[f"Row_memory{suffix}"] = _array_schema((spec.memory_size,), float32)
        extras["memory"] = {"$ref": f"{ref}Row_memory{suffix}"}
    else:
        options["memory"] = {"type": "null", "description": "no recurrent memory"}
    columnar_batches = len(rows_fields) == 1 and not extras
    forms = {name: ({"oneOf": [row, _rows(row, 1, max_rows)]} if columnar_batches else row)
             for name, row in rows_fields.items()}
    properties = {**options, **{name: {"anyOf": [{"type": "null"}, row], "description": (
        "one row; absent or null: zeros (an episode's start)" if name == "memory"
        else "one row, 1/true = allowed")} for name, row in extras.items()}}
    variants = [{"type": "object", "additionalProperties": False, "required": ["inputs"],
                 "properties": {**properties, "inputs": {
                     "type": "object", "additionalProperties": False, "required": list(forms),
                     "properties": forms, "description": "every observation input by name"}}}]
    if len(forms) == 1:
        (only,) = forms.values()
        variants.append({"type": "object", "additionalProperties": False, "required": ["obs"],
                         "properties": {**properties, "obs": {
                             **only, "description": "the one observation input (instead of "
                                                    "'inputs')"}}})
    instance = {"type": "object", "additionalProperties": False, "required": list(rows_fields),
                "properties": {**rows_fields, **{name: properties[name] for name in extras}},
                "description": "one row: every input" + (
                    ", and optionally its " + " and ".join(extras) if extras else "")}
    variants.append({"type": "object", "additionalProperties": False, "required": ["instances"],
                     "properties": {**options, "instances": {
                         **_rows(instance, 1, max_rows),
                         "description": "a batch, one object per row"}}})
    schemas[f"ActRequest{suffix}"] = {"oneOf": variants, "description": (
        "exactly one of 'obs' (a policy with one observation input), 'inputs' and 'instances'"
        + ("; 'obs' and 'inputs' take one row or a list of 1 to max_rows rows"
           if columnar_batches else "; 'obs' and 'inputs' take one row of each field, "
           "'instances' a batch (columnar batches, every field with the same rows, are "
           "accepted too)"))}
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
    accepts and answers.

    Args:
        spec: the interface of `/v1/act`'s policies.
        max_rows: the most observation rows of a request.
        max_body_bytes: the largest request body.
        api_key: whether the bearer key is required (on every route but the health check).
        policies: the served policies (id -> interface): each gets its own
            `/v1/models/{id}/act` route with its own interface, and `GET /v1/models` lists them.
            None: one policy of interface `spec`, no ids.
        act_policies: the ids `/v1/act` may answer with (the default, or the split's), whose
            interface is `spec`; the `serve_multiplexed_model_id` header may name any policy of
            that interface.

    Returns:
        The document, JSON-ready.
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
            path = model_act_path(policy_id)
            paths[path] = act_route(f"Actions of policy {policy_id}", [interface], act_errors)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "huggy-agent policy server", "version": "1",
                 "description": (f"policy: {spec.describe()}" if not served else
                                 f"{len(served)} {'policy' if len(served) == 1 else 'policies'}; "
                                 f"/v1/act: {spec.describe()}")
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
