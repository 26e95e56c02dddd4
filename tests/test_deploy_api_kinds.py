"""`POST /v1/act` for every policy kind, without a cluster: several inputs by name, action
masks, recurrent memories, and what the API refuses about them (with its message)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from deploy.api import ApiError, openapi_document, parse_act_request
from huggy_agent.spec import ActorSpec, ObservationInput

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
     "give exactly one of 'obs' and 'inputs', received both: expected 'inputs' {obs_0, obs_1}"),
    ("inputs-missing-one", TARGET, {"inputs": {"obs_0": [0] * 27}}, 422,
     "'inputs' must be an object with exactly the fields ['obs_0', 'obs_1'], received ['obs_0']"),
    ("inputs-not-object", TARGET, {"inputs": [[0] * 27, [0] * 12]}, 422,
     "'inputs' must be an object with exactly the fields ['obs_0', 'obs_1'], received a list of 2"),
    ("input-wrong-size", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 11}}, 422,
     "'inputs.obs_1': obs_1: observation shape mismatch: expected (12,) or (N, 12)"),
    ("input-rows-differ", TARGET, {"inputs": {"obs_0": [[0] * 27] * 2, "obs_1": [[0] * 12] * 3}},
     422, "every input must have the same number of rows, received [(2, 27), (3, 12)]"),
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
     "action_mask must hold booleans or 0/1 (1 = allowed)"),
    ("mask-string", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 12},
                             "action_mask": [1, 1, "yes", 1, 1, 1, 1, 1]}, 422,
     "'action_mask' must hold only numbers or booleans; received the string 'yes'"),
    ("mask-on-continuous", RECURRENT, {"obs": [0] * 8, "action_mask": [1, 1]}, 422,
     "this policy has no discrete actions: action_mask must be None"),
    ("memory-wrong-size", RECURRENT, {"obs": [0] * 8, "memory": [0] * 31}, 422,
     "memory must have shape (32,) or (N, 32) with N = 1 rows, received (31,)"),
    ("memory-without-lstm", TARGET, {"inputs": {"obs_0": [0] * 27, "obs_1": [0] * 12},
                                     "memory": [0] * 4}, 422,
     "this policy has no recurrent memory: pass memory=None"),
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


def test_openapi_describes_each_kind() -> None:
    schemas = openapi_document(VISUAL, 8, 1 << 20)["components"]["schemas"]
    request, response = schemas["ActRequest"]["properties"], schemas["ActResponse"]["properties"]
    assert set(request) == {"inputs", "action_mask", "deterministic", "seed", "row_offset"}
    assert set(response) == {"continuous", "discrete", "model"}
    image = request["inputs"]["properties"]["obs_0"]["oneOf"][0]
    assert (image["minItems"], image["items"]["minItems"], image["items"]["items"]["minItems"]) \
        == (1, 4, 5)
    recurrent = openapi_document(RECURRENT, 8, 1 << 20)["components"]["schemas"]
    assert {"obs", "memory"} <= set(recurrent["ActRequest"]["properties"])
    assert {"continuous", "actions", "memory"} <= set(recurrent["ActResponse"]["properties"])
