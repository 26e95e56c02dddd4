"""huggy's changes to the HAProxy configuration Ray generates (deploy/serving/haproxy.py), without
a Ray cluster, against HAProxy itself (the binary Ray runs): the configuration that the installed
Ray writes (rendered by Ray's own writer; `make test-ray-oldest` runs these on the oldest
supported Ray) is changed, HAProxy accepts the result, a live HAProxy with no replica up answers as the module
says, and one whose replica listens on a socket of its own sends the requests there and its
health checks to the replica's Serve port. A configuration without the expected lines is
refused, naming the Ray version. The same on a live Serve: tests/test_deploy_faults.py and
tests/test_deploy_serve.py."""

from __future__ import annotations

import http.client
import http.server
import io
import json
import re
import resource
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest

from deploy import ray_internals
from deploy.ray_internals import (
    HAPROXY_SERVE_GRPC_RAY,
    RAY_REQUIREMENT,
    SUPPORTED_RAY,
    has_release,
    installed_ray,
)
from deploy.serving.haproxy import (
    HELD,
    HOLD_S,
    Front,
    HAProxyConfigError,
    error_page,
    patch_config,
    real_binary,
    replica_socket,
)
from deploy.serving.haproxy_admin import HAProxyAdmin, drain_haproxy, haproxy_dir
from deploy.serving.limits import ServingLimits
from deploy.serving.server import (
    UNAVAILABLE,
    check_haproxy_changes_apply,
    free_ports_other_than,
    ingress_env_vars,
)
from tests.support.processes import free_port, free_ports, port_open
from tests.support.serving import KEY, FrontDoor, ray_config

pytestmark = pytest.mark.ray_release


@pytest.fixture
def page(tmp_path: Path) -> Path:
    path = tmp_path / "unavailable.http"
    path.write_bytes(error_page(UNAVAILABLE.status, UNAVAILABLE.headers, UNAVAILABLE.body()))
    return path


