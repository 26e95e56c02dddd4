"""`huggy serve` as a user runs it: a subprocess that serves the bundled policy over HTTP until
SIGTERM or SIGINT (Ctrl-C), then shuts down and exits 0. Joining the session cluster, it leaves
that cluster running; on a cluster of its own, it leaves no process behind, also when started as a
background job of a non-interactive shell (SIGINT ignored) and when requests are in flight."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import numpy as np
import pytest

from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent_client.http_api import GRPC_ACT_METHOD
from huggy_agent_client.remote import RemoteAgent
from tests.support.cli import huggy_in_process
from tests.support.processes import (
    OutputFollower,
    free_port,
    free_server_port,
    group_killed_on_exit,
    huggy,
    kill_processes_mentioning,
    mentions,
    port_open,
)
from tests.support.ray_cluster import RayCluster

# what a non-interactive shell does to a background job: SIGINT ignored (inherited through exec)
IGNORING_SIGINT = ("bash", "-c", 'trap "" INT; exec "$@"', "bash")


def serve_in_process(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                     *args: str, key: str = "") -> tuple[int, str]:
    """`huggy serve ARGS` in this process, with `$HUGGY_API_KEY` = `key`: (exit code, stderr)."""
    monkeypatch.setenv("HUGGY_API_KEY", key)
    return huggy_in_process(capsys, ["serve", *args])


def test_serve_arguments_are_checked_before_anything_starts(tmp_path, capsys, monkeypatch) -> None:
    code, output = serve_in_process(capsys, monkeypatch, "--replicas", "2", "--autoscale")
    assert code == 2
    assert "argument --autoscale: not allowed with argument --replicas" in output
    code, output = serve_in_process(capsys, monkeypatch, "--policy", str(tmp_path / "nope.onnx"))
    assert code == 2
    assert f"policy '{tmp_path / 'nope.onnx'}' not found" in output
    code, output = serve_in_process(capsys, monkeypatch, "--limit", "max_glitches=0")
    assert code == 2
    assert "huggy serve: error: limit max_glitches must be an integer > 0, received 0" in output
    code, output = serve_in_process(capsys, monkeypatch, "--limit", "max_streams")
    assert code == 2
    assert "expected NAME=NUMBER such as max_concurrent_streams=50, received 'max_streams'" \
        in output
    code, output = serve_in_process(capsys, monkeypatch, "--grpc-port", "9", "--ingress", "proxy")
    assert code == 2
    assert ("--grpc-ingress replica goes through HAProxy, not --ingress proxy: use --ingress "
            "haproxy or --grpc-ingress serve") in output


@pytest.mark.parametrize("option", ["--port", "--grpc-port"])
def test_a_port_in_use_is_named_in_one_line_before_anything_starts(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, option: str) -> None:
    """Before Ray or HAProxy start: one line naming the option and the port, no traceback."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        busy = listening.getsockname()[1]
        other = str(free_port())
        ports = (["--port", str(busy), "--grpc-port", other] if option == "--port"
                 else ["--port", other, "--grpc-port", str(busy)])
        code, output = serve_in_process(capsys, monkeypatch, *ports)
    assert code == 2
    assert output == (f"huggy serve: error: {option} 127.0.0.1:{busy} is not free (Address "
                      "already in use); choose another port or stop what listens there\n")


def test_an_unreadable_or_empty_key_file_is_named_in_plain_words(tmp_path, capsys,
                                                                 monkeypatch) -> None:
    """The key file is read first, and its problem is said in the project's words: no
    validation library's error codes or links."""
    empty = tmp_path / "empty-key"
    empty.write_text("\n  \n")
    unreadable = tmp_path / "folder-key"
    unreadable.mkdir()
    for path, problem in ((tmp_path / "missing", "cannot be read: No such file or directory"),
                          (unreadable, "cannot be read: Is a directory"),
                          (empty, "is empty; expected the key on its first line")):
        code, output = serve_in_process(capsys, monkeypatch, "--api-key-file", str(path))
        assert code == 2
        assert output == f"huggy serve: error: API key file {str(path)!r} {problem}" + (
            "; expected a readable text file with the key on its first line\n"
            if "cannot be read" in problem else "\n")
        assert "pydantic" not in output


def not_its_own(lines: list[str]) -> list[str]:
    """The lines of `huggy serve`'s output that are not its own (`huggy serve: ...`), such as
    Ray's "Connecting to existing Serve app ... will not be applied" on every start or "Task
    ServeController.graceful_shutdown failed" on every stop."""
    return [line for line in lines if not line.startswith("huggy serve: ")]


