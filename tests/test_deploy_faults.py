"""Serving while no replica can answer, behind HAProxy (the default ingress), on the session
cluster:

- while `huggy serve` starts, `/v1/healthz` refuses connections or answers 503 in the JSON error
  format with `Retry-After`, until it answers 200; the command prints only its own lines;
- eight clients keep asking while the replica's process is killed (SIGKILL): with a lone
  replica, every request sent after the kill gets its 200 or a 503 in the JSON error format with
  `Retry-After` (none a 500, none waits until its client gives up) until the replacement
  answers; with two replicas, every one of them gets its 200. Only requests in flight at the
  kill may be cut off;
- `stop_serve` shuts Serve down even where its controller answers too late for Serve's own
  shutdown, which then gives up and leaves Serve running.

The outcomes are printed as a table (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import requests

from deploy.serving.server import DEFAULT_INGRESS, deploy, serve_running, start_serve, stop_serve
from deploy.serving.settings import AppArgs
from huggy_agent_client.http_api import ACT_PATH, HEALTH_PATH, INFO_PATH, RETRY_AFTER_S
from tests.support.processes import (
    OutputFollower,
    free_port,
    free_server_port,
    group_killed_on_exit,
    huggy,
    mentions,
)
from tests.support.ray_cluster import RayCluster

CLIENTS = 8
CLIENT_TIMEOUT_S = 10.0
"""Each request's own limit: a request that hits it waited on a replica that was not there."""
WAIT_S = 240.0
"""The most any step waits (a bound against hanging, not a measurement)."""
APP = "faults"
ACT_BODY = json.dumps({"obs": np.zeros(59).tolist()}).encode()


def is_unavailable(status: int | str, headers: Mapping[str, str], body: bytes) -> bool:
    """A 503 in the API's JSON error format, with `Retry-After` (`headers`: a mapping that
    ignores the case of names)."""
    if status != 503 or headers.get("Retry-After") != str(RETRY_AFTER_S):
        return False
    if not headers.get("Content-Type", "").startswith("application/json"):
        return False
    try:
        document = json.loads(body)
    except ValueError:
        return False
    return (set(document) == {"error", "message"} and document["error"] == "unavailable"
            and "retry" in document["message"])


# --- start-up ----------------------------------------------------------------------------------

def test_healthz_answers_503_json_while_huggy_serve_starts_and_output_is_its_own(
        ray_cluster: RayCluster) -> None:
    """`/v1/healthz` is polled from the moment `huggy serve` starts: each answer is a refused
    connection (before HAProxy listens), a JSON 503 (before the app exists, and before its
    replica answers) or, from the ready line on, a 200; never Serve's plain-text 404. SIGTERM then
    stops it, and all it printed is its own two lines."""
    port = free_server_port()
    url = f"http://127.0.0.1:{port}{HEALTH_PATH}"
    process = huggy("serve", "--accelerator", "cpu", "--num-cpus", "0.5", "--port", str(port),
                    "--address", ray_cluster.address, start_new_session=True)
    output = OutputFollower(process, "served at")
    lines = output.lines
    answers: collections.Counter[str] = collections.Counter()
    wrong: list[str] = []
    with group_killed_on_exit(process):
        deadline = time.monotonic() + WAIT_S
        while not output.seen.is_set():
            assert process.poll() is None and time.monotonic() < deadline, (
                "huggy serve did not come up:\n" + "".join(lines[-30:]))
            answers[healthz(url, wrong)] += 1
            time.sleep(0.05)
        answers_when_ready = healthz(url, wrong)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 0, "".join(lines[-30:])
    output.join()
    print(f"\n/v1/healthz while huggy serve started: {dict(answers)}")
    assert wrong == [], f"answers other than refusals, JSON 503s and 200s: {wrong}"
    assert answers["503 unavailable"] > 0  # it was asked while the app was not answering
    assert answers_when_ready == "200"
    banner = (f"huggy serve: policy served at http://127.0.0.1:{port}/v1/act (ingress haproxy); "
              "/v1/act answers with assets/Huggy.onnx; all at /v1/models; "
              "Ctrl-C or SIGTERM to stop\n")
    assert lines == [banner, "huggy serve: shutting down (SIGTERM)\n"], "".join(lines)


