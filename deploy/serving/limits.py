"""What one client may make `huggy serve` hold or compute. HAProxy, in front of every replica,
speaks to the clients (HTTP/1.1 and HTTP/2, gRPC included) and applies these caps before a
request reaches a replica; each is one HAProxy setting (`deploy.serving.haproxy` writes them
into the configuration Ray generates). The request body's own cap, `max_body_bytes`, is the
replicas' live setting (`deploy.serving.settings.BatchSettings`), the same for HTTP bodies and
gRPC messages.

    huggy serve --limit max_concurrent_streams=50 --limit idle_timeout_s=120

This module imports only the standard library: HAProxy's wrapper reads it at every reload.
"""

from __future__ import annotations

import math
import resource
from dataclasses import asdict, dataclass, fields
from typing import Any

DESCRIPTORS_PER_CONNECTION = 3
"""File descriptors HAProxy may hold per connection: the client's and the server's socket, and
half a pipe (Ray's configuration splices, and HAProxy sets aside `maxconn / 4` pipes of two),
rounded up."""
MIN_HEADER_BYTES, MAX_HEADER_BYTES = 4 << 10, 64 << 10
"""The range of `max_header_bytes`: HAProxy keeps 1 KiB of its buffer for its own rewrites, and
the replicas' listener refuses heads over 64 KiB whatever HAProxy lets through."""
DESCRIPTORS_SPARE = 256
"""File descriptors HAProxy keeps for its listeners, checks, logs and admin sockets."""


@dataclass(frozen=True)
class ServingLimits:
    """HAProxy's caps for `huggy serve`, each with its HAProxy setting."""

    max_connections: int = 8192
    """Client connections at once (`maxconn`); past it new ones wait to be accepted. Lowered to
    what the open-file limit allows HAProxy (`DESCRIPTORS_PER_CONNECTION` each)."""
    max_connections_per_replica: int = 256
    """Requests in one replica at once (`maxconn` of each server); past it requests wait in
    HAProxy's queue, so a burst waits for the replica instead of overflowing it. A request
    takes a slot once its body has come, up to HAProxy's buffer (`option http-buffer-request`)."""
    queue_timeout_s: float = 10.0
    """The longest a request waits in that queue (`timeout queue`); then it is answered 503
    with `Retry-After`."""
    request_timeout_s: float = 10.0
    """The longest a client may take to send a request's head and its body, up to HAProxy's
    buffer (`timeout http-request`); then HAProxy answers 408 and closes (an HTTP/2 call is
    reset): a slow client cannot hold a connection or a replica's slot."""
    idle_timeout_s: float = 30.0
    """How long a connection may wait for its next request (`timeout http-keep-alive`), HTTP/1.1
    and HTTP/2 alike."""
    client_timeout_s: float = 30.0
    """How long a client may send and read nothing while HAProxy waits on it (`timeout client`):
    a request body that stops coming, an answer its windows or reads hold back."""
    max_header_bytes: int = 16 << 10
    """The largest request head, URL and headers, HTTP/1.1 and HTTP/2 alike (HAProxy's buffer,
    `tune.bufsize`, which holds a whole head); a larger one is refused (400, or the HTTP/2
    stream reset). Between `MIN_HEADER_BYTES` and `MAX_HEADER_BYTES`."""
    max_concurrent_streams: int = 100
    """HTTP/2 calls open at once on one connection (`tune.h2.fe.max-concurrent-streams`)."""
    max_glitches: int = 100
    """HTTP/2 that a well-behaved client does not send, as HAProxy counts it (a header block
    cut in many tiny pieces, frames of the wrong kind or size, ...), before HAProxy closes the
    connection (`tune.h2.fe.glitches-threshold`). A header block that never ends holds no
    memory (HAProxy drops empty frames as they come) and is cut at `request_timeout_s`."""

    @classmethod
    def from_mapping(cls, values: dict[str, Any] | None) -> ServingLimits:
        """The defaults with `values` applied.

        Args:
            values: setting name -> value; None or empty for the defaults.

        Returns:
            The limits.

        Raises:
            ValueError: naming an unknown setting, or a value that is not a positive number (an
                integer for the counts), or `max_header_bytes` out of its range.
        """
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values or {}) - set(names))
        if unknown:
            raise ValueError(f"unknown limit(s) {unknown}; expected any of {names}")
        limits = cls(**{**asdict(cls()), **(values or {})})
        for field in fields(cls):
            value = getattr(limits, field.name)
            counted = field.type == "int"
            if (isinstance(value, bool) or not isinstance(value, int if counted else int | float)
                    or not (math.isfinite(value) and value > 0)):
                kind = "an integer" if counted else "a number"
                raise ValueError(f"limit {field.name} must be {kind} > 0, received {value!r}")
        if not MIN_HEADER_BYTES <= limits.max_header_bytes <= MAX_HEADER_BYTES:
            raise ValueError(f"limit max_header_bytes must be between {MIN_HEADER_BYTES} and "
                             f"{MAX_HEADER_BYTES}, received {limits.max_header_bytes}")
        return limits

    def connections_allowed(self) -> int:
        """The connections HAProxy may hold at once.

        Returns:
            `max_connections`, lowered to what this process's open-file limit allows (HAProxy
                inherits it); at least 1.
        """
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections,
                          (hard - DESCRIPTORS_SPARE) // DESCRIPTORS_PER_CONNECTION))


def haproxy_time(seconds: float) -> str:
    """A time as HAProxy's configuration writes it.

    Args:
        seconds: the time, > 0.

    Returns:
        `30s` for whole seconds, else whole milliseconds such as `1500ms` (at least `1ms`).
    """
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"


def parse_limit(text: str) -> tuple[str, int | float]:
    """One `--limit NAME=VALUE` of `huggy serve`.

    Args:
        text: `NAME=VALUE`, the value a number.

    Returns:
        (NAME, the value as an int where it is written as one, else a float).

    Raises:
        ValueError: `text` is not NAME=VALUE with a number for VALUE.
    """
    name, equals, value = text.partition("=")
    try:
        number: int | float = int(value) if value.strip().isdigit() else float(value)
    except ValueError:
        number = math.nan
    if not equals or not name.strip() or math.isnan(number):
        raise ValueError(f"expected NAME=NUMBER such as max_concurrent_streams=50, "
                         f"received {text[:80]!r}")
    return name.strip(), number