EXPOSED = ("huggy serve: warning: no API key (--api-key-file or $HUGGY_API_KEY): anyone who "
           "can reach 0.0.0.0:{port}{grpc} can query the policy, read /v1/info and "
           "/v1/openapi.json, and load the replicas\n")


def test_serve_warns_once_when_it_listens_beyond_loopback_without_a_key(tmp_path, capsys,
                                                                         monkeypatch) -> None:
    """The warning comes before anything starts (here the missing policy stops the command)."""
    missing = str(tmp_path / "nope.onnx")
    key_file = tmp_path / "key"
    key_file.write_text("k\n")
    for args, key, warned in [
        (("--host", "0.0.0.0", "--port", "8123"), "", EXPOSED.format(port=8123, grpc="")),
        (("--host", "0.0.0.0", "--port", "8123", "--grpc-port", "9123"), "",
         EXPOSED.format(port=8123, grpc=" and gRPC 0.0.0.0:9123")),
        (("--host", "0.0.0.0"), "k", None),
        (("--host", "0.0.0.0", "--api-key-file", str(key_file)), "", None),
        (("--host", "127.0.0.1"), "", None),
        (("--host", "localhost"), "", None),
    ]:
        code, output = serve_in_process(capsys, monkeypatch, "--policy", missing, *args, key=key)
        assert code == 2, output
        assert output.count("warning") == (1 if warned else 0), output
        if warned:
            assert warned in output.splitlines(keepends=True), output
    code, output = serve_in_process(capsys, monkeypatch, "--api-key-file", str(tmp_path / "no-key"))
    assert code == 2
    assert f"API key file '{tmp_path / 'no-key'}' cannot be read: No such file" in output


def test_huggy_serve_serves_until_ctrl_c(ray_cluster: RayCluster) -> None:
    """As a user runs it, with the API key from the environment."""
    import ray
    import requests

    port = free_server_port()
    process = huggy("serve", "--accelerator", "cpu", "--num-cpus", "0.5", "--port", str(port),
                    "--address", ray_cluster.address, env={"HUGGY_API_KEY": "cli-key"},
                    start_new_session=True)
    output = OutputFollower(process, "served at")
    lines = output.lines
    with group_killed_on_exit(process):
        assert output.seen.wait(150), "huggy serve did not come up:\n" + "".join(lines[-30:])
        assert f"http://127.0.0.1:{port}/v1/act (ingress haproxy)" in "".join(lines)
        obs = np.random.default_rng(5).standard_normal((4, 59)).astype(np.float32)
        with RemoteAgent(f"http://127.0.0.1:{port}", api_key="cli-key") as remote:
            np.testing.assert_allclose(remote.compute_action(obs),
                                       HuggyAgent(device="cpu").compute_action(obs),
                                       rtol=0, atol=FP32_ACTION_ATOL)
        url = f"http://127.0.0.1:{port}/v1"
        assert requests.post(f"{url}/act", json={"obs": obs.tolist()}, timeout=30
                             ).status_code == 401
        assert requests.get(f"{url}/healthz", timeout=30).status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=90) == 0, "".join(lines[-30:])
    output.join()
    assert "huggy serve: shutting down (SIGINT)\n" in lines
    assert sum("policy served at" in line for line in lines) == 1
    assert not_its_own(lines) == []
    assert not any("warning" in line or "cli-key" in line for line in lines)
    assert not port_open(port)
    with pytest.raises(ValueError):  # Serve was removed from the joined cluster
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2  # the joined cluster still runs


@dataclass
class OwnServer:
    """`huggy serve` on a Ray cluster of its own, with Ray's files under `temp_dir`."""

    process: subprocess.Popen
    port: int
    temp_dir: Path
    haproxy_dir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def markers(self) -> tuple[str, ...]:
        """What the command line or open files of each of its processes mention."""
        return str(self.temp_dir), f"{self.haproxy_dir}/"

    def leftovers(self) -> list[str]:
        """Processes still alive (not zombies) that belong to this server: pid and command."""
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and any(mentions(proc, marker) for marker in self.markers()):
                try:
                    if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                        found.append(f"{proc.name} {proc.joinpath('cmdline').read_bytes()[:150]!r}")
                except OSError:
                    pass
        return found


