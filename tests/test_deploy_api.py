"""The serving rules that need no cluster: request parsing, batch settings, accelerator placement,
the Serve config file, and the remote client's failure modes. At the end, the hostile request
bodies once more, over real HTTP to real Serve on the session cluster, and a client that cannot
import torch acting through it."""

from __future__ import annotations

import json
import random
import re
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from deploy.placement import plan_placement, resolve_accelerator
from deploy.serving import parsing
from deploy.serving.parsing import parse_act_request, plain_one_row
from deploy.serving.responses import ApiError, act_response
from deploy.serving.routes import ApiKey, check_route
from huggy_agent import HuggyAgent
from huggy_agent.native import KERNELS
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent_client.http_api import load_api_key
from huggy_agent_client.remote import RemoteAgent, RemoteServerError
from huggy_agent_client.spec import ActorSpec, ObservationInput
from tests.support.client import actions_without_torch, assert_in_process_actions
from tests.support.fixtures import REPO_ROOT
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster

OBS = 59
ROW = [0.5] * OBS
SPEC = ActorSpec((ObservationInput("obs_0", (OBS,), "vector"),), continuous_size=21)


def body(document: object) -> bytes:
    return json.dumps(document).encode()


def test_parse_single_and_batch_keep_rank_and_values() -> None:
    rows = np.random.default_rng(0).standard_normal((3, OBS)).astype(np.float32)
    batch = parse_act_request(body({"obs": rows.tolist(), "seed": 7}), SPEC, 8)
    assert batch.obs.dtype == np.float32 and not batch.single
    np.testing.assert_array_equal(batch.obs, rows)  # float32 -> JSON -> float32 is exact
    assert (batch.deterministic, batch.seed, batch.row_offset) == (True, 7, 0)
    single = parse_act_request(body({"obs": ROW, "deterministic": False, "row_offset": 5}), SPEC, 8)
    assert single.single and single.obs.shape == (1, OBS)
    assert (single.deterministic, single.seed, single.row_offset) == (False, None, 5)


def test_both_readings_of_a_body_give_the_same_request() -> None:
    """A body that orjson reads and one that goes through the standard library's exact reading
    (here: a key written with a backslash escape) parse alike, integers beyond 64 bits too."""
    numbers = ["0.5", "-0", "1e-45", str(2**63), str(-2**63), str(10**30), "3.4028235e38",
               "12345678901234567890123"] + ["0.25"] * (OBS - 8)
    rows = "[" + ", ".join(numbers) + "], [" + ", ".join(reversed(numbers)) + "]"
    plain = f'{{"obs": [{rows}], "deterministic": false, "seed": null, "row_offset": 3}}'
    parsed = [parse_act_request(text.encode(), SPEC, 8)
              for text in (plain, plain.replace('"obs"', '"o\\u0062s"'))]
    for request in parsed:
        assert (request.single, request.deterministic, request.seed, request.row_offset) == (
            False, False, None, 3)
    np.testing.assert_array_equal(parsed[0].obs, parsed[1].obs)
    np.testing.assert_array_equal(parsed[0].obs[0], np.array(numbers, dtype=np.float64)
                                  .astype(np.float32))


def test_one_row_bodies_read_alike_plain_and_exactly_up_to_the_float32_limit() -> None:
    """The common body, one row with options (read by orjson in one pass), against the same
    body read exactly (a key with a backslash escape takes the standard library's reading and
    every check): the same request, the values those of numpy's float64 -> float32 cast, the
    largest magnitude that rounds to FLOAT32_MAX accepted, the smallest that rounds to
    infinity (2**128 - 2**103) refused with the same message."""
    below_overflow = float(np.nextafter(2.0**128 - 2.0**103, 0.0))
    numbers = ["0.5", "-0.0", "1e-45", str(2**63), str(-2**63), repr(below_overflow),
               repr(-below_overflow), "3.4028235e38", "7"] + ["0.25"] * (OBS - 9)
    for options in ('"deterministic": false, "seed": 18446744073709551615, "row_offset": 3',
                    '"seed": null', '"row_offset": 0, "deterministic": true'):
        plain = f'{{"obs": [{", ".join(numbers)}], {options}}}'
        parsed = [parse_act_request(text.encode(), SPEC, 8)
                  for text in (plain, plain.replace('"obs"', '"o\\u0062s"'))]
        for request in parsed:
            assert request.single and request.obs.shape == (1, OBS)
            assert request.obs.dtype == np.float32 and request.obs.flags.c_contiguous
            np.testing.assert_array_equal(request.obs[0], np.array(numbers, dtype=np.float64)
                                          .astype(np.float32))
        expected = json.loads(plain)
        assert {(r.deterministic, r.seed, r.row_offset) for r in parsed} == {
            (expected.get("deterministic", True), expected.get("seed"),
             expected.get("row_offset", 0))}
    overflow = ", ".join([repr(2.0**128 - 2.0**103)] + ["0.5"] * (OBS - 1))
    for text in (f'{{"obs": [{overflow}]}}', f'{{"o\\u0062s": [{overflow}]}}'):
        with pytest.raises(ApiError) as refused:
            parse_act_request(text.encode(), SPEC, 8)
        assert (refused.value.status, refused.value.kind) == (422, "non_finite")
        assert refused.value.message == (f"{NOT_FINITE} the number {2.0**128 - 2.0**103!r} at "
                                         "row 0, column 0")


EXPECTED_OBS = "expected [59 numbers] or [[59 numbers], ...]"
EXPECTED_BODY = 'expected a JSON object such as {"obs": [numbers]}'
NOT_NUMBERS = f"'obs' must hold only numbers, {EXPECTED_OBS}; received"
NOT_FINITE = "'obs' must hold finite float32 values (magnitude at most 3.4028235e+38), received"
TOO_DEEP = (f"request body is nested too deeply to read, {EXPECTED_BODY} (3 levels); received "
            "arrays or objects nested deeper than the parser's limit of about 1,000 levels")
NOT_UTF8 = f"request body must be JSON in UTF-8, {EXPECTED_BODY}; received"
HUGE = "Infinity or a number beyond float64's range"
SEED = "'seed' must be null or an integer in [0, 2**64), received"
ROW_OFFSET = "'row_offset' must be an integer in [0, 2**64), received"
ROW_TEXT = ", ".join(["0.5"] * OBS)
MAX_ROWS = 256


