"""`huggy watch` on Ray runners (the session's cluster), compared with the same watch run in one
process (`--no-ray`): the same items with the same returns, the same decisions, whichever runner
ran which item."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ray_cluster import RayCluster

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "watch"))
from generate import write_checkpoint

pytestmark = pytest.mark.ray

SMALL = ["--budget-items", "4", "--looks", "2", "--no-follow", "--seed", "3"]


def watch(run: Path, out: Path, *extra: str) -> None:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run([sys.executable, "-m", "huggy_agent.cli", "watch", str(run),
                           "--out", str(out), *SMALL, *extra], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def items(db: Path) -> dict[tuple[str, int], tuple[list[float], str]]:
    with sqlite3.connect(db) as connection:
        runners = dict(((f, i), r) for f, i, r in connection.execute(
            "SELECT fingerprint, item_index, runner FROM items"))
        returns: dict[tuple[str, int], list[float]] = {}
        for fingerprint, index, value in connection.execute(
                "SELECT fingerprint, item_index, episode_return FROM episodes "
                "ORDER BY fingerprint, item_index, position"):
            returns.setdefault((fingerprint, index), []).append(value)
    return {key: (returns[key], runners[key]) for key in runners}


def test_a_watch_on_two_ray_runners_decides_as_one_in_process(
        ray_cluster: RayCluster, tmp_path: Path) -> None:
    run = tmp_path / "results" / "run"
    write_checkpoint(run, 100_000, 0.3)
    write_checkpoint(run, 200_000, 0.0)
    watch(run, tmp_path / "ray", "--runners", "2", "--address", ray_cluster.address,
          "--accelerator", "cpu")
    watch(run, tmp_path / "plain", "--no-ray")
    on_ray, plain = items(tmp_path / "ray" / "watch.db"), items(tmp_path / "plain" / "watch.db")
    assert {key: value[0] for key, value in on_ray.items()} == {
        key: value[0] for key, value in plain.items()}
    assert {runner for _, runner in plain.values()} == {"plain"}
    assert "plain" not in {runner for _, runner in on_ray.values()}

    def decisions(out: Path) -> list[tuple[str, str, int]]:
        summary = json.loads((out / "watch.json").read_text())
        return [(c["label"], c["decision"], c["episodes"]) for c in summary["checkpoints"]]

    assert decisions(tmp_path / "ray") == decisions(tmp_path / "plain")
    assert len(decisions(tmp_path / "ray")) == 2
