"""The serving rules that need no cluster: request parsing, batch settings, accelerator placement,
the Serve config file, and the remote client's failure modes."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from deploy.api import ApiError, act_response, check_route, parse_act_request
from deploy.client import RemoteAgent, RemoteServerError
from deploy.placement import plan_placement, resolve_accelerator
from tests.conftest import REPO_ROOT, free_port

OBS = 59
ROW = [0.5] * OBS


def body(document: object) -> bytes:
    return json.dumps(document).encode()


def refused(raw: bytes, max_rows: int = 8) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_act_request(raw, OBS, max_rows)
    return caught.value


def test_parse_single_and_batch_keep_rank_and_values() -> None:
    rows = np.random.default_rng(0).standard_normal((3, OBS)).astype(np.float32)
    batch = parse_act_request(body({"obs": rows.tolist(), "seed": 7}), OBS, 8)
    assert batch.obs.dtype == np.float32 and not batch.single
    np.testing.assert_array_equal(batch.obs, rows)  # float32 -> JSON -> float32 is exact
    assert (batch.deterministic, batch.seed, batch.row_offset) == (True, 7, 0)
    single = parse_act_request(body({"obs": ROW, "deterministic": False, "row_offset": 5}), OBS, 8)
    assert single.single and single.obs.shape == (1, OBS)
    assert (single.deterministic, single.seed, single.row_offset) == (False, None, 5)


@pytest.mark.parametrize(("raw", "status", "kind", "message"), [
    (b"{", 400, "malformed_json", "request body is not valid JSON"),
    (b"\xff\xfe", 400, "malformed_json", "request body is not valid JSON"),
    (body([1, 2]), 422, "invalid_request", "must be a JSON object with an 'obs' field, "
     "received list"),
    (body({"ob": ROW}), 422, "invalid_request", "unknown field(s) ['ob']"),
    (body({"deterministic": True}), 422, "invalid_request", "missing field 'obs'"),
    (body({"obs": ROW, "deterministic": "yes"}), 422, "invalid_request",
     "'deterministic' must be true or false, received 'yes'"),
    (body({"obs": ROW, "seed": -1}), 422, "invalid_request", "'seed' must be null or an integer"),
    (body({"obs": ROW, "seed": 2**64}), 422, "invalid_request", "in [0, 2**64)"),
    (body({"obs": ROW, "seed": True}), 422, "invalid_request", "received True"),
    (body({"obs": ROW, "row_offset": 1.5}), 422, "invalid_request", "'row_offset' must be"),
    (body({"obs": [1.0] * 58}), 422, "invalid_shape",
     "expected [59 numbers] or [[59 numbers], ...], received shape [58]"),
    (body({"obs": [ROW, ROW[:-1]]}), 422, "invalid_shape", "rows of different lengths"),
    (body({"obs": [[ROW]]}), 422, "invalid_shape", "received shape [1, 1, 59]"),
    (body({"obs": []}), 422, "invalid_shape", "received an empty list"),
    (body({"obs": "abc"}), 422, "invalid_shape", "received str 'abc'"),
    (body({"obs": ["a"] * OBS}), 422, "invalid_value", "must hold only numbers"),
    (body({"obs": [True] * OBS}), 422, "invalid_value", "must hold only numbers"),
    (body({"obs": [ROW] * 9}), 413, "too_many_rows", "'obs' has 9 rows, the limit is 8"),
    (b'{"obs": [' + b"NaN, " * 58 + b"1]}", 422, "non_finite", "received nan at row 0, column 0"),
    (body({"obs": [ROW, [*ROW[:-1], 1e39]]}), 422, "non_finite",
     "received inf at row 1, column 58"),
])
def test_bad_requests_get_their_status_and_message(raw: bytes, status: int, kind: str,
                                                   message: str) -> None:
    error = refused(raw)
    assert (error.status, error.kind) == (status, kind)
    assert message in error.message
    assert json.loads(error.body()) == {"error": kind, "message": error.message}


def test_routes() -> None:
    check_route("/v1/act", "POST")
    check_route("/v1/info/", "GET")
    assert refused_route("/v2/act", "POST").status == 404
    error = refused_route("/v1/act", "GET")
    assert (error.status, error.message) == (405, "/v1/act expects POST, received GET")


def refused_route(path: str, method: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        check_route(path, method)
    return caught.value


def test_act_response_is_exact_and_keeps_rank() -> None:
    actions = np.random.default_rng(1).uniform(-1, 1, (2, 21)).astype(np.float32)
    batch = json.loads(act_response(actions, False, "abc"))
    assert batch["model"] == "abc"
    np.testing.assert_array_equal(np.asarray(batch["actions"], dtype=np.float32), actions)
    single = json.loads(act_response(actions[:1], True, "abc"))
    assert np.asarray(single["actions"]).shape == (21,)


def test_batch_settings_validation() -> None:
    from deploy.serve import BatchSettings

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

    from deploy.serve import AppArgs, build_app

    config = yaml.safe_load(Path(REPO_ROOT, "deploy", "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    assert schema.controller_options.runtime_env["env_vars"]["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    (application,) = schema.applications
    assert application.import_path == "deploy.serve:app"
    args = AppArgs.model_validate({**application.args, "accelerator": "npu"})
    built = build_app(args, nodes=[HEAD, WORKER])
    deployment = built._bound_deployment
    assert deployment.ray_actor_options["resources"] == {"NPU": 1}
    assert deployment.init_args[1] == "npu:0"
    with pytest.raises(ValueError, match="accelerator"):
        AppArgs.model_validate({"accelerator": "tpu"})


def test_remote_agent_gives_up_after_retries_with_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(RemoteServerError, match=re.escape(f"GET {url}/v1/info failed after 3 "
                                                          "attempt(s)")):
        RemoteAgent(url, timeout=2, retries=2, backoff=0.01)
    assert time.monotonic() - started < 5


def test_app_builder_replicas_and_autoscaling() -> None:
    from deploy.serve import AppArgs, build_app

    fixed = build_app(AppArgs(accelerator="cpu", replicas=3), nodes=[HEAD, WORKER])
    assert fixed._bound_deployment._deployment_config.num_replicas == 3
    scaled = build_app(AppArgs(accelerator="cpu", autoscale=True, max_replicas=5),
                       nodes=[HEAD, WORKER])
    autoscaling = scaled._bound_deployment._deployment_config.autoscaling_config
    assert (autoscaling.min_replicas, autoscaling.max_replicas) == (1, 5)
    assert scaled._bound_deployment.user_config["max_batch_size"] == 256
    with pytest.raises(RuntimeError, match="cannot start 5 replicas"):
        build_app(AppArgs(accelerator="cpu", replicas=5), nodes=[HEAD, WORKER])
