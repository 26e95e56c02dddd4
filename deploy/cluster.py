"""How huggy starts and joins Ray clusters: always with Ray's token authentication.

Every `ray.init` of `huggy evaluate` and `huggy serve` goes through `init_ray`:

- Token authentication (`RAY_AUTH_MODE=token`) for the clusters huggy starts and the ones it
  joins, unless the environment sets `RAY_AUTH_MODE` itself, which is respected.
- A cluster started here serves this machine alone: every Ray port (GCS, raylet, object
  manager, workers, agents, metrics) listens on 127.0.0.1, and the token is read from
  `$RAY_AUTH_TOKEN`, `$RAY_AUTH_TOKEN_PATH` or `~/.ray/auth_token`. Where none of them holds
  one, a fresh token is written to `~/.ray/auth_token`, readable by its owner only.
- A cluster joined by address ("auto", HOST:PORT, ray://HOST:PORT) needs its token in one of
  those three places (`ray get-auth-token` on the head prints it).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any

from deploy import ray_internals

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"


class RayTokenError(RuntimeError):
    """Token authentication is on, and this process has no token or the cluster refused it."""


def default_token_path() -> Path:
    """Where Ray looks for the token when neither `$RAY_AUTH_TOKEN` nor `$RAY_AUTH_TOKEN_PATH` is set.

    Returns:
        `~/.ray/auth_token`.
    """
    return Path.home() / ".ray" / "auth_token"


def use_token_auth() -> str:
    """Make Ray use token authentication in this process and the processes it starts, unless
    `$RAY_AUTH_MODE` is already set.

    Returns:
        The mode in effect: "token" unless the environment chose another.
    """
    if AUTH_MODE_VAR in os.environ:
        return os.environ[AUTH_MODE_VAR]
    os.environ[AUTH_MODE_VAR] = "token"
    if "ray" in sys.modules:  # Ray read its configuration when imported: read it again
        ray_internals.reload_config()
    return "token"


def ensure_private_token() -> None:
    """Where token auth is on and no token is configured, write a new random one (256 bits,
    the format Ray generates) to `~/.ray/auth_token` with mode 0600, so that other users of
    the machine cannot read it. An existing token is left as it is."""
    if os.environ.get(AUTH_MODE_VAR, "").lower() != "token":
        return
    if os.environ.get(TOKEN_VAR) or os.environ.get(TOKEN_PATH_VAR):
        return
    path = default_token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32))


def init_ray(address: str | None, **init_kwargs: Any) -> None:
    """`ray.init` with token authentication, as the module docstring describes; usage stats stay off
    unless `$RAY_USAGE_STATS_ENABLED` says otherwise.

    Args:
        address: "local" starts a new cluster for this machine alone (loopback only); None is Ray's
            default (`$RAY_ADDRESS`, else the latest cluster started with `ray start` on this
            machine, else a new one, for this machine alone as with "local"); anything else joins
            that cluster.
        **init_kwargs: more arguments of `ray.init`.

    Raises:
        RayTokenError: token auth is on and this process has no token, or the cluster refused it.
        RayInternalsError: the installed Ray lacks a private name that `deploy.ray_internals`
            uses.
    """
    import ray  # Ray is imported where it is used (huggy evaluate --no-ray never imports it)
    from ray.exceptions import AuthenticationError

    ray_internals.check()
    use_token_auth()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        if address == "local" or (address is None and not os.environ.get("RAY_ADDRESS")):
            ensure_private_token()
            with ray_internals.single_machine_cluster():
                ray.init(address=address, **init_kwargs)
        else:
            ray.init(address=address, **init_kwargs)
    except AuthenticationError as error:
        raise RayTokenError(f"Ray cluster {address or '(default)'}: {error}") from error
