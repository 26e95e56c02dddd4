"""Parsing and validating the body of an act route (`POST /v1/act`, `POST /v1/models/{id}/act`)
for a policy of a given interface. No Ray and no web framework: bytes in, a validated
`ActRequest` out or `ApiError`, so the rules are testable on their own and a replica runs them
before a request joins a batch (a bad request never reaches the batch, so it cannot poison it).

Three forms carry the observations (and, where the policy has them, action masks and memories):

    {"obs": row | [rows]}                                   a policy with one observation input
    {"inputs": {"obs_0": row | [rows], "obs_1": ...},       any policy, columnar: every field
     "action_mask": row | [rows], "memory": row | [rows]}   with the same rows (or one row)
    {"instances": [{"obs_0": row, "obs_1": row,             any policy, one object per row
                    "action_mask": row, "memory": row}, ...]}

with the options `"deterministic"` (default true), `"seed"`, `"row_offset"` and `"session"`.
"""

from __future__ import annotations

import codecs
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from deploy.serving.responses import ApiError
from huggy_agent.native import KERNELS
from huggy_agent_client.http_api import SEED_LIMIT, check_session_key, shown
from huggy_agent_client.inputs import as_input_batch, as_mask_batch, as_memory_batch
from huggy_agent_client.spec import ActorSpec

ROW_FIELDS = ("obs", "inputs", "instances", "action_mask", "memory")
"""The fields that carry rows."""
OPTION_FIELDS = ("deterministic", "seed", "row_offset", "session")
ACT_FIELDS = (*ROW_FIELDS, *OPTION_FIELDS)
_ACT_FIELD_SET = frozenset(ACT_FIELDS)
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
"""The smallest magnitude that rounds to infinity in float32 (halfway past FLOAT32_MAX)."""
UNKNOWN_FIELDS_SHOWN = 5
"""The most unknown fields an error message names."""
UNKNOWN_NAME_CHARS = 32
"""The most characters of each unknown field's name an error message quotes."""
ONE_ROW_FIELDS = frozenset(("obs", "deterministic", "seed", "row_offset"))
"""The fields of the common body that `_one_row` reads on its own (after the options)."""


# Not frozen: a frozen dataclass's __init__ costs more, on every request (docs/benchmarks.md,
# "Three cuts to the serving code's own cost").
@dataclass(slots=True)
class ActRequest:
    """A validated act request, never changed once made: `inputs` are (rows, *shape) float32 in
    `obs_i` order, `action_mask` (rows, sum of branches) bool or None, `memory` (rows, m) float32
    or None (a recurrent policy's zeros); `single` if the observations were sent as one row."""

    inputs: list[np.ndarray]
    single: bool
    deterministic: bool
    seed: int | None
    row_offset: int
    action_mask: np.ndarray | None = None
    memory: np.ndarray | None = None
    session: str | None = None
    """The key that keeps a user on one policy of a split (`huggy_agent_client.http_api.Split`)."""

    @property
    def obs(self) -> np.ndarray:
        """The first input (the only one of a single-input policy)."""
        return self.inputs[0]

    @property
    def rows(self) -> int:
        return self.inputs[0].shape[0]


def parse_act_request(body: bytes, spec: ActorSpec, max_rows: int) -> ActRequest:
    """Parse and validate the body of an act route for a policy. Messages name what was expected and
    what was received.

    Args:
        body: the request's body.
        spec: the policy's interface.
        max_rows: the most observations a request may hold.

    Returns:
        The validated request.

    Raises:
        ApiError: for any body that does not parse, never anything else: 400 not UTF-8 JSON (also
            empty, nested too deeply); 413 more than `max_rows` observations; 422 anything else
            wrong (not an object, unknown, repeated or missing field, wrong type, wrong shape, a
            boolean or other non-number in the observations, a value that is not finite in
            float32, a mask branch with no allowed action).
    """
    return act_from_document(*read_act_document(body), spec, max_rows)


