"""What the tests of the serving front door share, without Ray: a configuration shaped as Ray 2.60
writes it (`ray_config`), a service that records what the replica's listener hands it
(`Recorder`), and a live HAProxy on the changed configuration in front of a live listener
(`FrontDoor`)."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import threading
import time
from pathlib import Path

from deploy.serving.haproxy import Front, patch_config, real_binary, replica_socket
from deploy.serving.http_server import HttpService, UnixHttpServer
from deploy.serving.limits import ServingLimits
from deploy.serving.responses import ApiError, internal_error
from deploy.serving.service import Admission, Reply, RequestHead
from tests.support.processes import free_ports, port_open

WAIT_S = 30
"""The most a test waits for HAProxy or an answer (a bound against hanging, not a measurement)."""
KEY = "Bearer k"

# a configuration with the sections and lines of one that Ray 2.60 writes for one app
# (ray/serve/_private/haproxy_templates.py), shortened: ports and the error page are filled in
RAY_CONFIG = """global
    maxconn 64
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    option redispatch 1
    retry-on conn-failure empty-response
    # Normalize 502/503/504 to 500 per Serve's default behavior.
    errorfile 502 {ray_page}
    errorfile 503 {ray_page}
    errorfile 504 {ray_page}
    balance leastconn
frontend prometheus
    bind :{metrics}
    mode http
    http-request use-service prometheus-exporter if {{ path /metrics }}
    no log
frontend http_frontend
    bind {host}:{port}
    acl healthcheck path -i /-/healthz
    acl backend_http-huggy_server_up nbsrv(http-huggy) ge 1
    http-request return status 503 content-type text/plain string "Service Unavailable" if healthcheck
    acl is_http-huggy path_beg /
    acl is_http-huggy path /
    # Static routing based on path prefixes in decreasing length then alphabetical order
    use_backend http-huggy if is_http-huggy
    default_backend default_backend
backend default_backend
    http-request return status 404 content-type text/plain lf-string "Path '%[path]' not found."
backend http-huggy
    http-reuse always
    option httpchk GET /-/healthz
    http-check expect status 200
    default-server fastinter 250ms downinter 250ms fall 2 rise 2 inter 5s check
    # Servers in this backend
    server SERVE_REPLICA_huggy-HuggyPolicy-1 127.0.0.1:{replica} check observe layer4 error-limit 3
    # Fallback to head node's Serve proxy when no ingress replicas are available
    server SERVE_PROXY_ACTOR-fallback-node 127.0.0.1:{fallback} check backup
backend grpc-huggy
    mode http
    server SERVE_PROXY_ACTOR-fallback-node 127.0.0.1:{fallback} proto h2 check backup
listen stats
  bind *:{stats}
  stats enable
  stats uri /stats
"""


def ray_config(tmp_path: Path, port: int = 18000, replica: int = 30000, fallback: int = 8500,
               host: str = "127.0.0.1", metrics: int = 18001, stats: int = 18002) -> str:
    """`RAY_CONFIG` with its ports, its host and Ray's own error page (in `tmp_path`)."""
    ray_page = tmp_path / "500.http"
    ray_page.write_bytes(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
    return RAY_CONFIG.format(ray_page=ray_page, port=port, replica=replica, fallback=fallback,
                             host=host, metrics=metrics, stats=stats)


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
    in front of a live listener of the replica `1` whose service is a `Recorder` (or `service`,
    a replica's real one), all on 127.0.0.1; a stand-in for the replica's Serve port answers the
    health checks. Use as a context manager; `call(coroutine)` runs one on the listener's event
    loop."""

    def __init__(self, tmp_path: Path, page: Path, limits: ServingLimits | None = None,
                 grpc: bool = False, service_limit: int = 1_000,
                 service: HttpService | None = None) -> None:
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
        sock = replica_socket(self.page.parent, "1")
        sock.parent.mkdir(exist_ok=True)
        self.call(self.listener.start(sock))
        front = Front(self.limits, ("127.0.0.1", self.grpc_port) if self.grpc else None)
        self.config.write_text(patch_config(ray_config(
            self.tmp_path, self.port, self.serve_port.server_address[1], self.fallback,
            metrics=self.metrics, stats=self.stats), self.page, front))
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
