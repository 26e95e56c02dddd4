"""The only module that touches Ray's private names: each one here because Ray has no public way
to do the job, each with a check that names the Ray version when it is missing.

`deployment_with_version` (a Serve deployment version of our choosing), `task_attempt_number`
(which try of the running task this is), `reload_config` (read `RAY_AUTH_MODE` again after
Ray was imported), `single_machine_cluster` (a cluster on 127.0.0.1 only) and
`quiet_retried_task_errors` (no line for a task that will be retried); each says why.

Supported: Ray `SUPPORTED_RAY` (the release the project pins). `check()` runs at start-up
(`deploy.cluster.init_ray`, `deploy.serving.app.build_app`) and raises `RayInternalsError`,
naming the Ray version and the missing piece, on a release without one of them. Ray itself is
imported only when one of them is used (the evaluation's plain loop never imports it). A release
without Ray's setting for `quiet_retried_task_errors` ignores it and prints its line again,
which changes nothing else, so `check()` leaves it to the tests (tests/test_deploy_cli.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SUPPORTED_RAY = "2.60"
"""The Ray release series whose private names this module uses (tested in CI)."""
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


def _missing(name: str, purpose: str) -> RayInternalsError:
    import ray

    return RayInternalsError(
        f"Ray {ray.__version__} has no {name}, which huggy-agent uses to {purpose}; huggy-agent "
        f"supports Ray {SUPPORTED_RAY}.x (pip install 'ray[serve]=={SUPPORTED_RAY}.0')")


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
