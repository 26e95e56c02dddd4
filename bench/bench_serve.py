"""Loopback load test of the policy server, side by side in one run (bounded; not a test).

    .venv/bin/python bench/bench_serve.py                 # 20 s per point, ~25 minutes
    .venv/bin/python bench/bench_serve.py --duration 5    # quicker, noisier
    .venv/bin/python bench/bench_serve.py --settle 0      # no idle 11 s before each point
    .venv/bin/python bench/bench_serve.py --quick         # 1 client, HAProxy: echos vs ours only
    .venv/bin/python bench/bench_serve.py --client raw    # a load client that costs a third

Series (each at 1, 16 and 64 concurrent clients; one aiohttp session per client, or with
`--client raw` one connection each written to directly):
    fastapi        plain FastAPI + uvicorn around the same HuggyAgent, no batching: the ceiling
    echo@proxy     a Serve echo deployment behind Serve's default HTTP proxy
    ours@proxy     our deployment behind the default proxy          (the baseline of "3x")
    echo@haproxy   the echo behind HAProxy (RAY_SERVE_ENABLE_HA_PROXY=1)
    echo+pass@X    the echo plus the policy's forward pass, batched as ours, behind proxy X:
                   the floor of a deployment that runs the pass in Serve's HTTP server (no
                   body read, no actions written)
    ours@haproxy   our deployment behind HAProxy                    (the default of `huggy serve`),
                   which sends the requests to each replica's own socket
                   (deploy/serving/http_server.py), not through Serve's HTTP server
    ours@direct    our replica's own port (RAY_SERVE_ENABLE_DIRECT_INGRESS=1), no proxy
    ours@proxy-grpc  Serve's gRPC ingress (deploy/serving/grpc_ingress.py) next to its proxy,
                   one observation
    ours@replica-grpc  HAProxy's HTTP/2 to the replicas' own listeners (`huggy serve
                   --grpc-port`'s default), in the haproxy series, one observation
    ...-64obs      the same with 64 observations per request
    models         many policies behind HAProxy (`--series models --rounds 5` alone): p50/p99
                   of a resident policy among 15 against one policy served alone, 16 clients
                   over 15 policies, the miss latency, a split over 10,000 sessions, and 0
                   failed requests while a policy is added and removed under 16 clients
Prints requests/s, observations/s, p50/p99 latency, errors and the mean number of requests per
forward pass (from /v1/info), then the ratios against the baselines of the same run. Everything
runs on one machine: the load client shares the CPUs with the server, as it would on a 2-core box,
so under load the requests/s of two series follow the CPU that each request costs the whole
machine. Under each point (on Linux) that cost is split by process, from /proc before and after
the point: each Serve replica, HAProxy, the load client (this process), Ray's metrics agent and
the rest (Ray's other processes and anything else running), in microseconds of CPU per request.
The metrics agent's share lags: each process exports its metrics every 10 s, and the agent then
replays every histogram observation of them (Serve observes two per request through its HTTP
server, one through a replica's socket), so a point is
charged part of the point before's unless the points are apart by more than that (`--settle`,
11 s by default). Over a point and a 20 s tail the agent took 23.5-26.7 us per request for
echo+pass and ours alike (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
from proc_cpu import cpu_seconds

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


@dataclass
class Point:
    series: str
    clients: int
    obs_per_request: int
    seconds: float
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    mean_batch_requests: float | None
    cpu_us_per_request: dict[str, float] | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def obs_per_s(self) -> float:
        return self.rps * self.obs_per_request


def request_body(rows: int) -> bytes:
    obs = np.random.default_rng(rows).standard_normal((rows, 59)).astype(np.float32)
    return json.dumps({"obs": obs[0].tolist() if rows == 1 else obs.tolist(),
                       "deterministic": True}).encode()


async def load(url: str | list[str], body: bytes, clients: int, duration: float,
               warmup: float = 1.0, cpu: dict[str, dict] | None = None,
               http_client: str = "aiohttp") -> tuple[int, int, list[float], float]:
    """`clients` loops sending `body` for `warmup + duration` s; counts only the last `duration`
    (and, given a `cpu` dict, puts `process_cpu` snapshots at its start and end in it as "before"
    and "after").

    `url` is `http://...` (POST with `http_client`, one connection per client: see `_sender`)
    or `grpc://host:port` (the gRPC ingress's Act method, one channel per client); a list:
    client i sends to url i modulo its length.
    """
    urls = [url] if isinstance(url, str) else url
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    counted_from, end = start + warmup, start + warmup + duration

    async def client(index: int) -> None:
        nonlocal errors
        async with _sender(urls[index % len(urls)], body, http_client) as send:
            while (now := time.perf_counter()) < end:
                ok = await send()
                if now >= counted_from:
                    latencies.append(time.perf_counter() - now)
                    errors += not ok

    async def snapshot_when_counting() -> None:
        await asyncio.sleep(warmup)
        cpu["before"] = process_cpu()

    snapshot = [snapshot_when_counting()] if cpu is not None else []
    await asyncio.gather(*(client(index) for index in range(clients)), *snapshot)
    if cpu is not None:
        cpu["after"] = process_cpu()
    return len(latencies), errors, latencies, duration


@contextlib.asynccontextmanager
async def _sender(url: str, body: bytes, http_client: str = "aiohttp"
                  ) -> AsyncIterator[Callable[[], Awaitable[bool]]]:
    """A coroutine function sending `body` once over its own connection; True on success.
    `http_client` (`--client`) is "aiohttp", or "raw" (`_raw_http`) for an HTTP `url`."""
    if url.startswith("grpc://"):
        import grpc

        from huggy_agent_client.http_api import GRPC_ACT_METHOD

        async with grpc.aio.insecure_channel(url.removeprefix("grpc://")) as channel:
            act = channel.unary_unary(GRPC_ACT_METHOD)

            async def send_grpc() -> bool:
                try:
                    await act(body, metadata=(("application", "huggy"),), timeout=30)
                    return True
                except grpc.RpcError:
                    return False

            yield send_grpc
        return
    if http_client == "raw":
        async with _raw_http(url, body) as send:
            yield send
        return
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        async def send_http() -> bool:
            try:
                async with session.post(url, data=body,
                                        headers={"Content-Type": "application/json"}) as reply:
                    await reply.read()
                    return reply.status == 200
            except aiohttp.ClientError:
                return False

        yield send_http


class _AnswerReader(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection's answers, each framed by its Content-Length; `answer`
    gets True for a 200, False for any other status or a closed connection."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.answer: asyncio.Future[bool] | None = None
        self.closed = False

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = bytes(self.buffer[:head_end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            if self.answer is not None and not self.answer.done():
                self.answer.set_exception(RuntimeError(
                    f"--client raw reads answers with a Content-Length only; got {head[:200]!r}"))
            return
        line_end = head.find(b"\r\n", at + 2)
        length = int(head[at + 17:line_end if line_end >= 0 else len(head)])
        if len(self.buffer) < head_end + 4 + length:
            return
        ok = self.buffer[9:12] == b"200"
        del self.buffer[:head_end + 4 + length]
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(ok)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(False)


@contextlib.asynccontextmanager
async def _raw_http(url: str, body: bytes) -> AsyncIterator[Callable[[], Awaitable[bool]]]:
    """`_sender`'s raw client (`--client raw`): the request's bytes, prepared once, written on a
    keep-alive connection, and the answer read by its Content-Length. Measured at 1 client
    behind HAProxy: 58-72 us of the load client's CPU per request, mostly the event loop's own,
    where aiohttp takes 175-213."""
    loop = asyncio.get_running_loop()
    rest = url.removeprefix("http://")
    host_port, _, path = rest.partition("/")
    host, _, port = host_port.partition(":")
    request = (f"POST /{path} HTTP/1.1\r\nHost: {host_port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    transport: asyncio.Transport | None = None
    reader: _AnswerReader | None = None

    async def send_raw() -> bool:
        nonlocal transport, reader
        if transport is None or reader is None or reader.closed:
            try:
                transport, reader = await loop.create_connection(_AnswerReader, host, int(port))
            except OSError:
                return False
        reader.answer = loop.create_future()
        transport.write(request)
        return await reader.answer

    try:
        yield send_raw
    finally:
        if transport is not None:
            transport.close()


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds used so far (user + system) by each process on this machine, with its group:
    "replica NAME" (a Serve replica of app NAME), "haproxy", "load client" (this process), "Ray
    metrics agent" (Ray's dashboard agent, which ingests every process's metrics) or "Ray and
    other". Empty where there is no /proc."""
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        try:
            seconds = cpu_seconds(pid)
            command = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:  # the process ended meanwhile
            continue
        if pid == os.getpid():
            group = "load client"
        elif "ServeReplica:" in command:
            group = "replica " + command.partition("ServeReplica:")[2].partition(":")[0]
        elif Path(command).name == "haproxy":
            group = "haproxy"
        elif command.startswith("ray::DashboardAgent"):
            group = "Ray metrics agent"
        else:
            group = "Ray and other"
        found[pid] = (group, seconds)
    return found


def cpu_per_request(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                    requests: int) -> dict[str, float]:
    """Microseconds of CPU per request by group between two `process_cpu` snapshots (processes
    that started meanwhile count from zero), with "total"."""
    used: dict[str, float] = {}
    for pid, (group, seconds) in after.items():
        used[group] = used.get(group, 0.0) + seconds - before.get(pid, (group, 0.0))[1]
    per_request = {group: 1e6 * seconds / max(requests, 1) for group, seconds in used.items()}
    per_request["total"] = sum(per_request.values())
    return dict(sorted(per_request.items(), key=lambda item: -item[1]))


def measure(series: str, url: str | list[str], rows: int, clients: int,
            args: argparse.Namespace, info_url: str | None = None, settle: bool = True
            ) -> Point:
    """One point: `clients` clients (HTTP ones: `--client`) on `url` for `--duration` s, after
    `--settle` s idle if `settle` (in which Ray's metrics agent ingests what the point before
    left, instead of during this one). `info_url`: the replica's /v1/info, for the mean batch."""
    import requests

    time.sleep(args.settle if settle else 0.0)

    before = requests.get(info_url, timeout=10).json()["counters"] if info_url else None
    snapshots: dict[str, dict] = {}
    count, errors, latencies, seconds = asyncio.run(load(url, request_body(rows), clients,
                                                         args.duration, cpu=snapshots,
                                                         http_client=args.client))
    cpu = (cpu_per_request(snapshots["before"], snapshots["after"], count)
           if snapshots.get("before") else None)
    mean_batch = None
    if info_url:
        after = requests.get(info_url, timeout=10).json()["counters"]
        passes = after["forward_passes"] - before["forward_passes"]
        mean_batch = (after["requests"] - before["requests"]) / passes if passes else 0.0
    ms = np.percentile(np.asarray(latencies) * 1e3, [50, 99]) if latencies else (np.nan, np.nan)
    point = Point(series, clients, rows, seconds, count, errors, float(ms[0]), float(ms[1]),
                  mean_batch, cpu)
    print(f"{series:<22} {clients:>3} clients {point.rps:>8.0f} req/s {point.obs_per_s:>9.0f} "
          f"obs/s  p50 {point.p50_ms:6.2f} ms  p99 {point.p99_ms:7.2f} ms  errors {errors}"
          + (f"  batch {mean_batch:.2f}" if mean_batch is not None else ""), flush=True)
    if cpu:
        busy = cpu["total"] * 1e-6 * count / seconds
        print(f"{'':<22} CPU us per request: "
              + ", ".join(f"{group} {us:.0f}" for group, us in cpu.items() if group != "total")
              + f"; total {cpu['total']:.0f} ({busy:.2f} of {os.cpu_count()} cores busy)",
              flush=True)
    return point


def wait_http(url: str, timeout: float = 60) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while True:
        try:
            requests.post(url, data=request_body(1), timeout=5)
            return
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def run_fastapi(points: list[Point], args: argparse.Namespace, port: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as a Serve replica with num_cpus=1 gets
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fastapi_ceiling.py")),
                               str(port)], env=env)
    try:
        url = f"http://127.0.0.1:{port}/v1/act"
        wait_http(url)
        for rows in args.rows:
            for clients in args.clients:
                points.append(measure(series_name("fastapi", rows), url, rows, clients, args,
                                      settle=False))
    finally:
        server.terminate()
        server.wait(timeout=30)