@contextmanager
def own_server(wrapper: tuple[str, ...] = (), *extra: str) -> Iterator[OwnServer]:
    """Start `huggy serve` without --address, on a free port, with RAY_TMPDIR=/tmp/hs<8 hex>
    (Ray's temp root: every process of its cluster names it) and its output in a log file there;
    wait for the ready line; `extra`: more arguments. Whatever is left of it is killed on
    exit."""
    from deploy.serving.server import haproxy_dir

    temp_dir = Path(f"/tmp/hs{uuid.uuid4().hex[:8]}")
    temp_dir.mkdir()
    port = free_server_port()
    log = temp_dir / "serve.log"
    with log.open("w") as out:
        process = huggy("serve", "--accelerator", "cpu", "--num-cpus", "0.5", "--port", str(port),
                        *extra, env={"RAY_TMPDIR": str(temp_dir)}, wrapper=wrapper, stdout=out,
                        start_new_session=True)
    server = OwnServer(process, port, temp_dir, haproxy_dir(port), log)
    try:
        deadline = time.monotonic() + 150
        while "served at" not in server.output():
            assert process.poll() is None and time.monotonic() < deadline, (
                "huggy serve did not come up:\n" + server.output()[-3000:])
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for marker in server.markers():
            kill_processes_mentioning(marker)
        shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(server.haproxy_dir, ignore_errors=True)