def healthz(url: str, wrong: list[str]) -> str:
    """What `GET url` got: "refused", "503 unavailable", "200" or "wrong" (described in
    `wrong`)."""
    try:
        reply = requests.get(url, timeout=CLIENT_TIMEOUT_S)
    except requests.ConnectionError as error:
        if "Connection refused" in str(error):
            return "refused"
        wrong.append(repr(error))
        return "wrong"
    if reply.status_code == 200 and reply.json()["status"] == "ok":
        return "200"
    if is_unavailable(reply.status_code, reply.headers, reply.content):
        return "503 unavailable"
    wrong.append(f"{reply.status_code} {reply.headers.get('Content-Type')} {reply.content[:200]!r}")
    return "wrong"


# --- shutdown ----------------------------------------------------------------------------------

class _Seen(logging.Handler):
    """Sets `event` when a record's message contains `text`."""

    def __init__(self, text: str, event: threading.Event) -> None:
        super().__init__()
        self.text, self.event = text, event

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_stop_serve_shuts_down_a_controller_that_answers_late(ray_cluster: RayCluster) -> None:
    """Serve's own shutdown gives up on a controller that takes over 5 s to answer its liveness
    check, and leaves Serve running (Ray 2.60: it logs the controller "unreachable", then
    "Nothing to shut down"); `stop_serve` asks again and returns once the controller is gone.
    The controller is frozen (SIGSTOP) until Serve's shutdown has logged it unreachable."""
    port = free_port()
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    [controller] = pids_titled("ray::ServeController", ray_cluster.temp_dir)
    unreachable = threading.Event()
    seen = _Seen("unreachable", unreachable)
    serve_logger = logging.getLogger("ray.serve")
    level = serve_logger.level
    serve_logger.setLevel(logging.INFO)
    serve_logger.addHandler(seen)
    resume = threading.Thread(
        target=lambda: unreachable.wait(WAIT_S) and os.kill(controller, signal.SIGCONT))
    os.kill(controller, signal.SIGSTOP)
    try:
        resume.start()
        stop_serve(port)
        assert unreachable.is_set(), "Serve's shutdown never found the frozen controller unreachable"
        assert not serve_running()
    finally:
        unreachable.set()
        resume.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(controller, signal.SIGCONT)
        serve_logger.removeHandler(seen)
        serve_logger.setLevel(level)


# --- a replica killed under load ---------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """One request: when it was sent and answered (time.monotonic), and how."""

    sent: float
    done: float
    status: int | str  # the HTTP status, or the name of the client's error ("timeout", ...)
    unavailable: bool  # a 503 in the JSON error format with Retry-After

    @property
    def kind(self) -> str:
        return "503 unavailable" if self.unavailable else str(self.status)


async def _ask(session: aiohttp.ClientSession, url: str) -> Outcome:
    sent = time.monotonic()
    try:
        async with session.post(url, data=ACT_BODY) as reply:
            body = await reply.read()
            status: int | str = reply.status
            unavailable = is_unavailable(reply.status, reply.headers, body)
    except asyncio.TimeoutError:
        status, unavailable = "timeout", False
    except aiohttp.ClientError as error:
        status, unavailable = type(error).__name__, False
    return Outcome(sent, time.monotonic(), status, unavailable)


async def _replica_id(session: aiohttp.ClientSession, base: str) -> str | None:
    """The replica that answers `/v1/info` now, or None while none does."""
    try:
        async with session.get(f"{base}{INFO_PATH}") as reply:
            return (await reply.json())["replica"] if reply.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


def pids_titled(title: str, temp_dir: Path) -> list[int]:
    """The processes of the session cluster (whose open files name its temp dir) whose title,
    as Ray sets it (`ray::<actor class>...`), starts with `title`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(title.encode())
                    and mentions(proc, str(temp_dir))):
                found.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return sorted(found)


def replica_pids(temp_dir: Path) -> list[int]:
    """The processes of the app's replicas in the session cluster."""
    return pids_titled(f"ray::ServeReplica:{APP}:", temp_dir)


