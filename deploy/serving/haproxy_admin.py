"""The HAProxy of `huggy serve` while it runs: its admin socket (`HAProxyAdmin`), and its
draining before Serve's shutdown (`drain_haproxy`), which would otherwise kill it outright."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import signal
import socket
import time
from pathlib import Path

from deploy.serving.processes import processes_configured_in


def haproxy_dir(port: int) -> Path:
    """Where HAProxy keeps its config, sockets and state for a Serve HTTP port.

    Args:
        port: the HTTP port.

    Returns:
        `/tmp/huggy-haproxy-<port>`.
    """
    return Path(f"/tmp/huggy-haproxy-{port}")


def drain_haproxy(port: int, timeout_s: float = 10.0) -> None:
    """Soft-stop every HAProxy of an HTTP port; return when none has a request in flight, or after
    `timeout_s`.

    Soft stop (SIGUSR1): HAProxy closes its listening sockets at once, so new connections are
    refused, answers the requests in flight, and closes each client connection after its next
    answer. The requests in flight of the HAProxy that listens now are counted (`show sess`) on
    an admin session opened before the soft stop, which survives it. The ones that Serve
    displaced (each configuration change starts a new HAProxy with `-sf`; the old one goes on
    answering the requests it had accepted, then exits) have no admin socket left: they are
    waited for until they exit. HAProxy is found through its files under `haproxy_dir(port)`, so
    only a HAProxy on this machine; with none (another ingress, or the head node elsewhere) this
    does nothing.

    Args:
        port: the Serve HTTP port.
        timeout_s: the longest wait, in seconds.
    """
    deadline = time.monotonic() + timeout_s
    folder = haproxy_dir(port)
    with contextlib.ExitStack() as stack:
        sessions = []
        for path in folder.glob("*/admin.sock"):
            try:
                admin = stack.enter_context(HAProxyAdmin(path))
                sessions.append((admin, admin.pid()))
            except OSError:  # a stale socket, or HAProxy gone: nothing in flight there
                continue
        listening = {pid for _, pid in sessions}
        displaced = processes_configured_in(folder) - listening
        for pid in displaced | listening:
            with contextlib.suppress(ProcessLookupError):  # the displaced ones had it: no harm
                os.kill(pid, signal.SIGUSR1)
        for admin, _ in sessions:
            with contextlib.suppress(OSError):  # HAProxy gone: nothing in flight there
                while admin.requests_in_flight() and time.monotonic() < deadline:
                    time.sleep(0.05)
    while displaced & processes_configured_in(folder) and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_until_servers_up(folder: Path, backend: str, timeout_s: float) -> None:
    """Return once a HAProxy routes a backend's requests to one of its servers, not a backup
    (`HAProxyAdmin.servers_up`). An admin socket that does not answer (HAProxy reloading) is
    asked again.

    Args:
        folder: the HAProxy's files (`haproxy_dir`).
        backend: the backend's name.
        timeout_s: the longest wait, seconds.

    Raises:
        RuntimeError: naming the backend, when none of its servers is up after `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        for path in folder.glob("*/admin.sock"):
            with contextlib.suppress(OSError), HAProxyAdmin(path) as admin:
                if admin.servers_up(backend):
                    return
        if time.monotonic() > deadline:
            raise RuntimeError(f"HAProxy of {folder} has no server of {backend} up after "
                               f"{timeout_s:.0f} s")
        time.sleep(0.1)


class HAProxyAdmin:
    """An interactive session on HAProxy's admin socket (`prompt` mode: one reply per command, each
    ending with a prompt line).

    Args:
        path: the admin socket.

    Raises:
        OSError: the socket cannot be reached, or HAProxy does not answer.
    """

    def __init__(self, path: Path) -> None:
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.settimeout(5)
        try:
            self._sock.connect(str(path))
            self._sock.sendall(b"prompt\n")
            self._reply()
        except OSError:
            self._sock.close()
            raise

    def __enter__(self) -> HAProxyAdmin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._sock.close()

    def command(self, text: str) -> str:
        """Run one CLI command.

        Args:
            text: the command.

        Returns:
            HAProxy's reply, without the prompt.

        Raises:
            ConnectionError: HAProxy closed the session.
            OSError: the socket failed or timed out.
        """
        self._sock.sendall(text.encode() + b"\n")
        return self._reply()

    def pid(self) -> int:
        """HAProxy's process id (`show info`).

        Returns:
            The id.

        Raises:
            ConnectionError: the reply has no Pid line, or HAProxy closed the session.
        """
        for line in self.command("show info").splitlines():
            if line.startswith("Pid:"):
                return int(line.split()[1])
        raise ConnectionError("HAProxy's `show info` has no Pid line")

    def servers_up(self, backend: str) -> int:
        """The servers of a backend that HAProxy routes to now (`show stat`).

        Args:
            backend: the backend's name.

        Returns:
            How many of its servers are UP by their health checks, backups left out.
        """
        rows = csv.DictReader(io.StringIO(self.command("show stat").lstrip("# ")))
        return sum(row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND")
                   and row["status"].startswith("UP") and row["bck"] == "0" for row in rows)

    def requests_in_flight(self) -> int:
        """The requests HAProxy is handling now.

        Returns:
            Its streams (one per request) of any frontend but the CLI's own.

        Raises:
            ConnectionError: HAProxy closed the session.
        """
        return sum(line.startswith("0x") and " fe=GLOBAL " not in line
                   for line in self.command("show sess").splitlines())

    def _reply(self) -> str:
        reply = b""
        while not reply.endswith(b"\n> "):
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("HAProxy closed its admin session")
            reply += chunk
        return reply[:-3].decode(errors="replace")
