"""The floor under one Huggy step over gRPC: a bare Python-to-Python unary exchange, shaped as
mlagents-envs makes it (the Python side hosts a sync gRPC server with a thread pool, Unity calls
it from another process), with messages of a Huggy step's size (18 agents: observations up,
actions down), no protobuf and no work on either side.

Three server variants: a `grpc` server whose handler answers itself; one whose handler hands the
request to the main thread and waits for the answer (mlagents-envs' design, and this project's
until December 2026); and the Python side's own server, served in the main thread
(`envs.http2.UnaryServer`, what `envs.lockstep` uses). Three client variants: Python's `grpc`
with its default client I/O, with the older one (`GRPC_EXPERIMENTS=-event_engine_client`), and
the stand-ins' own HTTP/2 client (`envs.http2.UnaryClient`). Prints microseconds per exchange
and the client's and the server's CPU per exchange (several client runs per pair, each after its
warm-up), and what the exchange leaves of a step at a given agent-decisions/s target.

    .venv/bin/python bench/bench_grpc_floor.py [--exchanges 3000] [--runs 3] [--target 20000]
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from proc_cpu import cpu_seconds

AGENTS = 18
UP_BYTES = AGENTS * 59 * 4 + 2_000  # observations, and the rest of the agents' infos
DOWN_BYTES = AGENTS * 21 * 4 + 200  # continuous actions
METHOD = "/floor.Floor/Exchange"
OLDER_CLIENT_IO = {"GRPC_EXPERIMENTS": "-event_engine_client"}
CLIENTS = (("gRPC, default client I/O", "grpc", {}),
           ("gRPC, older client I/O", "grpc", OLDER_CLIENT_IO),
           ("the stand-ins' HTTP/2 client", "http2", {}))
SERVERS = (("grpc, handler answers", "answers"), ("grpc, handoff to main", "handoff"),
           ("own server, main thread", "lockstep"))
WARM_UP = 200


def _repository_on_path() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def serve(kind: str) -> None:
    """Answer `METHOD` on a free port of 127.0.0.1 until killed, after printing "ready PORT":
    `kind` "answers" (a grpc handler), "handoff" (a grpc handler through the main thread) or
    "lockstep" (`UnaryServer` in the main thread)."""
    reply = b"a" * DOWN_BYTES
    if kind == "lockstep":
        _repository_on_path()
        from envs.http2 import UnaryServer

        own = UnaryServer("127.0.0.1", 0, METHOD)
        print("ready", own.address[1], flush=True)
        while True:
            own.receive()
            own.answer(reply)
    handoff = kind == "handoff"
    inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def exchange(request: bytes, context: grpc.ServicerContext) -> bytes:
        if not handoff:
            return reply
        inbox.put(request)
        return outbox.get()

    service, method = METHOD.strip("/").split("/")
    handler = grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(exchange)})
    server = grpc.server(ThreadPoolExecutor(max_workers=10), options=(("grpc.so_reuseport", 1),))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("ready", port, flush=True)
    while handoff:
        inbox.get()
        outbox.put(reply)
    server.wait_for_termination()


def measure(port: int, exchanges: int, client: str) -> tuple[float, float]:
    """(wall, client CPU) microseconds per exchange over `exchanges` calls, after `WARM_UP` to
    warm up; `client` "grpc" (Python's gRPC client) or "http2" (the stand-ins' `UnaryClient`)."""
    body = b"o" * UP_BYTES
    if client == "http2":
        _repository_on_path()
        from envs.http2 import UnaryClient

        unary = UnaryClient("127.0.0.1", port, METHOD, connect_timeout=10)
        call, close = unary.call, unary.close
    else:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call, close = channel.unary_unary(METHOD), channel.close
    try:
        for _ in range(WARM_UP):
            call(body)
        cpu, start = time.process_time(), time.perf_counter()
        for _ in range(exchanges):
            call(body)
        return ((time.perf_counter() - start) / exchanges * 1e6,
                (time.process_time() - cpu) / exchanges * 1e6)
    finally:
        close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=3000, help="timed calls per run")
    parser.add_argument("--runs", type=int, default=3, help="client runs per variant")
    parser.add_argument("--target", type=int, default=20_000,
                        help="agent-decisions/s to compare the floor with (default 20,000)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--server", default="answers", help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", default="grpc", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.server)
        return
    if args.measure:
        print(*(f"{us:.1f}" for us in measure(args.measure, args.exchanges, args.client)))
        return
    budget_us = AGENTS / args.target * 1e6
    print(f"{AGENTS} agents at {args.target:,} agent-decisions/s: {budget_us:.0f} us per step, "
          f"all of it (the policy, both processes' work, the exchange)")
    for server_name, server_kind in SERVERS:
        server = subprocess.Popen([sys.executable, __file__, "--serve", "--server", server_kind],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            ready, port = server.stdout.readline().split()
            assert ready == "ready"
            for name, client, env in CLIENTS:
                runs, server_cpu = [], []
                for _ in range(args.runs):
                    before = cpu_seconds(server.pid)
                    runs.append([float(us) for us in subprocess.run(
                        [sys.executable, __file__, "--measure", port, "--client", client,
                         "--exchanges", str(args.exchanges)],
                        capture_output=True, text=True, check=True,
                        env={**os.environ, **env}).stdout.split()])
                    server_cpu.append((cpu_seconds(server.pid) - before)
                                      / (args.exchanges + WARM_UP) * 1e6)
                walls = [wall for wall, _ in runs]
                print(f"{server_name:24s} {name:29s} us per exchange: "
                      + ", ".join(f"{wall:.0f}" for wall in walls)
                      + f"  ({min(walls) / budget_us:.0%} of the step budget at best);"
                      + " CPU us, client: " + ", ".join(f"{cpu:.0f}" for _, cpu in runs)
                      + "; server: " + ", ".join(f"{cpu:.0f}" for cpu in server_cpu))
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