def nested(depth: int, inner: bytes = b"") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def obs_with(value: bytes, row: int, column: int, rows: int) -> bytes:
    """A body of `rows` observations, valid except for the raw JSON `value` at (row, column)."""
    cells = [b"0.5"] * OBS
    cells[column] = value
    listed = [b"[" + b", ".join(cells) + b"]" if i == row else f"[{ROW_TEXT}]".encode()
              for i in range(rows)]
    return b'{"obs": [' + b", ".join(listed) + b"]}"


def single_with(value: bytes, column: int = 0) -> bytes:
    """A body whose one observation is valid except for the raw JSON `value` at `column`."""
    cells = [b"0.5"] * OBS
    cells[column] = value
    return b'{"obs": [' + b", ".join(cells) + b"]}"


def with_field(name: str, raw: bytes) -> bytes:
    return b'{"obs": [' + ROW_TEXT.encode() + b'], "' + name.encode() + b'": ' + raw + b"}"


# (id, body, status, kind, message): every body gets its 4xx and a message naming what was
# expected and what was received (the message is matched from its start)
HOSTILE: list[tuple[str, bytes, int, str, str]] = [
    # not JSON, not UTF-8, nothing
    ("truncated", b"{", 400, "malformed_json", f"request body is not valid JSON, {EXPECTED_BODY}; "
     "received Expecting property name enclosed in double quotes"),
    ("not-json", b"not json", 400, "malformed_json", "request body is not valid JSON"),
    ("empty", b"", 400, "malformed_json",
     f"request body is empty, {EXPECTED_BODY}; received nothing"),
    ("whitespace", b" \n\t\r ", 400, "malformed_json",
     f"request body is empty, {EXPECTED_BODY}; received only whitespace (5 bytes)"),
    ("bytes-ff-fe", b"\xff\xfe{", 400, "malformed_json",
     f"{NOT_UTF8} UTF-16 or UTF-32 (the body starts with a byte-order mark)"),
    ("utf16-bom", json.dumps({"obs": ROW}).encode("utf-16"), 400, "malformed_json",
     f"{NOT_UTF8} UTF-16 or UTF-32 (the body starts with a byte-order mark)"),
    ("latin1", '{"obs": [0.5], "é": 1}'.encode("latin-1"), 400, "malformed_json",
     f"{NOT_UTF8} byte 0xe9 at position 16, not UTF-8"),
    ("utf8-bom", b"\xef\xbb\xbf" + body({"obs": ROW}), 400, "malformed_json",
     f"request body is not valid JSON, {EXPECTED_BODY}; received Unexpected UTF-8 BOM"),
    # nesting
    ("deep-500", nested(500), 422, "invalid_request",
     "request body must be a JSON object with an 'obs', 'inputs' or 'instances' field, received a list of 1"),
    ("deep-5000", nested(5000), 400, "malformed_json", TOO_DEEP),
    ("deep-objects-5000", b'{"obs": ' * 5000 + b"1" + b"}" * 5000, 400, "malformed_json",
     TOO_DEEP),
    ("obs-deep-500", b'{"obs": ' + nested(500) + b"}", 422, "invalid_shape",
     f"{NOT_NUMBERS} a list of 1 at row 0, column 0"),
    ("obs-deep-5000", b'{"obs": ' + nested(5000, b"1") + b"}", 400, "malformed_json", TOO_DEEP),
    ("obs-deep-5000-nan", b'{"obs": [NaN, ' + nested(5000) + b"]}", 400, "malformed_json",
     TOO_DEEP),
    ("obs-3-levels", body({"obs": [[ROW]]}), 422, "invalid_shape",
     f"{NOT_NUMBERS} a list of 59 at row 0, column 0"),
    # numbers out of range
    ("1e400", single_with(b"1e400"), 422, "non_finite", f"{NOT_FINITE} {HUGE} at row 0, column 0"),
    ("-1e400", obs_with(b"-1e400", row=1, column=3, rows=2), 422, "non_finite",
     f"{NOT_FINITE} -{HUGE} at row 1, column 3"),
    ("10**400", single_with(str(10**400).encode(), column=2), 422, "non_finite",
     f"{NOT_FINITE} {HUGE} at row 0, column 2"),
    ("-10**5000", single_with(b"-1" + b"0" * 5000), 422, "non_finite",
     f"{NOT_FINITE} -{HUGE} at row 0, column 0"),
    ("1e39", obs_with(b"1e39", row=1, column=58, rows=2), 422, "non_finite",
     f"{NOT_FINITE} the number 1e+39 at row 1, column 58"),
    ("NaN", single_with(b"NaN"), 422, "non_finite", f"{NOT_FINITE} NaN at row 0, column 0"),
    ("Infinity", single_with(b"-Infinity", column=1), 422, "non_finite",
     f"{NOT_FINITE} -{HUGE} at row 0, column 1"),
    # booleans, strings, null and objects in obs
    ("obs-true", body({"obs": True}), 422, "invalid_shape", f"'obs' {EXPECTED_OBS}, received true"),
    ("obs-all-false", body({"obs": [False] * OBS}), 422, "invalid_value",
     f"{NOT_NUMBERS} false at row 0, column 0"),
    ("bool-among-numbers", single_with(b"true", column=58), 422, "invalid_value",
     f"{NOT_NUMBERS} true at row 0, column 58"),
    ("bool-in-batch-row", obs_with(b"false", row=2, column=7, rows=3), 422, "invalid_value",
     f"{NOT_NUMBERS} false at row 2, column 7"),
    ("bool-beside-literal-fields",
     b'{"deterministic": false, "seed": null, "obs": [[' + ROW_TEXT.encode() + b"], [true"
     + b", 0.5" * (OBS - 1) + b"]]}", 422, "invalid_value", f"{NOT_NUMBERS} true at row 1, column 0"),
    ("numeric-string", single_with(b'"1.0"'), 422, "invalid_value",
     f"{NOT_NUMBERS} the string '1.0' at row 0, column 0"),
    ("string-in-batch", obs_with(b'"abc"', row=1, column=4, rows=2), 422, "invalid_value",
     f"{NOT_NUMBERS} the string 'abc' at row 1, column 4"),
    ("obs-string", body({"obs": "abc"}), 422, "invalid_shape",
     f"'obs' {EXPECTED_OBS}, received the string 'abc'"),
    ("null", single_with(b"null", column=3), 422, "invalid_value",
     f"{NOT_NUMBERS} null at row 0, column 3"),
    ("empty-object", single_with(b"{}"), 422, "invalid_value",
     f"{NOT_NUMBERS} an object with 0 field(s) at row 0, column 0"),
    ("object", single_with(b'{"x": 1}', column=5), 422, "invalid_value",
     f"{NOT_NUMBERS} an object with 1 field(s) at row 0, column 5"),
    ("number-as-row", body({"obs": [ROW, 0.5]}), 422, "invalid_shape",
     f"'obs' {EXPECTED_OBS}, received the number 0.5 as row 1"),
    # lone surrogates (orjson refuses them, the standard library reads them)
    ("surrogate-obs", b'{"obs": "\\ud800"}', 422, "invalid_shape",
     f"'obs' {EXPECTED_OBS}, received the string '\\ud800'"),
    ("surrogate-in-obs", single_with(b'"\\udc00"'), 422, "invalid_value",
     f"{NOT_NUMBERS} the string '\\udc00' at row 0, column 0"),
    ("surrogate-key", b'{"obs": [0.5], "\\ud800": 1}', 422, "invalid_request",
     "unknown field(s) '\\ud800'; expected only ['obs', 'inputs', 'instances', 'action_mask', "
     "'memory', 'deterministic', 'seed', 'row_offset', 'session']"),
    # fields
    ("duplicate-obs", b'{"obs": [1], "obs": [' + ROW_TEXT.encode() + b"]}", 422, "invalid_request",
     "each field may appear once in an object, received 'obs' 2 times"),
    ("duplicate-seed", with_field("seed", b'1, "seed": 2, "seed": 3'), 422, "invalid_request",
     "each field may appear once in an object, received 'seed' 3 times"),
    ("top-level-list", body([1, 2]), 422, "invalid_request",
     "request body must be a JSON object with an 'obs', 'inputs' or 'instances' field, received a list of 2"),
    ("top-level-null", b"null", 422, "invalid_request",
     "request body must be a JSON object with an 'obs', 'inputs' or 'instances' field, received null"),
    ("unknown-field", body({"ob": ROW}), 422, "invalid_request",
     "unknown field(s) 'ob'; expected only ['obs', 'inputs', 'instances', 'action_mask', "
     "'memory', 'deterministic', 'seed', 'row_offset', 'session']"),
    ("missing-obs", body({"deterministic": True}), 422, "invalid_request",
     "give exactly one of 'obs', 'inputs' and 'instances', received neither: expected 'obs' "
     "(its one input, (59,)) or 'inputs' {obs_0} or 'instances' [{obs_0}, ...]"),
    ("deterministic-string", body({"obs": ROW, "deterministic": "yes"}), 422, "invalid_request",
     "'deterministic' must be true or false, received the string 'yes'"),
    ("deterministic-1", body({"obs": ROW, "deterministic": 1}), 422, "invalid_request",
     "'deterministic' must be true or false, received the integer 1"),
    ("seed-negative", with_field("seed", b"-1"), 422, "invalid_request",
     f"{SEED} the integer -1"),
    ("seed-float", with_field("seed", b"1.5"), 422, "invalid_request", f"{SEED} the number 1.5"),
    ("seed-bool", with_field("seed", b"true"), 422, "invalid_request", f"{SEED} true"),
    ("seed-string", with_field("seed", b'"7"'), 422, "invalid_request", f"{SEED} the string '7'"),
    ("seed-2**64", with_field("seed", str(2**64).encode()), 422, "invalid_request",
     f"{SEED} the number 1.8446744073709552e+19"),
    ("seed-10**400", with_field("seed", str(10**400).encode()), 422, "invalid_request",
     f"{SEED} {HUGE}"),
    ("seed-10**5000", with_field("seed", b"1" + b"0" * 5000), 422, "invalid_request",
     f"{SEED} {HUGE}"),
    ("seed-NaN", with_field("seed", b"NaN"), 422, "invalid_request", f"{SEED} NaN"),
    ("row-offset-float", with_field("row_offset", b"2.5"), 422, "invalid_request",
     f"{ROW_OFFSET} the number 2.5"),
    ("row-offset-bool", with_field("row_offset", b"false"), 422, "invalid_request",
     f"{ROW_OFFSET} false"),
    ("row-offset-string", with_field("row_offset", b'"1"'), 422, "invalid_request",
     f"{ROW_OFFSET} the string '1'"),
    ("row-offset-huge", with_field("row_offset", b"1e300"), 422, "invalid_request",
     f"{ROW_OFFSET} the number 1e+300"),
    ("row-offset-null", with_field("row_offset", b"null"), 422, "invalid_request",
     f"{ROW_OFFSET} null"),
    # shapes and sizes
    ("58-numbers", body({"obs": [1.0] * 58}), 422, "invalid_shape",
     f"'obs' {EXPECTED_OBS}, received a list of 58 numbers"),
    ("ragged", body({"obs": [ROW, ROW[:-1]]}), 422, "invalid_shape",
     f"'obs' {EXPECTED_OBS}, received a list of 58 numbers as row 1"),
    ("empty-obs", body({"obs": []}), 422, "invalid_shape", f"'obs' {EXPECTED_OBS}, received an empty list"),
    ("long-flat-list", b'{"obs": [' + b"0.5, " * 99_999 + b"0.5]}", 422, "invalid_shape",
     f"'obs' {EXPECTED_OBS}, received a list of 100000 numbers"),
    ("too-many-rows", body({"obs": [ROW] * (MAX_ROWS + 1)}), 413, "too_many_rows",
     "'obs' has 257 rows, the limit is 256 per request; split it into several requests"),
]


