"""`huggy watch` on the stand-in, in this process (`--no-ray`): a checkpoint copied into a followed
results folder is seen, rated and written (watch.json, the database, TensorBoard scalars beside
the trainer's), each step gated on the watch's own state; a watch killed with -9 at a seeded
moment and started again holds every episode once and decides as an uninterrupted one; `huggy
evaluate --db` reports the database's episodes without running anything. The checkpoints are
the run of tests/fixtures/watch/generate.py."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from deploy.evaluation.plan import EnvSpec, EvalConfig
from deploy.watch.decisions import RuleSettings
from deploy.watch.execution import PlainExecutor
from deploy.watch.follow import RunFollower
from deploy.watch.loop import Watch, WatchOptions
from deploy.watch.store import WatchStore, settings_of

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "watch"))
from generate import write_checkpoint

pytestmark = pytest.mark.standin

HUGGY = str(Path(sys.executable).with_name("huggy"))
SMALL = ["--budget-items", "4", "--looks", "2", "--no-ray"]
"""Looks after 2 and 4 items of 18 episodes: a few seconds of stand-in per look."""
SAFETY_S = 300.0
"""The longest wait for a state the test waits on (a safety net, not a bound)."""


def step_until(watch: Watch, condition: Any) -> None:
    deadline = time.monotonic() + SAFETY_S
    while not condition():
        assert time.monotonic() < deadline, "the watch did not get there"
        watch.step(0.05)


def decided(out: Path) -> dict[str, dict[str, Any]]:
    path = out / "watch.json"
    if not path.exists():
        return {}
    return {c["label"]: c for c in json.loads(path.read_text())["checkpoints"]
            if c["decided_at"] is not None}


def finish_training(folder: Path) -> None:
    """What mlagents-learn writes last: run_logs/timers.json with its end time."""
    (folder / "run_logs").mkdir(parents=True, exist_ok=True)
    (folder / "run_logs" / "timers.json").write_text(json.dumps(
        {"name": "root", "metadata": {"start_time_seconds": "1", "end_time_seconds": "2"}}))


def test_a_copied_checkpoint_is_seen_rated_and_written(tmp_path: Path) -> None:
    run, out = tmp_path / "results" / "run", tmp_path / "out"
    scratch = tmp_path / "scratch"
    write_checkpoint(run, 100_000, 0.3)
    later = write_checkpoint(scratch, 200_000, 0.0)
    config = EvalConfig(episodes=4 * 18, episodes_per_item=18, progress=False)
    rule = RuleSettings(looks=(2, 4))
    store = WatchStore(out / "watch.db")
    store.check_settings(settings_of(config, EnvSpec(), rule.as_dict()))  # as `huggy watch` does
    executor = PlainExecutor(config, EnvSpec())
    lines: list[str] = []

    class Lines:
        def write(self, text: str) -> None:
            lines.extend(line for line in text.splitlines() if line)

        def flush(self) -> None:
            pass

    try:
        watch = Watch(store, [RunFollower(run, settle_s=0.0)], executor, config, rule,
                      WatchOptions(out=out, report=True),
                      output=Lines())  # type: ignore[arg-type]
        step_until(watch, lambda: "run@100000" in decided(out))
        assert decided(out)["run@100000"]["decision"] == "first"
        # the trainer writes the next checkpoint: copied in whole, as a trainer's file lands
        target = run / "Huggy" / later.name
        (run / "Huggy" / f".{later.name}.part").write_bytes(later.read_bytes())
        os.replace(run / "Huggy" / f".{later.name}.part", target)
        step_until(watch, lambda: "run@200000" in decided(out))
        finish_training(run)
        step_until(watch, watch.finished)
    finally:
        executor.close()
    summary = json.loads((out / "watch.json").read_text())
    second = decided(out)["run@200000"]
    assert second["seen_at"] <= second["decided_at"]
    assert second["decision"] in ("better", "tied", "not better", "undecided")
    assert second["against"] == "run@100000"
    assert second["episodes"] == 18 * second["items"]
    assert summary["best"] == ("run@200000" if second["decision"] == "better" else "run@100000")
    assert lines[0] == f"run@100000: seen ({run / 'Huggy' / 'Huggy-100000.onnx'})"
    assert any(line.startswith("run@200000: IQM ") for line in lines)
    # every item once in the database, its episodes those watch.json counts
    items, episodes = store.counts()
    first = decided(out)["run@100000"]
    assert episodes == 18 * items
    assert items >= first["items"] + second["items"]
    store.close()
    # the scalars in the trainer's folder of the behavior, at each checkpoint's step
    events = EventAccumulator(str(run / "Huggy"))
    events.Reload()
    iqm = {event.step: event.value for event in events.Scalars("Evaluation/IQM")}
    low = {event.step: event.value for event in events.Scalars("Evaluation/IQM CI Low")}
    assert iqm == pytest.approx({100_000: first["estimate"]["value"],
                                 200_000: second["estimate"]["value"]}, rel=1e-6)
    assert low[200_000] == pytest.approx(second["estimate"]["ci"][0], rel=1e-6)
    # huggy evaluate's report of the database, rewritten at the last decision: every episode
    # the database holds, and the run's model card in its results folder
    report = json.loads((out / "report" / "evaluation.json").read_text())
    assert sum(policy["episodes"] for policy in report["policies"]) == episodes
    assert {policy["label"] for policy in report["policies"]} == {"run@100000", "run@200000"}
    assert "run@200000" in (run / "README.md").read_text()


def make_finished_run(folder: Path) -> None:
    for step, blend in ((100_000, 0.3), (200_000, 0.0), (300_000, 0.15)):
        write_checkpoint(folder, step, blend)
    finish_training(folder)


def watch_command(run: Path, out: Path) -> list[str]:
    return [HUGGY, "watch", str(run), "--out", str(out), *SMALL]


def recorded(db: Path) -> tuple[dict[tuple[str, int], list[float]], int, int]:
    """Each recorded item's returns, and the episodes and distinct episodes in the database."""
    with sqlite3.connect(db) as connection:
        items: dict[tuple[str, int], list[float]] = {}
        for fingerprint, index, value in connection.execute(
                "SELECT fingerprint, item_index, episode_return FROM episodes "
                "ORDER BY fingerprint, item_index, position"):
            items.setdefault((fingerprint, index), []).append(value)
        total = connection.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
        distinct = connection.execute(
            "SELECT COUNT(*) FROM (SELECT DISTINCT fingerprint, seed, item_index, slot, "
            "episode_index FROM episodes)").fetchone()[0]
    return items, total, distinct


