"""Faults: missing, non-starting and never-connecting executables, a Unity process dying
mid-rollout, busy ports, the Python side disappearing; never an orphan process."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from envs import HuggyVectorEnv, RolloutInterrupted, rollout
from envs.vector_env import EnvironmentStartError
from huggy_agent import HuggyAgent
from tests.support.envs import KillAfter, env_kwargs, processes_mentioning, wait_until_gone
from tests.support.fixtures import REPO_ROOT
from tests.support.processes import free_port

pytestmark = pytest.mark.standin  # every test here starts the stand-in


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_missing_executable(tmp_path: Path) -> None:
    missing = tmp_path / "Huggy.x86_64"
    with pytest.raises(FileNotFoundError, match="Unity executable not found: .*Huggy.x86_64"):
        HuggyVectorEnv(file_name=str(missing), **env_kwargs(tmp_path))


def test_executable_that_exits_at_once(tmp_path: Path) -> None:
    exe = _script(tmp_path / "Broken.x86_64", "echo crashing >&2; exit 3")
    with pytest.raises(EnvironmentStartError, match="could not be started.*return code 3"):
        HuggyVectorEnv(file_name=exe, **env_kwargs(tmp_path, timeout_wait=10))
    assert wait_until_gone(str(tmp_path)) == []


def test_file_that_cannot_be_executed(tmp_path: Path) -> None:
    exe = tmp_path / "Huggy.x86_64"
    exe.write_text("not a program")
    exe.chmod(0o644)
    with pytest.raises(EnvironmentStartError, match="could not be started.*permissions"):
        HuggyVectorEnv(file_name=str(exe), **env_kwargs(tmp_path, timeout_wait=5))


def test_executable_that_never_connects(tmp_path: Path) -> None:
    exe = _script(tmp_path / "Silent.x86_64", "exec sleep 300")
    with pytest.raises(EnvironmentStartError, match="did not connect on port .* within 3 s"):
        HuggyVectorEnv(file_name=exe, **env_kwargs(tmp_path, timeout_wait=3))
    assert wait_until_gone(str(tmp_path)) == []


def test_unity_dying_mid_rollout_keeps_finished_episodes(tmp_path: Path) -> None:
    env = HuggyVectorEnv(**env_kwargs(tmp_path, max_steps=10, timeout_wait=10))
    try:
        killer = KillAfter(HuggyAgent(device="cpu"), steps=15, pid=env.process_id)
        with pytest.raises(RolloutInterrupted, match="stopped after 18 of 100 episodes") as info:
            rollout(killer, env, episodes=100, seed=0)
        result = info.value.result
        assert len(result.episodes) == 18
        assert all(e.length == 10 for e in result.episodes)
    finally:
        env.close()
    assert wait_until_gone(str(tmp_path)) == []


@pytest.mark.parametrize("taken", ["before the check", "after the check"])
def test_busy_port_moves_to_the_next_worker_id(tmp_path: Path, monkeypatch, taken: str) -> None:
    """A busy port moves the environment on to the next worker id, also when another program
    takes it between our free-port check and mlagents-envs' bind."""
    import envs.instance

    port = free_port()
    if taken == "after the check":
        monkeypatch.setattr(envs.instance, "_port_is_free", lambda candidate: True)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        with HuggyVectorEnv(**env_kwargs(tmp_path, base_port=port)) as env:
            assert env.worker_id >= 1 and env.port == port + env.worker_id
            env.reset()
            env.step(np.zeros((18, 21)))
        if taken == "before the check":
            with pytest.raises(RuntimeError, match=f"ports {port}-{port} are all in use"):
                HuggyVectorEnv(**env_kwargs(tmp_path, base_port=port, port_attempts=1))
    assert wait_until_gone(str(tmp_path)) == []


def test_standin_exits_when_the_python_side_is_killed(tmp_path: Path) -> None:
    code = (
        "import sys, time, envs\n"
        f"env = envs.HuggyVectorEnv(base_port={free_port()}, log_folder={str(tmp_path)!r})\n"
        "print(env.process_id, flush=True)\n"
        "time.sleep(300)\n"
    )
    python = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT)
    try:
        standin = int(python.stdout.readline())
        assert standin in processes_mentioning(str(tmp_path))
    finally:
        python.kill()
        python.wait()
    assert wait_until_gone(str(tmp_path), timeout=15) == []
