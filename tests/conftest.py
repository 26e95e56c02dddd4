"""Shared test scaffolding: the fixture sets under tests/fixtures, the lane markers (`ray`,
`standin`), and one two-node Ray cluster per test session."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


FIXTURES = REPO_ROOT / "tests" / "fixtures"


def _fixture_set(name: str, variable: str) -> Path:
    """The fixture set `tests/fixtures/<name>` (or `$<variable>` where set). Where it is absent,
    the test (or, when called at import time, the whole module) is skipped, saying how to get it."""
    path = Path(os.environ.get(variable, FIXTURES / name))
    if path.is_dir():
        return path
    if variable in os.environ:
        how = f"${variable} names no folder; unset it to use tests/fixtures/{name}"
    else:
        how = (f"it ships with the repository (`git checkout -- tests/fixtures/{name}` restores it), "
               f"or set ${variable} to a copy")
    pytest.skip(f"fixture set {name!r} not found at {path}: {how}", allow_module_level=True)


def fixtures_dir() -> Path:
    """Three real trained Huggy policies (tests/fixtures/huggy, see its README; `$HUGGY_FIXTURES`
    overrides)."""
    return _fixture_set("huggy", "HUGGY_FIXTURES")


FIXTURE_RUNS = ("ppo_baseline", "ppo_num_layers_2", "ppo_normalize_False")


def mlagents_fixtures_dir() -> Path:
    """ML-Agents policies of every other kind (tests/fixtures/mlagents, see its README;
    `$MLAGENTS_FIXTURES` overrides)."""
    return _fixture_set("mlagents", "MLAGENTS_FIXTURES")


MLAGENTS_RUNS = ("discrete_multibranch", "hybrid", "raycast_stack", "visual_simple",
                 "visual_nature", "visual_resnet", "visual_fc", "lstm", "buffer_sensor",
                 "pyramids_trained")


EXTRA_FIXTURES = FIXTURES / "mlagents_extra"
EXTRA_RUNS = ("sac_continuous", "sac_discrete", "poca_hybrid", "visual_match3")


def mlagents_policy_files() -> list[Path]:
    """Every ML-Agents fixture file the loaders must read: each run's final `.onnx` and its
    `.pt` where it has one (the trained Pyramids policy has none), tests/fixtures/mlagents
    first, then tests/fixtures/mlagents_extra (SAC, POCA, match3)."""
    runs = [mlagents_fixtures_dir() / run for run in MLAGENTS_RUNS]
    runs += [EXTRA_FIXTURES / run for run in EXTRA_RUNS]
    files = []
    for run in runs:
        files += sorted(run.glob("*.onnx")) + sorted(run.glob("*/*.pt"))
    return files


# --- lanes: `make test-fast` runs what is neither `ray` nor `standin` --------------------------

SLOW_LANES = ("ray", "standin")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `ray` every test that uses the session's Ray cluster (directly or through another
    fixture); `standin` is marked in the test modules, where a test starts a stand-in."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


def _starts_a_player(args: object) -> bool:
    """Whether a command line starts a Unity player (the stand-in is started as one) or an
    `envs` worker process (which starts one)."""
    words = [str(word) for word in args] if isinstance(args, (list, tuple)) else [str(args)]
    return any(word == "--mlagents-port" or "envs.workers" in word for word in words)


@pytest.fixture(autouse=True)
def _fast_lane_starts_no_standin(request: pytest.FixtureRequest,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A test in neither slow lane may not start a stand-in: it fails, naming the marker it needs,
    so the fast lane stays free of stand-ins. (Fixtures of a wider scope start before this.)"""
    if any(request.node.get_closest_marker(lane) for lane in SLOW_LANES):
        return
    popen_init = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
        if _starts_a_player(args):
            raise RuntimeError(f"{request.node.nodeid} starts a stand-in or an envs worker but is "
                               "not marked: add `pytest.mark.standin` to it")
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class RayCluster:
    """A running local cluster: `address` for `ray.init`, node ids of the head and the worker node."""

    address: str
    head_node_id: str
    worker_node_id: str
    temp_dir: Path


RAY_TOKEN_DIR = Path(f"/tmp/huggy-ray-token-{uuid.uuid4().hex[:8]}")
RAY_TOKEN_FILE = RAY_TOKEN_DIR / "auth_token"


def pytest_configure(config: pytest.Config) -> None:
    """Ray with token authentication on, as users get it, for this process and every process it
    starts (`ray start`, `huggy` subprocesses, their clusters), with a token of the session's
    own: a private file named by RAY_AUTH_TOKEN_PATH. The user's ~/.ray/auth_token and
    $RAY_AUTH_TOKEN are neither read nor written. Set before any test module imports Ray."""
    RAY_TOKEN_DIR.mkdir(mode=0o700)
    descriptor = os.open(RAY_TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32))
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(RAY_TOKEN_FILE),
                      RAY_USAGE_STATS_ENABLED="0")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(RAY_TOKEN_DIR, ignore_errors=True)


def _ray_env() -> dict[str, str]:
    """This process's environment, with the session's Ray token settings (`pytest_configure`)."""
    return dict(os.environ)


def _mentions(proc: Path, marker: str) -> bool:
    """Whether a process's command line or one of its open files names `marker`."""
    try:
        if marker.encode() in (proc / "cmdline").read_bytes():
            return True
        return any(marker in os.readlink(fd) for fd in (proc / "fd").iterdir())
    except OSError:
        return False


def _kill_processes_mentioning(marker: str) -> None:
    """Kill every process that names `marker` (our cluster's own temp dir) in its command line
    or open files (Ray's agents write their logs there), so other clusters survive."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        if _mentions(proc, marker):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """One two-node Ray cluster for the whole session, started with `ray start` on 127.0.0.1,
    with token authentication (the session's token, see `pytest_configure`).

    The head declares a fake `NPU: 1` resource (for the accelerator-pinning tests) and the worker
    node a `worker_node: 1` resource. This driver is connected with `ray.init(address=...)`.
    Everything is killed at the end, by the cluster's own temp dir, so other clusters survive.
    """
    import ray

    temp_dir = Path(f"/tmp/rt{uuid.uuid4().hex[:8]}")
    ray_bin = str(Path(sys.executable).with_name("ray"))
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--temp-dir", str(temp_dir), "--disable-usage-stats"]
    try:
        subprocess.run(
            [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
             "--num-cpus=2", "--resources", json.dumps({"NPU": 1}), "--include-dashboard=false",
             f"--ray-client-server-port={free_port()}",
             *common],
            check=True, env=_ray_env(), capture_output=True, timeout=120,
        )
        subprocess.run(
            [ray_bin, "start", f"--address={address}", "--node-ip-address=127.0.0.1",
             "--num-cpus=2", "--resources", json.dumps({"worker_node": 1}), *common],
            check=True, env=_ray_env(), capture_output=True, timeout=120,
        )
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        deadline = time.monotonic() + 60
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"second Ray node did not join: {ray.nodes()}")
            time.sleep(0.5)
        head = worker = ""
        for node in ray.nodes():
            if not node["Alive"]:
                continue
            if "worker_node" in node["Resources"]:
                worker = node["NodeID"]
            else:
                head = node["NodeID"]
        yield RayCluster(address=address, head_node_id=head, worker_node_id=worker,
                         temp_dir=temp_dir)
    finally:
        try:
            from ray import serve

            if ray.is_initialized():
                serve.shutdown()
        except Exception:  # noqa: BLE001 - best-effort cleanup; the kill below is what counts
            pass
        ray.shutdown()
        _kill_processes_mentioning(str(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
