"""gRPC (deploy/serving/grpc_ingress.py) on the session cluster, by both of its servers: Serve's
gRPC ingress through Serve's own proxy (the app by the `application` metadata), and the replicas'
own servers (`AppArgs.grpc_port`, a port per app, no metadata).

(Behind HAProxy, on this test cluster of two Ray nodes sharing one host, HAProxy drops the app's
gRPC backend after its first health checks; HTTP is unaffected. See the deploy notes.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

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

KEY = "grpc-key-42"


@dataclass(frozen=True)
class Target:
    """Where one app answers gRPC, and the metadata that names it there."""

    address: str
    metadata: tuple[tuple[str, str], ...]


@pytest.fixture(scope="module")
def grpc_targets(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[dict[tuple[str, str], Target]]:
    """The bundled policy as app "huggy" (no key) and as app "keyed" (API key `KEY`), each by
    Serve's gRPC ingress ("serve") and by its replica's own server ("replica")."""
    key_file = tmp_path_factory.mktemp("grpc") / "key"
    key_file.write_text(KEY)
    port, grpc_port, huggy_port, keyed_port = (free_port() for _ in range(4))
    start_serve("127.0.0.1", port, "proxy", grpc_port=grpc_port)
    try:
        deploy(AppArgs(accelerator="cpu", num_cpus=0.5, ingress="proxy", grpc_port=huggy_port),
               timeout_s=120)
        deploy(AppArgs(accelerator="cpu", num_cpus=0.25, ingress="proxy", grpc_port=keyed_port,
                       api_key_file=str(key_file)), name="keyed", route_prefix="/keyed",
               timeout_s=120)
        serve_address = f"127.0.0.1:{grpc_port}"
        yield {("huggy", "serve"): Target(serve_address, (("application", "huggy"),)),
               ("keyed", "serve"): Target(serve_address, (("application", "keyed"),)),
               ("huggy", "replica"): Target(f"127.0.0.1:{huggy_port}", ()),
               ("keyed", "replica"): Target(f"127.0.0.1:{keyed_port}", ())}
    finally:
        stop_serve(port)


@pytest.mark.parametrize("server", ["serve", "replica"])
def test_grpc_act_answers_like_in_process(grpc_targets: dict[tuple[str, str], Target],
                                          server: str) -> None:
    target = grpc_targets["huggy", server]
    local = HuggyAgent(device="cpu")
    obs = np.random.default_rng(9).standard_normal((5, 59)).astype(np.float32)
    with grpc.insecure_channel(target.address) as channel:
        act = channel.unary_unary(ACT_METHOD)
        body = json.dumps({"obs": obs.tolist(), "deterministic": False, "seed": 42}).encode()
        answer = json.loads(act(body, metadata=target.metadata, timeout=30))
        np.testing.assert_allclose(np.asarray(answer["actions"], dtype=np.float32),
                                   local.compute_action(obs, deterministic=False, seed=42),
                                   rtol=0, atol=FP32_ACTION_ATOL)
        assert answer["model"] == local.fingerprint
        with pytest.raises(grpc.RpcError) as refused:
            act(b'{"obs": [1, 2]}', metadata=target.metadata, timeout=30)
        with pytest.raises(grpc.RpcError) as too_many:
            act(json.dumps({"obs": [[0.0] * 59] * 257}).encode(), metadata=target.metadata,
                timeout=30)
        with pytest.raises(grpc.RpcError) as unknown:
            act(body, metadata=(*target.metadata, ("multiplexed_model_id", "nope@1")), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert json.loads(refused.value.details())["error"] == "invalid_shape"
    assert too_many.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the limit is 256" in json.loads(too_many.value.details())["message"]
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert json.loads(unknown.value.details())["error"] == "unknown_policy"


@pytest.mark.parametrize("server", ["serve", "replica"])
def test_grpc_takes_the_api_key_as_metadata(grpc_targets: dict[tuple[str, str], Target],
                                            server: str) -> None:
    target = grpc_targets["keyed", server]
    keyed = target.metadata
    local = HuggyAgent(device="cpu")
    obs = np.random.default_rng(10).standard_normal((2, 59)).astype(np.float32)
    body = json.dumps({"obs": obs.tolist()}).encode()
    with grpc.insecure_channel(target.address) as channel:
        act = channel.unary_unary(ACT_METHOD)
        for metadata, problem in ((keyed, "no Authorization header"),
                                  ((*keyed, ("authorization", "Bearer wrong")),
                                   "a wrong API key")):
            with pytest.raises(grpc.RpcError) as refused:
                act(body, metadata=metadata, timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            details = json.loads(refused.value.details())
            assert details["error"] == "unauthorized" and details["message"].endswith(problem)
        answer = json.loads(act(body, metadata=(*keyed, ("authorization", f"Bearer {KEY}")),
                                timeout=30))
    np.testing.assert_allclose(np.asarray(answer["actions"], dtype=np.float32),
                               local.compute_action(obs), rtol=0, atol=FP32_ACTION_ATOL)
