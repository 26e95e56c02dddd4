"""Loopback load test of the policy server, side by side in one run (bounded; not a test).

    .venv/bin/python bench/bench_serve.py                 # 20 s per point, ~12 minutes
    .venv/bin/python bench/bench_serve.py --duration 5    # quicker, noisier
    .venv/bin/python bench/bench_serve.py --quick         # 1 client, HAProxy: echo vs ours only

Series (each at 1, 16 and 64 concurrent clients; one aiohttp session per client):
    fastapi        plain FastAPI + uvicorn around the same HuggyAgent, no batching: the ceiling
    echo@proxy     a Serve echo deployment behind Serve's default HTTP proxy
    ours@proxy     our deployment behind the default proxy          (the baseline of "3x")
    echo@haproxy   the echo behind HAProxy (RAY_SERVE_ENABLE_HA_PROXY=1)
    ours@haproxy   our deployment behind HAProxy                    (the default of `huggy serve`)
    ours@direct    our replica's own port (RAY_SERVE_ENABLE_DIRECT_INGRESS=1), no proxy
    ours@X-grpc    the gRPC ingress (deploy/grpc_ingress.py) next to proxy X, one observation
    ...-64obs      the same with 64 observations per request
Prints requests/s, observations/s, p50/p99 latency, errors and the mean number of requests per
forward pass (from /v1/info), then the ratios the issue sets targets for. Everything runs on one
machine: the load client shares the CPUs with the server, as it would on a 2-core box.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

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


async def load(url: str, body: bytes, clients: int, duration: float,
               warmup: float = 1.0) -> tuple[int, int, list[float], float]:
    """`clients` loops sending `body` for `warmup + duration` s; counts only the last `duration`.

    `url` is `http://...` (POST with aiohttp, one session per client) or `grpc://host:port`
    (the gRPC ingress's Act method, one channel per client).
    """
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    counted_from, end = start + warmup, start + warmup + duration

    async def client() -> None:
        nonlocal errors
        async with _sender(url, body) as send:
            while (now := time.perf_counter()) < end:
                ok = await send()
                if now >= counted_from:
                    latencies.append(time.perf_counter() - now)
                    errors += not ok

    await asyncio.gather(*(client() for _ in range(clients)))
    return len(latencies), errors, latencies, duration


@contextlib.asynccontextmanager
async def _sender(url: str, body: bytes) -> AsyncIterator[Callable[[], Awaitable[bool]]]:
    """A coroutine function sending `body` once over its own connection; True on success."""
    if url.startswith("grpc://"):
        import grpc

        from deploy.grpc_ingress import ACT_METHOD

        async with grpc.aio.insecure_channel(url.removeprefix("grpc://")) as channel:
            act = channel.unary_unary(ACT_METHOD)

            async def send_grpc() -> bool:
                try:
                    await act(body, metadata=(("application", "huggy"),), timeout=30)
                    return True
                except grpc.RpcError:
                    return False

            yield send_grpc
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


def measure(series: str, url: str, rows: int, clients: int, duration: float,
            info_url: str | None) -> Point:
    import requests

    before = requests.get(info_url, timeout=10).json()["counters"] if info_url else None
    count, errors, latencies, seconds = asyncio.run(load(url, request_body(rows), clients,
                                                         duration))
    mean_batch = None
    if info_url:
        after = requests.get(info_url, timeout=10).json()["counters"]
        passes = after["forward_passes"] - before["forward_passes"]
        mean_batch = (after["requests"] - before["requests"]) / passes if passes else 0.0
    ms = np.percentile(np.asarray(latencies) * 1e3, [50, 99]) if latencies else (np.nan, np.nan)
    point = Point(series, clients, rows, seconds, count, errors, float(ms[0]), float(ms[1]),
                  mean_batch)
    print(f"{series:<22} {clients:>3} clients {point.rps:>8.0f} req/s {point.obs_per_s:>9.0f} "
          f"obs/s  p50 {point.p50_ms:6.2f} ms  p99 {point.p99_ms:7.2f} ms  errors {errors}"
          + (f"  batch {mean_batch:.2f}" if mean_batch is not None else ""), flush=True)
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
                points.append(measure(series_name("fastapi", rows), url, rows, clients,
                                      args.duration, None))
    finally:
        server.terminate()
        server.wait(timeout=30)


def series_name(base: str, rows: int) -> str:
    return base if rows == 1 else f"{base}-{rows}obs"


def run_serve(points: list[Point], args: argparse.Namespace, ingress: str, port: int) -> None:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    from deploy.runner import deploy, start_serve, stop_serve
    from deploy.serve import AppArgs

    @serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 1},
                      logging_config={"enable_access_log": False, "log_level": "WARNING"})
    class Echo:
        async def __call__(self, request: Request) -> Response:
            return Response(await request.body(), media_type="application/json")

    direct_port = port + 1
    extra = dict(args.env)
    if ingress == "direct":
        extra.update({"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(direct_port),
                      "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(direct_port + 20)})
    grpc_port = port + 2
    start_serve("127.0.0.1", port, ingress, extra_env=extra,
                grpc_port=None if ingress == "direct" else grpc_port)
    try:
        deploy(AppArgs(accelerator="cpu", ingress=ingress), timeout_s=120)
        base = f"http://127.0.0.1:{direct_port if ingress == 'direct' else port}"
        wait_http(f"{base}/v1/act")
        echo = f"http://127.0.0.1:{port}/echo"
        if ingress != "direct":
            serve.run(Echo.bind(), name="echo", route_prefix="/echo")
            wait_http(echo)
        for _ in range(args.rounds):
            for rows in args.rows:
                for clients in args.clients:
                    if rows == 1 and ingress != "direct":  # back to back with ours: same load
                        points.append(measure(f"echo@{ingress}", echo, 1, clients,
                                              args.duration, None))
                    points.append(measure(series_name(f"ours@{ingress}", rows),
                                          f"{base}/v1/act", rows, clients, args.duration,
                                          f"{base}/v1/info"))
        if ingress != "direct" and not args.quick:
            for clients in args.clients:
                points.append(measure(f"ours@{ingress}-grpc", f"grpc://127.0.0.1:{grpc_port}", 1,
                                      clients, args.duration, f"{base}/v1/info"))
    finally:
        stop_serve(port)


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


def summary(points: list[Point]) -> list[str]:
    by = {(p.series, p.clients): p for p in points}
    lines = []
    for clients in sorted({p.clients for p in points}):
        def rps(series: str, c: int = clients) -> float | None:
            point = by.get((series, c))
            return point.rps if point else None

        ratios = [("ours@haproxy / ours@proxy", "ours@haproxy", "ours@proxy"),
                  ("ours@haproxy / echo@haproxy", "ours@haproxy", "echo@haproxy"),
                  ("ours@proxy / echo@proxy", "ours@proxy", "echo@proxy"),
                  ("ours@haproxy / fastapi", "ours@haproxy", "fastapi"),
                  ("ours@direct / ours@haproxy", "ours@direct", "ours@haproxy"),
                  ("ours@haproxy-grpc / ours@haproxy", "ours@haproxy-grpc", "ours@haproxy")]
        for label, top, bottom in ratios:
            a, b = rps(top), rps(bottom)
            if a and b:
                lines.append(f"{clients:>3} clients  {label:<30} {a / b:6.2f}x")
        for series in ("proxy", "haproxy"):
            ours_points = [p for p in points if (p.series, p.clients) == (f"ours@{series}", clients)]
            echo_points = [p for p in points if (p.series, p.clients) == (f"echo@{series}", clients)]
            pairs = [(o.p50_ms, e.p50_ms) for o, e in zip(ours_points, echo_points, strict=False)]
            if pairs:
                ratios = sorted(ours / echo for ours, echo in pairs)
                lines.append(f"{clients:>3} clients  p50 ours@{series} / echo@{series}"
                             f"{'':<{12 - len(series)}} {float(np.median(ratios)):6.2f}x"
                             + (f" (median of {len(ratios)} pairs: "
                                f"{', '.join(f'{r:.2f}' for r in ratios)})"
                                if len(ratios) > 1 else ""))
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
    parser.add_argument("--series", default="fastapi,proxy,haproxy,direct",
                        help="which of fastapi, proxy, haproxy, direct to run")
    parser.add_argument("--env", action="append", default=[],
                        type=lambda s: tuple(s.split("=", 1)),
                        help="KEY=VALUE for the Serve controller (repeatable), e.g. "
                             "RAY_SERVE_HAPROXY_NBTHREAD=1")
    parser.add_argument("--out", type=Path, default=None, help="write the points as JSON here")
    parser.add_argument("--quick", action="store_true",
                        help="only echo vs ours behind HAProxy, 1 client, 1 observation per "
                             "request (the latency target), alternating --rounds times")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --quick: echo/ours measurement pairs (default 1)")
    args = parser.parse_args()
    if args.quick:
        args.series, args.clients, args.rows = "haproxy", [1], [1]
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    wanted = args.series.split(",")
    points: list[Point] = []
    started = time.monotonic()
    if "fastapi" in wanted:
        run_fastapi(points, args, free_port_block(1))
    if any(name in wanted for name in ("proxy", "haproxy", "direct")):
        ray.init(address="local", include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
        try:
            for ingress in ("proxy", "haproxy", "direct"):
                if ingress in wanted:
                    run_serve(points, args, ingress, free_port_block())
        finally:
            ray.shutdown()
    print(f"\nsummary ({time.monotonic() - started:.0f} s in all)")
    print("\n".join(summary(points)))
    if args.out:
        args.out.write_text(json.dumps([{**asdict(p), "rps": p.rps, "obs_per_s": p.obs_per_s}
                                        for p in points], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