def plain_one_row(body: bytes, spec: ActorSpec) -> ActRequest | None:
    """The request of the most common body, read and checked in one pass.

    The compiled reader (`huggy_agent.native`'s `json_obs_row`) reads the body straight into the
    float32 row; where the kernels were not built, `_plain_one_row_numpy` reads it.

    Args:
        body: the request's body.
        spec: the policy's interface.

    Returns:
        The request of `{"obs": [numbers]}` with any of the options `deterministic` (a boolean),
            `seed` and `row_offset` (integers in range, or a null seed), for a policy with one
            vector input and no memory; None for anything else (then `read_act_document` and
            `act_from_document` read it, with the same answer, and word any error).
    """
    inputs = spec.inputs
    if len(inputs) != 1 or spec.memory_size or inputs[0].kind != "vector":
        return None
    if KERNELS is None:
        return _plain_one_row_numpy(body, inputs[0].shape[0])
    row = np.empty((1, inputs[0].shape[0]), np.float32)
    options = KERNELS.json_obs_row(body, row)
    return None if options is None else ActRequest([row], True, *options)


def _plain_one_row_numpy(body: bytes, size: int) -> ActRequest | None:
    """`plain_one_row` for an observation of `size` numbers, with orjson and numpy.

    The body is plain when it holds no backslash, no '"' but its keys' and no 'u' or 'a' but
    its keys' and its top-level literals' (see `_may_hide_values`): no key repeats and no
    string or literal hides in 'obs'."""
    if b"\\" in body:
        return None
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(document) is not dict or not document.keys() <= ONE_ROW_FIELDS:
        return None
    obs = document.get("obs")
    deterministic = document.get("deterministic", True)
    seed = document.get("seed")
    row_offset = document.get("row_offset", 0)
    if (type(obs) is not list or len(obs) != size
            or type(deterministic) is not bool
            or not (seed is None or (type(seed) is int and 0 <= seed < SEED_LIMIT))
            or not (type(row_offset) is int and 0 <= row_offset < SEED_LIMIT)
            or body.count(b'"') != 2 * len(document)
            or body.count(b"u") + body.count(b"a")
            != sum(map(_LETTERS.__getitem__, document)) + (seed is None and "seed" in document)
            + ("deterministic" in document)):
        return None
    try:
        row = np.fromiter(obs, np.float32, len(obs))
    except (TypeError, ValueError):  # a nested list: a batch, or a shape to refuse
        return None
    # Every value is finite iff its product with zero is (an infinity times 0 is NaN, in
    # IEEE 754), and so their sum: half the cost of np.isfinite(row).all().
    if not math.isfinite(row.dot(np.zeros(len(row), np.float32))):
        return None  # beyond float32 (the full checks word it)
    return ActRequest([row.reshape(1, -1)], True, deterministic, seed, row_offset)


_LETTERS = {field: field.count("u") + field.count("a") for field in ONE_ROW_FIELDS}
"""The letters 'u' and 'a' in each key `plain_one_row` accepts."""


def read_act_document(body: bytes) -> tuple[dict, bool]:
    """The JSON object of an act body, before any policy's rules. Read first where the policy
    depends on the body (its `"session"`).

    Args:
        body: the request's body.

    Returns:
        The object, and whether it was read exactly (`_exact_json`).

    Raises:
        ApiError: 400 or 422, as `parse_act_request` says.
    """
    try:
        document, exact = orjson.loads(body), False
    except orjson.JSONDecodeError:
        document, exact = _exact_json(body), True
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", "request body must be a JSON object with an "
                       f"'obs', 'inputs' or 'instances' field, received {_describe(document)}")
    _refuse_unknown_fields(document)  # before any second reading: a body of many keys is cheap
    if not exact and _may_hide_values(body, document):
        document, exact = _exact_json(body), True
    return document, exact


