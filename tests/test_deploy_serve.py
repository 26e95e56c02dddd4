"""The policy served by real Ray Serve (default ingress: HAProxy) over real HTTP on 127.0.0.1.

One Serve instance for the module on the session cluster: the bundled policy at `/` (default
batch settings), again at `/batched` with a 100 ms batch wait, a fixture checkpoint (.pt) at
`/fixture`, and at `/gated` a subclass of the deployment whose batches wait at a gate the test
opens, so the grouping of requests into forward passes is exact whatever the timing. The
in-process `HuggyAgent.compute_action` is the reference; for the batch-size metrics, the
cluster's own Prometheus endpoints against the replica's `/v1/info` counters.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from deploy.serving.haproxy import ERROR_PAGE_NAME
from deploy.serving.replica import HuggyPolicyDeployment
from deploy.serving.runner import PolicyRunner
from deploy.serving.server import (
    DEFAULT_INGRESS,
    deploy,
    haproxy_dir,
    start_serve,
    stop_serve,
    wait_until_answering,
)
from deploy.serving.settings import AppArgs
from envs.heuristics import load_heuristic
from envs.team_rollout import rollout_teams
from envs.teams import TeamsEnv
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent_client.http_api import HEALTH_PATH
from huggy_agent_client.remote import RemoteAgent, RemoteRequestError
from tests.support.fixtures import EXTRA_FIXTURES, fixtures_dir, mlagents_fixtures_dir
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster

SOCCER = EXTRA_FIXTURES / "soccertwos_standin" / "SoccerTwos.onnx"

FIXTURE_PT = ("ppo_num_layers_2", "Huggy", "Huggy-2000139.pt")
TOL = FP32_ACTION_ATOL  # the numerical contract: serving vs in-process


BATCH_WAIT_S = 0.1
WAIT_S = 120
"""The most any step of these tests waits for the server (a bound against hanging, not a
measurement)."""


@dataclass(frozen=True)
class Server:
    url: str
    batched_url: str
    fixture_url: str


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster) -> Iterator[Server]:
    port = free_port()
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    try:
        deploy(AppArgs(accelerator="cpu", ingress=DEFAULT_INGRESS), timeout_s=120)
        deploy(AppArgs(policy=str(fixtures_dir().joinpath(*FIXTURE_PT)), accelerator="cpu",
                       num_cpus=0.5), name="fixture", route_prefix="/fixture", timeout_s=120)
        deploy(AppArgs(accelerator="cpu", num_cpus=0.5, batch_wait_timeout_s=BATCH_WAIT_S),
               name="batched", route_prefix="/batched", timeout_s=120)
        base = f"http://127.0.0.1:{port}"
        yield Server(base, f"{base}/batched", f"{base}/fixture")
    finally:
        stop_serve(port)


@pytest.fixture(scope="module")
def local() -> HuggyAgent:
    return HuggyAgent(device="cpu")


def observations(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 59)).astype(np.float32)


def info(url: str) -> dict:
    return requests.get(f"{url}/v1/info", timeout=10).json()


async def burst(url: str, bodies: list[bytes]) -> list[tuple[int, dict]]:
    """POST every body to /v1/act at once; (status, JSON answer) in order."""
    async with aiohttp.ClientSession() as session:
        async def post(body: bytes) -> tuple[int, dict]:
            async with session.post(f"{url}/v1/act", data=body) as response:
                return response.status, json.loads(await response.read())

        return list(await asyncio.gather(*(post(body) for body in bodies)))


def act_body(obs: np.ndarray, deterministic: bool = True, seed: int | None = None) -> bytes:
    return json.dumps({"obs": obs.tolist(), "deterministic": deterministic,
                       "seed": seed}).encode()


def test_served_deterministic_actions_equal_in_process(server: Server,
                                                       local: HuggyAgent) -> None:
    fixture = HuggyAgent.from_checkpoint(fixtures_dir().joinpath(*FIXTURE_PT), device="cpu")
    batch = observations(7, seed=0)
    for url, agent in ((server.url, local), (server.fixture_url, fixture)):
        with RemoteAgent(url) as remote:
            assert remote.fingerprint == agent.fingerprint
            single = remote.compute_action(batch[0])
            assert single.shape == (21,) and single.dtype == np.float32
            np.testing.assert_allclose(single, agent.compute_action(batch[0]), rtol=0, atol=TOL)
            served = remote.compute_action(batch)
            assert served.shape == (7, 21)
            np.testing.assert_allclose(served, agent.compute_action(batch), rtol=0, atol=TOL)
    # the two apps really serve different policies
    assert np.abs(local.compute_action(batch) - fixture.compute_action(batch)).max() > 0.01


def test_info_healthz_openapi(server: Server, local: HuggyAgent) -> None:
    described = info(server.url)
    assert described["architecture"] == local.describe()["architecture"]
    counts = described["parameters"]
    assert counts["body"] + counts["heads"] == 566_805
    assert described["spec"] == local.spec.as_dict()
    assert described["fingerprint"] == local.fingerprint
    assert described["source"].endswith("Huggy.onnx")
    assert (described["device"], described["precision"], described["ingress"]) == (
        "cpu", "fp32", "haproxy")
    assert described["batching"]["max_batch_size"] == 256
    assert {"requests", "forward_passes", "rejected", "mean_batch_requests"} <= set(
        described["counters"])
    health = requests.get(f"{server.url}/v1/healthz", timeout=10)
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "model": local.fingerprint}
    document = requests.get(f"{server.url}/v1/openapi.json", timeout=10).json()
    assert document["openapi"].startswith("3.")
    schemas = document["components"]["schemas"]
    assert schemas["Row_obs_0"]["minItems"] == schemas["Row_obs_0"]["maxItems"] == 59
    assert [variant["required"] for variant in schemas["ActRequest"]["oneOf"]] == [
        ["inputs"], ["obs"], ["instances"]]
    assert "security" not in document  # no key here
    wrong_method = requests.get(f"{server.url}/v1/act", timeout=10)
    assert (wrong_method.status_code, wrong_method.headers["Allow"]) == (405, "POST")


class _UnixConnection(http.client.HTTPConnection):
    """http.client over a Unix socket."""

    def __init__(self, path: str) -> None:
        super().__init__("replica", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(self.path)


def patched_config(port: int) -> str:
    """The text of HAProxy's configuration for the Serve port `port` once huggy's wrapper has
    changed it. Ray's HAProxy manager may reload at any time (it re-renders the file in place on
    each broadcast from the controller, then runs the wrapper, which replaces the file with its
    patched version), so a read can fall between the two; the wrapper's error page in the
    `errorfile` lines, which Ray never writes, tells a patched, complete file."""
    folder = haproxy_dir(port)
    marker = f"errorfile 503 {folder / ERROR_PAGE_NAME}\n"
    deadline = time.monotonic() + WAIT_S
    while True:
        configs = list(folder.glob("*/haproxy.cfg"))
        assert len(configs) == 1, configs
        text = configs[0].read_text()
        if marker in text or time.monotonic() > deadline:
            assert marker in text, text
            return text
        time.sleep(0.05)


def test_haproxy_sends_each_replicas_requests_to_its_own_socket(server: Server,
                                                              local: HuggyAgent) -> None:
    """Behind huggy serve's HAProxy each replica listens on a socket of its own
    (`deploy.serving.http_server`): HAProxy's configuration routes every app's replica there,
    its health checks to the replica's Serve port, and the replica answers on that socket as
    through HAProxy (the in-process actions)."""
    port = int(server.url.rsplit(":", 1)[1])
    text = patched_config(port)
    for app, url in (("huggy", server.url), ("fixture", server.fixture_url),
                     ("batched", server.batched_url)):
        replica = info(url)["replica"]
        sock = haproxy_dir(port) / "replicas" / f"{replica}.sock"
        line = re.search(rf"^ *server SERVE_REPLICA_{app}-HuggyPolicy-{replica} (.*)$", text,
                         re.MULTILINE)
        assert line is not None, (app, text)
        assert re.fullmatch(rf"unix@{re.escape(str(sock))} check addr 127\.0\.0\.1 port \d+ .*",
                            line[1]), line[1]
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    obs = observations(3, 11)
    default_replica = info(server.url)["replica"]
    connection = _UnixConnection(str(haproxy_dir(port) / "replicas" / f"{default_replica}.sock"))
    connection.request("POST", "/v1/act", body=act_body(obs))
    reply = connection.getresponse()
    answer = json.loads(reply.read())
    connection.close()
    assert reply.status == 200
    np.testing.assert_allclose(answer["actions"], local.compute_action(obs, deterministic=True),
                               rtol=0, atol=TOL)


def scraped_series(application: str) -> dict[tuple[str, str], float]:
    """{(sample name, its `le` or ""): value} of the huggy metrics of `application`'s replicas,
    summed over the Prometheus endpoints of every node of the cluster."""
    import ray

    found: dict[tuple[str, str], float] = {}
    for node in (node for node in ray.nodes() if node["Alive"]):
        text = requests.get(f"http://127.0.0.1:{node['MetricsExportPort']}/metrics",
                            timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (sample.name.startswith("ray_huggy_")
                        and sample.labels.get("application") == application):
                    key = (sample.name, sample.labels.get("le", ""))
                    found[key] = found.get(key, 0.0) + sample.value
    return found


def test_batch_sizes_reach_prometheus_as_bucket_counters(server: Server) -> None:
    """The fixture app's batch sizes as Prometheus reads them once Ray has exported them (within
    Ray's report interval): per `le` counts that never decrease with `le`, the `+Inf` count equal
    to the forward passes that /v1/info counts, and the sums equal to its requests and rows."""
    for rows in (1, 1, 3):
        reply = requests.post(f"{server.fixture_url}/v1/act",
                              data=act_body(observations(rows, 5)), timeout=30)
        assert reply.status_code == 200
    asyncio.run(burst(server.fixture_url, [act_body(observations(2, k)) for k in range(8)]))
    bounds = ["1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "+Inf"]
    deadline = time.monotonic() + WAIT_S
    while True:
        counted = info(server.fixture_url)["counters"]  # also hands the replica's counts to Ray
        series = scraped_series("fixture")
        if series.get(("ray_huggy_forward_passes_total", "")) == counted["forward_passes"]:
            break
        assert time.monotonic() < deadline, f"Ray exported {series}, /v1/info counts {counted}"
        time.sleep(1)
    for name, total in (("requests", counted["requests"]), ("rows", counted["rows"])):
        buckets = [series.get((f"ray_huggy_batch_{name}_bucket_total", le), 0.0)
                   for le in bounds]
        assert buckets == sorted(buckets) and buckets[-1] == counted["forward_passes"]
        assert buckets[bounds.index("1")] >= 2  # the two lone one-row requests at least
        assert series[(f"ray_huggy_batch_{name}_sum_total", "")] == total


def test_seeded_noise_is_the_same_alone_or_among_63_concurrent_others(
        server: Server, local: HuggyAgent) -> None:
    obs = observations(3, seed=7)
    alone = asyncio.run(burst(server.batched_url, [act_body(obs, False, 1234)]))[0]
    others = [act_body(observations(2, seed=200 + i), False, 5000 + i) for i in range(63)]
    together = asyncio.run(burst(server.batched_url, [*others[:31], act_body(obs, False, 1234),
                                                      *others[31:]]))
    assert all(status == 200 for status, _ in together)
    expected = local.compute_action(obs, deterministic=False, seed=1234)
    for status, answer in (alone, together[31]):
        assert status == 200
        np.testing.assert_allclose(np.asarray(answer["actions"], dtype=np.float32), expected,
                                   rtol=0, atol=TOL)
    # the noise is real and belongs to the seed
    assert np.abs(expected - local.compute_action(obs)).max() > 0.01
    assert np.abs(expected - local.compute_action(obs, deterministic=False, seed=1)).max() > 0.01
    # row_offset continues a request's noise stream, as in-process
    with RemoteAgent(server.url) as remote:
        tail = remote.compute_action(obs[1:], deterministic=False, seed=1234, row_offset=1)
    np.testing.assert_allclose(tail, expected[1:], rtol=0, atol=TOL)


def test_bad_inputs_get_4xx_while_good_requests_in_the_burst_get_200(
        server: Server, local: HuggyAgent) -> None:
    good = observations(4, seed=3)
    row = good[0].tolist()
    bad = {
        400: [b'{"obs": [1, 2', b"not json"],
        413: [json.dumps({"obs": [row] * 257}).encode(),  # over max_rows
              b'{"obs": [' + b" " * (2 << 20) + b"]}"],  # over max_body_bytes
        422: [json.dumps({"obs": row[:58]}).encode(),
              b'{"obs": [' + b"NaN, " * 58 + b"0]}",
              json.dumps({"obs": [row, [*row[:-1], 1e39]]}).encode(),
              json.dumps({"obs": row, "seed": "x"}).encode()],
    }
    bodies = [body for group in bad.values() for body in group]
    goods = [act_body(good[i:i + 1 + i]) for i in range(3)]
    answers = asyncio.run(burst(server.batched_url, [*goods[:1], *bodies, *goods[1:]]))
    good_answers = [answers[0], *answers[-2:]]
    for i, (status, answer) in enumerate(good_answers):
        assert status == 200
        np.testing.assert_allclose(np.asarray(answer["actions"], dtype=np.float32),
                                   local.compute_action(good[i:i + 1 + i]), rtol=0, atol=TOL)
    statuses = [status for status, _ in answers[1:-2]]
    assert statuses == [status for status, group in bad.items() for _ in group]
    for _, answer in answers[1:-2]:
        assert set(answer) == {"error", "message"} and answer["message"]
    # the replica is fine afterwards
    assert requests.get(f"{server.batched_url}/v1/healthz", timeout=10).status_code == 200


def test_remote_agent_errors_match_the_in_process_contract(server: Server,
                                                           local: HuggyAgent) -> None:
    with RemoteAgent(server.url) as remote:
        zeros = np.zeros(59, np.float32)
        for obs, seed in ((zeros[:58], None), (np.full((2, 59), np.nan, np.float32), None),
                          (zeros, 2**64)):
            with pytest.raises(ValueError) as local_error:
                local.compute_action(obs, deterministic=False, seed=seed)
            with pytest.raises(ValueError) as remote_error:
                remote.compute_action(obs, deterministic=False, seed=seed)
            assert str(remote_error.value) == str(local_error.value)
        with pytest.raises(RemoteRequestError, match=r"\(422 invalid_request\): 'row_offset' mu"):
            remote.compute_action(zeros, deterministic=False, seed=1, row_offset=-1)
        assert remote.healthy()


def test_npu_replica_holds_npu_and_fails_at_start_without_torch_npu(
        server: Server, ray_cluster: RayCluster) -> None:
    import ray

    from deploy.placement import plan_placement
    from deploy.serving.app import cluster_nodes

    placement = plan_placement("npu", 0, 1, cluster_nodes())

    @ray.remote
    def visible() -> tuple[dict, str | None]:
        ids = ray.get_runtime_context().get_accelerator_ids()
        return {k: v for k, v in ids.items() if v}, os.environ.get("ASCEND_RT_VISIBLE_DEVICES")

    granted, env = ray.get(visible.options(**placement.ray_actor_options()).remote(), timeout=60)
    assert granted == {"NPU": ["0"]} and env == "0"

    with pytest.raises(RuntimeError) as failure:
        deploy(AppArgs(accelerator="npu", num_cpus=0), name="npu", route_prefix="/npu",
               timeout_s=90)
    message = str(failure.value)
    assert "DEPLOY_FAILED" in message
    assert "replica pinned to npu:0 cannot use it" in message
    assert "no NPU is usable here" in message
    assert "ASCEND_RT_VISIBLE_DEVICES': '0'" in message
    from ray import serve

    serve.delete("npu")
    # the other apps are unaffected
    assert requests.get(f"{server.url}/v1/healthz", timeout=10).status_code == 200


def test_two_npus_on_a_one_npu_cluster_are_refused_with_the_reason(server: Server) -> None:
    with pytest.raises(RuntimeError, match=r"cannot start 2 replicas on accelerator 'npu'.*"
                                           r"cluster has NPU: 1 in total"):
        deploy(AppArgs(accelerator="npu", replicas=2, num_cpus=0), name="npu2",
               route_prefix="/npu2", timeout_s=30)


def test_remote_rollout_gives_the_in_process_returns(server: Server, local: HuggyAgent,
                                                     tmp_path) -> None:
    from envs import HuggyVectorEnv, rollout
    from tests.support.envs import env_kwargs

    results = []
    for agent in (local, RemoteAgent(server.url)):
        env = HuggyVectorEnv(**env_kwargs(tmp_path))
        try:
            results.append(rollout(agent, env, episodes=6, deterministic=True, seed=11))
        finally:
            env.close()
    in_process, remote = results
    assert len(remote.episodes) == len(in_process.episodes) == 6
    assert [e.length for e in remote.episodes] == [e.length for e in in_process.episodes]
    np.testing.assert_allclose([e.episode_return for e in remote.episodes],
                               [e.episode_return for e in in_process.episodes], rtol=0, atol=1e-5)


# --- other policy kinds -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kinds(server: Server) -> dict[str, str]:
    """The trained Pyramids policy (4 inputs, masked discrete actions) and the recurrent one,
    served beside the others, each with a batch wait so that concurrent requests share forward
    passes."""
    urls = {}
    for run in ("pyramids_trained", "lstm"):
        deploy(AppArgs(policy=str(mlagents_fixtures_dir() / run), accelerator="cpu",
                       num_cpus=0.25, batch_wait_timeout_s=BATCH_WAIT_S),
               name=run, route_prefix=f"/{run}", timeout_s=120)
        urls[run] = f"{server.url}/{run}"
    deploy(AppArgs(policy=str(SOCCER), accelerator="cpu", num_cpus=0.25), name="soccertwos",
           route_prefix="/soccertwos", timeout_s=120)
    urls["soccertwos"] = f"{server.url}/soccertwos"
    return urls


@pytest.mark.standin
def test_a_served_policy_plays_a_team(kinds: dict[str, str]) -> None:
    """The stand-in-trained SoccerTwos policy, served, plays team 0 against a scripted team 1
    (as `huggy rollout --policy team=0=URL` does): episode by episode, the same results,
    lengths and returns as the same file in process, with deterministic actions and the same
    seeds (its discrete actions are argmaxes of logits computed alike within the numerics
    contract; a near-tie would show as a different episode)."""
    results = []
    for team0 in (HuggyAgent(SOCCER, device="cpu"), RemoteAgent(kinds["soccertwos"])):
        with TeamsEnv("builtin:soccertwos", base_port=free_port(), timeout_wait=60,
                      env_parameters={"num_arenas": 2}) as env:
            players = {"SoccerTwos?team=0": team0,
                       "SoccerTwos?team=1": load_heuristic("heuristic:chaser")}
            results.append(rollout_teams(env, players, episodes=4, seed=3))
    in_process, served = ([(e.team, e.unit, e.index, e.result, e.length, e.episode_return)
                           for e in sorted(r.episodes, key=lambda e: (e.team, e.unit, e.index))]
                          for r in results)
    assert len(served) == len(in_process) == 8
    assert [e[:5] for e in served] == [e[:5] for e in in_process]
    np.testing.assert_allclose([e[5] for e in served], [e[5] for e in in_process], rtol=0,
                               atol=1e-5)


def test_several_inputs_and_masks_over_http(kinds: dict[str, str]) -> None:
    """32 concurrent requests to the Pyramids server, each with its own inputs, mask and seed:
    each answer is what the policy gives in-process for that request alone, and no answer ever
    picks a forbidden action."""
    url = kinds["pyramids_trained"]
    local = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "pyramids_trained", device="cpu")
    rng = np.random.default_rng(8)
    requests_ = []
    for k in range(32):
        inputs = [rng.standard_normal((3, size)).astype(np.float32) for size in (56, 56, 56, 4)]
        mask = rng.random((3, 5)) < 0.5
        mask[:, k % 5] = True
        requests_.append((inputs, mask, bool(k % 2), 100 + k))
    bodies = [json.dumps({"inputs": {f"obs_{i}": x.tolist() for i, x in enumerate(inputs)},
                          "action_mask": mask.tolist(), "deterministic": deterministic,
                          "seed": seed}).encode()
              for inputs, mask, deterministic, seed in requests_]
    answers = asyncio.run(burst(url, bodies))
    for (status, answer), (inputs, mask, deterministic, seed) in zip(answers, requests_,
                                                                     strict=True):
        assert status == 200, answer
        expected = local.compute_action(inputs, deterministic, seed, action_mask=mask)
        np.testing.assert_array_equal(np.asarray(answer["discrete"]), expected)
        assert mask[np.arange(3), np.asarray(answer["discrete"])[:, 0]].all()
        assert "actions" not in answer and "continuous" not in answer
    described = info(url)
    assert described["spec"]["discrete_branches"] == [5]
    assert [i["shape"] for i in described["spec"]["inputs"]] == [[56], [56], [56], [4]]


def test_memory_over_http_and_remote_agent(kinds: dict[str, str]) -> None:
    """The recurrent policy served: memories travel both ways, chained over 10 steps through
    `RemoteAgent` as in-process (within the contract), and concurrent requests with different
    memories get their own."""
    url = kinds["lstm"]
    local = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "lstm", device="cpu")
    rng = np.random.default_rng(9)
    with RemoteAgent(url) as remote:
        assert remote.spec == local.spec
        ours = theirs = None
        for _ in range(10):
            obs = rng.standard_normal((4, 8)).astype(np.float32)
            served, theirs = remote.compute_action(obs, memory=theirs)
            expected, ours = local.compute_action(obs, memory=ours)
            np.testing.assert_allclose(served, expected, rtol=0, atol=TOL)
            np.testing.assert_allclose(theirs, ours, rtol=0, atol=TOL)
        assert np.abs(theirs).max() > 0.05
    memories = [rng.standard_normal(32).astype(np.float32) for _ in range(16)]
    obs = rng.standard_normal(8).astype(np.float32)
    bodies = [json.dumps({"obs": obs.tolist(), "memory": m.tolist()}).encode() for m in memories]
    for (status, answer), memory in zip(asyncio.run(burst(url, bodies)), memories, strict=True):
        assert status == 200
        actions, new_memory = local.compute_action(obs, memory=memory)
        np.testing.assert_allclose(answer["continuous"], actions, rtol=0, atol=TOL)
        np.testing.assert_allclose(answer["memory"], new_memory, rtol=0, atol=TOL)


# --- exact batching: requests gated with events in the deployment ------------------------------

FAIL_SEED = 666
GATED_BATCH_ROWS = 8  # max_batch_size; a batch waits (up to 10 s) until it is full
GATED_ROWS = 2  # rows per request after the first: four of them fill a batch


class _Recorded:
    """A counter or `BucketCounters` that also keeps every value it is given (it still reports)."""

    def __init__(self, metric: object) -> None:
        self.metric = metric
        self.values: list[float] = []

    def add(self, values: Sequence[float]) -> None:
        self.values.extend(values)
        self.metric.add(values)

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        self.values.append(value)
        self.metric.inc(value, tags)


class GatedRunner(PolicyRunner):
    """The replica's runner with a gate in front of each batch's forward pass: every batch is
    recorded (the seeds of its requests) and waits for its own asyncio event, set by the test
    through a handle. Requests that arrive meanwhile queue up and form the next batch. A request
    with seed FAIL_SEED fails in its own part of the batch (its heads)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.batches: list[list[int | None]] = []
        self.gates: list[asyncio.Event] = []
        metrics = self.metrics
        metrics._batch_requests = _Recorded(metrics._batch_requests)  # type: ignore[assignment]
        metrics._batch_rows = _Recorded(metrics._batch_rows)  # type: ignore[assignment]
        metrics._forward_passes = _Recorded(metrics._forward_passes)  # type: ignore[assignment]

    def _build(self, entry: object) -> object:
        served = super()._build(entry)  # type: ignore[arg-type]
        agent = served.agent
        heads, shared_heads = agent.actions_from, agent.actions_of_parts

        def failing_heads(rows: object, deterministic: bool, seed: int | None, *rest: object
                          ) -> object:
            if seed == FAIL_SEED:
                raise RuntimeError("injected failure of one request's heads")
            return heads(rows, deterministic, seed, *rest)

        def failing_shared_heads(outputs: object, parts: list) -> object:
            """A batch's heads in one call fail with any part that fails on its own."""
            if any(part.seed == FAIL_SEED for part in parts):
                raise RuntimeError("injected failure of one request's heads")
            return shared_heads(outputs, parts)

        agent.actions_from = failing_heads
        agent.actions_of_parts = failing_shared_heads
        return served

    async def _run_batch(self, calls: list) -> list:
        self.batches.append([call.act.seed for call in calls])
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return await super()._run_batch(calls)