def items_in(db: Path) -> int:
    """Items recorded so far by a running watch (0 before it made its tables)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as connection:
            return int(connection.execute("SELECT COUNT(*) FROM items").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def decisions_of(out: Path) -> list[dict[str, Any]]:
    kept = ("label", "decision", "items", "episodes", "estimate", "difference", "best")
    return [{key: c.get(key) for key in kept}
            for c in json.loads((out / "watch.json").read_text())["checkpoints"]]


def test_a_watch_killed_at_a_seeded_moment_resumes_to_the_same_decisions(
        tmp_path: Path) -> None:
    run = tmp_path / "results" / "run"
    make_finished_run(run)
    whole = tmp_path / "whole"
    subprocess.run(watch_command(run, whole), check=True, capture_output=True, timeout=600)
    items, total, distinct = recorded(whole / "watch.db")
    assert total == distinct == 18 * len(items)
    # kill -9 once the database holds a number of items drawn by a seeded generator
    kill_at = int(np.random.default_rng(50).integers(1, len(items)))
    killed = tmp_path / "killed"
    watch = subprocess.Popen(watch_command(run, killed), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + SAFETY_S
    try:
        while True:
            assert watch.poll() is None, "the watch ended before the kill point"
            assert time.monotonic() < deadline
            if items_in(killed / "watch.db") >= kill_at:
                break
            time.sleep(0.02)
        os.kill(watch.pid, signal.SIGKILL)
    finally:
        watch.wait()
    assert watch.returncode == -signal.SIGKILL
    done = subprocess.run(watch_command(run, killed), check=True, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0
    again, total, distinct = recorded(killed / "watch.db")
    assert total == distinct  # every episode once
    assert again == items  # the same items, each with the same returns
    assert decisions_of(killed) == decisions_of(whole)
    # the report of the database, running nothing: every episode listed
    report = tmp_path / "report"
    subprocess.run([HUGGY, "evaluate", "--db", str(killed / "watch.db"), "--out", str(report)],
                   check=True, capture_output=True, timeout=600)
    evaluation = json.loads((report / "evaluation.json").read_text())
    listed = sum(len(item["returns"]) for policy in evaluation["policies"]
                 for item in policy["items"])
    assert listed == total
