"""`huggy watch`'s follower of results folders (deploy/watch/follow.py) on folders written here as
`mlagents-learn` writes them, with a clock of the test's own; and its SQLite record
(deploy/watch/store.py) against the items written into it. No Ray, no stand-in."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import pytest

from deploy.evaluation.plan import EnvSpec, EvalConfig
from deploy.evaluation.results import ItemResult
from deploy.watch.follow import RunFollower
from deploy.watch.store import WatchStore, evaluation_result, settings_of


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write_checkpoint(folder: Path, step: int, data: bytes = b"weights", behavior: str = "Huggy",
                     suffix: str = ".onnx") -> Path:
    path = folder / behavior / f"{behavior}-{step}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def write_status(folder: Path, steps: list[int], behavior: str = "Huggy") -> None:
    """training_status.json as ML-Agents 1.1.0 writes it, listing `steps`."""
    status = {behavior: {"checkpoints": [
        {"steps": step, "file_path": f"results/run/{behavior}/{behavior}-{step}.onnx",
         "reward": 1.0, "creation_time": 0.0,
         "auxillary_file_paths": [f"results/run/{behavior}/{behavior}-{step}.pt"]}
        for step in steps]}, "metadata": {"stats_format_version": "0.3.0"}}
    (folder / "run_logs").mkdir(parents=True, exist_ok=True)
    (folder / "run_logs" / "training_status.json").write_text(json.dumps(status))


def write_timers(folder: Path, ended: bool, mtime_ns: int) -> None:
    metadata = {"start_time_seconds": "1"} | ({"end_time_seconds": "2"} if ended else {})
    path = folder / "run_logs" / "timers.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": "root", "metadata": metadata}))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def labels(found: list) -> list[tuple[str, int, str]]:
    return [(c.label, c.step, c.path.name) for c in found]


# --- follow ------------------------------------------------------------------------------------


def test_a_listed_checkpoint_is_taken_at_once_and_only_once(tmp_path: Path) -> None:
    folder = tmp_path / "Huggy"
    follower = RunFollower(folder, settle_s=5, clock=Clock())
    assert follower.poll() == []
    assert follower.problem == f"{folder} does not exist yet"
    write_checkpoint(folder, 2000)
    write_checkpoint(folder, 2000, suffix=".pt")
    write_status(folder, [2000])
    assert labels(follower.poll()) == [("Huggy@2000", 2000, "Huggy-2000.onnx")]
    assert follower.problem is None
    assert follower.poll() == []


def test_an_unlisted_file_is_taken_once_unchanged_for_settle_s(tmp_path: Path) -> None:
    folder, clock = tmp_path / "run", Clock()
    follower = RunFollower(folder, settle_s=2.0, clock=clock)
    path = write_checkpoint(folder, 5000, b"half")
    assert follower.poll() == []            # first seen now
    clock.now = 1.5
    path.write_bytes(b"half and more")      # still being written: the clock starts again
    assert follower.poll() == []
    clock.now = 3.0
    assert follower.poll() == []            # unchanged for 1.5 s only
    clock.now = 3.5
    assert labels(follower.poll()) == [("run@5000", 5000, "Huggy-5000.onnx")]


def test_several_behaviors_are_named_in_labels_and_a_skipped_one_is_never_taken(
        tmp_path: Path) -> None:
    folder, clock = tmp_path / "two", Clock()
    for behavior in ("Blue", "Red"):
        write_checkpoint(folder, 100, behavior=behavior)
        write_checkpoint(folder, 200, behavior=behavior)
    follower = RunFollower(folder, settle_s=0.0, clock=clock)
    follower.skip("Red", 100)
    follower.poll()
    assert labels(follower.poll()) == [("two/Blue@100", 100, "Blue-100.onnx"),
                                       ("two/Blue@200", 200, "Blue-200.onnx"),
                                       ("two/Red@200", 200, "Red-200.onnx")]


def test_a_status_file_caught_mid_write_is_read_again_next_poll(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_checkpoint(folder, 10)
    (folder / "run_logs").mkdir()
    (folder / "run_logs" / "training_status.json").write_text('{"Huggy": {"checkp')
    follower = RunFollower(folder, settle_s=60, clock=Clock())
    assert follower.poll() == []
    assert follower.problem is not None and "not valid JSON" in follower.problem
    write_status(folder, [10])
    assert labels(follower.poll()) == [("run@10", 10, "Huggy-10.onnx")]


def test_a_listed_checkpoint_deleted_before_it_was_taken_is_passed_over(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_checkpoint(folder, 20)
    write_status(folder, [10, 20])  # the trainer deleted 10 (keep_checkpoints)
    assert labels(RunFollower(folder, clock=Clock()).poll()) == [("run@20", 20, "Huggy-20.onnx")]


def test_finished_needs_an_end_time_written_after_the_newest_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    follower = RunFollower(folder, clock=Clock())
    assert not follower.finished()                      # nothing there
    first = write_checkpoint(folder, 100)
    os.utime(first, ns=(10**18, 10**18))
    write_timers(folder, ended=False, mtime_ns=10**18 + 5)
    assert not follower.finished()                      # no end time: training
    write_timers(folder, ended=True, mtime_ns=10**18 + 5)
    assert follower.finished()
    resumed = write_checkpoint(folder, 200)             # `mlagents-learn --resume`
    os.utime(resumed, ns=(10**18 + 9, 10**18 + 9))
    assert not follower.finished()                      # the earlier session's timers
    write_timers(folder, ended=True, mtime_ns=10**18 + 9)
    assert follower.finished()


# --- store -------------------------------------------------------------------------------------


def item(index: int, returns: tuple[float, ...], seed: int = 0) -> ItemResult:
    n = len(returns)
    return ItemResult(policy_index=0, index=index, seed=seed + index, returns=returns,
                      lengths=tuple(10 + k for k in range(n)),
                      terminated=tuple(k % 2 == 0 for k in range(n)),
                      slots=tuple(range(n)), episode_indices=(0,) * n, agent_steps=40 * n,
                      seconds=0.25, node_id="local", runner="plain", behavior="Huggy?team=0")


SETTINGS = settings_of(EvalConfig(episodes_per_item=3, seed=0), EnvSpec(),
                       {"statistic": "iqm", "confidence": 0.95})


def test_an_item_is_recorded_once_with_its_episodes_as_given(tmp_path: Path) -> None:
    store = WatchStore(tmp_path / "watch.db")
    first = item(1, (0.5, -1.25, 2.0))
    assert store.add_item("abc", first, "2026-12-07T10:00:00+00:00")
    assert store.add_item("abc", item(0, (3.0,)), "2026-12-07T10:00:01+00:00")
    rerun = item(1, (9.0, 9.0, 9.0))  # the same item run again: its first record stands
    assert not store.add_item("abc", rerun, "2026-12-07T10:00:02+00:00")
    assert store.counts() == (2, 4)
    found = store.items("abc", policy_index=3)
    assert [(i.index, i.returns) for i in found] == [(0, (3.0,)), (1, (0.5, -1.25, 2.0))]
    assert found[1] == ItemResult(**{**first.__dict__, "policy_index": 3})
    assert store.items("other") == []
    store.close()


def test_an_item_whose_episodes_cannot_be_written_leaves_nothing(tmp_path: Path) -> None:
    store = WatchStore(tmp_path / "watch.db")
    broken = ItemResult(**{**item(0, (1.0, 2.0)).__dict__, "lengths": (5,)})  # 2 returns, 1 length
    with pytest.raises(ValueError, match="zip"):
        store.add_item("abc", broken, "2026-12-07T10:00:00+00:00")
    assert store.counts() == (0, 0)
    assert store.add_item("abc", item(0, (1.0, 2.0)), "2026-12-07T10:00:01+00:00")


def test_settings_are_recorded_once_and_a_watch_with_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "watch.db"
    WatchStore(path).check_settings(SETTINGS)
    again = WatchStore(path)
    again.check_settings(SETTINGS)
    assert again.settings() == json.loads(json.dumps(SETTINGS))
    other = settings_of(EvalConfig(episodes_per_item=3, seed=5), EnvSpec(),
                        {"statistic": "iqm", "confidence": 0.95})
    message = (f"{path} holds a watch with other settings (config.seed: 0 recorded, 5 now); "
               "start it with the same settings, or use another --db")
    with pytest.raises(ValueError, match=re.escape(message)):
        again.check_settings(other)


def test_policies_keep_their_order_and_a_label_is_taken_once(tmp_path: Path) -> None:
    store = WatchStore(tmp_path / "watch.db")
    served = store.add_policy("Huggy@1000", "f0", "served", "http://127.0.0.1:8000", "t0",
                              url="http://127.0.0.1:8000", policy_id="Huggy@1000", step=1000)
    checkpoint = store.add_policy("Huggy@2000", "f1", "checkpoint", "/r/Huggy-2000.onnx", "t1",
                                  path="/w/Huggy@2000.onnx", run="Huggy", step=2000)
    assert (served.seq, checkpoint.seq) == (0, 1)
    assert store.policies() == [served, checkpoint]
    assert served.spec().url == "http://127.0.0.1:8000" and served.spec().path is None
    assert checkpoint.spec().path == "/w/Huggy@2000.onnx"
    with pytest.raises(ValueError, match=re.escape("policy 'Huggy@2000' is in ")):
        store.add_policy("Huggy@2000", "f2", "checkpoint", "x", "t2")


def test_a_decision_keeps_the_time_it_was_first_made(tmp_path: Path) -> None:
    store = WatchStore(tmp_path / "watch.db")
    store.add_policy("a", "f0", "checkpoint", "a.onnx", "t0")
    assert store.record_decision(0, "10:00", {"decision": "first"}) == "10:00"
    assert store.record_decision(0, "11:00", {"decision": "first", "episodes": 36}) == "10:00"
    assert store.decisions() == {0: ("10:00", {"decision": "first", "episodes": 36})}
    store.add_promotion("10:01", "best", "a", None, {"decision": "first"})
    assert store.promotions() == [{"at": "10:01", "kind": "best", "label": "a",
                                   "previous": None, "evidence": {"decision": "first"}}]


def test_the_database_reads_back_as_an_evaluation(tmp_path: Path) -> None:
    store = WatchStore(tmp_path / "watch.db")
    store.check_settings(SETTINGS)
    store.add_policy("run@1", "f0", "checkpoint", "/r/a.onnx", "t0", path="/w/a.onnx", run="run",
                     step=1)
    store.add_policy("run@2", "f1", "checkpoint", "/r/b.onnx", "t1", path="/w/b.onnx", run="run",
                     step=2)
    store.add_item("f1", item(0, (1.0, 2.0, 3.0)), "t2")
    store.add_item("f0", item(1, (4.0, 5.0, 6.0)), "t3")
    store.add_item("f0", item(0, (7.0, 8.0, 9.0)), "t4")
    result = evaluation_result(store)
    assert [p.spec.label for p in result.policies] == ["run@1", "run@2"]
    assert [[i.returns for i in p.ordered_items()] for p in result.policies] == [
        [(7.0, 8.0, 9.0), (4.0, 5.0, 6.0)], [(1.0, 2.0, 3.0)]]
    assert [i.policy_index for i in result.policies[1].items] == [1]
    assert result.planned_episodes == [6, 3]
    assert (result.config.episodes_per_item, result.config.seed) == (3, 0)
    assert result.env == EnvSpec()


def test_a_file_that_is_no_watch_database_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.db"
    text.write_text("not a database at all, but long enough to have a header page" * 20)
    with pytest.raises(ValueError, match=re.escape(f"{text} is not a watch database: ")):
        WatchStore(text)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    with pytest.raises(ValueError, match=re.escape(
            f"{other}: a watch database of schema version 99; this huggy reads version 1")):
        WatchStore(other)
    with pytest.raises(ValueError, match="holds no watch"):
        evaluation_result(WatchStore(tmp_path / "empty.db"))
