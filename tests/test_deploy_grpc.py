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

from deploy.grpc_ingress import ACT_METHOD
from deploy.runner import deploy, start_serve, stop_serve
from deploy.serve import AppArgs
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.conftest import RayCluster, free_port

METADATA = (("application", "huggy"),)


@pytest.fixture(scope="module")
def grpc_target(ray_cluster: RayCluster) -> Iterator[str]:
    port, grpc_port = free_port(), free_port()
    start_serve("127.0.0.1", port, "proxy", grpc_port=grpc_port)
    try:
        deploy(AppArgs(accelerator="cpu", num_cpus=0.5, ingress="proxy"), timeout_s=120)
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
