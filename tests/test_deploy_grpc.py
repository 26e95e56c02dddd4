"""The gRPC ingress (deploy/grpc_ingress.py) through Serve's own proxy, on the session cluster.

(Behind HAProxy, on this test cluster of two Ray nodes sharing one host, HAProxy drops the app's
gRPC backend after its first health checks; HTTP is unaffected. See the deploy notes.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from deploy.serving.grpc_ingress import ACT_METHOD
from deploy.serving.server import deploy, start_serve, stop_serve
from deploy.serving.settings import AppArgs
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster

METADATA = (("application", "huggy"),)
KEY = "grpc-key-42"
KEYED = (("application", "keyed"),)


@pytest.fixture(scope="module")
def grpc_target(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[str]:
    """The bundled policy as app "huggy" (no key) and as app "keyed" (API key `KEY`)."""
    key_file = tmp_path_factory.mktemp("grpc") / "key"
    key_file.write_text(KEY)
    port, grpc_port = free_port(), free_port()
    start_serve("127.0.0.1", port, "proxy", grpc_port=grpc_port)
    try:
        deploy(AppArgs(accelerator="cpu", num_cpus=0.5, ingress="proxy"), timeout_s=120)
        deploy(AppArgs(accelerator="cpu", num_cpus=0.25, ingress="proxy",
                       api_key_file=str(key_file)), name="keyed", route_prefix="/keyed",
               timeout_s=120)
        yield f"127.0.0.1:{grpc_port}"
    finally:
        stop_serve(port)


def test_grpc_act_answers_like_in_process(grpc_target: str) -> None:
    local = HuggyAgent(device="cpu")
    obs = np.random.default_rng(9).standard_normal((5, 59)).astype(np.float32)
    with grpc.insecure_channel(grpc_target) as channel:
        act = channel.unary_unary(ACT_METHOD)
        body = json.dumps({"obs": obs.tolist(), "deterministic": False, "seed": 42}).encode()
        answer = json.loads(act(body, metadata=METADATA, timeout=30))
        np.testing.assert_allclose(np.asarray(answer["actions"], dtype=np.float32),
                                   local.compute_action(obs, deterministic=False, seed=42),
                                   rtol=0, atol=FP32_ACTION_ATOL)
        assert answer["model"] == local.fingerprint
        with pytest.raises(grpc.RpcError) as refused:
            act(b'{"obs": [1, 2]}', metadata=METADATA, timeout=30)
        with pytest.raises(grpc.RpcError) as too_many:
            act(json.dumps({"obs": [[0.0] * 59] * 257}).encode(), metadata=METADATA, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert json.loads(refused.value.details())["error"] == "invalid_shape"
    assert too_many.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the limit is 256" in json.loads(too_many.value.details())["message"]


def test_grpc_takes_the_api_key_as_metadata(grpc_target: str) -> None:
    local = HuggyAgent(device="cpu")
    obs = np.random.default_rng(10).standard_normal((2, 59)).astype(np.float32)
    body = json.dumps({"obs": obs.tolist()}).encode()
    with grpc.insecure_channel(grpc_target) as channel:
        act = channel.unary_unary(ACT_METHOD)
        for metadata, problem in ((KEYED, "no Authorization header"),
                                  ((*KEYED, ("authorization", "Bearer wrong")),
                                   "a wrong API key")):
            with pytest.raises(grpc.RpcError) as refused:
                act(body, metadata=metadata, timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            details = json.loads(refused.value.details())
            assert details["error"] == "unauthorized" and details["message"].endswith(problem)
        answer = json.loads(act(body, metadata=(*KEYED, ("authorization", f"Bearer {KEY}")),
                                timeout=30))
    np.testing.assert_allclose(np.asarray(answer["actions"], dtype=np.float32),
                               local.compute_action(obs), rtol=0, atol=FP32_ACTION_ATOL)
