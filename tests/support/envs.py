"""Helpers shared by the tests of `envs` (test_envs_*.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np

from tests.support.processes import free_port


def env_kwargs(tmp_path: Path, **overrides: object) -> dict:
    """Keyword arguments for a stand-in HuggyVectorEnv on a free port, logging under tmp_path
    (whose name then appears in the stand-in's command line: see `processes_mentioning`)."""
    kwargs: dict = {"base_port": free_port(), "worker_id": 0, "timeout_wait": 20,
                    "log_folder": str(tmp_path)}
    kwargs.update(overrides)
    return kwargs


def gait_actions(step: int, n: int) -> np.ndarray:
    """A scripted trot that walks the stand-in's dogs to the stick: legs alternately swing
    forward lifted and sweep back planted at full strength, turning force on."""
    phase = 1.0 if step % 2 else -1.0
    actions = np.zeros((n, 21), dtype=np.float32)
    actions[:, 1:8:2] = -phase * np.array([1.0, -1.0, 1.0, -1.0])  # upper legs Y (fore-aft)
    actions[:, 8:12] = phase  # lower legs X: planted while sweeping back
    actions[:, 12:20] = 1.0  # strengths
    actions[:, 20] = 1.0  # turn toward the stick
    return actions


def processes_mentioning(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker.encode() not in (proc / "cmdline").read_bytes():
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(proc.name))
    return found


def wait_until_gone(marker: str, timeout: float = 10.0) -> list[int]:
    """Wait up to `timeout` s for every process naming `marker` to exit; returns the survivors."""
    deadline = time.monotonic() + timeout
    while (alive := processes_mentioning(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def wait_until_dead(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait up to `timeout` s for every process in `pids` to exit (zombies count as exited);
    returns the survivors."""
    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


class KillAfter:
    """Wraps an agent; SIGKILLs process `pid` once `steps` decisions have been made."""

    def __init__(self, agent: object, steps: int, pid: int) -> None:
        self.agent, self.steps, self.pid = agent, steps, pid

    def compute_action(self, obs: np.ndarray, **kwargs: object) -> np.ndarray:
        self.steps -= 1
        if self.steps == 0:
            os.kill(self.pid, signal.SIGKILL)
        return self.agent.compute_action(obs, **kwargs)  # type: ignore[attr-defined]