def series_name(base: str, rows: int) -> str:
    return base if rows == 1 else f"{base}-{rows}obs"


def run_serve(points: list[Point], args: argparse.Namespace, ingress: str, port: int) -> None:
    from echo_pass import EchoPass
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    from deploy.serving.server import deploy, start_serve, stop_serve
    from deploy.serving.settings import AppArgs

    quiet = {"enable_access_log": False, "log_level": "WARNING"}

    @serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 1},
                      logging_config=quiet)
    class Echo:
        async def __call__(self, request: Request) -> Response:
            return Response(await request.body(), media_type="application/json")

    # num_cpus 0: ours and the echo reserve both CPUs of a 2-core machine; one thread, as theirs.
    # Its replicas import echo_pass from bench/: Ray puts the driver's script directory on its
    # workers' paths.
    echo_pass_deployment = serve.deployment(
        EchoPass, max_ongoing_requests=512, logging_config=quiet,
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}}})

    direct_port = port + 1
    extra = dict(args.env)
    if ingress == "direct":
        extra.update({"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(direct_port),
                      "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(direct_port + 20)})
    # gRPC next to each ingress: Serve's own beside its proxy, HAProxy's HTTP/2 to the replicas'
    # listeners beside HAProxy (`huggy serve --grpc-port`'s default)
    grpc_port = port + 31  # direct ingress takes port + 1 to port + 21
    grpc_series = {"proxy": ("serve", "ours@proxy-grpc"),
                   "haproxy": ("replica", "ours@replica-grpc")}.get(ingress)
    start_serve("127.0.0.1", port, ingress, extra_env=extra,
                grpc_port=grpc_port if grpc_series else None,
                grpc_ingress=grpc_series[0] if grpc_series else "serve")
    try:
        deploy(AppArgs(accelerator="cpu", ingress=ingress), timeout_s=120)
        base = f"http://127.0.0.1:{direct_port if ingress == 'direct' else port}"
        wait_http(f"{base}/v1/act")
        echo, echo_pass = f"http://127.0.0.1:{port}/echo", f"http://127.0.0.1:{port}/echo-pass"
        if ingress != "direct":
            serve.run(Echo.bind(), name="echo", route_prefix="/echo")
            serve.run(echo_pass_deployment.bind(), name="echo-pass", route_prefix="/echo-pass")
            wait_http(echo)
            wait_http(echo_pass)
        for _ in range(args.rounds):
            for rows in args.rows:
                for clients in args.clients:
                    if rows == 1 and ingress != "direct":  # back to back with ours: same load
                        points.append(measure(f"echo@{ingress}", echo, 1, clients, args))
                        points.append(measure(f"echo+pass@{ingress}", echo_pass, 1, clients,
                                              args))
                    points.append(measure(series_name(f"ours@{ingress}", rows),
                                          f"{base}/v1/act", rows, clients, args,
                                          f"{base}/v1/info"))
        if grpc_series and not args.quick:
            for clients in args.clients:
                points.append(measure(grpc_series[1], f"grpc://127.0.0.1:{grpc_port}", 1,
                                      clients, args, f"{base}/v1/info"))
    finally:
        stop_serve(port)


METRICS_EXPORT_S = 10.0
"""How often each Ray process exports its metrics to the metrics agent (Ray's default
`metrics_report_interval_ms`)."""
MODEL_COUNT = 15
"""Policies of the many-policies series: the checkpoints of one run."""
SPLIT_SESSIONS = 10_000


def fixture_checkpoint() -> Path:
    """A Huggy-sized checkpoint of the fixture set ($HUGGY_FIXTURES, else tests/fixtures/huggy)."""
    fixtures = Path(os.environ.get("HUGGY_FIXTURES", REPO_ROOT / "tests" / "fixtures" / "huggy"))
    return fixtures / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt"


def checkpoint_run(folder: Path, count: int) -> Path:
    """A results folder `folder/bench_run` holding `count` copies of the fixture checkpoint as
    `Huggy/Huggy-<step>.pt`: `count` policies (`bench_run@<step>`) of one run."""
    run = folder / "bench_run"
    (run / "Huggy").mkdir(parents=True)
    for index in range(count):
        shutil.copy(fixture_checkpoint(), run / "Huggy" / f"Huggy-{(index + 1) * 100_000}.pt")
    return run


async def _post_all(url: str, bodies: list[bytes], clients: int) -> list[tuple[int, dict]]:
    """POST each body once to `url` over `clients` connections; (status, answer) in order."""
    import aiohttp

    answers: list[tuple[int, dict]] = [(0, {})] * len(bodies)
    queue = list(enumerate(bodies))[::-1]

    async def client() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            while queue:
                index, body = queue.pop()
                async with session.post(url, data=body) as reply:
                    answers[index] = (reply.status, json.loads(await reply.read()))

    await asyncio.gather(*(client() for _ in range(clients)))
    return answers


def split_check(url: str, split: dict[str, float]) -> list[str]:
    """Send `SPLIT_SESSIONS` sessions to `url` (/v1/act), then each again: each policy's share
    against its weight, and how many sessions kept their policy."""
    bodies = [json.dumps({"obs": [0.0] * 59, "session": f"user-{i}"}).encode()
              for i in range(SPLIT_SESSIONS)]
    first = asyncio.run(_post_all(url, bodies, 16))
    again = asyncio.run(_post_all(url, bodies, 16))
    failed = sum(status != 200 for status, _ in first + again)
    policies = [answer.get("policy") for _, answer in first]
    total = sum(split.values())
    lines = []
    for policy_id, weight in split.items():
        share = policies.count(policy_id) / len(policies)
        lines.append(f"split {policy_id:<24} {share:6.2%} of sessions, weight {weight / total:.2%} "
                     f"({100 * (share - weight / total):+.2f} pp)")
    sticky = sum(a.get("policy") == b.get("policy") for (_, a), (_, b) in zip(first, again,
                                                                                 strict=True))
    lines.append(f"split sticky: {sticky / len(bodies):.2%} of {len(bodies)} sessions; "
                 f"failed requests {failed}")
    return lines


def miss_latencies(base: str, ids: list[str], rounds: int) -> list[float]:
    """Seconds per request to a replica that holds one policy, asking each of `ids` in turn:
    every request loads its policy (a miss) before it answers."""
    import requests

    body = request_body(1)
    latencies = []
    with requests.Session() as session:
        for _ in range(rounds):
            for policy_id in ids:
                start = time.perf_counter()
                reply = session.post(f"{base}/v1/models/{quote(policy_id, safe='@')}/act",
                                     data=body, timeout=60)
                latencies.append(time.perf_counter() - start)
                reply.raise_for_status()
    return latencies


def live_changes(args: argparse.Namespace, urls: list[str], redeploy: Callable[[list[str]], None],
                 changes: list[list[str]]) -> tuple[int, int]:
    """16 clients on `urls` while the app is redeployed with each policy list of `changes` in
    turn: (requests, failed requests)."""
    import threading

    result: dict[str, tuple[int, int, list[float], float]] = {}
    duration = args.duration + 10 * len(changes)

    def run_load() -> None:
        result["load"] = asyncio.run(load(urls, request_body(1), 16, duration, warmup=0,
                                          http_client=args.client))

    loader = threading.Thread(target=run_load)
    loader.start()
    try:
        for policies in changes:
            time.sleep(2)
            redeploy(policies)
    finally:
        loader.join()
    count, errors, _, _ = result["load"]
    return count, errors


def run_models(points: list[Point], args: argparse.Namespace, port: int) -> list[str]:
    """The many-policies series behind HAProxy, all in one Serve instance: one policy alone
    (`/single`) against one resident policy among `MODEL_COUNT` (`/models`), the miss latency
    (`/lru`: one policy per replica), 16 clients over the `MODEL_COUNT` policies, the split over
    `SPLIT_SESSIONS` sessions, and adding and removing a policy under 16-client load."""
    import tempfile

    from deploy.serving.server import deploy, start_serve, stop_serve
    from deploy.serving.settings import AppArgs

    lines: list[str] = []
    start_serve("127.0.0.1", port, "haproxy", extra_env=dict(args.env))
    try:
        with tempfile.TemporaryDirectory() as folder:
            run = checkpoint_run(Path(folder), MODEL_COUNT)
            files = sorted((run / "Huggy").glob("*.pt"), key=lambda f: int(f.stem.split("-")[1]))
            ids = [f"bench_run@{f.stem.split('-')[1]}" for f in files]
            split = {ids[0]: 0.5, ids[1]: 0.3, ids[2]: 0.2}
            common = {"accelerator": "cpu", "ingress": "haproxy", "num_cpus": 0.5}
            started = time.perf_counter()
            deploy(AppArgs(policies=[str(files[0])], **common), name="single",
                   route_prefix="/single", timeout_s=180)
            models = AppArgs(policies=[str(run)], models_per_replica=MODEL_COUNT + 1,
                             split=",".join(f"{k}={v}" for k, v in split.items()), **common)
            deploy(models, name="models", route_prefix="/models", timeout_s=300)
            deploy(AppArgs(policies=[str(run)], models_per_replica=1, **common), name="lru",
                   route_prefix="/lru", timeout_s=180)
            lines.append(f"deployed single, models ({MODEL_COUNT} policies resident) and lru in "
                         f"{time.perf_counter() - started:.0f} s")
            base = f"http://127.0.0.1:{port}"
            single = f"{base}/single/v1/act"
            resident = f"{base}/models/v1/models/{quote(ids[7], safe='@')}/act"
            for url in (single, resident):
                wait_http(url)
            pairs = []
            for _ in range(args.rounds):
                alone = measure("single@haproxy", single, 1, 1, args)
                among = measure(f"resident-of-{MODEL_COUNT}@haproxy", resident, 1, 1, args)
                points += [alone, among]
                pairs.append((among.p50_ms / alone.p50_ms, among.p99_ms / alone.p99_ms))
            p50_ratio = float(np.median([p for p, _ in pairs]))
            p99_ratio = float(np.median([p for _, p in pairs]))
            lines.append(f"p50 resident among {MODEL_COUNT} / single: {p50_ratio:.2f}x (median of "
                         f"{len(pairs)}: {', '.join(f'{p:.2f}' for p, _ in pairs)}; target <= "
                         f"1.2x); p99 {p99_ratio:.2f}x")
            spread = [f"{base}/models/v1/models/{quote(i, safe='@')}/act" for i in ids]
            many = measure(f"16-over-{MODEL_COUNT}@haproxy", spread, 1, 16, args,
                           f"{base}/models/v1/info")
            alone16 = measure("single@haproxy", single, 1, 16, args)
            points += [many, alone16]
            lines.append(f"16 clients over {MODEL_COUNT} policies: {many.rps:,.0f} req/s, "
                         f"{many.rps / alone16.rps:.2f}x one policy alone ({alone16.rps:,.0f} "
                         f"req/s); errors {many.errors}")
            misses = np.asarray(miss_latencies(f"{base}/lru", ids, 2)) * 1e3
            lines.append(f"miss (load + answer, Huggy-sized .pt): p50 {np.median(misses):.0f} ms, "
                         f"max {misses.max():.0f} ms over {len(misses)} (target <= 300 ms)")
            lines += split_check(f"{base}/models/v1/act", split)
            extra = fixture_checkpoint().parent.parent / "Huggy.onnx"

            def redeploy(policies: list[str]) -> None:
                deploy(models.model_copy(update={"policies": policies}), name="models",
                       route_prefix="/models", timeout_s=180)

            stable = [f"{base}/models/v1/act", *spread[1:]]
            count, failed = live_changes(args, stable, redeploy,
                                         [[str(run), str(extra)], [str(run)]])
            lines.append(f"added and removed {extra.parent.name}/{extra.name} under 16 clients: "
                         f"{failed} of {count} requests failed (target 0)")
    finally:
        stop_serve(port)
    for line in lines:
        print(line, flush=True)
    return lines


def free_port_block(size: int = 32) -> int:
    """A port with `size` free ports after it (for the direct-ingress replica port range)."""
    import socket

    for base in range(21000, 29000, size):
        free = True
        for port in range(base, base + size):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    free = False
                    break
        if free:
            return base
    raise RuntimeError("no free port block")


def median_text(ratios: list[float]) -> str:
    """`0.84x`, and with several rounds `0.84x (median of 3 pairs: 0.76, 0.83, 0.84)`."""
    ratios = sorted(ratios)
    text = f"{float(np.median(ratios)):6.2f}x"
    if len(ratios) > 1:
        text += f" (median of {len(ratios)} pairs: {', '.join(f'{r:.2f}' for r in ratios)})"
    return text


def summary(points: list[Point]) -> list[str]:
    """The ratios of the run, each the median over the rounds' pairs (the points of two series
    at one client count, taken round by round)."""
    lines = []
    for clients in sorted({p.clients for p in points}):
        def rounds(series: str, c: int = clients) -> list[Point]:
            return [p for p in points if (p.series, p.clients) == (series, c)]

        ratios = [("ours@haproxy / ours@proxy", "ours@haproxy", "ours@proxy"),
                  ("ours@haproxy / echo@haproxy", "ours@haproxy", "echo@haproxy"),
                  ("echo+pass@haproxy / echo@haproxy", "echo+pass@haproxy", "echo@haproxy"),
                  ("ours@haproxy / echo+pass@haproxy", "ours@haproxy", "echo+pass@haproxy"),
                  ("ours@proxy / echo@proxy", "ours@proxy", "echo@proxy"),
                  ("echo+pass@proxy / echo@proxy", "echo+pass@proxy", "echo@proxy"),
                  ("ours@proxy / echo+pass@proxy", "ours@proxy", "echo+pass@proxy"),
                  ("ours@haproxy / fastapi", "ours@haproxy", "fastapi"),
                  ("ours@direct / ours@haproxy", "ours@direct", "ours@haproxy"),
                  ("ours@proxy-grpc / ours@proxy", "ours@proxy-grpc", "ours@proxy"),
                  ("ours@replica-grpc / ours@haproxy", "ours@replica-grpc", "ours@haproxy")]
        for label, top, bottom in ratios:
            pairs = [(a.rps, b.rps) for a, b in zip(rounds(top), rounds(bottom), strict=False)
                     if a.rps and b.rps]
            if pairs:
                lines.append(f"{clients:>3} clients  {label:<34} "
                             + median_text([a / b for a, b in pairs]))
        for series in ("proxy", "haproxy"):
            pairs = [(o.p50_ms, e.p50_ms) for o, e in zip(rounds(f"ours@{series}"),
                                                          rounds(f"echo@{series}"), strict=False)]
            if pairs:
                lines.append(f"{clients:>3} clients  p50 ours@{series} / echo@{series}"
                             f"{'':<{12 - len(series)}} "
                             + median_text([ours / echo for ours, echo in pairs]))
    for point in points:
        if point.obs_per_request > 1 and point.series.startswith("ours@haproxy"):
            lines.append(f"{point.clients:>3} clients  {point.series:<30} "
                         f"{point.obs_per_s:,.0f} obs/s")
    lines.append(f"errors in total: {sum(p.errors for p in points)}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per point")
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 16, 64])
    parser.add_argument("--rows", type=lambda s: [int(c) for c in s.split(",")], default=[1, 64],
                        help="observations per request, one series each")
    parser.add_argument("--series", default="fastapi,proxy,haproxy,direct,models",
                        help="which of fastapi, proxy, haproxy, direct, models (many policies "
                             "behind HAProxy) to run")
    parser.add_argument("--env", action="append", default=[],
                        type=lambda s: tuple(s.split("=", 1)),
                        help="KEY=VALUE for the Serve controller (repeatable), e.g. "
                             "RAY_SERVE_HAPROXY_NBTHREAD=1")
    parser.add_argument("--out", type=Path, default=None, help="write the points as JSON here")
    parser.add_argument("--quick", action="store_true",
                        help="only the echos vs ours behind HAProxy, 1 client, 1 observation per "
                             "request (the latency target), alternating --rounds times")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --quick: echo/ours measurement pairs; with models: "
                             "single/resident pairs (default 1)")
    parser.add_argument("--settle", type=float, default=METRICS_EXPORT_S + 1,
                        help="seconds idle before each Serve point, so that Ray's metrics agent "
                             "ingests the point before's metrics then, not during the next point "
                             f"(default {METRICS_EXPORT_S + 1:g}; 0 runs back to back)")
    parser.add_argument("--client", choices=("aiohttp", "raw"), default="aiohttp",
                        help="the HTTP load client: aiohttp (the default, as in every earlier "
                             "run), or raw: prepared request bytes on a keep-alive connection, "
                             "answers framed by Content-Length (far less client CPU per request). "
                             "The gRPC series keep their grpc.aio clients, so their ratios to "
                             "HTTP compare two clients under raw")
    args = parser.parse_args()
    if args.quick:
        args.series, args.clients, args.rows = "haproxy", [1], [1]
    import ray

    from deploy.cluster import init_ray

    wanted = args.series.split(",")
    points: list[Point] = []
    started = time.monotonic()
    if "fastapi" in wanted:
        run_fastapi(points, args, free_port_block(1))
    model_lines: list[str] = []
    if any(name in wanted for name in ("proxy", "haproxy", "direct", "models")):
        init_ray("local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            for ingress in ("proxy", "haproxy", "direct"):
                if ingress in wanted:
                    run_serve(points, args, ingress, free_port_block())
            if "models" in wanted:
                model_lines = run_models(points, args, free_port_block())
        finally:
            ray.shutdown()
    print(f"\nsummary ({time.monotonic() - started:.0f} s in all)")
    print("\n".join(summary(points) + model_lines))
    if args.out:
        args.out.write_text(json.dumps([{**asdict(p), "rps": p.rps, "obs_per_s": p.obs_per_s}
                                        for p in points], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
