"""`huggy serve` as a user runs it: a subprocess that joins the session cluster, serves the bundled
policy over HTTP until SIGINT (Ctrl-C), then removes Serve and exits 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from deploy.client import RemoteAgent
from huggy_agent import HuggyAgent
from tests.conftest import REPO_ROOT, RayCluster, free_port


def huggy(*args: str, **kwargs: object) -> subprocess.Popen:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen([sys.executable, "-m", "huggy_agent.cli", *args], cwd=REPO_ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def test_serve_arguments_are_checked_before_anything_starts(tmp_path) -> None:
    both = huggy("serve", "--replicas", "2", "--autoscale")
    output, _ = both.communicate(timeout=60)
    assert both.returncode == 2
    assert "argument --autoscale: not allowed with argument --replicas" in output
    missing = huggy("serve", "--policy", str(tmp_path / "nope.onnx"))
    output, _ = missing.communicate(timeout=60)
    assert missing.returncode == 2
    assert f"policy '{tmp_path / 'nope.onnx'}' not found" in output


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_huggy_serve_serves_until_ctrl_c(ray_cluster: RayCluster) -> None:
    import ray

    port = free_port()
    process = huggy("serve", "--accelerator", "cpu", "--num-cpus", "0.5", "--port", str(port),
                    "--address", ray_cluster.address, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if "served at" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(150), "huggy serve did not come up:\n" + "".join(lines[-30:])
        assert f"http://127.0.0.1:{port}/v1/act (ingress haproxy)" in "".join(lines)
        obs = np.random.default_rng(5).standard_normal((4, 59)).astype(np.float32)
        with RemoteAgent(f"http://127.0.0.1:{port}") as remote:
            np.testing.assert_allclose(remote.compute_action(obs),
                                       HuggyAgent(device="cpu").compute_action(obs),
                                       rtol=0, atol=1e-6)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=90) == 0, "".join(lines[-30:])
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(timeout=10)
    assert "shutting down" in "".join(lines)
    assert not port_open(port)
    with pytest.raises(ValueError):  # Serve was removed from the joined cluster
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2  # the joined cluster still runs
