"""The floor under one Huggy step over gRPC: a bare Python-to-Python unary exchange, shaped as
mlagents-envs makes it (the Python side hosts a sync gRPC server with a thread pool, Unity calls
it from another process), with messages of a Huggy step's size (18 agents: observations up,
actions down), no protobuf and no work on either side.

Two server variants: the handler answers itself, or it hands the request to the main thread and
waits for the answer (the handoff envs/fast_step.py makes); three client variants: Python's
`grpc` with its default client I/O, with the older one (`GRPC_EXPERIMENTS=-event_engine_client`),
and the stand-ins' own HTTP/2 client (`envs.standin.http2`). Prints microseconds per exchange
and the client's CPU per exchange (several client runs per pair, each after its warm-up), and
what the exchange leaves of a step at a given agent-decisions/s target.

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

AGENTS = 18
UP_BYTES = AGENTS * 59 * 4 + 2_000  # observations, and the rest of the agents' infos
DOWN_BYTES = AGENTS * 21 * 4 + 200  # continuous actions
METHOD = "/floor.Floor/Exchange"
OLDER_CLIENT_IO = {"GRPC_EXPERIMENTS": "-event_engine_client"}
CLIENTS = (("gRPC, default client I/O", "grpc", {}),
           ("gRPC, older client I/O", "grpc", OLDER_CLIENT_IO),
           ("the stand-ins' HTTP/2 client", "http2", {}))


def serve(handoff: bool) -> None:
    """Answer `METHOD` on a free port of 127.0.0.1 until killed, after printing "ready PORT";
    with `handoff`, through the main thread."""
    inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    reply = b"a" * DOWN_BYTES

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
    """(wall, client CPU) microseconds per exchange over `exchanges` calls, after 200 to warm
    up; `client` "grpc" (Python's gRPC client) or "http2" (the stand-ins' `UnaryClient`)."""
    body = b"o" * UP_BYTES
    if client == "http2":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from envs.standin.http2 import UnaryClient

        unary = UnaryClient("127.0.0.1", port, METHOD, connect_timeout=10)
        call, close = unary.call, unary.close
    else:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call, close = channel.unary_unary(METHOD), channel.close
    try:
        for _ in range(200):
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
    parser.add_argument("--handoff", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", default="grpc", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.handoff)
        return
    if args.measure:
        print(*(f"{us:.1f}" for us in measure(args.measure, args.exchanges, args.client)))
        return
    budget_us = AGENTS / args.target * 1e6
    print(f"{AGENTS} agents at {args.target:,} agent-decisions/s: {budget_us:.0f} us per step, "
          f"all of it (the policy, both processes' work, the exchange)")
    for handoff in (False, True):
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", *(["--handoff"] * handoff)],
            stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            ready, port = server.stdout.readline().split()
            assert ready == "ready"
            for name, client, env in CLIENTS:
                runs = [[float(us) for us in subprocess.run(
                    [sys.executable, __file__, "--measure", port, "--client", client,
                     "--exchanges", str(args.exchanges)],
                    capture_output=True, text=True, check=True,
                    env={**os.environ, **env}).stdout.split()] for _ in range(args.runs)]
                server_kind = "handoff to the main thread" if handoff else "handler answers"
                walls = [wall for wall, _ in runs]
                print(f"{server_kind:27s} {name:26s} us per exchange: "
                      + ", ".join(f"{wall:.0f}" for wall in walls)
                      + f"  ({min(walls) / budget_us:.0%} of the step budget at best);"
                      + " client CPU us: " + ", ".join(f"{cpu:.0f}" for _, cpu in runs))
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
