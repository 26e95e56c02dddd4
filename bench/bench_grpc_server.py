"""The replicas' gRPC path (HAProxy's HTTP/2 in front, the replica's own HTTP/1.1 listener
`deploy.serving.http_server` behind it, as `huggy serve --grpc-port` runs them) against a
`grpc.aio` server, each serving one unary method, loaded by `grpc.aio` clients in this process
(one channel per client, as `bench/bench_serve.py` loads them). No Ray, no policy: what the
path itself costs and whether calls arriving together meet.

Two methods: `echo` answers the request; `batch` hands it to a `BatchQueue` (the replica's,
`deploy.serving.batching`) whose batch costs a fixed 60 us plus 3 us per call of busy CPU, a
stand-in for a forward pass. Per point: calls/s, the server side's CPU per call (HAProxy and
the listener together, or the `grpc.aio` process) and the client's, the mean batch; then each
figure of the HAProxy path as a ratio to `grpc.aio`'s in the same round (the two alternate,
`--rounds` times).

    .venv/bin/python bench/bench_grpc_server.py [--clients 1,16,64] [--seconds 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

METHOD = "/huggy.v1.Policy/Act"
SERVERS = ("grpc.aio", "haproxy")
BODY = json.dumps({"obs": [0.1234567] * 59}).encode()  # a one-observation act body
WARM_UP_S = 1.0
REPO_ROOT = Path(__file__).resolve().parents[1]


def _busy(microseconds: float) -> None:
    end = time.perf_counter() + microseconds * 1e-6
    while time.perf_counter() < end:
        pass


def _haproxy_config(port: int, socket_path: Path) -> str:
    """HAProxy speaking HTTP/2 on `port` to the listener at `socket_path`, as `huggy serve`'s
    gRPC frontend does (deploy/serving/haproxy.py)."""
    return (f"global\n    maxconn 4096\ndefaults\n    mode http\n    timeout connect 5s\n"
            f"    timeout client 30s\n    timeout server 30s\n"
            f"frontend grpc\n    bind 127.0.0.1:{port} proto h2\n    default_backend replica\n"
            f"backend replica\n    http-reuse always\n"
            f"    server replica unix@{socket_path} maxconn 256\n")


async def serve(kind: str, method: str) -> None:
    """Serve `METHOD` on a free port of 127.0.0.1, print "ready PORT [PID]" (the pid of
    HAProxy, which also works for the call), then answer each "stats" line on stdin with the
    calls, batches and CPU seconds so far; stop at any other."""
    sys.path.insert(0, str(REPO_ROOT))
    from deploy.serving.batching import BatchQueue
    from deploy.serving.haproxy import real_binary
    from deploy.serving.http_server import UnixHttpServer
    from deploy.serving.service import Admission, Reply, RequestHead

    counts = {"calls": 0, "batches": 0}

    async def run(calls: list[bytes]) -> list[bytes]:
        counts["batches"] += 1
        _busy(60 + 3 * len(calls))
        return calls

    queue: BatchQueue[bytes, bytes] = BatchQueue(run, lambda call: 1, 256)

    async def act(request: bytes) -> bytes:
        counts["calls"] += 1
        return await queue.submit(request) if method == "batch" else request

    class Service:
        """The listener's side of a replica, answering `act`."""

        def admit(self, method: str, path: str, head: RequestHead) -> Admission:
            return Admission(path)

        def check_size(self, size: int, declared: bool = False) -> None:
            pass

        async def reply(self, admission: Admission, body: bytes,
                        may_run_alone: bool = True) -> Reply:
            return Reply(200, await act(body))

        def refusal(self, error: Exception) -> Reply:
            raise error

        def abandoned(self) -> None:
            pass

    extra_pid = ""
    if kind == "haproxy":
        folder = Path(tempfile.mkdtemp(prefix="bench-grpc-"))
        listener = UnixHttpServer(Service())  # type: ignore[arg-type]
        await listener.start(folder / "replica.sock")
        port = int(sys.argv[sys.argv.index("--port") + 1])
        (folder / "haproxy.cfg").write_text(_haproxy_config(port, folder / "replica.sock"))
        haproxy = subprocess.Popen([str(real_binary()), "-db", "-f", str(folder / "haproxy.cfg")],
                                   stdout=subprocess.DEVNULL)
        extra_pid = f" {haproxy.pid}"
    else:
        async def aio_act(request: bytes, context: object) -> bytes:
            return await act(request)

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "huggy.v1.Policy", {"Act": grpc.unary_unary_rpc_method_handler(aio_act)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
    print("ready", port, extra_pid, flush=True)
    loop = asyncio.get_running_loop()
    try:
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "stats":
            usage = resource.getrusage(resource.RUSAGE_SELF)
            print(json.dumps({**counts, "cpu": usage.ru_utime + usage.ru_stime}), flush=True)
    finally:
        if kind == "haproxy":
            haproxy.terminate()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def process_cpu(pid: int) -> float:
    """CPU seconds of process `pid` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(port: int, clients: int, seconds: float) -> int:
    """`clients` loops calling `METHOD` with `BODY` for `seconds`; the calls made."""
    made = 0
    end = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal made
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            act = channel.unary_unary(METHOD)
            while time.perf_counter() < end:
                await act(BODY, timeout=30)
                made += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return made


def measure(kind: str, method: str, clients: int, seconds: float) -> dict[str, float]:
    """One point: the server started, warmed up, then loaded for `seconds`."""
    from deploy.serving.server import free_ports_other_than

    port = free_ports_other_than(0, 1)[0]
    server = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--method", method,
                               "--port", str(port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    try:
        ready = server.stdout.readline().split()
        port, others = int(ready[1]), [int(pid) for pid in ready[2:]]

        def stats() -> dict[str, float]:
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write("stats\n")
            server.stdin.flush()
            found = dict(json.loads(server.stdout.readline()))
            found["cpu"] += sum(process_cpu(pid) for pid in others)
            return found

        deadline = time.monotonic() + 30
        while not _listening(port):  # HAProxy starts
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            time.sleep(0.05)
        asyncio.run(load(port, clients, WARM_UP_S))
        before, start = stats(), os.times()
        made = asyncio.run(load(port, clients, seconds))
        after, end = stats(), os.times()
    finally:
        server.stdin.write("stop\n")
        server.stdin.close()
        server.wait(timeout=30)
    calls = after["calls"] - before["calls"]
    batches = after["batches"] - before["batches"]
    return {"calls_per_s": made / seconds,
            "server_us": (after["cpu"] - before["cpu"]) / calls * 1e6,
            "client_us": (end.user + end.system - start.user - start.system) / made * 1e6,
            "batch": calls / batches if batches else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16,64",
                        help="comma-separated concurrent clients (default: 1,16,64)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per point")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both servers")
    parser.add_argument("--methods", default="echo,batch", help="echo, batch or both")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--method", default="echo", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.method))
        return
    sys.path.insert(0, str(REPO_ROOT))
    print(f"{'method':<6} {'server':<9} {'clients':>7} {'calls/s':>8} {'server us':>10} "
          f"{'client us':>10} {'batch':>6}")
    ratios: list[str] = []
    for method in args.methods.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            for _ in range(args.rounds):
                points = {}
                for kind in SERVERS:
                    point = points[kind] = measure(kind, method, clients, args.seconds)
                    print(f"{method:<6} {kind:<9} {clients:>7} {point['calls_per_s']:>8.0f} "
                          f"{point['server_us']:>10.0f} {point['client_us']:>10.0f} "
                          f"{point['batch']:>6.2f}", flush=True)
                ours, theirs = points["haproxy"], points["grpc.aio"]
                ratios.append(
                    f"{method:<6} {clients:>3} clients: haproxy / grpc.aio calls/s "
                    f"{ours['calls_per_s'] / theirs['calls_per_s']:.2f}x, server CPU per call "
                    f"{ours['server_us'] / theirs['server_us']:.2f}x, mean batch "
                    f"{ours['batch']:.2f} / {theirs['batch']:.2f}")
    print("\n" + "\n".join(ratios))


if __name__ == "__main__":
    main()