def act_from_document(document: dict, exact: bool, spec: ActorSpec, max_rows: int
                      ) -> ActRequest:
    """The request of a `read_act_document` result, validated for a policy.

    Args:
        document: the body's JSON object.
        exact: whether it was read exactly.
        spec: the policy's interface.
        max_rows: the most observations a request may hold.

    Returns:
        The validated request.

    Raises:
        ApiError: 413 or 422, as `parse_act_request` says.
    """
    _refuse_unknown_fields(document)
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
    if not exact:
        row = _one_row(document, spec)
        if row is not None:
            return ActRequest([row], True, deterministic, seed, row_offset)
    try:
        session = check_session_key(document.get("session"))
    except ValueError as error:
        raise ApiError(422, "invalid_request", str(error)) from None
    rows_given = "instances" in document
    if rows_given:
        document = _columns_of_instances(document, spec, max_rows)
    inputs, single = _parse_inputs(document, spec, max_rows, exact,
                                   "instances" if rows_given else "inputs")
    if rows_given and single:  # every instance a row of one dimension less than expected
        raise ApiError(422, "invalid_shape", "each of 'instances' must hold one row of each "
                       f"input, {_row_shapes(spec)}, received rows of one dimension less")
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


def _refuse_unknown_fields(document: dict) -> None:
    """422 naming the first few fields of `document` that an act request does not have (the
    client's names quoted short: `shown`), and how many there are."""
    if document.keys() <= _ACT_FIELD_SET:
        return
    unknown = [name for name in document if name not in _ACT_FIELD_SET]
    named = ", ".join(shown(name, UNKNOWN_NAME_CHARS) for name in unknown[:UNKNOWN_FIELDS_SHOWN])
    more = f" and {len(unknown) - UNKNOWN_FIELDS_SHOWN:,} more" \
        if len(unknown) > UNKNOWN_FIELDS_SHOWN else ""
    raise ApiError(422, "invalid_request", f"unknown field(s) {named}{more}; expected only "
                   f"{list(ACT_FIELDS)}")


def _one_row(document: dict, spec: ActorSpec) -> np.ndarray | None:
    """The (1, n) observation of the common body, `{"obs": [numbers]}` (one row for a policy
    with one vector input and no memory, with no fields but the options that
    `act_from_document` has checked), read in one pass; None for any other body, or anything
    in its "obs" to refuse: `_parse_inputs` then reads it and words the error.

    Only for a document read by orjson and found plain by `_may_hide_values`: its 'obs' holds
    no booleans, strings or nulls, only ints and floats. A value of magnitude at least
    `FLOAT32_OVERFLOW` is not finite in float32 (refused by the full checks)."""
    obs = document.get("obs")
    if type(obs) is not list or not document.keys() <= ONE_ROW_FIELDS:
        return None
    inputs = spec.inputs
    if len(inputs) != 1 or spec.memory_size or inputs[0].kind != "vector" \
            or len(obs) != inputs[0].shape[0]:
        return None
    try:
        if not (min(obs) > -FLOAT32_OVERFLOW and max(obs) < FLOAT32_OVERFLOW):
            return None
    except TypeError:  # a nested list: a batch, or a shape to refuse
        return None
    return np.array(obs, dtype=np.float32).reshape(1, -1)


def _parse_inputs(document: dict, spec: ActorSpec, max_rows: int, exact: bool,
                  form: str = "inputs") -> tuple[list[np.ndarray], bool]:
    """The observation inputs of the request: `obs` (single-input policies) or `inputs`
    (`form` names the field in messages: 'instances' where the columns came from rows)."""
    names = [i.name for i in spec.inputs]
    if ("obs" in document) == ("inputs" in document):
        given = "both" if "obs" in document else "neither"
        single_input = (f"'obs' (its one input, {spec.inputs[0].shape}) or "
                        if len(names) == 1 else "")
        raise ApiError(422, "invalid_request", f"give exactly one of 'obs', 'inputs' and "
                       f"'instances', received {given}: expected {single_input}'inputs' "
                       f"{{{', '.join(names)}}} or 'instances' [{{{', '.join(names)}}}, ...]")
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
        field = "obs" if "obs" in document else f"{form}.{observation.name}"
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
        received = ", ".join(
            f"{observation.name} {'a single row' if single else f'a batch of {len(batch)}'}"
            for observation, (batch, single) in zip(spec.inputs, parsed, strict=True))
        raise ApiError(422, "invalid_shape", "every input must be a single row, or every input "
                       f"a batch of the same number of rows; received {received}")
    return batches, parsed[0][1]