@dataclass
class Run:
    """What the clients saw: every request, the moment the replica was sent SIGKILL, and the
    moment its replacement (a replica that was not there before the kill) first answered.

    The kill takes effect when the kernel has closed the process's sockets, tens of ms after the
    signal on this machine (it tears the process down first); the clients see that moment as
    the first request after the signal that fails. A request sent before it was in flight."""

    outcomes: list[Outcome]
    signalled_at: float = 0.0
    back_at: float = 0.0

    @property
    def killed_at(self) -> float:
        return min((o.done for o in self.outcomes
                    if o.status != 200 and o.done > self.signalled_at), default=self.signalled_at)

    def phase(self, outcome: Outcome) -> str:
        if outcome.done < self.signalled_at:
            return "before"
        return "in flight" if outcome.sent < self.killed_at else "after"


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    """Return once `condition()` holds; fail saying `what` was awaited after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not await _value(condition()):
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        await asyncio.sleep(0.1)


async def _value(result: bool | Awaitable[bool]) -> bool:
    return await result if inspect.isawaitable(result) else bool(result)


async def kill_a_replica_under_load(base: str, replicas: int, temp_dir: Path) -> Run:
    """CLIENTS clients ask `/v1/act`, one request after another, while one replica of
    `replicas` is killed (SIGKILL); they stop once its replacement has answered and every client
    has had two answers to requests sent after that."""
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    run = Run([])
    per_client: list[list[Outcome]] = [[] for _ in range(CLIENTS)]
    stop = asyncio.Event()

    async def client(mine: list[Outcome]) -> None:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                mine.append(await _ask(session, f"{base}{ACT_PATH}"))
                run.outcomes.append(mine[-1])
                if mine[-1].status != 200:
                    await asyncio.sleep(0.02)  # as a client that backs off would

    async with aiohttp.ClientSession(timeout=timeout) as probe:
        before: set[str | None] = {None}

        async def every_replica_answered() -> bool:
            before.add(await _replica_id(probe, base))
            return len(before) == replicas + 1

        async def replacement_answered() -> bool:
            return await _replica_id(probe, base) not in before

        await until(every_replica_answered, f"answers from {replicas} replicas")
        tasks = [asyncio.ensure_future(client(mine)) for mine in per_client]
        try:
            await until(lambda: all(len(mine) >= 20 for mine in per_client),
                        "20 answers per client before the kill")
            pids = replica_pids(temp_dir)
            assert len(pids) == replicas, f"replica processes {pids}, expected {replicas}"
            run.signalled_at = time.monotonic()
            os.kill(pids[0], signal.SIGKILL)
            await until(replacement_answered, "answer from a new replica after the kill")
            run.back_at = time.monotonic()
            await until(lambda: all(sum(o.sent > run.back_at for o in mine) >= 2
                                    for mine in per_client),
                        "two answers per client after the replacement answered")
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    return run


def table(run: Run) -> str:
    """Count, slowest and median answer time by kind, for the requests answered before the
    kill, in flight at the kill and sent after it."""
    rows: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for outcome in run.outcomes:
        rows[run.phase(outcome), outcome.kind].append(outcome.done - outcome.sent)
    order = {"before": 0, "in flight": 1, "after": 2}
    return "\n".join(f"  {phase:<9} {kind:<16} {len(times):>6}  slowest {max(times) * 1e3:7.1f} ms"
                     f"  median {np.median(times) * 1e3:6.1f} ms"
                     for (phase, kind), times in sorted(rows.items(),
                                                        key=lambda row: order[row[0][0]]))


@dataclass(frozen=True)
class Server:
    base: str


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster) -> Iterator[Server]:
    port = free_port()
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    try:
        deploy(AppArgs(accelerator="cpu", num_cpus=0.5), name=APP, route_prefix=f"/{APP}",
               timeout_s=WAIT_S)
        yield Server(f"http://127.0.0.1:{port}/{APP}")
    finally:
        stop_serve(port)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_killed_replica_costs_only_the_requests_in_flight(
        server: Server, ray_cluster: RayCluster, replicas: int) -> None:
    """A lone replica: until its replacement answers, every request gets a JSON 503 with
    Retry-After (HAProxy answers for the missing replica), then its 200; none gets a 500 and
    none runs into its timeout. One of two: every request sent after the kill gets its 200
    (HAProxy sends it to the other replica, again if the first one died under it)."""
    deploy(AppArgs(accelerator="cpu", num_cpus=0.5, replicas=replicas), name=APP,
           route_prefix=f"/{APP}", timeout_s=WAIT_S)
    run = asyncio.run(kill_a_replica_under_load(server.base, replicas, ray_cluster.temp_dir))
    print(f"\n{replicas} replica(s), one killed under {CLIENTS} clients:\n{table(run)}")
    phases = collections.defaultdict(list)
    for outcome in run.outcomes:
        phases[run.phase(outcome)].append(outcome)
    assert not [o for o in run.outcomes if o.status in ("timeout", 500)], table(run)
    assert all(o.status == 200 for o in phases["before"]), table(run)
    if replicas == 1:
        assert all(o.status == 200 or o.unavailable for o in phases["after"]), table(run)
        assert any(o.unavailable for o in phases["after"]), "no request found the replica gone"
        assert all(o.status == 200 for o in run.outcomes if o.sent > run.back_at), table(run)
    else:
        assert all(o.status == 200 for o in phases["after"]), table(run)
