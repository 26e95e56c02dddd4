"""gRPC (deploy/serving/grpc_ingress.py) on the session cluster, by both of its paths: Serve's
gRPC ingress through Serve's own proxy, and HAProxy's HTTP/2 to the replicas' own listeners
(`huggy serve --grpc-port`'s default); each app chosen by the `application` metadata.

(Serve's own gRPC backend behind HAProxy, which neither path uses, is dropped by HAProxy after
its first health checks on this test cluster of two Ray nodes sharing one host.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from deploy.serving.server import deploy, start_serve, stop_serve
from deploy.serving.settings import AppArgs
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent_client.http_api import GRPC_ACT_METHOD
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster

KEY = "grpc-key-42"


@dataclass(frozen=True)
class Target:
    """Where one app answers gRPC, and the metadata that names it there."""

    address: str
    metadata: tuple[tuple[str, str], ...]


@pytest.fixture(scope="module", params=["serve", "replica"])
def grpc_targets(request: pytest.FixtureRequest, ray_cluster: RayCluster,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Target]]:
    """The bundled policy as app "huggy" (no key) and as app "keyed" (API key `KEY`), behind
    one gRPC port: Serve's gRPC ingress ("serve", next to Serve's HTTP proxy) or HAProxy's, to
    the replicas' listeners ("replica")."""
    server = request.param
    key_file = tmp_path_factory.mktemp("grpc") / "key"
    key_file.write_text(KEY)
    port, grpc_port = free_port(), free_port()
    ingress = "proxy" if server == "serve" else "haproxy"
    start_serve("127.0.0.1", port, ingress, grpc_port=grpc_port, grpc_ingress=server)
    try:
        deploy(AppArgs(accelerator="cpu", num_cpus=0.5, ingress=ingress), timeout_s=120)
        deploy(AppArgs(accelerator="cpu", num_cpus=0.25, ingress=ingress,
                       api_key_file=str(key_file)), name="keyed", route_prefix="/keyed",
               timeout_s=120)
        address = f"127.0.0.1:{grpc_port}"
        yield {"huggy": Target(address, (("application", "huggy"),)),
               "keyed": Target(address, (("application", "keyed"),)),
               # the replicas' path takes a call without the metadata to huggy serve's app
               "default": Target(address, ())}
    finally:
        stop_serve(port)


def test_grpc_act_answers_like_in_process(grpc_targets: dict[str, Target]) -> None:
    target = grpc_targets["huggy"]
    local = HuggyAgent(device="cpu")
    obs = np.random.default_rng(9).standard_normal((5, 59)).astype(np.float32)
    with grpc.insecure_channel(target.address) as channel:
        act = channel.unary_unary(GRPC_ACT_METHOD)
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


def test_grpc_takes_the_api_key_as_metadata(grpc_targets: dict[str, Target]) -> None:
    target = grpc_targets["keyed"]
    keyed = target.metadata
    local = HuggyAgent(device="cpu")
    obs = np.random.default_rng(10).standard_normal((2, 59)).astype(np.float32)
    body = json.dumps({"obs": obs.tolist()}).encode()
    with grpc.insecure_channel(target.address) as channel:
        act = channel.unary_unary(GRPC_ACT_METHOD)
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


def test_a_call_without_the_application_metadata(grpc_targets: dict[str, Target],
                                                 request: pytest.FixtureRequest) -> None:
    """With two apps, Serve's gRPC ingress refuses a call that names none (NOT_FOUND); HAProxy
    sends it to `huggy serve`'s app, "huggy", which answers it."""
    body = json.dumps({"obs": [0.0] * 59}).encode()
    with grpc.insecure_channel(grpc_targets["default"].address) as channel:
        act = channel.unary_unary(GRPC_ACT_METHOD)
        if request.node.callspec.params["grpc_targets"] == "serve":
            with pytest.raises(grpc.RpcError) as refused:
                act(body, timeout=30)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        else:
            answer = json.loads(act(body, timeout=30))
            assert answer["model"] == HuggyAgent(device="cpu").fingerprint
