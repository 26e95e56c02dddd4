"""Shared test scaffolding: the fixture folder, and one two-node Ray cluster per test session."""

from __future__ import annotations

import json
import os
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


def fixtures_dir() -> Path:
    """The shared Huggy fixtures: `$HUGGY_FIXTURES`, else `../shared/fixtures/huggy` beside the repo."""
    path = Path(os.environ.get("HUGGY_FIXTURES", REPO_ROOT.parent / "shared" / "fixtures" / "huggy"))
    if not path.is_dir():
        raise FileNotFoundError(f"Huggy fixtures not found at {path}; set HUGGY_FIXTURES")
    return path


FIXTURE_RUNS = ("ppo_baseline", "ppo_num_layers_2", "ppo_normalize_False")


def mlagents_fixtures_dir() -> Path:
    """ML-Agents policies of every other kind: `$MLAGENTS_FIXTURES`, else
    `../shared/fixtures/mlagents` beside the repo (see its README)."""
    path = Path(os.environ.get("MLAGENTS_FIXTURES",
                               REPO_ROOT.parent / "shared" / "fixtures" / "mlagents"))
    if not path.is_dir():
        raise FileNotFoundError(f"ML-Agents fixtures not found at {path}; set MLAGENTS_FIXTURES")
    return path


MLAGENTS_RUNS = ("discrete_multibranch", "hybrid", "raycast_stack", "visual_simple",
                 "visual_nature", "visual_resnet", "visual_fc", "lstm", "buffer_sensor",
                 "pyramids_trained")


EXTRA_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "mlagents_extra"
EXTRA_RUNS = ("sac_continuous", "sac_discrete", "poca_hybrid", "visual_match3")


def mlagents_policy_files() -> list[Path]:
    """Every ML-Agents fixture file the loaders must read: each run's final `.onnx` and its
    `.pt` where it has one (the trained Pyramids policy has none), the shared fixtures first,
    then this repository's extra ones (tests/fixtures/mlagents_extra: SAC, POCA, match3)."""
    runs = [mlagents_fixtures_dir() / run for run in MLAGENTS_RUNS]
    runs += [EXTRA_FIXTURES / run for run in EXTRA_RUNS]
    files = []
    for run in runs:
        files += sorted(run.glob("*.onnx")) + sorted(run.glob("*/*.pt"))
    return files


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


def _ray_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    return env


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
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """One two-node Ray cluster for the whole session, started with `ray start` on 127.0.0.1.

    The head declares a fake `NPU: 1` resource (for the accelerator-pinning tests) and the worker
    node a `worker_node: 1` resource. This driver is connected with `ray.init(address=...)`.
    Everything is killed at the end, by the cluster's own temp dir, so other clusters survive.
    """
    import ray

    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
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