@pytest.mark.parametrize(("raw", "status", "kind", "message"),
                         [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_hostile_bodies_get_their_4xx_and_message(raw: bytes, status: int, kind: str,
                                                  message: str) -> None:
    with pytest.raises(ApiError, match="^" + re.escape(message)) as caught:
        parse_act_request(raw, SPEC, MAX_ROWS)
    error = caught.value
    assert (error.status, error.kind) == (status, kind)
    assert json.loads(error.body()) == {"error": kind, "message": error.message}


def test_routes() -> None:
    check_route("/v1/act", "POST")
    check_route("/v1/info/", "GET")
    assert refused_route("/v2/act", "POST").status == 404
    error = refused_route("/v1/act", "GET")
    assert (error.status, error.message) == (405, "/v1/act expects POST, received GET")
    assert error.headers == {"Allow": "POST"}


def test_head_is_taken_wherever_get_is() -> None:
    """Load balancers and uptime probes send HEAD: answered as GET (the HTTP server leaves the
    body out); a route of POST still refuses it, and a 405 of a GET route allows both."""
    for path in ("/v1/healthz", "/v1/healthz/", "/v1/info", "/v1/models", "/v1/openapi.json"):
        assert check_route(path, "HEAD") == (path.rstrip("/"), None)
    for path in ("/v1/act", "/v1/models/r@10/act"):
        error = refused_route(path, "HEAD")
        assert (error.status, error.message) == (405, f"{path} expects POST, received HEAD")
        assert error.headers == {"Allow": "POST"}
    error = refused_route("/v1/healthz", "POST")
    assert (error.status, error.message) == (405, "/v1/healthz expects GET or HEAD, received POST")
    assert error.headers == {"Allow": "GET, HEAD"}
    assert refused_route("/v2/healthz", "HEAD").status == 404


def test_integral_numbers_count_as_integers_as_in_json_schema() -> None:
    request = parse_act_request(with_field("seed", b"7.0")[:-1] + b', "row_offset": 3e2}', SPEC, 8)
    assert (request.seed, request.row_offset) == (7, 300)
    assert isinstance(request.seed, int) and isinstance(request.row_offset, int)


def test_api_key_opens_every_route_but_healthz_only_to_the_bearer_of_the_key() -> None:
    key = ApiKey.of("s3cret key")
    assert "s3cret" not in repr(key)
    key.authorize("/v1/act", "Bearer s3cret key")
    key.authorize("/v1/act", "bearer   s3cret key ")
    key.authorize("/v1/healthz", None)
    key.authorize("/v1/healthz/", "Bearer wrong")
    for path, header, problem in [
        ("/v1/act", None, "no Authorization header"),
        ("/v1/info", "", "no Authorization header"),
        ("/v1/openapi.json", "Bearer wrong", "a wrong API key"),
        ("/v1/act", "Bearer s3cret key2", "a wrong API key"),
        ("/v1/act", "Basic czNjcmV0", "an Authorization header of scheme 'Basic'"),
        ("/v1/act", "Bearer ", "an Authorization header of scheme 'Bearer'"),
        ("/no/such/route", "Bearer wrong", "a wrong API key"),
    ]:
        with pytest.raises(ApiError) as refused:
            key.authorize(path, header)
        error = refused.value
        assert (error.status, error.kind) == (401, "unauthorized")
        assert error.message == ("this server requires its API key as 'Authorization: Bearer "
                                 f"<key>', received {problem}")
        assert error.headers == {"WWW-Authenticate": 'Bearer realm="huggy"'}
        assert "s3cret" not in error.body().decode()


def test_api_key_from_a_file_or_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("HUGGY_API_KEY", raising=False)
    assert load_api_key() is None
    monkeypatch.setenv("HUGGY_API_KEY", "from-env")
    assert load_api_key() == "from-env"
    path = tmp_path / "key"
    path.write_text("  from-file \nsecond line\n")
    assert load_api_key(path) == "from-file"
    path.write_text("\n \n")
    with pytest.raises(ValueError, match=re.escape(f"API key file {str(path)!r} is empty")):
        load_api_key(path)


def refused_route(path: str, method: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        check_route(path, method)
    return caught.value


def test_act_response_is_exact_and_keeps_rank() -> None:
    actions = np.random.default_rng(1).uniform(-1, 1, (2, 21)).astype(np.float32)
    batch = json.loads(act_response({"continuous": actions}, False, "abc"))
    assert batch["model"] == "abc"
    np.testing.assert_array_equal(np.asarray(batch["continuous"], dtype=np.float32), actions)
    assert batch["actions"] == batch["continuous"]  # continuous-only: the name clients know
    single = json.loads(act_response({"continuous": actions[:1]}, True, "abc"))
    assert np.asarray(single["continuous"]).shape == (21,)
    hybrid = json.loads(act_response({"continuous": actions, "discrete": np.array([[2], [0]])},
                                     False, "abc"))
    assert hybrid["discrete"] == [[2], [0]] and "actions" not in hybrid


def test_batch_settings_validation() -> None:
    from deploy.serving.settings import BatchSettings

    settings = BatchSettings.from_config({"max_batch_size": 64, "max_rows": 64})
    assert (settings.max_batch_size, settings.max_rows) == (64, 64)
    for config, message in [
        ({"max_batch": 3}, "unknown batch setting(s) ['max_batch']"),
        ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, received 0"),
        ({"batch_wait_timeout_s": -1}, "batch_wait_timeout_s must be a number in [0, 10]"),
        ({"max_batch_size": 8, "max_rows": 9}, "max_rows (9) must not exceed max_batch_size (8)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            BatchSettings.from_config(config)


HEAD = {"CPU": 2.0, "NPU": 1.0, "memory": 1e9}
WORKER = {"CPU": 2.0, "worker_node": 1.0}


def test_placement_per_accelerator() -> None:
    npu = plan_placement("npu", 1.0, 1, [HEAD, WORKER])
    assert npu.ray_actor_options() == {"num_cpus": 1.0, "resources": {"NPU": 1}}
    assert npu.device == "npu:0"
    gpu = plan_placement("gpu", 0.5, 2, [{"CPU": 4.0, "GPU": 2.0}])
    assert gpu.ray_actor_options() == {"num_cpus": 0.5, "num_gpus": 1}
    assert gpu.device == "cuda:0"
    assert plan_placement("cpu", 1.0, 3, [HEAD, WORKER]).device == "cpu"
    assert resolve_accelerator("auto", {"CPU": 4, "NPU": 1, "GPU": 1}) == "npu"
    assert resolve_accelerator("auto", {"CPU": 4, "GPU": 1}) == "gpu"
    assert resolve_accelerator("auto", {"CPU": 4}) == "cpu"
    with pytest.raises(ValueError, match="unknown accelerator 'tpu'; expected one of auto, cpu"):
        resolve_accelerator("tpu", {})


def test_placement_reports_why_replicas_cannot_start() -> None:
    with pytest.raises(RuntimeError, match=re.escape(
            "cannot start 2 replicas on accelerator 'npu': each needs {CPU: 1, NPU: 1}, so 2 "
            "need NPU: 2, and the cluster has NPU: 1 in total")):
        plan_placement("npu", 1.0, 2, [HEAD, WORKER])
    with pytest.raises(RuntimeError, match=re.escape(
            "cannot start a replica on accelerator 'gpu': each replica needs {CPU: 1, GPU: 1}, "
            "and no node has that (nodes: {CPU: 2, GPU: 0}; {CPU: 2, GPU: 0})")):
        plan_placement("gpu", 1.0, 1, [HEAD, WORKER])
    with pytest.raises(RuntimeError, match="no node has that"):
        plan_placement("cpu", 3.0, 1, [HEAD, WORKER])


def test_serve_config_file_is_valid_and_builds() -> None:
    from ray.serve.schema import ServeDeploySchema

    from deploy.serving.app import build_app
    from deploy.serving.server import BUNDLED_HAPROXY_ENV, ingress_env_vars
    from deploy.serving.settings import AppArgs

    config = yaml.safe_load(Path(REPO_ROOT, "deploy", "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    flags = dict(schema.controller_options.runtime_env["env_vars"])
    # Ray 2.56's switch to Ray's own HAProxy binary, which `huggy serve` sets where it does
    # not run HAProxy through its wrapper
    assert flags.pop(BUNDLED_HAPROXY_ENV) == "1"
    served = ingress_env_vars("haproxy", 8000)  # what `huggy serve` sets, but for its files
    assert flags == {name: served[name] for name in flags}
    assert {"RAY_SERVE_HAPROXY_RETRY_ON", "RAY_SERVE_HAPROXY_MAXCONN",
            "RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S"} <= set(flags)
    (application,) = schema.applications
    assert application.import_path == "deploy.serving.app:app"
    args = AppArgs.model_validate({**application.args, "accelerator": "npu"})
    built = build_app(args, nodes=[HEAD, WORKER])
    deployment = built._bound_deployment
    assert deployment.ray_actor_options["resources"] == {"NPU": 1}
    assert deployment.init_args[0] == "npu:0"
    with pytest.raises(ValueError, match="accelerator"):
        AppArgs.model_validate({"accelerator": "tpu"})


def test_remote_agent_gives_up_after_retries_with_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(RemoteServerError, match=re.escape(f"GET {url}/v1/models failed after 3 "
                                                          "attempt(s)")):
        RemoteAgent(url, timeout=2, retries=2, backoff=0.01)


def test_app_builder_replicas_and_autoscaling() -> None:
    from deploy.serving.app import build_app
    from deploy.serving.settings import AppArgs

    folder = "/tmp/huggy-haproxy-8000"
    fixed = build_app(AppArgs(accelerator="cpu", replicas=3, haproxy_folder=folder),
                      nodes=[HEAD, WORKER])
    assert fixed._bound_deployment._deployment_config.num_replicas == 3
    assert fixed._bound_deployment.init_args[-2:] == (folder, "/")  # the own listener
    scaled = build_app(AppArgs(accelerator="cpu", autoscale=True, max_replicas=5,
                               haproxy_folder=folder), nodes=[HEAD, WORKER])
    # Serve's autoscaler counts the requests that Serve's HTTP server hands over: no listener
    assert scaled._bound_deployment.init_args[-2] is None
    autoscaling = scaled._bound_deployment._deployment_config.autoscaling_config
    assert (autoscaling.min_replicas, autoscaling.max_replicas) == (1, 5)
    assert scaled._bound_deployment.user_config["max_batch_size"] == 256
    with pytest.raises(RuntimeError, match="cannot start 5 replicas"):
        build_app(AppArgs(accelerator="cpu", replicas=5), nodes=[HEAD, WORKER])


@pytest.fixture(scope="module")
def served_url(ray_cluster: RayCluster) -> Iterator[str]:
    """The bundled policy behind real Serve (default ingress) on the session cluster."""
    from deploy.serving.server import DEFAULT_INGRESS, deploy, start_serve, stop_serve
    from deploy.serving.settings import AppArgs

    port = free_port()
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    try:
        deploy(AppArgs(accelerator="cpu", num_cpus=0.5, ingress=DEFAULT_INGRESS), timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_serve(port)


def test_hostile_bodies_over_http_get_their_4xx_and_the_server_stays_healthy(
        served_url: str) -> None:
    expected, answered = {}, {}
    with requests.Session() as session:
        for name, raw, status, kind, _ in HOSTILE:
            with pytest.raises(ApiError) as local:
                parse_act_request(raw, SPEC, MAX_ROWS)
            expected[name] = (status, {"error": kind, "message": local.value.message})
            response = session.post(f"{served_url}/v1/act", data=raw, timeout=60)
            try:
                answered[name] = (response.status_code, response.json())
            except ValueError:  # not JSON: keep the text for the failure message
                answered[name] = (response.status_code, response.text[:300])
        assert answered == expected
        health = session.get(f"{served_url}/v1/healthz", timeout=30)
        assert health.status_code == 200
        head = session.head(f"{served_url}/v1/healthz", timeout=30)  # as a probe sends it
        assert (head.status_code, head.content) == (200, b"")
        assert head.headers["content-type"] == health.headers["content-type"]
        assert int(head.headers["content-length"]) == len(health.content)
        obs = np.random.default_rng(4).standard_normal((3, OBS)).astype(np.float32)
        good = session.post(f"{served_url}/v1/act", data=body({"obs": obs.tolist()}), timeout=30)
        assert good.status_code == 200
        np.testing.assert_allclose(np.asarray(good.json()["actions"], dtype=np.float32),
                                   HuggyAgent(device="cpu").compute_action(obs), rtol=0,
                                   atol=FP32_ACTION_ATOL)


def test_clients_that_leave_mid_body_over_http_are_counted_and_the_server_serves_on(
        served_url: str) -> None:
    """Each client sends half its declared body and closes: the replica counts each one as
    disconnected (none as a request or a rejection) and answers the next request. The client
    waits for `100 Continue`, which the replica's listener sends once it has the request's
    headers (uvicorn, through Serve's server: when the replica first reads the body), so that
    the replica has its request before the client leaves."""
    host, port = served_url.removeprefix("http://").split(":")
    info = f"{served_url}/v1/info"
    before = requests.get(info, timeout=30).json()["counters"]
    half = body({"obs": [0.5] * OBS})[:200]
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=30) as client:
            client.sendall(b"POST /v1/act HTTP/1.1\r\nHost: test\r\nContent-Type: application/json"
                           b"\r\nContent-Length: 2000\r\nExpect: 100-continue\r\n\r\n")
            assert client.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n")
            client.sendall(half)
            client.shutdown(socket.SHUT_WR)
            while client.recv(4096):  # until the server side closes too
                pass
    deadline = time.monotonic() + 60
    while (after := requests.get(info, timeout=30).json()["counters"])["disconnected"] < (
            before["disconnected"] + 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after["disconnected"] - before["disconnected"] == 3
    assert (after["requests"], after["rejected"]) == (before["requests"], before["rejected"])
    obs = np.zeros(OBS, np.float32)
    good = requests.post(f"{served_url}/v1/act", data=body({"obs": obs.tolist()}), timeout=30)
    np.testing.assert_allclose(np.asarray(good.json()["actions"], np.float32),
                               HuggyAgent(device="cpu").compute_action(obs), rtol=0,
                               atol=FP32_ACTION_ATOL)


def test_a_client_without_torch_gets_the_in_process_actions_from_serve(served_url: str) -> None:
    """`RemoteAgent` in a fresh interpreter where torch, onnx, onnxruntime and orjson cannot be
    imported, as a user of huggy-agent-client alone has it, against real Serve."""
    obs = np.random.default_rng(8).standard_normal((5, OBS)).astype(np.float32)
    answers = actions_without_torch(served_url, obs)
    assert_in_process_actions(answers, obs)


def test_banner_names_who_answers_v1_act() -> None:
    """With a split, the start-up line gives the split's shares, not a default that /v1/act
    would not answer with."""
    from deploy.serving.catalogue import PolicyEntry, PolicySet
    from deploy.serving.server import banner

    spec = ActorSpec((ObservationInput("obs_0", (59,), "vector"),), continuous_size=21)
    entries = [PolicyEntry(id=i, path=f"/p/{i}.onnx", source=f"/p/{i}.onnx",
                           interface=spec.describe(), spec=spec.as_dict(), fingerprint=i)
               for i in ("run@100", "run@200")]
    split = banner(PolicySet.build(entries, split="run@100=3,run@200=1"), "127.0.0.1", 8000,
                   "haproxy", None, "replica")
    assert "/v1/act split by session: run@100 75%, run@200 25%" in split
    assert "answers with" not in split
    assert "gRPC" not in split
    default = banner(PolicySet.build(entries, default="run@200"), "127.0.0.1", 8000, "proxy",
                     9000, "replica")
    assert ("huggy serve: 2 policies served at http://127.0.0.1:8000/v1/act (ingress proxy, gRPC "
            "/huggy.v1.Policy/Act on 127.0.0.1:9000 by replica); /v1/act answers with run@200"
            ) in default


def test_app_arguments_are_refused_in_plain_words() -> None:
    from deploy.serving.settings import app_args

    for values, expected in (({"replicas": 0}, "replicas: Input should be greater than or "
                                                "equal to 1"),
                             ({"max_rows": 300}, "max_rows (300) must not exceed max_batch_size "
                                                 "(256): a request is never split over batches"),
                             ({"max_ongoing_requests": 0}, "max_ongoing_requests: Input should "
                                                           "be greater than or equal to 1")):
        with pytest.raises(ValueError) as refused:
            app_args(**values)
        assert str(refused.value) == expected
        assert "pydantic" not in str(refused.value)


@pytest.fixture(params=["compiled", "numpy"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """`plain_one_row` with each of its readers: the compiled one (huggy_agent.native, where it
    was built) and orjson with numpy (where it was not)."""
    if request.param == "numpy":
        monkeypatch.setattr(parsing, "KERNELS", None)
    elif KERNELS is None:
        pytest.skip("the compiled kernels were not built (no C compiler at install)")
    return request.param


@pytest.mark.parametrize("raw", [case[1] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_the_one_pass_reader_leaves_every_refused_body_to_the_full_checks(
        raw: bytes, reader: str) -> None:
    assert plain_one_row(raw, SPEC) is None


def test_the_one_pass_reader_leaves_a_value_beyond_float32_anywhere_in_the_row(
        reader: str) -> None:
    # 2**128 - 2**103 is the least magnitude that rounds to infinity in float32 (halfway past
    # its largest); the largest float32 beside it keeps the other values as big as they come.
    largest = repr(float(np.finfo(np.float32).max))
    for column in range(OBS):
        for overflow in (2.0**128 - 2.0**103, -(2.0**128 - 2.0**103)):
            numbers = [largest] * OBS
            numbers[column] = repr(overflow)
            text = f'{{"obs": [{", ".join(numbers)}]}}'.encode()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow in the cast
                assert plain_one_row(text, SPEC) is None, column
    accepted = plain_one_row(f'{{"obs": [{", ".join([largest] * OBS)}]}}'.encode(), SPEC)
    assert accepted is not None and (accepted.obs == np.finfo(np.float32).max).all()


def float32_of_json_number(text: str) -> np.float32:
    """What the full reading makes of one JSON number: Python's int or float of it (correctly
    rounded), then numpy's cast to float32 through float64."""
    value = int(text) if text.lstrip("-").isdigit() else float(text)
    return np.array([value], dtype=np.float64).astype(np.float32)[0]


@pytest.mark.skipif(KERNELS is None, reason="the compiled kernels were not built (no C compiler "
                    "at install)")
def test_the_compiled_reader_rounds_every_number_as_the_full_reading_does() -> None:
    """`json_obs_row` bit for bit against Python's reading and numpy's cast (signed zeros
    included), over numbers that take its fast path (up to 19 digits, exponent within 22) and
    the ones it must hand to strtod: float32 halfway points written exactly (an integer such as
    2**24 + 1 of few digits, and a 25-digit decimal), numbers within 2**-48 of one, which round
    to float64 first (16777217.000000001 is float64's 16777217.0, so float32's 16777216), long
    significands, exponents past 22, subnormals and the overflow edge; then 4,000 random float32
    values as Python writes them and to 9 digits."""
    halfway = 1 + 2.0**-24  # between 1 and float32's next value: exactly 25 decimal digits
    tokens = ["0", "-0", "0.0", "-0.0", "-0e-5", "0E+3", "7", "-7", "0.5", "1e-45", "7e-46",
              "-7e-46", "1e-400", "-1e-400", "0.1", "1E22", "1e23", "4.5e-23", "16777217",
              "-16777217", "16777219", "1073741888", "1.6777217e7", "16777217.000000001",
              f"{halfway:.24f}", f"{np.nextafter(halfway, 2):.25f}", "9007199254740993",
              str(2**64 - 1), str(2**64), str(10**30), "3.4028235e38",
              repr(float(np.nextafter(2.0**128 - 2.0**103, 0.0))),
              "1.00000000000000000000000000001", "0." + "0" * 40 + "123",
              # 16 to 19 digits a few float64 steps from a float32 halfway point: w * 10**e
              # lands on its other side (found by removing the check)
              "1.109804096000000089e+9", "1.079502148437499945e+5", "4.614927893271669474e-4",
              "3.575167590400000381e+10", "6.14971424000000060e+8", "1.5072121186676669e-5"]
    bits = np.random.default_rng(5).integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[np.isfinite(values)]
    tokens += [repr(float(v)) for v in values[:2000]] + [f"{v:.9g}" for v in values[2000:]]
    row = np.empty((1, OBS), np.float32)
    for start in range(0, len(tokens), OBS):
        chunk = (tokens[start:start + OBS] * OBS)[:OBS]
        text = f'{{"obs": [{", ".join(chunk)}]}}'.encode()
        assert KERNELS.json_obs_row(text, row) == (True, None, 0)
        expected = np.array([float32_of_json_number(t) for t in chunk], dtype=np.float32)
        mismatched = np.flatnonzero(row[0].view(np.uint32) != expected.view(np.uint32))
        assert not mismatched.size, [(chunk[i], row[0][i], expected[i]) for i in mismatched]
        full = parse_act_request(text, SPEC, 8).obs[0]  # the full reading agrees, bit for bit
        assert (full.view(np.uint32) == expected.view(np.uint32)).all()


@pytest.mark.skipif(KERNELS is None, reason="the compiled kernels were not built (no C compiler "
                    "at install)")
def test_the_compiled_reader_takes_json_s_grammar_and_leaves_the_rest() -> None:
    """Whitespace anywhere between tokens and the keys in any order are read; what is not JSON
    (leading zeros, a bare point, a plus sign, hex, NaN), a key with an escape or out of the
    common form, a repeated key, an integer option written as a float or out of [0, 2**64), a
    row of the wrong length and anything after the object are left to the full reading."""
    values = ["0.25"] * (OBS - 1)
    row = np.empty((1, OBS), np.float32)

    def read(text: str) -> tuple | None:
        return KERNELS.json_obs_row(text.encode(), row)

    spaced = f' \t{{\r\n"seed" : 9 ,\t"obs":[ 2 ,{",".join(values)} ] , "row_offset":4,' \
             f'"deterministic" :false }}\n '
    assert read(spaced) == (False, 9, 4) and row[0, 0] == 2 and (row[0, 1:] == 0.25).all()
    assert read(f'{{"obs": [1, {", ".join(values)}], "seed": null, "deterministic": true}}') == (
        True, None, 0)
    for number in ("01", "1.", ".5", "+1", "1e", "1e+", "-", "0x10", "NaN", "-Infinity",
                   "1_0", "true", '"1"', "null", "[1]", "1" * 65):
        assert read(f'{{"obs": [{number}, {", ".join(values)}]}}') is None, number
    row_text = ", ".join(["0.5"] * OBS)
    for tail in (', "seed": 7.0', ', "seed": -1', f', "seed": {2**64}', ', "row_offset": 1e2',
                 ', "deterministic": 1', ', "session": "u"', ', "obs": [1]', ', "seed": 01'):
        assert read(f'{{"obs": [{row_text}]{tail}}}') is None, tail
    for text in (f'{{"o\\u0062s": [{row_text}]}}', f'{{"obs": [{row_text}]}} x',
                 f'{{"obs": [{row_text}, 0.5]}}', f'{{"obs": [{row_text}],}}',
                 f'{{"obs": [{", ".join(["0.5"] * (OBS - 1))}]}}', '{"seed": 1}', "{}", "[]"):
        assert read(text) is None, text
    # An exponent of more digits than it reads is declined, even where a long fraction would
    # bring the number back within the fast path's range (this one is infinite in float32).
    huge = f'{{"obs": [0.{"0" * 99_999}1e1000009, {", ".join(values)}]}}'
    assert read(huge) is None and read(huge.replace("e1000009", "e99999")) is not None
    with pytest.raises(ApiError, match="finite"):
        parse_act_request(huge.encode(), SPEC, 8)
    with pytest.raises(ValueError, match="float32"):
        KERNELS.json_obs_row(b'{"obs": [1]}', np.empty(1, np.float64))


EDIT_TOKENS = [b"-", b"+", b".", b"0", b"1", b"9", b"e", b"E", b"e-", b"E+", b",", b" ", b"\t",
               b"\n", b"[", b"]", b"{", b"}", b'"', b":", b"\\", b"\\u0062", b"true", b"false",
               b"null", b"NaN", b"Infinity", b"\x00", b"\xff", b"\xc3\xa9", b'"seed": 7, ',
               b'"seed": null, ', b'"row_offset": 1, ', b'"deterministic": false, ',
               b'"session": "u", ', b'"obs": [1], ', b"1e22", b"1e23", b"7e-46", b"3.4028235e38",
               b"3.4028236e38", b"16777217", b"9007199254740993", b"18446744073709551616",
               b"e99999", b"e100000", b"0" * 30, b"9" * 25]
"""What `mutated` splices into a body: JSON's tokens, keys, and numbers at the compiled reader's
edges (float32's overflow, 2**24 + 1, the fast path's exponent 22, 2**64, the exponent it
declines, long significands)."""


def mutated(body: bytes, rng: random.Random) -> bytes:
    """`body` after one to three random edits: a span of 1 to 3 bytes deleted, a token of
    EDIT_TOKENS inserted, a byte replaced by one of those tokens' first bytes, a span of up to 12
    bytes repeated in place, or a digit inserted 1 to 25 times."""
    data = bytearray(body)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data) + 1)
        edit = rng.randrange(5)
        if edit == 0:
            del data[at:at + rng.randint(1, 3)]
        elif edit == 1:
            data[at:at] = rng.choice(EDIT_TOKENS)
        elif edit == 2 and at < len(data):
            data[at] = rng.choice(EDIT_TOKENS)[0]
        elif edit == 3:
            data[at:at] = data[at:at + rng.randint(1, 12)]
        else:
            data[at:at] = bytes([rng.choice(b"0123456789")]) * rng.randint(1, 25)
    return bytes(data)


def leaves_to_the_full_reading(body: bytes) -> bool:
    """Whether `body` holds a form that the compiled reader leaves to the full reading although
    that reads it: an exponent of 100000 or more, a number over 64 characters, or a seed or
    row_offset with a sign, fraction or exponent (JSON Schema counts 7.0 and -0 as integers)."""
    numbers = list(re.finditer(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?(\d+))?", body))
    return (any(number[1] is not None and int(number[1]) >= 100_000 for number in numbers)
            or any(len(number[0]) > 64 for number in numbers)
            or re.search(rb'"(?:seed|row_offset)"\s*:\s*(?:-|\d+[.eE])', body) is not None)


@pytest.mark.skipif(KERNELS is None, reason="the compiled kernels were not built (no C compiler "
                    "at install)")
def test_the_compiled_reader_agrees_with_the_full_reading_on_mutated_bodies() -> None:
    """3,000 bodies mutated from the fuzz target's seed bodies (fuzz/corpus: real bodies as
    `RemoteAgent` sends them and edge cases), each read for the row length of the body it came
    from. Wherever `json_obs_row` accepts one, the full reading (`parse_act_request`) reads one
    row with the same options and the same floats bit for bit, and so does the orjson and numpy
    reader (`_plain_one_row_numpy`) wherever that accepts. Where the full reading accepts a
    single row that the compiled reader declines, the body holds a form it leaves on purpose
    (`leaves_to_the_full_reading`). And the full reading answers every body or raises ApiError."""
    seeds = []
    for path in sorted((REPO_ROOT / "fuzz" / "corpus").glob("*.json")):
        body = path.read_bytes()
        seeds.append((body, np.size(json.loads(body)["obs"])))
    assert len(seeds) >= 5
    rng = random.Random(11)
    accepted = declined_by_design = 0
    for _ in range(3000):
        original, size = rng.choice(seeds)
        body = mutated(original, rng)
        spec = ActorSpec((ObservationInput("obs_0", (size,), "vector"),), continuous_size=2)
        row = np.empty((1, size), np.float32)
        options = KERNELS.json_obs_row(body, row)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow in the cast
            try:
                full = parse_act_request(body, spec, 8)
            except ApiError:
                full = None
            plain = parsing._plain_one_row_numpy(body, size)
        one_row = full is not None and full.single and full.session is None
        if options is not None:
            accepted += 1
            assert one_row, body
            assert (full.deterministic, full.seed, full.row_offset) == options, body
            assert (full.obs.view(np.uint32) == row.view(np.uint32)).all(), body
        elif one_row:
            declined_by_design += 1
            assert leaves_to_the_full_reading(body), body
        if plain is not None:
            assert one_row, body
            assert (plain.deterministic, plain.seed, plain.row_offset) == (
                full.deterministic, full.seed, full.row_offset), body
            assert (plain.obs.view(np.uint32) == full.obs.view(np.uint32)).all(), body
    assert accepted >= 100 and declined_by_design >= 1  # the edits reach both sides


def test_the_one_pass_reader_reads_the_common_body_as_the_full_checks_do(reader: str) -> None:
    below_overflow = float(np.nextafter(2.0**128 - 2.0**103, 0.0))
    numbers = ["0.5", "-0.0", "1e-45", str(2**63), str(-2**63), repr(below_overflow),
               repr(-below_overflow), "3.4028235e38", "7"] + ["0.25"] * (OBS - 9)
    for options in ("", ', "deterministic": false, "seed": 18446744073709551615, "row_offset": 3',
                    ', "seed": null', ', "row_offset": 0, "deterministic": true', ', "seed": 0'):
        text = f'{{"obs": [{", ".join(numbers)}]{options}}}'.encode()
        fast, full = plain_one_row(text, SPEC), parse_act_request(text, SPEC, 8)
        assert fast is not None and fast.single and fast.obs.shape == (1, OBS)
        assert fast.obs.dtype == np.float32 and fast.obs.flags.c_contiguous
        np.testing.assert_array_equal(fast.obs[0], np.array(numbers, dtype=np.float64)
                                      .astype(np.float32))
        assert (fast.deterministic, fast.seed, fast.row_offset, fast.session) == (
            full.deterministic, full.seed, full.row_offset, full.session)
    # Accepted bodies outside the common form are left to the full reading.
    row = ", ".join(["0.5"] * OBS)
    for text in (f'{{"obs": [{row}], "seed": 7.0}}', f'{{"obs": [{row}], "session": "u"}}',
                 f'{{"o\\u0062s": [{row}]}}', f'{{"obs": [[{row}]]}}',
                 f'{{"obs": [{row}], "deterministic": false, "deterministic": true}}'):
        assert plain_one_row(text.encode(), SPEC) is None
    assert parse_act_request(f'{{"obs": [{row}], "seed": 7.0}}'.encode(), SPEC, 8).seed == 7


def test_many_fields_with_a_repeat_are_refused_naming_a_few_and_the_repeat_in_one_pass() -> None:
    """40,000 unknown fields, the last one repeated (0.43 MB): 422 naming five of them and how
    many more, quoted short. The repeat alone, among 100,000 fields read by the exact reader,
    is named with its count: found in one pass over them (a count per field would compare
    them 5e9 times, past the suite's timeout)."""
    names = [f"k{index:05d}" for index in range(40_000)]
    document = "{" + ",".join(f'"{name}": 1' for name in [*names, names[-1]]) + "}"
    with pytest.raises(ApiError) as refused:
        parse_act_request(document.encode(), SPEC, 256)
    assert refused.value.status == 422
    message = refused.value.message
    assert message.startswith("unknown field(s) 'k00000', 'k00001', 'k00002', 'k00003', "
                              "'k00004' and 39,995 more; expected only")
    assert len(message) < 300
    repeated = "{" + ",".join(f'"f{index}": 1' for index in range(100_000)) + ', "f99999": 2}'
    with pytest.raises(ApiError) as refused:
        parsing._exact_json(repeated.encode())
    assert refused.value.message == ("each field may appear once in an object, received "
                                     "'f99999' 2 times")


def test_a_500_names_its_exception_cut_short() -> None:
    """The exception's `repr` as it is (quotes kept, not escaped twice), at most 200
    characters of it: an exception's text may quote what a client sent."""
    from deploy.serving.responses import internal_error

    short = internal_error(RuntimeError("one request's heads"))
    assert (short.status, short.message) == (
        500, 'the server failed to answer: RuntimeError("one request\'s heads")')
    long = internal_error(ValueError("x" * 5000))
    assert long.message == ("the server failed to answer: ValueError('" + "x" * 188
                            + "... and 4,814 more")
