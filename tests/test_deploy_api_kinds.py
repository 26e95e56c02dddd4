"""`POST /v1/act` for every policy kind, without a cluster: several inputs by name, action
masks, recurrent memories, and what the API refuses about them (with its message)."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from deploy.serving.openapi import openapi_document
from deploy.serving.parsing import parse_act_request
from deploy.serving.responses import ApiError
from huggy_agent.formats import load_policy
from huggy_agent_client.spec import ActorSpec, ObservationInput
from tests.support.fixtures import fixtures_dir, mlagents_policy_files

PYRAMIDS = ActorSpec(tuple(ObservationInput(f"obs_{i}", (size,), "vector")
                           for i, size in enumerate((56, 56, 56, 4))), discrete_branches=(5,))
TARGET = ActorSpec((ObservationInput("obs_0", (27,), "vector"),
                    ObservationInput("obs_1", (12,), "vector")), discrete_branches=(3, 3, 2))
RECURRENT = ActorSpec((ObservationInput("obs_0", (8,), "vector"),), continuous_size=2,
                      memory_size=32)
VISUAL = ActorSpec((ObservationInput("obs_0", (1, 4, 5), "visual"),
                    ObservationInput("obs_1", (3,), "vector")), continuous_size=2,
                   discrete_branches=(3,))


def body(document: object) -> bytes:
    return json.dumps(document).encode()


def pyramids_inputs(rows: int | None) -> dict:
    def row(size: int, value: float) -> list:
        return [value] * size
    return {f"obs_{i}": (row(size, 0.1 * i) if rows is None else [row(size, 0.1 * i)] * rows)
            for i, size in enumerate((56, 56, 56, 4))}


def test_inputs_by_name_with_a_mask_per_row() -> None:
    mask = [[1, 0, 1, 1, 0], [True, True, False, False, True]]
    request = parse_act_request(body({"inputs": pyramids_inputs(2), "action_mask": mask,
                                      "seed": 4}), PYRAMIDS, 8)
    assert [a.shape for a in request.inputs] == [(2, 56), (2, 56), (2, 56), (2, 4)]
    assert not request.single and request.rows == 2 and request.seed == 4
    np.testing.assert_allclose(request.inputs[3], 0.3)
    np.testing.assert_array_equal(request.action_mask, np.array(mask, dtype=bool))


def test_one_row_with_one_mask_row() -> None:
    request = parse_act_request(body({"inputs": pyramids_inputs(None),
                                      "action_mask": [0, 0, 0, 1, 0]}), PYRAMIDS, 8)
    assert request.single and request.rows == 1
    assert request.action_mask.tolist() == [[False, False, False, True, False]]


def test_visual_inputs_keep_their_shape() -> None:
    image = np.arange(20, dtype=np.float32).reshape(1, 4, 5) / 20
    request = parse_act_request(body({"inputs": {"obs_0": [image.tolist()] * 3,
                                                 "obs_1": [[1, 2, 3]] * 3}}), VISUAL, 8)
    assert request.inputs[0].shape == (3, 1, 4, 5)
    np.testing.assert_array_equal(request.inputs[0][2], image)
    assert request.action_mask is None


def test_memory_rows_and_its_default() -> None:
    memory = (np.arange(64, dtype=np.float32).reshape(2, 32) / 64).tolist()
    request = parse_act_request(body({"obs": [[0.5] * 8] * 2, "memory": memory}), RECURRENT, 8)
    np.testing.assert_array_equal(request.memory, np.array(memory, np.float32))
    fresh = parse_act_request(body({"obs": [0.5] * 8}), RECURRENT, 8)
    assert fresh.memory.shape == (1, 32) and not fresh.memory.any()


REFUSALS = [
    ("obs-for-several-inputs", PYRAMIDS, {"obs": [0.5] * 56}, 422,
     "this policy has 4 observation inputs (obs_0 (56,), obs_1 (56,), obs_2 (56,), obs_3 (4,) -> "
     "discrete (5,)): send 'inputs' {obs_0, obs_1, obs_2, obs_3} instead of 'obs'"),
    ("both-obs-and-inputs", TARGET, {"obs": [1], "inputs": {}}, 422,
     "give exactly one of 'obs', 'inputs' and 'instances', received both: expected 'inputs' "
     "{obs_0, obs_1} or 'instances' [{obs_0, obs_1}, ...]"),
    ("inputs-missing-one", TARGET, {"inputs": {"obs_0": [0] * 27}}, 422,
     "'inputs' must be an object with exactly the fields ['obs_0', 'obs_1'], received ['obs_0']"),
    ("inputs-not-object", TARGET, {"inputs": [[0] * 27, [0] * 12]}, 422,
     "'inputs' must be an object with exactly the fields ['obs_0', 'obs_1'], received a list of 2"),
    ("input-wrong-size", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 11}}, 422,
     "'inputs.obs_1': obs_1: observation shape mismatch: expected (12,) or (N, 12)"),
    ("input-rows-differ", TARGET, {"inputs": {"obs_0": [[0] * 27] * 2, "obs_1": [[0] * 12] * 3}},
     422, "every input must be a single row, or every input a batch of the same number of rows; "
     "received obs_0 a batch of 2, obs_1 a batch of 3"),
    ("input-batch-and-row", TARGET, {"inputs": {"obs_0": [[0] * 27], "obs_1": [0] * 12}}, 422,
     "every input must be a single row, or every input a batch of the same number of rows; "
     "received obs_0 a batch of 1, obs_1 a single row"),
    ("boolean-in-input", TARGET, {"inputs": {"obs_0": [0] * 26 + [True], "obs_1": [0] * 12}},
     422, "'inputs.obs_0' must hold only numbers; received true"),
    ("string-in-input", TARGET, {"inputs": {"obs_0": [0] * 26 + ["1"], "obs_1": [0] * 12}},
     422, "'inputs.obs_0' must hold only numbers; received the string '1'"),
    ("nan-in-input", TARGET, {"inputs": {"obs_0": [0] * 26 + [float("nan")], "obs_1": [0] * 12}},
     422, "'inputs.obs_0': obs_0: observation must be finite"),
    ("too-many-rows", TARGET, {"inputs": {"obs_0": [[0] * 27] * 9, "obs_1": [[0] * 12] * 9}},
     413, "'inputs.obs_0' has 9 rows, the limit is 8 per request"),
    ("mask-wrong-width", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 12},
                                  "action_mask": [1] * 7}, 422,
     "action_mask must have shape (8,) or (N, 8)"),
    ("mask-empty-branch", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 12},
                                   "action_mask": [1, 1, 1, 0, 0, 0, 1, 1]}, 422,
     "branch 1 (actions 3-5) allows no action in row 0"),
    ("mask-values", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 12},
                             "action_mask": [1, 1, 2, 1, 1, 1, 1, 1]}, 422,
     "action_mask must hold booleans or 0/1 (1 = allowed), received 2 at column 2"),
    ("mask-fraction-in-rows", TARGET, {"inputs": {"obs_0": [[0] * 27] * 2, "obs_1": [[0] * 12] * 2},
                                       "action_mask": [[1] * 8, [1] * 5 + [0.5, 1, 1]]}, 422,
     "action_mask must hold booleans or 0/1 (1 = allowed), received 0.5 at row 1, column 5"),
    ("mask-string", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 12},
                             "action_mask": [1, 1, "yes", 1, 1, 1, 1, 1]}, 422,
     "'action_mask' must hold only numbers or booleans; received the string 'yes'"),
    ("mask-on-continuous", RECURRENT, {"obs": [0] * 8, "action_mask": [1, 1]}, 422,
     "this policy has no discrete actions, so action_mask must be None (in a request body null "
     "or absent), received an array of shape (2,)"),
    ("memory-wrong-size", RECURRENT, {"obs": [0] * 8, "memory": [0] * 31}, 422,
     "memory must have shape (32,) or (N, 32) with N = 1 rows, received (31,)"),
    ("memory-without-lstm", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 12},
                                     "memory": [0] * 4}, 422,
     "this policy has no recurrent memory, so memory must be None (in a request body null or "
     "absent), received an array of shape (4,)"),
    ("memory-boolean", RECURRENT, {"obs": [0] * 8, "memory": [0] * 31 + [False]}, 422,
     "'memory' must hold only numbers; received false"),
]


@pytest.mark.parametrize(("case", "spec", "document", "status", "message"), REFUSALS,
                         ids=[case[0] for case in REFUSALS])
def test_refusals_name_what_was_expected(case: str, spec: ActorSpec, document: dict,
                                         status: int, message: str) -> None:
    with pytest.raises(ApiError, match=re.escape(message)) as caught:
        parse_act_request(body(document), spec, 8)
    assert caught.value.status == status


def request_validator(spec: ActorSpec, max_rows: int) -> jsonschema.Draft202012Validator:
    """A validator of `POST /v1/act` bodies by the OpenAPI document of `spec`."""
    document = openapi_document(spec, max_rows, 1 << 20)
    schema = {"$ref": "#/components/schemas/ActRequest", "components": document["components"]}
    return jsonschema.Draft202012Validator(schema)


def accepted(document: dict, spec: ActorSpec, max_rows: int) -> bool:
    try:
        parse_act_request(body(document), spec, max_rows)
    except ApiError:
        return False
    return True


TARGET_ONE = {"obs_0": [0.5] * 27, "obs_1": [1] * 12}
TARGET_TWO = {"obs_0": [[0.5] * 27] * 2, "obs_1": [[1] * 12] * 2}
MASK = [1, 0, 0, 0, 1, 0, True, False]
# (id, spec, body): the document and the parser must agree on each, accepted or refused
AGREEMENT = [
    ("target-one-row", TARGET, {"inputs": TARGET_ONE, "action_mask": MASK}),
    ("target-mask-rows-differ", TARGET, {"inputs": TARGET_TWO, "action_mask": [MASK] * 3}),
    ("target-input-rows-differ", TARGET, {"inputs": {"obs_0": TARGET_TWO["obs_0"],
                                                     "obs_1": [[1] * 12] * 3}}),
    ("target-input-ranks-differ", TARGET, {"inputs": {"obs_0": TARGET_ONE["obs_0"],
                                                      "obs_1": [[1] * 12]}}),
    ("target-empty-branch", TARGET, {"inputs": TARGET_ONE, "action_mask": [1, 1, 1, 0, 0, 0,
                                                                           1, 1]}),
    ("target-mask-two", TARGET, {"inputs": TARGET_ONE, "action_mask": [2, 1, 1, 1, 1, 1, 1, 1]}),
    ("target-obs", TARGET, {"obs": [0.5] * 27}),
    ("target-too-many-rows", TARGET, {"inputs": {"obs_0": [[0] * 27] * 5,
                                                 "obs_1": [[0] * 12] * 5}}),
    ("target-memory", TARGET, {"inputs": TARGET_ONE, "memory": [0] * 4}),
    ("target-null-memory", TARGET, {"inputs": TARGET_ONE, "memory": None}),
    ("recurrent-inputs", RECURRENT, {"inputs": {"obs_0": [0.5] * 8}, "memory": [0.1] * 32}),
    ("recurrent-memory-rows-differ", RECURRENT, {"obs": [[0.5] * 8] * 3,
                                                 "memory": [[0.1] * 32] * 2}),
    ("recurrent-both", RECURRENT, {"obs": [0.5] * 8, "inputs": {"obs_0": [0.5] * 8}}),
    ("recurrent-neither", RECURRENT, {"seed": 3}),
    ("recurrent-empty", RECURRENT, {}),
    ("recurrent-mask", RECURRENT, {"obs": [0.5] * 8, "action_mask": [1, 1]}),
    ("recurrent-null-mask", RECURRENT, {"obs": [0.5] * 8, "action_mask": None}),
    ("recurrent-float32-max", RECURRENT, {"obs": [3.4028234663852886e38] * 8}),
    ("recurrent-beyond-float32", RECURRENT, {"obs": [3.5e38] + [0] * 7}),
    ("recurrent-seed-too-large", RECURRENT, {"obs": [0.5] * 8, "seed": 2**64}),
    ("recurrent-negative-offset", RECURRENT, {"obs": [0.5] * 8, "row_offset": -1}),
    ("visual-image-wrong", VISUAL, {"inputs": {"obs_0": [[[[0.5] * 5] * 3]],
                                               "obs_1": [[1, 2, 3]]}}),
    ("visual-boolean", VISUAL, {"inputs": {"obs_0": [[[0.5] * 5] * 4], "obs_1": [1, 2, True]}}),
    # the row form: one object per row
    ("target-instances", TARGET, {"instances": [{**TARGET_ONE, "action_mask": MASK}] * 2,
                                  "seed": 2**64 - 1, "row_offset": 3}),
    ("target-instances-mask-in-one", TARGET, {"instances": [{**TARGET_ONE, "action_mask": MASK},
                                                            TARGET_ONE]}),
    ("target-instances-null-mask", TARGET, {"instances": [{**TARGET_ONE, "action_mask": None}]}),
    ("target-instances-missing-input", TARGET, {"instances": [{"obs_0": [0.5] * 27}]}),
    ("target-instances-unknown-field", TARGET, {"instances": [{**TARGET_ONE, "seed": 1}]}),
    ("target-instances-memory", TARGET, {"instances": [{**TARGET_ONE, "memory": [0] * 4}]}),
    ("target-instances-too-many", TARGET, {"instances": [TARGET_ONE] * 5}),
    ("target-instances-empty", TARGET, {"instances": []}),
    ("target-instances-and-inputs", TARGET, {"instances": [TARGET_ONE], "inputs": TARGET_ONE}),
    ("target-instances-batch-inside", TARGET, {"instances": [TARGET_TWO]}),
    ("target-instances-empty-branch", TARGET, {"instances": [{**TARGET_ONE, "action_mask": [
        1, 1, 1, 0, 0, 0, 1, 1]}]}),
    ("recurrent-instances", RECURRENT, {"instances": [{"obs_0": [0.5] * 8, "memory": [0.1] * 32},
                                                      {"obs_0": [0.5] * 8, "memory": None},
                                                      {"obs_0": [0.5] * 8}]}),
    ("recurrent-instances-obs-key", RECURRENT, {"instances": [{"obs": [0.5] * 8}]}),
    ("recurrent-instances-null-mask-beside", RECURRENT, {"instances": [{"obs_0": [0.5] * 8}],
                                                         "action_mask": None}),
    ("target-instances-null-memory-beside", TARGET, {"instances": [TARGET_ONE], "memory": None}),
    ("target-instances-mask-beside", TARGET, {"instances": [TARGET_ONE], "action_mask": MASK}),
    ("visual-instances", VISUAL, {"instances": [{"obs_0": [[[0.5] * 5] * 4], "obs_1": [1, 2, 3],
                                                 "action_mask": [1, 0, 1]}] * 2}),
    ("visual-instances-image-row-short", VISUAL, {"instances": [{"obs_0": [[0.5] * 5] * 4,
                                                                 "obs_1": [1, 2, 3]}]}),
]
COLUMNAR_BATCHES = [
    ("target-two-rows-one-mask", TARGET, {"inputs": TARGET_TWO, "action_mask": MASK}),
    ("target-two-rows-two-masks", TARGET, {"inputs": TARGET_TWO, "action_mask": [MASK] * 2,
                                           "seed": 2**64 - 1, "row_offset": 3}),
    ("target-mask-batch-of-one-for-one-row", TARGET, {"inputs": TARGET_ONE,
                                                      "action_mask": [MASK]}),
    ("recurrent-obs", RECURRENT, {"obs": [[0.5] * 8] * 3, "memory": [[0.1] * 32] * 3}),
    ("recurrent-one-memory-for-rows", RECURRENT, {"obs": [[0.5] * 8] * 3, "memory": [0] * 32}),
    ("visual-rows", VISUAL, {"inputs": {"obs_0": [[[[0.5] * 5] * 4]] * 2,
                                        "obs_1": [[1, 2, 3]] * 2}, "action_mask": [[1, 0, 1]] * 2}),
]
"""Columnar batches of policies with several row-carrying fields: accepted (every field with the
same rows), but outside the document, which cannot say "the same length" in JSON Schema and
describes them in words (the row form, 'instances', is the documented way to send a batch)."""


@pytest.mark.parametrize(("case", "spec", "document"), AGREEMENT, ids=[c[0] for c in AGREEMENT])
def test_openapi_document_accepts_exactly_what_the_parser_accepts(
        case: str, spec: ActorSpec, document: dict) -> None:
    assert request_validator(spec, 4).is_valid(document) == accepted(document, spec, 4)


@pytest.mark.parametrize(("case", "spec", "document"), COLUMNAR_BATCHES,
                         ids=[c[0] for c in COLUMNAR_BATCHES])
def test_columnar_batches_are_accepted_and_described_in_words(
        case: str, spec: ActorSpec, document: dict) -> None:
    assert accepted(document, spec, 4) and not request_validator(spec, 4).is_valid(document)
    description = openapi_document(spec, 4, 1 << 20)["components"]["schemas"]["ActRequest"][
        "description"]
    assert "columnar batches, every field with the same rows, are accepted too" in description


def test_instances_give_the_arrays_of_the_columnar_form() -> None:
    """The row form is the columnar form transposed: the same arrays, masks (an instance without
    one allows every action) and memories (without one: zeros), and never a single row."""
    mask = [1, 0, 0, 0, 1, 0, 1, 0]
    rows = [{"obs_0": [0.25 * k] * 27, "obs_1": [k] * 12, "action_mask": mask} for k in range(3)]
    del rows[1]["action_mask"]
    by_rows = parse_act_request(body({"instances": rows, "seed": 5}), TARGET, 4)
    by_columns = parse_act_request(body({"inputs": {
        "obs_0": [row["obs_0"] for row in rows], "obs_1": [row["obs_1"] for row in rows]},
        "action_mask": [mask, [1] * 8, mask], "seed": 5}), TARGET, 4)
    assert not by_rows.single and by_rows.rows == 3 and by_rows.seed == 5
    for ours, theirs in zip(by_rows.inputs, by_columns.inputs, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(by_rows.action_mask, by_columns.action_mask)
    one = parse_act_request(body({"instances": [{"obs_0": [0.5] * 8}]}), RECURRENT, 4)
    assert not one.single and one.memory.shape == (1, 32) and not one.memory.any()


def test_openapi_document_shape_of_each_kind() -> None:
    """Cases the agreement test needs both ways: some accepted, some refused."""
    verdicts = [accepted(document, spec, 4) for _, spec, document in AGREEMENT]
    assert 5 < sum(verdicts) < len(verdicts) - 5
    document = openapi_document(VISUAL, 8, 1 << 20)
    schemas = document["components"]["schemas"]
    image = schemas["Row_obs_0"]
    assert (image["minItems"], image["items"]["minItems"], image["items"]["items"]["minItems"]) \
        == (1, 4, 5)
    assert set(schemas["ActResponse"]["properties"]) == {"continuous", "discrete", "model"}
    recurrent = openapi_document(RECURRENT, 8, 1 << 20)["components"]["schemas"]
    assert {"continuous", "actions", "memory"} <= set(recurrent["ActResponse"]["properties"])
    assert "security" not in document and "securitySchemes" not in document["components"]


def test_openapi_document_with_an_api_key_declares_bearer_on_all_but_healthz() -> None:
    document = openapi_document(RECURRENT, 8, 1 << 20, api_key=True)
    assert document["components"]["securitySchemes"] == {"bearer": {
        "type": "http", "scheme": "bearer", "description": document["components"][
            "securitySchemes"]["bearer"]["description"]}}
    assert document["security"] == [{"bearer": []}]
    assert document["paths"]["/v1/healthz"]["get"]["security"] == []
    for path in ("/v1/act", "/v1/info", "/v1/openapi.json"):
        (operation,) = document["paths"][path].values()
        assert "security" not in operation
        assert operation["responses"]["401"] == {"$ref": "#/components/responses/Unauthorized"}
    unauthorized = document["components"]["responses"]["Unauthorized"]
    assert unauthorized["headers"]["WWW-Authenticate"]["required"] is True


@pytest.mark.parametrize("path", [*mlagents_policy_files(), *sorted(
    fixtures_dir().glob("*/Huggy.onnx"))], ids=lambda path: f"{path.parent.name}/{path.name}")
def test_openapi_document_stays_small_at_any_row_limit(path) -> None:
    """Every fixture policy's document is at most 32 KB at the default limits, and the row
    limit changes only the numbers in it (no variant per row count)."""
    spec = load_policy(path).spec
    default = json.dumps(openapi_document(spec, 256, 1 << 20))
    assert len(default) <= 32 * 1024
    larger = json.dumps(openapi_document(spec, 4096, 1 << 20))
    assert len(larger) - len(default) <= 4 * default.count("256")


def test_a_large_integer_reads_as_the_float32_of_its_json_value_in_every_form() -> None:
    """2**60 + 2**36 + 1 lies just past a float32 halfway point: read straight from int64 it
    rounds up, read as JSON's value (a float64 first, as `np.float32(json.loads(token))`) it
    rounds down. Every form of the body reads it the same way, as the one-input `obs` does."""
    token = 2**60 + 2**36 + 1
    expected = np.float32(json.loads(str(token)))
    assert expected != np.array([token], dtype=np.int64).astype(np.float32)[0]  # the trap
    row = [token] + [0] * 26
    for document in ({"inputs": {"obs_0": row, "obs_1": [0] * 12}},
                     {"instances": [{"obs_0": row, "obs_1": [0] * 12}]}):
        request = parse_act_request(body(document), TARGET, 8)
        assert request.inputs[0][0, 0] == expected, document.keys()
