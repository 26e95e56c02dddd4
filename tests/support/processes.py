"""Processes and ports of the tests: `huggy` as a subprocess and its output, free ports, and
finding or killing the processes a test started (by a marker in their command line or open
files)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.support.fixtures import REPO_ROOT


def starts_a_player(args: object) -> bool:
    """Whether a command line starts a Unity player (the stand-in is started as one) or an
    `envs` worker process (which starts one)."""
    words = [str(word) for word in args] if isinstance(args, (list, tuple)) else [str(args)]
    return any(word == "--mlagents-port" or "envs.workers" in word for word in words)


def huggy(*args: str, env: dict[str, str] | None = None, wrapper: tuple[str, ...] = (),
          stdout: object = subprocess.PIPE, **kwargs: object) -> subprocess.Popen:
    """`huggy ARGS` started through `wrapper`, with `env` added, stdout and stderr together."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    return subprocess.Popen([*wrapper, sys.executable, "-m", "huggy_agent.cli", *args],
                            cwd=REPO_ROOT, env=env, stdout=stdout, stderr=subprocess.STDOUT,
                            text=True, **kwargs)


class OutputFollower:
    """The lines a process writes to its stdout, read in a thread as they come; `seen` is set
    once a line holds `marker`."""

    def __init__(self, process: subprocess.Popen, marker: str) -> None:
        self.lines: list[str] = []
        self.seen = threading.Event()
        self._marker = marker
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout or ():
            self.lines.append(line)
            if self._marker in line:
                self.seen.set()

    def join(self) -> None:
        """Wait (10 s at most) for the rest of the output of a process that has ended."""
        self._thread.join(timeout=10)


@contextlib.contextmanager
def group_killed_on_exit(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Yield `process` (started with `start_new_session=True`); on leaving, SIGKILL its process
    group if it still runs."""
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def free_ports(count: int) -> list[int]:
    """`count` different TCP ports on 127.0.0.1 that nothing listens on right now (all are held
    until all are chosen: one at a time, the system may hand a port out twice)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


SERVER_PORTS = range(20_000, 30_000)
"""Ports for a server a test starts with a Ray cluster: above Ray's worker ports (10002-19999 by
default), below the ports Serve gives its replicas (from 30000) and below the ephemeral range
(from 32768 on Linux by default), from which a starting cluster's own processes take theirs,
so none of them takes the server's port first."""


def free_server_port() -> int:
    """A port of `SERVER_PORTS` on 127.0.0.1 that nothing listens on right now, at random."""
    for port in random.sample(SERVER_PORTS, len(SERVER_PORTS)):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {SERVER_PORTS}")


@contextlib.contextmanager
def free_port_with_the_next_held() -> Iterator[int]:
    """A port P on 127.0.0.1 that nothing listens on, while this context listens on P + 1."""
    while True:
        port = free_port()
        with socket.socket() as held:
            try:
                held.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            held.listen()
            yield port
            return


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def mentions(proc: Path, marker: str) -> bool:
    """Whether a process's command line or one of its open files names `marker`."""
    try:
        if marker.encode() in (proc / "cmdline").read_bytes():
            return True
        return any(marker in os.readlink(fd) for fd in (proc / "fd").iterdir())
    except OSError:
        return False


def kill_processes_mentioning(marker: str) -> None:
    """Kill every process that names `marker` (our cluster's own temp dir) in its command line
    or open files (Ray's agents write their logs there), so other clusters survive."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        if mentions(proc, marker):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)
