"""The test session's Ray cluster: two nodes on 127.0.0.1 started with `ray start`, with token
authentication on and a token of the session's own (a private file named by RAY_AUTH_TOKEN_PATH;
the user's ~/.ray/auth_token and $RAY_AUTH_TOKEN are neither read nor written)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_ports, kill_processes_mentioning


@dataclass(frozen=True)
class RayCluster:
    """A running local cluster: `address` for `ray.init`, node ids of the head and the worker node."""

    address: str
    head_node_id: str
    worker_node_id: str
    temp_dir: Path


RAY_TOKEN_DIR = Path(f"/tmp/huggy-ray-token-{uuid.uuid4().hex[:8]}")
RAY_TOKEN_FILE = RAY_TOKEN_DIR / "auth_token"


def use_session_token() -> None:
    """Ray with token authentication on, as users get it, for this process and every process it
    starts (`ray start`, `huggy` subprocesses, their clusters), with a fresh token in a private
    file. Call before anything imports Ray."""
    RAY_TOKEN_DIR.mkdir(mode=0o700)
    descriptor = os.open(RAY_TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32))
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(RAY_TOKEN_FILE),
                      RAY_USAGE_STATS_ENABLED="0")


def remove_session_token() -> None:
    shutil.rmtree(RAY_TOKEN_DIR, ignore_errors=True)


@contextmanager
def two_node_cluster() -> Iterator[RayCluster]:
    """One two-node Ray cluster, started with `ray start` on 127.0.0.1, with this process
    connected (`ray.init(address=...)`). The head declares a fake `NPU: 1` resource (for the
    accelerator-pinning tests) and the worker node a `worker_node: 1` resource. Everything is
    killed at the end, by the cluster's own temp dir, so other clusters survive."""
    import ray

    temp_dir = Path(f"/tmp/rt{uuid.uuid4().hex[:8]}")
    ray_bin = str(Path(sys.executable).with_name("ray"))
    port, client_server_port = free_ports(2)
    address = f"127.0.0.1:{port}"
    common = ["--temp-dir", str(temp_dir), "--disable-usage-stats"]
    try:
        subprocess.run(
            [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
             "--num-cpus=2", "--resources", json.dumps({"NPU": 1}), "--include-dashboard=false",
             f"--ray-client-server-port={client_server_port}",
             *common],
            check=True, env=dict(os.environ), capture_output=True, timeout=120,
        )
        subprocess.run(
            [ray_bin, "start", f"--address={address}", "--node-ip-address=127.0.0.1",
             "--num-cpus=2", "--resources", json.dumps({"worker_node": 1}), *common],
            check=True, env=dict(os.environ), capture_output=True, timeout=120,
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
        ray.shutdown()  # Serve was shut down at the end of each test module (conftest)
        kill_processes_mentioning(str(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


def stop_serve_left_running() -> bool:
    """Shut Serve down where it runs on the cluster this process is connected to
    (`deploy.serving.server.shutdown_serve`); whether it ran. Connects nothing and imports Ray
    only where this process already did."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    from deploy.serving.server import serve_running, shutdown_serve  # Ray is imported by now

    if not serve_running():
        return False
    shutdown_serve()
    return True
