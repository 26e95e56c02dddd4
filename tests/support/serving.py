"""What the tests of the serving front door share, without a Ray cluster: the HAProxy
configuration that the installed Ray writes (`ray_config`), a service that records what the
replica's listener hands it (`Recorder`), and a live HAProxy on the changed configuration in
front of a live listener (`FrontDoor`)."""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import subprocess
import threading
import time
from pathlib import Path

from deploy.ray_internals import render_haproxy_config
from deploy.serving.haproxy import Front, patch_config, real_binary, replica_socket
from deploy.serving.http_server import HttpService, UnixHttpServer
from deploy.serving.limits import ServingLimits
from deploy.serving.responses import ApiError, internal_error
from deploy.serving.service import Admission, Reply, RequestHead
from tests.support.processes import free_ports, port_open

WAIT_S = 30
"""The most a test waits for HAProxy or an answer (a bound against hanging, not a measurement)."""
KEY = "Bearer k"
REPLICA_ID = "1"
"""The replica of `ray_config`: Ray's name for its server ends with it."""


def ray_config(tmp_path: Path, port: int = 18000, replica: int = 30000, fallback: int = 8500,
               host: str = "127.0.0.1", metrics: int = 18001, stats: int = 18002,
               grpc_port: int | None = None) -> str:
    """The HAProxy configuration that the installed Ray writes for the app "huggy" at "/" with
    one replica (`REPLICA_ID`, Serve port `replica` on 127.0.0.1), Serve's proxy on `fallback`
    as its backup, HTTP on `host:port`, HAProxy's metrics and statistics on `metrics` and
    `stats` (and Serve's gRPC on `grpc_port` where that Ray's HAProxy carries it), rendered by
    Ray's own writer (`deploy.ray_internals.render_haproxy_config`, the one place that touches
    those private classes), its files in `tmp_path`."""
    folder = tmp_path / "ray-haproxy"
    folder.mkdir(exist_ok=True)
    return render_haproxy_config(folder, host, port, [(REPLICA_ID, "127.0.0.1", replica)],
                                 fallback, metrics, stats, grpc_port=grpc_port)


class Recorder:
    """A service that admits a request with `KEY` (none needed on /open), to any path but
    /nope, refuses bodies over `limit`, and answers what it was handed as JSON; /held waits for
    `release` (setting `held`), /fail fails, /unknown-policy is refused with 404. Its methods
    run on one event loop."""

    def __init__(self, limit: int = 1_000) -> None:
        self.limit = limit
        self.admitted: list[tuple[str, str, RequestHead]] = []
        self.handed: list[tuple[str, bytes]] = []
        self.refused: list[int] = []
        self.left = 0
        self.release = asyncio.Event()
        self.held = asyncio.Event()

    def admit(self, method: str, path: str, head: RequestHead) -> Admission:
        if path != "/open" and head.authorization != KEY:
            raise ApiError(401, "unauthorized", f"no key on {path}")
        if path == "/nope":
            raise ApiError(404, "not_found", "no route")
        if head.content_length is not None:
            self.check_size(head.content_length, declared=True)
        self.admitted.append((method, path, head))
        return Admission(path, head.policy_id)

    def check_size(self, size: int, declared: bool = False) -> None:
        if size > self.limit:
            raise ApiError(413, "body_too_large",
                           f"{size} bytes ({'declared' if declared else 'received'})")

    async def reply(self, admission: Admission, body: bytes, may_run_alone: bool = True
                    ) -> Reply:
        self.handed.append((admission.route, body))
        if admission.route == "/held":
            self.held.set()
            await self.release.wait()
        if admission.route == "/fail":
            return self.refusal(internal_error(ValueError("broken")))
        if admission.route == "/unknown-policy":
            return self.refusal(ApiError(404, "unknown_policy", "no such policy"))
        return Reply(200, json.dumps({"route": admission.route, "policy": admission.policy_id,
                                      "body": body.decode("latin-1")}).encode(),
                     (("x-seen", "1"),))

    def refusal(self, error: ApiError) -> Reply:
        self.refused.append(error.status)
        return Reply(error.status, error.body(), tuple(error.headers.items()))

    def abandoned(self) -> None:
        self.left += 1


class _ServePort(http.server.BaseHTTPRequestHandler):
    """Stands for Serve's HTTP server in a replica: answers HAProxy's health checks."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class FrontDoor:
    """A live HAProxy on Ray's configuration changed for `limits` (and gRPC on `grpc_port`),
    in front of a live listener of the replica `REPLICA_ID` whose service is a `Recorder` (or
    `service`, a replica's real one), all on 127.0.0.1; a stand-in for the replica's Serve port
    answers the health checks. Use as a context manager; `call(coroutine)` runs one on the
    listener's event loop. `check_interval`: HAProxy's health check interval instead of Ray's
    (`inter` of its `default-server` line), for a test that waits for a check."""

    def __init__(self, tmp_path: Path, page: Path, limits: ServingLimits | None = None,
                 grpc: bool = False, service_limit: int = 1_000,
                 service: HttpService | None = None, check_interval: str | None = None) -> None:
        self.check_interval = check_interval
        self.tmp_path = tmp_path
        self.page = page
        self.limits = limits or ServingLimits()
        self.port, self.grpc_port, fallback, self.metrics, self.stats = free_ports(5)
        self.fallback = fallback
        self.grpc = grpc
        self.loop = asyncio.new_event_loop()
        self.recorder = Recorder(service_limit)  # its events bind to the loop at first use
        self.listener = UnixHttpServer(service or self.recorder)
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.serve_port = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ServePort)
        self.config = tmp_path / "haproxy.cfg"

    def call(self, coroutine: object) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=WAIT_S)

    def __enter__(self) -> FrontDoor:
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        threading.Thread(target=self.serve_port.serve_forever, daemon=True).start()
        sock = replica_socket(self.page.parent, REPLICA_ID)
        sock.parent.mkdir(exist_ok=True)
        self.call(self.listener.start(sock))
        front = Front(self.limits, ("127.0.0.1", self.grpc_port) if self.grpc else None)
        config = patch_config(ray_config(
            self.tmp_path, self.port, self.serve_port.server_address[1], self.fallback,
            metrics=self.metrics, stats=self.stats), self.page, front)
        if self.check_interval is not None:
            config, changed = re.subn(r"^(\s*default-server .*\binter )\S+", rf"\g<1>{self.check_interval}",
                                      config, flags=re.MULTILINE)
            assert changed, "no default-server line with an inter in Ray's configuration"
        self.config.write_text(config)
        self.haproxy = subprocess.Popen([real_binary(), "-db", "-f", str(self.config)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + WAIT_S
        while not (port_open(self.port) and (not self.grpc or port_open(self.grpc_port))):
            assert self.haproxy.poll() is None, self.haproxy.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.haproxy is not None:
            self.haproxy.terminate()
            self.haproxy.wait(timeout=WAIT_S)
        self.serve_port.shutdown()
        self.serve_port.server_close()
        self.call(self.listener.stop(grace=5))
        self.loop.call_soon_threadsafe(self.loop.stop)

    def release(self) -> None:
        """Let every held request go."""
        self.loop.call_soon_threadsafe(self.recorder.release.set)