class _Socket:
    """What http.client reads a response from."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


def test_the_error_page_is_the_api_503_as_an_http_parser_reads_it(page: Path) -> None:
    response = http.client.HTTPResponse(_Socket(page.read_bytes()))  # type: ignore[arg-type]
    response.begin()
    assert (response.status, response.reason) == (503, "Service Unavailable")
    assert response.getheader("Content-Type") == "application/json"
    assert response.getheader("Retry-After") == "1"
    document = json.loads(response.read())
    assert document["error"] == "unavailable" and set(document) == {"error", "message"}


def section(lines: list[str], head: str) -> list[str]:
    """The section of a configuration that starts with the line `head`, up to the next one."""
    start = lines.index(head)
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\t", "")),
               len(lines))
    return lines[start:end]


def haproxy_accepts(config: Path) -> None:
    """HAProxy's own check of a configuration (`haproxy -c`)."""
    checked = subprocess.run([real_binary(), "-c", "-f", str(config)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_changes_and_nothing_else_in_a_configuration_haproxy_accepts(
        tmp_path: Path, page: Path) -> None:
    original = ray_config(tmp_path)
    limits = ServingLimits(max_connections=100, max_connections_per_replica=7,
                           queue_timeout_s=0.25, request_timeout_s=3, idle_timeout_s=4,
                           client_timeout_s=5, max_header_bytes=8192, max_concurrent_streams=6,
                           max_glitches=9)
    patched = patch_config(original, page, Front(limits))
    lines = patched.splitlines()
    assert [line for line in lines if "errorfile 50" in line] == [
        f"    errorfile {code} {page}" for code in (502, 503, 504)]
    assert "    http-request deny deny_status 503" in lines  # the default backend
    assert "return status 404" not in patched
    (fallback,) = [line.split()[1] for line in original.splitlines()
                   if line.endswith(" 127.0.0.1:8500 check backup")]
    backend = section(lines, "backend http-huggy")
    assert not any("backup" in line for line in backend)
    # change 6: requests past 7 wait in a queue; 3 connection errors take the replica out
    assert [line for line in backend if "SERVE_REPLICA" in line] == [
        "    server SERVE_REPLICA_huggy-HuggyPolicy-1 127.0.0.1:30000 check observe layer4 "
        "error-limit 3 on-error mark-down maxconn 7"]
    held = section(lines, f"backend http-huggy{HELD}")
    assert f"    timeout server {HOLD_S}s" in held
    assert f"    server {fallback} 127.0.0.1:8500" in held
    route = lines.index("    use_backend http-huggy if is_http-huggy")
    assert lines[route - 1] == (f"    use_backend http-huggy{HELD} if is_http-huggy "
                                "!{ nbsrv(http-huggy) ge 1 }")
    assert [line for line in lines if "bind " in line] == [
        "    bind 127.0.0.1:18001", "    bind 127.0.0.1:18000", "  bind 127.0.0.1:18002"]
    # change 6: Ray's global maxconn and client timeout replaced by the limits' settings
    assert lines[lines.index("global") + 1:lines.index("global") + 6] == [
        "    # huggy: the caps of deploy/serving/limits.py", "    maxconn 100",
        "    tune.bufsize 8192", "    tune.h2.fe.max-concurrent-streams 6",
        "    tune.h2.fe.glitches-threshold 9"]
    assert lines[lines.index("defaults") + 1:lines.index("defaults") + 7] == [
        "    # huggy: the caps of deploy/serving/limits.py", "    timeout client 5s",
        "    timeout http-request 3s", "    timeout http-keep-alive 4s",
        "    timeout queue 250ms", "    option http-buffer-request"]
    assert [line.split()[:2] for line in lines if line.strip().startswith(
        ("maxconn", "timeout client", "tune.bufsize", "timeout http-keep-alive"))] == [
        ["maxconn", "100"], ["tune.bufsize", "8192"], ["timeout", "client"],
        ["timeout", "http-keep-alive"]]  # Ray's own replaced
    replaced = ("errorfile 50", "return status 404", ":8500 check", "bind ", "maxconn",
                "timeout client", "timeout http-request", "timeout http-keep-alive",
                "timeout queue", "tune.bufsize", "tune.h2.fe.", "SERVE_REPLICA")
    kept = [line for line in original.splitlines()
            if not any(replaced_part in line for replaced_part in replaced)]
    assert [line for line in lines if line in kept] == kept  # in the same order
    assert patch_config(patched, page, Front(limits)) == patched
    (tmp_path / "haproxy.cfg").write_text(patched)
    haproxy_accepts(tmp_path / "haproxy.cfg")


def test_rays_own_grpc_sections_pass_unchanged_where_its_haproxy_carries_grpc(
        tmp_path: Path, page: Path) -> None:
    """With Serve's gRPC (`--grpc-ingress serve`), the release's HAProxy carries it from
    `HAPROXY_SERVE_GRPC_RAY` on: huggy's changes leave Ray's gRPC frontend and backends as Ray
    wrote them (no socket, no held backend) and HAProxy accepts the result."""
    original = ray_config(tmp_path, grpc_port=18003)
    carried = "frontend grpc_frontend" in original.splitlines()
    assert carried is has_release(HAPROXY_SERVE_GRPC_RAY)
    patched = patch_config(original, page).splitlines()
    if carried:
        for head in ("frontend grpc_frontend", "backend grpc-huggy"):
            assert section(patched, head) == section(original.splitlines(), head)
        assert "    bind 127.0.0.1:18003 proto h2" in patched
    assert not any(line.startswith("backend grpc-huggy:") for line in patched)
    (tmp_path / "haproxy.cfg").write_text("\n".join(patched) + "\n")
    haproxy_accepts(tmp_path / "haproxy.cfg")


def test_maxconn_is_what_the_open_file_limit_allows() -> None:
    """HAProxy refuses to start where `maxconn` needs more descriptors than its hard limit
    allows: the default is lowered to (limit - spare) / 3, worked out here by hand from the
    limit this process has (HAProxy inherits it)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = 8192 if hard == resource.RLIM_INFINITY else min(8192, (hard - 256) // 3)
    assert ServingLimits().connections_allowed() == expected
    assert ServingLimits(max_connections=5).connections_allowed() == min(5, expected)


def test_a_replica_with_its_own_socket_gets_its_requests_there_and_its_checks_on_its_port(
        tmp_path: Path, page: Path) -> None:
    """Change 5, by the text: only the replica's line of the HTTP backend changes, and only
    where its socket (named by the id that ends Ray's server name) is in the page's folder."""
    original = ray_config(tmp_path, replica=30007)
    unchanged = patch_config(original, page)
    assert "    server SERVE_REPLICA_huggy-HuggyPolicy-1 127.0.0.1:30007 check observe layer4 " \
        "error-limit 3 on-error mark-down maxconn 256" in unchanged.splitlines()  # no socket yet
    sock = replica_socket(page.parent, "1")
    # gRPC has no other way into a replica: it goes to the socket where the replica listens
    # once it has started, as soon as Ray addresses the replica on this machine
    early = patch_config(original, page, Front(grpc=("127.0.0.1", 18050))).splitlines()
    assert early[-1] == (f"    server SERVE_REPLICA_huggy-HuggyPolicy-1 unix@{sock} maxconn 256 "
                         "track http-huggy/SERVE_REPLICA_huggy-HuggyPolicy-1")
    elsewhere = patch_config(original.replace("127.0.0.1:30007", "10.0.0.9:30007"), page,
                             Front(grpc=("127.0.0.1", 18050))).splitlines()
    assert elsewhere[-2:] == ["backend huggy_grpc:http-huggy", "    http-reuse always"]
    sock.parent.mkdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(sock))
        patched = patch_config(original, page)
        with_grpc = patch_config(original, page, Front(grpc=("127.0.0.1", 18050)))
    lines = patched.splitlines()
    assert (f"    server SERVE_REPLICA_huggy-HuggyPolicy-1 unix@{sock} check addr 127.0.0.1 "
            "port 30007 observe layer4 error-limit 3 on-error mark-down maxconn 256") in lines
    assert [line for line in lines if "unix@" in line] == [
        line for line in lines if "SERVE_REPLICA" in line]  # Ray's gRPC backend has none
    assert [line for line in lines if "unix@" not in line] == [
        line for line in unchanged.splitlines() if "SERVE_REPLICA" not in line]
    assert patch_config(patched, page) == patched
    # change 7: gRPC on its own port, to the same socket, the server tracking its HTTP twin
    assert with_grpc.startswith(patched)
    assert with_grpc[len(patched):].splitlines() == [
        "frontend huggy_grpc",
        "    # huggy: gRPC over HTTP/2 here, to the replicas' listeners as HTTP/1.1",
        "    bind 127.0.0.1:18050 proto h2",
        "    http-request return status 200 content-type application/grpc hdr grpc-status 5 hdr "
        'grpc-message "no app of that name (the application metadata)" if '
        "{ req.hdr(application) -m found } !{ req.hdr(application) -m str huggy }",
        "    use_backend huggy_grpc:http-huggy if { req.hdr(application) -m str huggy }",
        "    default_backend huggy_grpc:http-huggy",
        "backend huggy_grpc:http-huggy",
        "    http-reuse always",
        f"    server SERVE_REPLICA_huggy-HuggyPolicy-1 unix@{sock} maxconn 256 track "
        "http-huggy/SERVE_REPLICA_huggy-HuggyPolicy-1"]
    assert patch_config(with_grpc, page, Front(grpc=("127.0.0.1", 18050))) == with_grpc
    for name, text in (("patched", patched), ("with_grpc", with_grpc)):
        (tmp_path / f"{name}.cfg").write_text(text)
        haproxy_accepts(tmp_path / f"{name}.cfg")


def test_a_live_haproxy_sends_requests_to_the_replicas_socket_and_checks_its_serve_port(
        tmp_path: Path, page: Path) -> None:
    """A live HAProxy on the changed configuration: the requests reach the replica's own
    listener (`deploy.serving.http_server`) whole, while the replica's Serve port gets only
    HAProxy's health checks; once that port stops answering, as Serve's does when a replica
    drains, HAProxy takes the replica out (the JSON 503), as its admin socket tells
    (`HAProxyAdmin.servers_up`: the backup server, Serve's proxy, not counted). Checked every
    200 ms instead of Ray's 5 s, so that the test waits less for the check that finds it gone."""
    with FrontDoor(tmp_path, page, check_interval="200ms") as door:
        admin_socket = tmp_path / "ray-haproxy" / "admin.sock"
        with HAProxyAdmin(admin_socket) as admin:
            assert admin.servers_up("http-huggy") == 1
        connection = http.client.HTTPConnection(f"127.0.0.1:{door.port}", timeout=30)
        for body in (b'{"obs": [1]}', b'{"obs": [2]}'):
            connection.request("POST", "/v1/act", body=body, headers={"Authorization": KEY})
            reply = connection.getresponse()
            assert reply.status == 200 and json.loads(reply.read())["body"] == body.decode()
        connection.close()
        assert door.recorder.handed == [("/v1/act", b'{"obs": [1]}'),
                                        ("/v1/act", b'{"obs": [2]}')]
        door.serve_port.shutdown()
        door.serve_port.server_close()
        deadline = time.monotonic() + 30
        while _get(f"127.0.0.1:{door.port}", "/v1/act")[0] != 503:
            assert time.monotonic() < deadline, "the replica was not taken out"
            time.sleep(0.05)
        with HAProxyAdmin(admin_socket) as admin:
            assert admin.servers_up("http-huggy") == 0


def test_the_pages_beside_a_frontend_on_every_interface_stay_there(tmp_path: Path,
                                                                   page: Path) -> None:
    """Ray writes a frontend on every interface as `*`; the pages stay on every interface."""
    patched = patch_config(ray_config(tmp_path, host="0.0.0.0"), page)
    assert [line.strip() for line in patched.splitlines() if "bind " in line] == [
        "bind :18001", "bind *:18000", "bind *:18002"]


def test_the_side_ports_differ_from_each_other_and_from_the_http_port() -> None:
    """HAProxy's metrics and stats ports and Serve's fallback proxy's HTTP and gRPC ports, as
    `huggy serve` sets them for the HTTP port `port`. Ports chosen one at a time, each socket
    closed before the next bind, repeat: 512 such choices held a repeat in 20 of 20 tries on
    Linux, where each bind to port 0 starts at a random place in the ephemeral range."""
    port = free_port()
    chosen = free_ports_other_than(port, 512)
    assert len(set(chosen)) == 512 and port not in chosen
    env = ingress_env_vars("haproxy", port)
    side = [int(env[name]) for name in ("RAY_SERVE_HAPROXY_METRICS_PORT",
                                        "RAY_SERVE_HAPROXY_STATS_PORT",
                                        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
                                        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")]
    assert len(set(side)) == 4 and port not in side


@pytest.mark.parametrize("missing", ["errorfile 503", "http-request return status 404",
                                     "use_backend http-huggy if", "frontend http_frontend",
                                     "defaults"])
def test_a_configuration_without_the_lines_is_refused_naming_the_ray_version(
        tmp_path: Path, page: Path, missing: str) -> None:
    config = "".join(line for line in ray_config(tmp_path).splitlines(keepends=True)
                     if missing not in line)
    with pytest.raises(HAProxyConfigError) as refused:
        patch_config(config, page)
    message = str(refused.value)
    assert f"Ray {installed_ray()} generated" in message
    assert f"supports Ray {SUPPORTED_RAY} (pip install '{RAY_REQUIREMENT}')" in message
    assert {"errorfile 503": "found 2 of 3", "http-request return status 404": "not-found answer",
            "use_backend http-huggy if": "the rule routing to http-huggy",
            "frontend http_frontend": "the HTTP frontend's address",
            "defaults": "the 'global' and 'defaults' sections"}[missing] in message


def test_the_start_up_check_passes_on_the_installed_ray_and_refuses_a_release_without_lines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`huggy serve` renders the installed Ray's configuration at start and applies its changes:
    they apply, with gRPC by the replicas and, where its HAProxy carries it, Serve's gRPC; a
    release whose configuration lacked the not-found answer (taken out of Ray's own text here)
    would be refused before Serve starts, naming the Ray version."""
    port, grpc_port = free_ports(2)
    check_haproxy_changes_apply("127.0.0.1", port, None, Front(grpc=("127.0.0.1", grpc_port)))
    if has_release(HAPROXY_SERVE_GRPC_RAY):
        check_haproxy_changes_apply("127.0.0.1", port, grpc_port, Front())
    rendered = ray_internals.render_haproxy_config

    def without_not_found(*args: object, **kwargs: object) -> str:
        return "".join(line for line in rendered(*args, **kwargs).splitlines(keepends=True)
                       if "http-request return status 404" not in line)

    monkeypatch.setattr(ray_internals, "render_haproxy_config", without_not_found)
    with pytest.raises(HAProxyConfigError, match=rf"^Ray {re.escape(installed_ray())} generated "
                       r"an HAProxy configuration without .*the not-found answer"):
        check_haproxy_changes_apply("127.0.0.1", port, None, Front())


class _ServeProxy(http.server.BaseHTTPRequestHandler):
    """Stands for Serve's proxy: /json answers as a replica would, /text as Serve's proxy
    itself, /slow longer than HOLD_S."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(HOLD_S + 3)
        body, kind, status = {"/json": (b'{"status": "ok"}', "application/json", 200),
                              "/text": (b"Path not found", "text/plain", 404)
                              }.get(self.path, (b"late", "text/plain", 200))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def haproxy_without_replica(tmp_path: Path, page: Path) -> Iterator[str]:
    """HAProxy on the changed configuration, its replica's port closed, a stand-in for Serve's
    proxy as the fallback; its URL."""
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ServeProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    port, replica, metrics, stats = free_ports(4)
    config = tmp_path / "haproxy.cfg"
    config.write_text(patch_config(ray_config(tmp_path, port, replica, proxy.server_address[1],
                                              metrics=metrics, stats=stats), page))
    haproxy = subprocess.Popen([real_binary(), "-db", "-f", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _replica_down(port):  # HAProxy up, and its health check found no replica
            assert haproxy.poll() is None and time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        haproxy.terminate()
        haproxy.wait(timeout=30)
        proxy.shutdown()


def _replica_down(port: int) -> bool:
    try:
        return _get(f"127.0.0.1:{port}", "/-/healthz")[0] == 503
    except OSError:
        return False


def _get(address: str, path: str) -> tuple[int, Message, bytes, float]:
    """Status, headers (names in any case: HAProxy writes them in lower case), body, seconds."""
    connection = http.client.HTTPConnection(address, timeout=30)
    start = time.monotonic()
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        return reply.status, reply.headers, reply.read(), time.monotonic() - start
    finally:
        connection.close()


def test_with_no_replica_up_requests_wait_for_the_fallback_at_most_the_hold(
        haproxy_without_replica: str) -> None:
    """The fallback's JSON answer passes, its plain text becomes the JSON 503, and one it holds
    past HOLD_S is answered with the JSON 503 at HOLD_S."""
    status, _, body, _ = _get(haproxy_without_replica, "/json")
    assert (status, body) == (200, b'{"status": "ok"}')
    for path in ("/text", "/slow"):
        status, headers, body, seconds = _get(haproxy_without_replica, path)
        assert (status, headers["Retry-After"], json.loads(body)["error"]) == (
            503, "1", "unavailable"), path
    assert seconds >= HOLD_S  # held, then answered before the fallback's own answer came


class _HeldBackend(http.server.BaseHTTPRequestHandler):
    """A replica that holds each request until `release` is set; `arrived` counts them."""

    protocol_version = "HTTP/1.1"
    arrived = threading.Semaphore(0)
    release = threading.Event()

    def do_GET(self) -> None:
        type(self).arrived.release()
        type(self).release.wait()
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def _admin_pid(socket_path: Path) -> int | None:
    """The pid HAProxy's admin socket at `socket_path` reports, or None while it does not answer."""
    try:
        with HAProxyAdmin(socket_path) as admin:
            return admin.pid()
    except OSError:
        return None


def test_draining_waits_for_the_requests_of_a_haproxy_that_a_reload_displaced() -> None:
    """Serve reloads HAProxy at each configuration change: a new process takes the listeners
    (`-sf OLD -x SOCKET`) and the old one answers what it had accepted. `drain_haproxy` returns
    only once the old one has answered its held requests and exited, so the shutdown that follows
    (which kills every HAProxy) cuts none of them."""
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HeldBackend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    port = free_port()
    folder = haproxy_dir(port) / "test"
    folder.mkdir(parents=True)
    socket_path = folder / "admin.sock"
    config = folder / "haproxy.cfg"
    config.write_text(f"""global
    stats socket {socket_path} mode 600 level admin expose-fd listeners
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend http_frontend
    bind 127.0.0.1:{port}
    default_backend replica
backend replica
    server replica 127.0.0.1:{backend.server_address[1]}
""")
    command = [real_binary(), "-db", "-f", str(config)]
    started: list[subprocess.Popen[bytes]] = []
    answers: list[int | str] = []

    def get() -> None:
        try:
            answers.append(_get(f"127.0.0.1:{port}", "/held")[0])
        except OSError as error:
            answers.append(type(error).__name__)

    try:
        started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while _admin_pid(socket_path) != started[0].pid:
            assert started[0].poll() is None and time.monotonic() < deadline, "no HAProxy"
            time.sleep(0.05)
        clients = [threading.Thread(target=get) for _ in range(4)]
        for client in clients:
            client.start()
        for _ in clients:  # each request is held by the replica, through the first HAProxy
            assert _HeldBackend.arrived.acquire(timeout=30)
        started.append(subprocess.Popen([*command, "-sf", str(started[0].pid),
                                         "-x", str(socket_path)], stdout=subprocess.DEVNULL))
        while _admin_pid(socket_path) != started[1].pid:
            assert started[1].poll() is None and time.monotonic() < deadline, "no reload"
            time.sleep(0.05)
        assert started[0].poll() is None  # displaced, still holding the requests

        drain = threading.Thread(target=drain_haproxy, args=(port, 60.0))
        drain.start()
        while port_open(port):  # the drain has soft-stopped the new HAProxy
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert drain.is_alive()  # the displaced HAProxy still holds the requests
        _HeldBackend.release.set()
        drain.join()
        assert started[0].poll() is not None  # it answered them and exited, before the return
        for client in clients:
            client.join()
        assert answers == [200] * 4
    finally:
        _HeldBackend.release.set()
        for process in started:
            process.kill()
            process.wait()
        backend.shutdown()
        shutil.rmtree(folder.parent, ignore_errors=True)