class GatedPolicy(HuggyPolicyDeployment.func_or_class):
    """The policy deployment on a `GatedRunner`, with the methods the test calls through a
    handle."""

    runner_class = GatedRunner

    async def batches_once(self, requests: int, batches: int) -> list[list[int | None]]:
        """The batches, once `requests` requests were accepted and `batches` gathered;
        TimeoutError saying what came after WAIT_S."""
        runner = self.runner
        deadline = time.monotonic() + WAIT_S
        while runner.metrics.counters["requests"] < requests or len(runner.batches) < batches:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"expected {requests} requests in {batches} batches within {WAIT_S} s, "
                    f"received {runner.metrics.counters['requests']} requests in batches "
                    f"{runner.batches}")
            await asyncio.sleep(0.01)
        return runner.batches

    def open_gate(self, batch: int) -> None:
        self.runner.gates[batch].set()

    def reported_metrics(self) -> dict[str, list[float]]:
        """What the replica handed to Ray's metrics (after reporting what was pending)."""
        metrics = self.runner.metrics
        metrics.report()
        return {"requests": metrics._batch_requests.values,
                "rows": metrics._batch_rows.values,
                "passes": metrics._forward_passes.values}


@pytest.fixture(scope="module")
def gated(server: Server) -> str:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the replica cannot import tests
    application = HuggyPolicyDeployment.options(
        func_or_class=GatedPolicy, num_replicas=1, ray_actor_options={"num_cpus": 0.25},
        user_config={"max_batch_size": GATED_BATCH_ROWS, "max_rows": GATED_BATCH_ROWS,
                     "batch_wait_timeout_s": 10,
                     **AppArgs(accelerator="cpu").policy_set().as_config()},
    ).bind("cpu", "fp32", DEFAULT_INGRESS)
    serve.run(application, name="gated", route_prefix="/gated")
    wait_until_answering(f"{server.url}/gated{HEALTH_PATH}", WAIT_S)  # HAProxy routes there
    return f"{server.url}/gated"


