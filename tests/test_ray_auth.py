"""Ray clusters that huggy starts stay authenticated.

Unit level: the token-auth default, the user's explicit `RAY_AUTH_MODE` (the opt-out included),
and the private token file. End to end: `huggy serve` and `huggy evaluate`, each started as a
user starts it (a clean environment: an empty home, no RAY_AUTH_* variables), start a cluster
whose Ray ports listen on 127.0.0.1 only; a process with no token, or a wrong one, can neither
connect to it nor run a task on it; a process with the token can. Each of the two starts its own
cluster (the commands' own code path is what is tested), one after the other, each stopped and
removed at the end.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy.cluster import ensure_private_token, use_token_auth
from deploy.serving.haproxy import private_folder
from deploy.serving.server import haproxy_dir
from tests.support.fixtures import REPO_ROOT, fixtures_dir
from tests.support.processes import free_port, kill_processes_mentioning, mentions

# --- unit level: no cluster ------------------------------------------------------------------


def test_token_auth_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE")
    assert use_token_auth() == "token"
    assert os.environ["RAY_AUTH_MODE"] == "token"


@pytest.mark.parametrize("mode", ["token", "disabled"])
def test_the_users_explicit_mode_is_respected(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The explicit opt-out (`RAY_AUTH_MODE=disabled`) is the user's to make; huggy keeps it."""
    monkeypatch.setenv("RAY_AUTH_MODE", mode)
    assert use_token_auth() == mode
    assert os.environ["RAY_AUTH_MODE"] == mode


