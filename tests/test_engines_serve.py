"""Serve replicas and the engines: `auto` in the replica, warm-up before it reports healthy, and
a lone request skipping the batch queue (real Ray Serve behind HAProxy on 127.0.0.1, the
session's cluster, default batch settings). How concurrent requests share forward passes is
tested exactly, gated, in test_deploy_serve.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from deploy.serving.runner import warmup_sizes
from deploy.serving.server import DEFAULT_INGRESS, deploy, start_serve, stop_serve
from deploy.serving.settings import AppArgs
from huggy_agent import HuggyAgent
from huggy_agent.engines import auto_choice
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.support.engines import AUTO_CPU
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster


@pytest.fixture(scope="module")
def url(ray_cluster: RayCluster) -> Iterator[str]:
    port = free_port()
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    try:
        deploy(AppArgs(accelerator="cpu", num_cpus=0.5), timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_serve(port)


def _counters(url: str) -> dict:
    return requests.get(f"{url}/v1/info", timeout=10).json()["counters"]


def _body(rows: int, seed: int) -> bytes:
    obs = np.random.default_rng(seed).standard_normal((rows, 59)).astype(np.float32)
    return json.dumps({"obs": obs.tolist(), "deterministic": False, "seed": seed}).encode()


def test_warmup_sizes_cover_every_rung_up_to_the_batch_limit() -> None:
    assert warmup_sizes(1) == [1]
    assert warmup_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert warmup_sizes(300) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def test_replica_runs_auto_and_warmed_up_before_it_was_healthy(url: str) -> None:
    info = requests.get(f"{url}/v1/info", timeout=10).json()
    assert info["engine"] == AUTO_CPU and "1 thread(s)" in info["engine_detail"]
    assert info["engine_reason"] == auto_choice("cpu", "fp32", onnxruntime=True, graphs=False,
                                                native=AUTO_CPU == "native")[1]
    assert info["warmed_up_to"] == info["batching"]["max_batch_size"] == 256


def test_lone_requests_skip_the_queue(url: str) -> None:
    """One request at a time: each finds the replica idle and runs as its own pass."""
    local = HuggyAgent(device="cpu")
    before = _counters(url)
    for seed in range(5):
        reply = requests.post(f"{url}/v1/act", data=_body(3, seed), timeout=10)
        assert reply.status_code == 200
        expected = local.compute_action(json.loads(_body(3, seed))["obs"], deterministic=False,
                                        seed=seed)
        np.testing.assert_allclose(np.asarray(reply.json()["actions"], dtype=np.float32),
                                   expected, rtol=0, atol=FP32_ACTION_ATOL)
    after = _counters(url)
    assert after["requests_alone"] - before["requests_alone"] == 5
    assert after["forward_passes"] - before["forward_passes"] == 5