async def post_all(url: str, bodies: list[bytes],
                   first_answer: threading.Event) -> list[tuple[float, int | str]]:
    """POST every body to /v1/act at once: (time answered, HTTP status or the error's name)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def post(body: bytes) -> tuple[float, int | str]:
            try:
                async with session.post(f"{url}/v1/act", data=body) as response:
                    await response.read()
                    outcome: int | str = response.status
            except aiohttp.ClientError as error:
                outcome = type(error).__name__
            first_answer.set()
            return time.monotonic(), outcome

        return list(await asyncio.gather(*(post(body) for body in bodies)))


async def call_all(address: str, bodies: list[bytes], first_answer: threading.Event
                   ) -> list[tuple[float, str]]:
    """Call /huggy.v1.Policy/Act with every body at once: (time answered, status code name).
    `first_answer` is set at the first OK answer, so that a signal sent after it finds the
    server serving."""
    async with grpc.aio.insecure_channel(address) as channel:
        act = channel.unary_unary(GRPC_ACT_METHOD)

        async def call(body: bytes) -> tuple[float, str]:
            try:
                await act(body, timeout=60)
            except grpc.aio.AioRpcError as error:
                return time.monotonic(), error.code().name
            first_answer.set()
            return time.monotonic(), grpc.StatusCode.OK.name

        return list(await asyncio.gather(*(call(body) for body in bodies)))


@pytest.mark.ray  # starts a Ray cluster of its own
def test_huggy_serve_answers_the_grpc_calls_in_flight_when_it_stops() -> None:
    """`--grpc-port` (HAProxy's HTTP/2 to the replicas' listeners): SIGTERM arrives while 50
    calls are in flight; each is answered, or refused before it was sent (UNAVAILABLE), none
    cut; then the port is closed and no process is left."""
    grpc_port = free_server_port()
    with own_server((), "--grpc-port", str(grpc_port)) as server:
        assert f"gRPC {GRPC_ACT_METHOD} on 127.0.0.1:{grpc_port} by replica" in server.output()
        obs = np.random.default_rng(7).standard_normal((256, 59)).astype(np.float32)
        first_answer = threading.Event()
        answers: list[tuple[float, str]] = []
        burst = threading.Thread(target=lambda: answers.extend(asyncio.run(call_all(
            f"127.0.0.1:{grpc_port}", [json.dumps({"obs": obs.tolist()}).encode()] * 50,
            first_answer))))
        burst.start()
        assert first_answer.wait(60)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0, server.output()[-3000:]
        burst.join(timeout=60)
        deadline = time.monotonic() + 5
        while (left := server.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not left, f"processes left behind: {left}"
    assert not port_open(grpc_port)
    assert len(answers) == 50
    assert {outcome for _, outcome in answers} <= {"OK", "UNAVAILABLE"}, answers
    assert any(when > signalled and outcome == "OK" for when, outcome in answers), (
        f"no call was in flight when the signal came: {answers}")


@pytest.mark.ray  # starts a Ray cluster of its own
def test_huggy_serve_stops_cleanly_while_it_changes_its_policies(tmp_path: Path) -> None:
    """SIGTERM while a `PUT /v1/policies` is being applied (the line "changing policies" printed,
    its redeploy under way): the thread that applies changes ends before Ray is shut down, so the
    process exits 0 with one shutdown line and no traceback (a Ray call under `ray.shutdown` ends
    it with exit code 1 or SIGSEGV), and the PUT is answered: 200 where the redeploy finished
    first, else 503 naming the shutdown."""
    import requests

    key_file = tmp_path / "api-key"
    key_file.write_text("change-key\n")
    other = Path("tests/fixtures/huggy/ppo_num_layers_2/Huggy.onnx").resolve()
    with own_server((), "--api-key-file", str(key_file)) as server:
        answer: list[requests.Response] = []
        put = threading.Thread(target=lambda: answer.append(requests.put(
            f"{server.url}/v1/policies", json={"policies": [{"id": "other", "path": str(other)}]},
            headers={"Authorization": "Bearer change-key"}, timeout=120)))
        put.start()
        deadline = time.monotonic() + 60
        while "huggy serve: changing policies to other" not in server.output():
            assert put.is_alive() and time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0, server.output()[-3000:]
        put.join(timeout=60)
        output = server.output()
    assert "Traceback" not in output and "core worker" not in output, output
    assert output.count("huggy serve: shutting down (SIGTERM)") == 1, output
    (reply,) = answer
    assert reply.status_code in {200, 503}, reply.text
    if reply.status_code == 503:
        assert "huggy serve is shutting down" in reply.json()["message"], reply.text
    else:
        assert reply.json()["policies"] == ["other"], reply.text


@pytest.mark.ray  # starts a Ray cluster of its own
@pytest.mark.parametrize("case", ["SIGTERM", "SIGINT", "SIGINT, ignored as in a background job",
                                  "SIGTERM to the process group"])
def test_huggy_serve_on_its_own_cluster_stops_cleanly_on_a_signal(case: str) -> None:
    """The signal arrives while 50 requests are in flight: those are answered with 200, then it
    exits 0 within 30 s with one line for the shutdown and no traceback (a second signal during
    the shutdown included), and no process of its cluster or its HAProxy is left. Sent to the
    process group (`kill -TERM -PGID`, `timeout`, a shell's `kill %1`), SIGTERM also reaches
    the cluster's head processes, which Ray starts in it: then Serve's own shutdown, which would
    wait 30 s for a controller that no raylet answers, is not waited for; and as the raylet
    ends, so do the replicas, so a request in flight may be cut off instead of answered."""
    signum = signal.SIGINT if case.startswith("SIGINT") else signal.SIGTERM
    wrapper = IGNORING_SIGINT if "ignored" in case else ()
    if wrapper:  # the case is what it claims: what the wrapper starts has SIGINT ignored
        ignored = subprocess.run([*wrapper, "grep", "SigIgn", "/proc/self/status"], check=True,
                                 capture_output=True, text=True).stdout.split()[1]
        assert int(ignored, 16) & 1 << (signal.SIGINT - 1)
    with own_server(wrapper) as server:
        obs = np.random.default_rng(6).standard_normal((256, 59)).astype(np.float32)
        # patient: on a loaded machine a health check may take the replica out for seconds
        with RemoteAgent(server.url, retries=8) as remote:
            np.testing.assert_allclose(remote.compute_action(obs[:4]),
                                       HuggyAgent(device="cpu").compute_action(obs[:4]),
                                       rtol=0, atol=FP32_ACTION_ATOL)
        first_answer = threading.Event()
        answers: list[tuple[float, int | str]] = []
        burst = threading.Thread(target=lambda: answers.extend(asyncio.run(post_all(
            server.url, [json.dumps({"obs": obs.tolist()}).encode()] * 50, first_answer))))
        burst.start()
        assert first_answer.wait(60)
        signalled = time.monotonic()
        send = (functools.partial(os.killpg, server.process.pid) if "group" in case
                else server.process.send_signal)  # its own session: its pid is its group's id
        send(signum)
        time.sleep(0.5)
        send(signum)  # a second one, during the shutdown
        assert server.process.wait(timeout=30) == 0, server.output()[-3000:]
        burst.join(timeout=60)
        deadline = time.monotonic() + 5
        while (left := server.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        output = server.output()
    assert not left, f"processes left behind: {left}"
    assert not port_open(server.port)
    # each request is answered, or refused before it is sent; none gets a 5xx, and none is cut
    # off unless the signal went to the group (which ends the replicas with the raylet)
    cut_off = ({"ServerDisconnectedError", "ClientOSError", "ClientPayloadError"} if "group" in case
               else set())
    assert len(answers) == 50
    assert {outcome for _, outcome in answers} <= {200, "ClientConnectorError", *cut_off}, answers
    assert any(when > signalled and outcome in {200, *cut_off} for when, outcome in answers), (
        "no request was in flight when the signal came")
    assert output.count("huggy serve: policy served at") == 1, output
    assert output.count("huggy serve: shutting down") == 1, output
    assert f"huggy serve: shutting down ({signal.Signals(signum).name})\n" in output
    assert "Traceback" not in output and "SIGTERM received" not in output, output
    assert not_its_own(output.splitlines()) == []