def test_a_missing_token_is_created_private(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    ensure_private_token()
    token_file = tmp_path / ".ray" / "auth_token"
    token = token_file.read_text()
    assert len(token) == 64 and int(token, 16) >= 0  # 256 bits in hex, as Ray writes them
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    ensure_private_token()  # an existing token is kept
    assert token_file.read_text() == token


def test_no_token_is_written_when_one_is_configured_or_auth_is_off(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    ensure_private_token()  # the session's RAY_AUTH_TOKEN_PATH names the token
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x" * 64)
    ensure_private_token()
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ensure_private_token()
    assert not (tmp_path / ".ray").exists()


def test_joining_without_a_token_is_a_clear_error(tmp_path: Path) -> None:
    """Checked before any connection: no cluster is needed (nothing listens on port 1)."""
    code = ("from deploy.cluster import RayTokenError, init_ray\n"
            "try:\n    init_ray('127.0.0.1:1')\n"
            "except RayTokenError as error:\n    print('refused:', error)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=_clean_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused: Ray cluster 127.0.0.1:1: Token authentication is "
                                  "enabled but no authentication token was found"), done.stdout


# --- end to end: clusters started by the commands --------------------------------------------

PROBE = """
import sys
import ray

address, target = sys.argv[1], sys.argv[2]
ray.init(address=address, logging_level="ERROR", log_to_driver=False)


@ray.remote(num_cpus=0)
def write(path):
    with open(path, "w") as file:
        file.write("ran")
    return "ran"


print("task:", ray.get(write.remote(target), timeout=120))
"""


@dataclass(frozen=True)
class Started:
    """A command running on a cluster of its own: its GCS address, its token file, its marker."""

    process: subprocess.Popen
    address: str
    token_file: Path
    marker: str
    log: Path


def _clean_env(home: Path) -> dict[str, str]:
    """This environment without any RAY_* variable, with `home` as the home directory."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    return {**env, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}


def _processes(marker: str) -> list[Path]:
    return [proc for proc in Path("/proc").iterdir()
            if proc.name.isdigit() and int(proc.name) != os.getpid() and mentions(proc, marker)]


def _gcs_port(marker: str) -> int | None:
    """The GCS port of the cluster whose Ray temp root is `marker`, once Ray has written it."""
    for path in Path(marker).glob("ray/session_latest/gcs_server_port_*"):
        text = path.read_text().strip()
        if text:
            return int(text)
    return None


def _listening(marker: str) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of the processes that name
    `marker`, read from /proc."""
    sockets: dict[str, tuple[str, int]] = {}
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            raw, port = fields[1].split(":")
            packed = b"".join(bytes.fromhex(raw[i:i + 8])[::-1] for i in range(0, len(raw), 8))
            address = ipaddress.ip_address(packed[:width])
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            sockets[fields[9]] = (str(address), int(port, 16))
    found = []
    for proc in _processes(marker):
        try:
            name = proc.joinpath("comm").read_text().strip()
            links = [os.readlink(fd) for fd in proc.joinpath("fd").iterdir()]
        except OSError:
            continue
        for link in links:
            inode = link[len("socket:["):-1] if link.startswith("socket:[") else None
            if inode in sockets:
                found.append((name, *sockets[inode]))
    return found


@contextmanager
def started(command: list[str], tmp_path: Path, ready: str | None) -> Iterator[Started]:
    """Run `huggy COMMAND` as a user would, from a clean environment with an empty home of its
    own and Ray's temp root under a fresh marker; yield once its cluster answers (and `ready`
    is in its output, when given). Stops it with SIGINT and removes every process of it at the
    end."""
    marker = f"/tmp/ra{uuid.uuid4().hex[:8]}"
    Path(marker).mkdir()
    home = tmp_path / "owner-home"
    home.mkdir()
    log = Path(marker) / "huggy.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "huggy_agent.cli", *command], cwd=REPO_ROOT,
            env={**_clean_env(home), "RAY_TMPDIR": marker}, stdout=out,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        port = None
        while port is None or (ready is not None and ready not in log.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, (
                "huggy did not come up:\n" + log.read_text()[-3000:])
            time.sleep(0.3)
            port = port or _gcs_port(marker)
        while True:  # the GCS answers
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, f"GCS on port {port} never answered"
            time.sleep(0.3)
        yield Started(process, f"127.0.0.1:{port}", home / ".ray" / "auth_token", marker, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        kill_processes_mentioning(marker)
        shutil.rmtree(marker, ignore_errors=True)


def probe(address: str, target: Path, home: Path, **auth: str) -> subprocess.CompletedProcess:
    """Connect to `address` from a new process on this machine, with an empty home and only the
    `auth` variables, and run a task that writes `target`. Ray would resolve 127.0.0.1 to the
    machine's network address, where nothing of the cluster listens: the probe asks it not to.
    It retries a refused connection twice (Ray's default: 20 times, 1 s apart)."""
    env = {**_clean_env(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_NUM_REDIS_GET_RETRIES": "2", **auth}
    return subprocess.run([sys.executable, "-c", PROBE, address, str(target)], env=env,
                          capture_output=True, text=True, timeout=150)


def check_authenticated(cluster: Started, tmp_path: Path) -> list[tuple[str, str, int]]:
    """The refusals and the acceptance; returns the cluster's listening sockets."""
    stranger = tmp_path / "stranger-home"
    stranger.mkdir()
    assert stat.S_IMODE(cluster.token_file.stat().st_mode) == 0o600
    for name, auth in [
        ("no token", {}),
        ("wrong token", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}),
    ]:
        target = tmp_path / f"written by {name}"
        refused = probe(cluster.address, target, stranger, **auth)
        output = refused.stdout + refused.stderr
        assert refused.returncode != 0, f"{name}: connected and ran a task:\n{output[-2000:]}"
        assert "InvalidAuthToken" in output, f"{name}:\n{output[-2000:]}"  # the GCS refused
        assert not target.exists(), name
    target = tmp_path / "written with the token"
    accepted = probe(cluster.address, target, stranger, RAY_AUTH_MODE="token",
                     RAY_AUTH_TOKEN_PATH=str(cluster.token_file))
    assert accepted.returncode == 0, (accepted.stdout + accepted.stderr)[-3000:]
    assert target.read_text() == "ran"
    return _listening(cluster.marker)


def _off_loopback(listening: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    return [entry for entry in listening if not ipaddress.ip_address(entry[1]).is_loopback]


@pytest.mark.ray
def test_huggy_serve_cluster_refuses_processes_without_the_token(tmp_path: Path) -> None:
    port = free_port()
    with started(["serve", "--accelerator", "cpu", "--num-cpus", "0.5", "--port", str(port)],
                 tmp_path, ready="served at") as cluster:
        listening = check_authenticated(cluster, tmp_path)
        proxy = _listening(str(haproxy_dir(port)))
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in listening}, listening
    assert ("haproxy", "127.0.0.1", port) in proxy, proxy
    # On every interface: only each Serve replica's inter-replica gRPC server (Ray Serve binds
    # it there; it checks the token). Everything else of the cluster, HTTP, HAProxy's metrics
    # and stats pages included, is on loopback.
    off_loopback = _off_loopback(listening + proxy)
    assert all(name.startswith("ray::ServeRepli") for name, _, _ in off_loopback), off_loopback
    assert len({entry[2] for entry in proxy}) >= 3, proxy  # the HTTP port, metrics, stats


@pytest.mark.ray
@pytest.mark.standin
def test_huggy_evaluate_cluster_refuses_processes_without_the_token(tmp_path: Path) -> None:
    run = str(fixtures_dir() / "ppo_normalize_False")
    with started(["evaluate", run, "--episodes", "18000", "--max-steps", "400", "--runners", "1",
                  "--accelerator", "cpu", "--no-progress", "--out", str(tmp_path / "out")],
                 tmp_path, ready=None) as cluster:
        listening = check_authenticated(cluster, tmp_path)
        assert cluster.process.poll() is None, "the evaluation ended before the probes"
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in listening}, listening
    # On every interface: only the environment's own gRPC port in each runner (mlagents-envs
    # binds it there for the Unity player to connect to; it runs no code). All of Ray is on
    # loopback.
    off_loopback = _off_loopback(listening)
    assert all(name.startswith("ray::Runner") for name, _, _ in off_loopback), off_loopback


def test_haproxy_folder_is_private(tmp_path: Path) -> None:
    """HAProxy's admin socket (mode 666) is reachable only through a folder of mode 700."""
    fresh = tmp_path / "fresh"
    private_folder(fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    private_folder(loose)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700
