"""`huggy serve`'s HAProxy ingress on a cluster of several nodes: a replica on the worker node of
HAProxy's machine (the session's two-node cluster, both nodes on 127.0.0.1) is served exactly as
one on the head node, its HTTP requests and gRPC calls through its own listener within the same
caps, and `start_serve` warns of nothing; for replicas on other machines, and for HAProxy on a
head node elsewhere, the warnings say what differs (`ingress_differences`)."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import grpc
import numpy as np
import pytest
import ray
import requests
from ray import serve

from deploy.serving.haproxy_admin import HAProxyAdmin, haproxy_dir
from deploy.serving.replica import HuggyPolicyDeployment
from deploy.serving.server import (
    ingress_differences,
    start_serve,
    stop_serve,
    wait_until_answering,
)
from deploy.serving.settings import AppArgs
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent_client.http_api import GRPC_ACT_METHOD, HEALTH_PATH
from tests.support.processes import free_ports
from tests.support.ray_cluster import RayCluster

WAIT_S = 120
"""The most a step waits for the server (a bound against hanging, not a measurement)."""
WORKER_SHARE = 0.25
"""The share of the worker node's `worker_node` resource that the replica holds."""


@dataclass(frozen=True)
class Served:
    port: int
    grpc_port: int
    differences: list[str]


@pytest.fixture(scope="module")
def on_worker(ray_cluster: RayCluster) -> Iterator[Served]:
    """`huggy serve`'s HAProxy ingress with gRPC by the replicas, and the bundled policy as the
    app "huggy" with its one replica pinned to the worker node (by the `worker_node` resource
    that only that node has)."""
    port, grpc_port = free_ports(2)
    differences = start_serve("127.0.0.1", port, "haproxy", grpc_port=grpc_port,
                              grpc_ingress="replica")
    try:
        args = AppArgs(accelerator="cpu")
        application = HuggyPolicyDeployment.options(
            num_replicas=1,
            ray_actor_options={"num_cpus": 0.25, "resources": {"worker_node": WORKER_SHARE}},
            user_config={**asdict(args.batch_settings()), **args.policy_set().as_config()},
        ).bind("cpu", "fp32", "haproxy", None, None, str(haproxy_dir(port)), "/")
        serve.run(application, name="huggy", route_prefix="/")
        wait_until_answering(f"http://127.0.0.1:{port}{HEALTH_PATH}", WAIT_S)
        yield Served(port, grpc_port, differences)
    finally:
        stop_serve(port)


def _replica_servers(port: int) -> dict[str, dict[str, str]]:
    """HAProxy's statistics of the replica servers, by (backend, server) as "backend/server"."""
    (socket_path,) = haproxy_dir(port).glob("*/admin.sock")
    with HAProxyAdmin(socket_path) as admin:
        text = admin.command("show stat")
    rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
    return {f"{row['pxname']}/{row['svname']}": row for row in rows
            if row["svname"].startswith("SERVE_REPLICA")}


def test_a_replica_on_the_worker_node_is_served_as_one_on_the_head(on_worker: Served) -> None:
    """The replica holds the worker node's resource; HAProxy's configuration routes its HTTP
    requests and gRPC calls to its own socket; both answer the in-process actions and count on
    those socket servers in HAProxy's statistics; `start_serve` warned of nothing."""
    assert on_worker.differences == []
    deadline = time.monotonic() + WAIT_S
    while ray.available_resources().get("worker_node") != 1 - WORKER_SHARE:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)
    info = requests.get(f"http://127.0.0.1:{on_worker.port}/v1/info", timeout=30).json()
    sock = haproxy_dir(on_worker.port) / "replicas" / f"{info['replica']}.sock"
    assert sock.is_socket()
    (config,) = haproxy_dir(on_worker.port).glob("*/haproxy.cfg")
    servers = [line.split() for line in config.read_text().splitlines()
               if line.strip().startswith(f"server SERVE_REPLICA_huggy-HuggyPolicy-{info['replica']} ")]
    assert [words[2] for words in servers] == [f"unix@{sock}"] * 2  # HTTP, then gRPC
    obs = np.random.default_rng(5).standard_normal((3, 59)).astype(np.float32)
    body = json.dumps({"obs": obs.tolist()}).encode()
    expected = HuggyAgent(device="cpu").compute_action(obs, deterministic=True)
    answer = requests.post(f"http://127.0.0.1:{on_worker.port}/v1/act", data=body, timeout=30)
    assert answer.status_code == 200
    np.testing.assert_allclose(answer.json()["actions"], expected, rtol=0, atol=FP32_ACTION_ATOL)
    with grpc.insecure_channel(f"127.0.0.1:{on_worker.grpc_port}") as channel:
        called = json.loads(channel.unary_unary(GRPC_ACT_METHOD)(body, timeout=30))
    np.testing.assert_allclose(called["actions"], expected, rtol=0, atol=FP32_ACTION_ATOL)
    stats = _replica_servers(on_worker.port)
    name = f"SERVE_REPLICA_huggy-HuggyPolicy-{info['replica']}"
    assert int(stats[f"http-huggy/{name}"]["stot"]) >= 2  # /v1/info and /v1/act
    assert stats[f"huggy_grpc:http-huggy/{name}"]["stot"] == "1"


def test_replicas_on_other_machines_are_named_with_what_differs() -> None:
    (line,) = ingress_differences(True, "10.0.0.4", ["10.0.0.5", "10.0.0.6"], replica_grpc=True)
    assert line == (
        "huggy serve: warning: replicas placed on the cluster's other machines (10.0.0.5, "
        "10.0.0.6) are reached through Serve's HTTP server in the replica, not the replica's "
        "own listener (more of the replica's CPU per request, and Serve's max_ongoing_requests "
        "holds back the requests past it), within the same HAProxy caps; gRPC by the replicas "
        "(--grpc-port) reaches only the replicas on this machine")
    (without_grpc,) = ingress_differences(True, "10.0.0.4", ["10.0.0.5"], replica_grpc=False)
    assert without_grpc.endswith("within the same HAProxy caps")
    assert ingress_differences(True, "10.0.0.4", [], replica_grpc=True) == []


def test_haproxy_on_a_head_node_elsewhere_is_named_with_what_it_lacks() -> None:
    assert ingress_differences(False, "10.0.0.4", ["10.0.0.5"], replica_grpc=False) == [
        "huggy serve: warning: HAProxy runs on the cluster's head node (10.0.0.4), not on this "
        "machine, as Ray writes it: without huggy serve's caps (--limit), its JSON 503 while no "
        "replica can answer, and the replicas' own listeners; run huggy serve on the head node "
        "for those"]
