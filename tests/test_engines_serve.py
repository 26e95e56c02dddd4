"""Serve replicas and the engines: `auto` in the replica, warm-up before it reports healthy, and
a lone request skipping the batch queue while concurrent ones still share forward passes (real
Ray Serve behind HAProxy on 127.0.0.1, the session's cluster, default batch settings)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import numpy as np
import pytest
import requests

from deploy.runner import DEFAULT_INGRESS, deploy, start_serve, stop_serve
from deploy.serve import AppArgs, warmup_sizes
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.conftest import RayCluster, free_port


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
    assert info["engine"] == "onnxruntime" and "1 thread(s)" in info["engine_detail"]
    assert info["warmed_up_to"] == info["batching"]["max_batch_size"] == 256


def test_lone_requests_skip_the_queue_and_bursts_share_passes(url: str) -> None:
    local = HuggyAgent(device="cpu")
    before = _counters(url)
    for seed in range(5):  # one at a time: each finds the replica idle
        reply = requests.post(f"{url}/v1/act", data=_body(3, seed), timeout=10)
        assert reply.status_code == 200
        expected = local.compute_action(json.loads(_body(3, seed))["obs"], deterministic=False,
                                        seed=seed)
        np.testing.assert_allclose(np.asarray(reply.json()["actions"], dtype=np.float32),
                                   expected, rtol=0, atol=FP32_ACTION_ATOL)
    after = _counters(url)
    assert after["requests_alone"] - before["requests_alone"] == 5
    assert after["forward_passes"] - before["forward_passes"] == 5

    async def burst() -> list[int]:
        async with aiohttp.ClientSession() as session:
            async def post(seed: int) -> int:
                async with session.post(f"{url}/v1/act", data=_body(2, seed)) as response:
                    await response.read()
                    return response.status

            return list(await asyncio.gather(*(post(seed) for seed in range(64))))

    assert asyncio.run(burst()) == [200] * 64
    final = _counters(url)
    assert final["requests"] - after["requests"] == 64
    assert final["forward_passes"] - after["forward_passes"] < 64  # concurrent ones were batched