def test_batches_group_exactly_what_queued_and_one_failure_stays_alone(
        gated: str, local: HuggyAgent) -> None:
    """Request 0 fills a batch on its own (8 rows) and waits at its gate; meanwhile eight more
    of 2 rows (one of them failing in its heads) and two malformed ones arrive. The eight form
    the next batches exactly as the row limit cuts them (4 + 4 requests), the malformed ones
    never join a batch, the failing one gets its 500 alone and every other request its own
    in-process answer."""
    handle = serve.get_app_handle("gated")
    obs = {seed: observations(GATED_BATCH_ROWS if seed == 10 else GATED_ROWS, seed)
           for seed in (10, 11, 12, 13, FAIL_SEED, 15, 16, 17, 18)}
    bodies = {seed: act_body(rows, deterministic=False, seed=seed) for seed, rows in obs.items()}

    async def scenario() -> tuple[dict[int, tuple[int, dict]], list[tuple[int, dict]], list]:
        async with aiohttp.ClientSession() as session:
            async def post(body: bytes) -> tuple[int, dict]:
                async with session.post(f"{gated}/v1/act", data=body) as response:
                    return response.status, json.loads(await response.read())

            first = asyncio.ensure_future(post(bodies[10]))
            assert await handle.batches_once.remote(1, 1) == [[10]]
            later = [seed for seed in obs if seed != 10]
            posted = asyncio.gather(*(post(bodies[seed]) for seed in later))
            malformed = asyncio.gather(post(b'{"obs": [1, 2]}'), post(b"{"))
            refused = await malformed  # answered at once, while batch 0 still waits
            batches = await handle.batches_once.remote(1 + len(later), 1)
            await handle.open_gate.remote(0)
            batches = await handle.batches_once.remote(1 + len(later), 2)
            await handle.open_gate.remote(1)
            batches = await handle.batches_once.remote(1 + len(later), 3)
            await handle.open_gate.remote(2)
            answers = dict(zip(later, await posted, strict=True))
            answers[10] = await first
            return answers, refused, batches

    answers, refused, batches = asyncio.run(scenario())
    assert [status for status, _ in refused] == [422, 400]
    assert batches[0] == [10]
    assert [len(batch) for batch in batches] == [1, 4, 4]
    assert sorted(seed for batch in batches for seed in batch) == sorted(obs)
    failing_batch = next(batch for batch in batches if FAIL_SEED in batch)
    assert len(failing_batch) > 1  # it shared its forward pass with others
    status, answer = answers.pop(FAIL_SEED)
    assert status == 500 and answer["error"] == "internal_error"
    assert "injected failure of one request's heads" in answer["message"]
    for seed, (status, answer) in answers.items():
        assert status == 200, answer
        np.testing.assert_allclose(
            np.asarray(answer["actions"], dtype=np.float32),
            local.compute_action(obs[seed], deterministic=False, seed=seed), rtol=0, atol=TOL)
    metrics = handle.reported_metrics.remote().result()
    assert (metrics["requests"], metrics["rows"]) == ([1, 4, 4], [8, 8, 8])
    assert sum(metrics["passes"]) == 3  # handed over in one report or several
    counters = info(gated)["counters"]
    assert (counters["requests"], counters["forward_passes"], counters["rows"]) == (9, 3, 24)
    assert (counters["largest_batch_requests"], counters["largest_batch_rows"]) == (4, 8)
    assert counters["rejected"] == 2