def _columns_of_instances(document: dict, spec: ActorSpec, max_rows: int) -> dict:
    """The columnar document of a row-form request: `{"instances": [{name: row}, ...]}` becomes
    `{"inputs": {name: [rows]}, "action_mask": [rows], "memory": [rows]}` (the options kept).
    An instance without a mask (or with null) allows every action; one without a memory (or
    with null) starts from zeros. 422 for another row field beside 'instances' or an instance
    that is not an object of rows; 413 above `max_rows`."""
    others = sorted(name for name in set(document) & (set(ROW_FIELDS) - {"instances"})
                    if document[name] is not None or name in ("obs", "inputs"))
    if others:
        raise ApiError(422, "invalid_request", f"give 'instances' alone, without {others}: "
                       "each instance holds its own row of every input (and of 'action_mask' "
                       "and 'memory')")
    instances = document["instances"]
    names = [i.name for i in spec.inputs]
    defaults: dict[str, list] = {}  # the row an instance without the field stands for
    if spec.discrete_branches:
        defaults["action_mask"] = [True] * spec.mask_size
    if spec.memory_size:
        defaults["memory"] = [0.0] * spec.memory_size
    allowed = [*names, *defaults]
    expected = f"a list of 1 to {max_rows} objects {{{', '.join(allowed)}}}"
    if not isinstance(instances, list) or not instances:
        raise ApiError(422, "invalid_shape", f"'instances' must be {expected}, received "
                       f"{_describe(instances)}")
    if len(instances) > max_rows:
        raise ApiError(413, "too_many_rows", f"'instances' has {len(instances)} rows, the limit "
                       f"is {max_rows} per request; split it into several requests")
    for index, instance in enumerate(instances):
        if not isinstance(instance, dict):
            raise ApiError(422, "invalid_shape", f"'instances' must be {expected}, received "
                           f"{_describe(instance)} at index {index}")
        if not set(names) <= set(instance) <= set(allowed):
            raise ApiError(422, "invalid_request", f"instance {index} has the fields "
                           f"{sorted(instance)}; expected {names}"
                           + (f" and optionally {list(defaults)}" if defaults else ""))
        for name, value in instance.items():
            if not isinstance(value, list) and not (value is None and name in defaults):
                raise ApiError(422, "invalid_shape", f"'instances[{index}].{name}' must be one "
                               f"row (a list), received {_describe(value)}")
    columns: dict[str, Any] = {name: value for name, value in document.items()
                               if name in OPTION_FIELDS}
    columns["inputs"] = {name: [instance[name] for instance in instances] for name in names}
    for name, default in defaults.items():
        if any(instance.get(name) is not None for instance in instances):
            columns[name] = [default if instance.get(name) is None else instance[name]
                             for instance in instances]
    return columns


def _row_shapes(spec: ActorSpec) -> str:
    """`obs_0 (59,), obs_1 (3, 84, 84)`: each input's row shape, for messages."""
    return ", ".join(f"{i.name} {i.shape}" for i in spec.inputs)


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
    if array is not None and array.dtype.kind in "iu" and not booleans:
        # through float64, as every other reading of a number: np.float32(json.loads(token))
        array = array.astype(np.float64)
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
    return (body.count(b'"') != 2 * len(strings)
            or body.count(b"u") + body.count(b"a") != letters)


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
    """The object of `pairs`; 422 naming the first key that repeats, in one pass over them."""
    document = dict(pairs)
    if len(document) < len(pairs):
        seen: set[str] = set()
        for repeated, _ in pairs:
            if repeated in seen:
                break
            seen.add(repeated)
        times = sum(key == repeated for key, _ in pairs)
        raise ApiError(422, "invalid_request", "each field may appear once in an object, "
                       f"received {shown(repeated, UNKNOWN_NAME_CHARS)} {times} times")
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
        raise ApiError(422, "invalid_shape", f"'{field}' {expected}")
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


