"""The replica's own request path in one process, against its floor (bounded; not a test).

    .venv/bin/python bench/bench_replica.py                       # 1, 16, 64 at once, ~30 s
    .venv/bin/python bench/bench_replica.py --at-once 16 --rounds 15

No Ray and no sockets: `HuggyPolicyDeployment.__call__` on starlette requests for
`POST /v1/act` (one observation each, the common body), `--at-once` of them gathered on one
event loop at a time, as a replica's loop sees requests that arrive together. The floor, in
the same run, alternated round by round: the same requests answered by `echo_pass.EchoPass`,
an echo that runs the bundled policy's forward pass as the replica runs it, reading the body
but parsing nothing and writing no actions (`bench_serve.py`'s `echo+pass` series, without
Serve).

Prints CPU microseconds per request (process time, the best round of each; one thread, as a
replica runs), ours / floor, and ours - floor: what the serving code itself costs (parsing,
validation, the heads, the answer, routing and counting). Under Serve the same code costs
about twice as much per request (docs/benchmarks.md), but this isolates it from the noise of
a loaded machine, so two trees can be told apart in a minute. With `--parts`, also what parsing
the body (`plain_one_row`) and writing the answer (`act_response`) cost in this loop, where the
forward pass leaves the caches cold: ours against ours with the parsing replaced by its
result, parsed beforehand, and with the answer's writing replaced by fixed bytes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # a replica's one thread (bench_serve sets it so)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any
from unittest import mock

import numpy as np
from echo_pass import EchoPass
from starlette.requests import Request
from starlette.responses import Response

from deploy.serving import runner as runner_module
from deploy.serving.replica import HuggyPolicyDeployment
from deploy.serving.settings import AppArgs
from huggy_agent.tables import format_table

Handler = Callable[[Request], Awaitable[Response]]


class Replica(HuggyPolicyDeployment.func_or_class):  # type: ignore[misc,name-defined]
    """The replica without Serve (its async `__del__` only stops a listener never started)."""

    def __del__(self) -> None:
        pass


def act_request(body: bytes) -> Request:
    """A `POST /v1/act` carrying `body` in one ASGI message."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    return Request({"type": "http", "method": "POST", "path": "/v1/act", "root_path": "",
                    "query_string": b"", "headers": headers}, receive)


async def cpu_us_per_request(handler: Handler, bodies: list[bytes], at_once: int,
                             requests: int) -> float:
    """CPU microseconds per request over `requests` requests, `at_once` gathered at a time;
    raises if any is not answered 200. The requests are built before the clock starts."""
    rounds = max(requests // at_once, 1)
    batches = [[act_request(bodies[(r * at_once + i) % len(bodies)]) for i in range(at_once)]
               for r in range(rounds)]
    start = time.process_time()
    for batch in batches:
        for response in await asyncio.gather(*map(handler, batch)):
            if response.status_code != 200:
                raise RuntimeError(f"answered {response.status_code}: {response.body[:200]!r}")
    return (time.process_time() - start) / (rounds * at_once) * 1e6


async def measure(args: argparse.Namespace) -> list[list[Any]]:
    app = AppArgs(accelerator="cpu")
    replica = Replica("cpu")
    settings = app.batch_settings()
    await replica.reconfigure({**asdict(settings), **app.policy_set().as_config()})
    floor = EchoPass()
    spec = floor.agent.spec  # the bundled policy's, as the replica's default
    rows = np.random.default_rng(1).standard_normal((256, *spec.inputs[0].shape))
    bodies = [json.dumps({"obs": row.astype(np.float32).tolist()}).encode() for row in rows]
    parsed = runner_module.plain_one_row(bodies[0], spec)
    written = runner_module.act_response({"continuous": np.zeros((1, spec.continuous_size),
                                                                  np.float32)}, True, "", "")
    variants: dict[str, tuple[Handler, contextlib.AbstractContextManager[Any]]] = {
        "ours": (replica, contextlib.nullcontext()),
        "floor": (floor, contextlib.nullcontext())}
    if args.parts:
        variants["body parsed beforehand"] = (replica, mock.patch.object(
            runner_module, "plain_one_row", lambda body, spec: parsed))
        variants["answer fixed"] = (replica, mock.patch.object(
            runner_module, "act_response", lambda *_: written))
    table = []
    for at_once in args.at_once:
        for handler, patch in variants.values():  # a round each unmeasured: warm caches
            with patch:
                await cpu_us_per_request(handler, bodies, at_once, at_once * 20)
        best = dict.fromkeys(variants, float("inf"))
        for _ in range(args.rounds):
            for name, (handler, patch) in variants.items():
                with patch:
                    spent = await cpu_us_per_request(handler, bodies, at_once, args.requests)
                best[name] = min(best[name], spent)
        ours, least = best["ours"], best["floor"]
        row = [at_once, round(ours), round(least), f"{ours / least:.2f}x", round(ours - least)]
        if args.parts:
            row += [round(ours - best["body parsed beforehand"]),
                    round(ours - best["answer fixed"])]
        table.append(row)
        print(f"{at_once} at once: " + ", ".join(f"{name} {us:.1f} us"
                                                 for name, us in best.items()), flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at-once", type=lambda text: [int(n) for n in text.split(",")],
                        default=[1, 16, 64], help="requests gathered at a time (default 1,16,64)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="measured rounds of each handler, alternated; the best is kept")
    parser.add_argument("--requests", type=int, default=2000, help="requests per round")
    parser.add_argument("--parts", action="store_true",
                        help="also what parsing the body and writing the answer cost")
    args = parser.parse_args()
    if args.rounds < 1 or args.requests < 1 or min(args.at_once) < 1:
        parser.error("--rounds, --requests and --at-once take positive integers")
    table = asyncio.run(measure(args))
    print()
    headers = ["at once", "ours us/request", "floor us/request", "ours / floor",
               "serving code us"]
    if args.parts:
        headers += ["parsing the body us", "writing the answer us"]
    print(format_table(headers, table))


if __name__ == "__main__":
    main()
