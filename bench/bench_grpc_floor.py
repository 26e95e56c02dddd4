"""The floor under one Huggy step over gRPC: a bare Python-to-Python unary exchange, shaped as
mlagents-envs makes it (the Python side hosts a sync gRPC server with a thread pool, Unity calls
it from another process), with messages of a Huggy step's size (18 agents: observations up,
actions down), no protobuf and no work on either side.

Two server variants: the handler answers itself, or it hands the request to the main thread and
waits for the answer (the handoff envs/fast_step.py makes); two client variants: gRPC's default
client I/O, and the older one the stand-ins use (`GRPC_EXPERIMENTS=-event_engine_client`).
Prints microseconds per exchange (several client runs per pair, each after its warm-up) and what
that leaves of a step at a given agent-decisions/s target.

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

import grpc

AGENTS = 18
UP_BYTES = AGENTS * 59 * 4 + 2_000  # observations, and the rest of the agents' infos
DOWN_BYTES = AGENTS * 21 * 4 + 200  # continuous actions
METHOD = "/floor.Floor/Exchange"
OLDER_CLIENT_IO = {"GRPC_EXPERIMENTS": "-event_engine_client"}


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


def measure(port: int, exchanges: int) -> float:
    """Microseconds per exchange over `exchanges` calls, after 200 to warm up."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD)
        body = b"o" * UP_BYTES
        for _ in range(200):
            call(body)
        start = time.perf_counter()
        for _ in range(exchanges):
            call(body)
        return (time.perf_counter() - start) / exchanges * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=3000, help="timed calls per run")
    parser.add_argument("--runs", type=int, default=3, help="client runs per variant")
    parser.add_argument("--target", type=int, default=20_000,
                        help="agent-decisions/s to compare the floor with (default 20,000)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--handoff", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.handoff)
        return
    if args.measure:
        print(f"{measure(args.measure, args.exchanges):.1f}")
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
            for name, env in (("default client I/O", {}), ("older client I/O", OLDER_CLIENT_IO)):
                runs = [float(subprocess.run(
                    [sys.executable, __file__, "--measure", port,
                     "--exchanges", str(args.exchanges)],
                    capture_output=True, text=True, check=True,
                    env={**os.environ, **env}).stdout.split()[-1]) for _ in range(args.runs)]
                server_kind = "handoff to the main thread" if handoff else "handler answers"
                print(f"{server_kind:27s} {name:18s} us per exchange: "
                      + ", ".join(f"{run:.0f}" for run in runs)
                      + f"  ({min(runs) / budget_us:.0%} of the step budget at best)")
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
