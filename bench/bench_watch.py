"""Benchmark of `huggy watch` following a run as a trainer writes it: seconds from each checkpoint
file to its first decision in TensorBoard.

A run's checkpoints (tests/fixtures/watch/generate.py: a Huggy policy blended toward a weak
network) land in a results folder one at a time, `--interval` seconds apart, as `mlagents-learn`
writes them: the file (written beside, then renamed into place), then
`run_logs/training_status.json` listing it. `huggy watch` follows the folder with `--runners`
Ray runners on the built-in stand-in (a local Ray it starts itself). After the last checkpoint,
`run_logs/timers.json` gets its end time and the watch ends.

As a trainer writes its first checkpoint one interval after it starts, the first file lands one
interval after the watch says it follows the folder (its Ray runners starting by then).

For each checkpoint: when its `Evaluation/IQM` scalar first appears in the run's TensorBoard
folder (its first rating, at its first look; polled every `--poll` seconds), minus when its file
landed; and from watch.json, its first rating's and its decision's times minus the landing
time.

    .venv/bin/python bench/bench_watch.py [--interval 20] [--runners 2] [--out out/bench-watch]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "watch"))
from generate import BEHAVIOR, CHECKPOINTS, make_run  # noqa: E402

from huggy_agent.tables import format_table  # noqa: E402

HUGGY = str(Path(sys.executable).with_name("huggy"))


def land(source: Path, run: Path, landed: list[int]) -> float:
    """A checkpoint landing as the trainer writes it: the file, then the status file listing it.

    Returns:
        When the file landed (epoch seconds).
    """
    step = int(source.stem.rsplit("-", 1)[1])
    target = run / BEHAVIOR / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{source.name}.part")
    shutil.copyfile(source, partial)
    os.replace(partial, target)
    at = time.time()
    landed.append(step)
    status = {BEHAVIOR: {"checkpoints": [
        {"steps": s, "file_path": f"results/{run.name}/{BEHAVIOR}/{BEHAVIOR}-{s}.onnx",
         "reward": None, "creation_time": at, "auxillary_file_paths": []} for s in landed]},
        "metadata": {"stats_format_version": "0.3.0"}}
    (run / "run_logs").mkdir(exist_ok=True)
    temporary = run / "run_logs" / ".training_status.json.part"
    temporary.write_text(json.dumps(status))
    os.replace(temporary, run / "run_logs" / "training_status.json")
    return at


def scalars_seen(folder: Path) -> set[int]:
    """The steps with an `Evaluation/IQM` scalar in a TensorBoard folder (none before the folder
    exists)."""
    if not folder.is_dir():
        return set()
    events = EventAccumulator(str(folder))
    events.Reload()
    if "Evaluation/IQM" not in events.Tags().get("scalars", []):
        return set()
    return {event.step for event in events.Scalars("Evaluation/IQM")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between files")
    parser.add_argument("--runners", type=int, default=2, help="Ray runners of the watch")
    parser.add_argument("--poll", type=float, default=0.5, help="TensorBoard poll, seconds")
    parser.add_argument("--out", type=Path, default=Path("out/bench-watch"))
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    sources = make_run(args.out / "source")
    run = args.out / "results" / "run"
    (run / "run_logs").mkdir(parents=True)
    watch_out = args.out / "watch"
    log = (args.out / "watch.log").open("w")
    watch = subprocess.Popen([HUGGY, "watch", str(run), "--runners", str(args.runners),
                              "--address", "local", "--out", str(watch_out)],
                             stdout=log, stderr=subprocess.STDOUT)
    landed_at: dict[int, float] = {}
    seen_at: dict[int, float] = {}
    landed: list[int] = []
    while "huggy watch: following" not in (args.out / "watch.log").read_text():
        if watch.poll() is not None:
            raise RuntimeError(f"huggy watch exited {watch.returncode}: see "
                               f"{args.out / 'watch.log'}")
        time.sleep(args.poll)
    started = time.time()
    next_file = started + args.interval
    try:
        while len(seen_at) < len(sources):
            if watch.poll() is not None:
                raise RuntimeError(f"huggy watch exited {watch.returncode}: see "
                                   f"{args.out / 'watch.log'}")
            now = time.time()
            if len(landed) < len(sources) and now >= next_file:
                source = sources[len(landed)]
                landed_at[int(source.stem.rsplit("-", 1)[1])] = land(source, run, landed)
                next_file += args.interval
            for step in scalars_seen(run / BEHAVIOR) - set(seen_at):
                seen_at[step] = time.time()
            time.sleep(args.poll)
        timers = {"name": "root", "metadata": {"start_time_seconds": str(started),
                                               "end_time_seconds": str(time.time())}}
        (run / "run_logs" / "timers.json").write_text(json.dumps(timers))
        code = watch.wait(timeout=600)
    finally:
        if watch.poll() is None:
            watch.terminate()
            watch.wait()
        log.close()
    decided = {c["step"]: c for c in json.loads((watch_out / "watch.json").read_text())[
        "checkpoints"]}
    rows = []
    for step, _ in CHECKPOINTS:
        entry = decided[step]
        rated, done = (datetime.datetime.fromisoformat(entry[key]).timestamp()
                       for key in ("first_rated_at", "decided_at"))
        rows.append([f"run@{step}", entry["decision"], entry["episodes"],
                     f"{seen_at[step] - landed_at[step]:.1f}", f"{rated - landed_at[step]:.1f}",
                     f"{done - landed_at[step]:.1f}"])
    print(format_table(["checkpoint", "decision", "episodes", "file -> TensorBoard s",
                        "file -> first_rated_at s", "file -> decided_at s"], rows))
    worst = max(seen_at[step] - landed_at[step] for step in landed_at)
    print(f"slowest file -> TensorBoard: {worst:.1f} s over {len(rows)} checkpoints, one every "
          f"{args.interval:g} s, {args.runners} runners; the watch exited {code}")
    (args.out / "bench_watch.json").write_text(json.dumps(
        {"interval_s": args.interval, "runners": args.runners,
         "file_to_tensorboard_s": {str(s): seen_at[s] - landed_at[s] for s in landed_at},
         "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
