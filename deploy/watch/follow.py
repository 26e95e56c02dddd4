"""Following ML-Agents results folders while `mlagents-learn` writes them: which checkpoints are
complete, and whether the trainer has finished.

A checkpoint (`<Behavior>/<Behavior>-<step>.onnx` or `.pt`) is taken once it is complete:

- listed in `run_logs/training_status.json`: the trainer lists a checkpoint after writing its
  files;
- else once its size and modification time have not changed for `settle_s` seconds (a file
  copied in by hand, or a trainer that writes no status file).

A run restarted with `--resume` writes into the same folder, its steps counting on, so its new
checkpoints are taken like any other; a checkpoint the trainer deleted (past
`keep_checkpoints`) before it was taken is passed over.

The trainer has finished when `run_logs/timers.json` holds `metadata.end_time_seconds` and was
written after the newest checkpoint file: a resumed run writes new checkpoints after the
`timers.json` of its earlier session. A follower is finished once, besides, every checkpoint on
disk has been taken: the trainer writes its last checkpoints and `timers.json` within a second,
often between two polls. A follower only reads the file system.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from huggy_agent import PolicyLoadError
from huggy_agent.formats.results import list_checkpoints

TIMERS_FILE = Path("run_logs") / "timers.json"
SETTLE_S = 2.0
"""How long an unlisted checkpoint file must keep its size and time before it is taken."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint file of a followed run."""

    label: str
    """`run@step`, or `run/Behavior@step` where the run trains several behaviors (as
    `huggy evaluate` labels a results folder's checkpoints)."""
    run: str
    """The run's name as labels carry it: `run`, or `run/Behavior`."""
    behavior: str
    step: int
    path: Path
    folder: Path
    """The run's results folder."""


class RunFollower:
    """One `results/<run>/` folder, polled for new complete checkpoints.

    Args:
        folder: the run's results folder (it may not exist yet: the trainer makes it).
        settle_s: how long an unlisted file must stay unchanged before it is taken.
        clock: monotonic seconds (a test's own clock).
    """

    def __init__(self, folder: str | Path, settle_s: float = SETTLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = Path(folder)
        self.run = self.folder.resolve().name
        self.settle_s = settle_s
        self._clock = clock
        self._taken: set[tuple[str, int]] = set()
        self._watched: dict[tuple[str, int], tuple[Path, int, int, float]] = {}
        """Unlisted files being watched: key -> (path, size, mtime_ns, unchanged since)."""
        self.problem: str | None = None
        """Why the last poll could not read the folder (a status file being rewritten, say)."""

    def skip(self, behavior: str, step: int) -> None:
        """Never take this checkpoint (one taken in an earlier session of the watch).

        Args:
            behavior: its behavior.
            step: its step.
        """
        self._taken.add((behavior, step))

    def poll(self) -> list[Checkpoint]:
        """The checkpoints that became complete since the last poll.

        Returns:
            Them, by behavior and step; [] while the folder does not exist or its status file
                cannot be read (`problem` says why; the next poll tries again).
        """
        if not self.folder.is_dir():
            self.problem = f"{self.folder} does not exist yet"
            return []
        try:
            entries = list_checkpoints(self.folder)
        except (PolicyLoadError, OSError) as error:
            self.problem = str(error)
            return []
        self.problem = None
        behaviors = {entry.behavior for entry in entries}
        now = self._clock()
        ready = []
        for entry in entries:
            key = (entry.behavior, entry.step)
            if key in self._taken or entry.path is None:
                continue
            if not entry.listed and not self._settled(key, entry.path, now):
                continue
            self._taken.add(key)
            self._watched.pop(key, None)
            run = self.run if len(behaviors) == 1 else f"{self.run}/{entry.behavior}"
            ready.append(Checkpoint(f"{run}@{entry.step}", run, entry.behavior, entry.step,
                                    entry.path, self.folder))
        return ready

    def _settled(self, key: tuple[str, int], path: Path, now: float) -> bool:
        """Whether an unlisted file has kept its size and time for `settle_s` (first seen now:
        not yet)."""
        try:
            status = path.stat()
        except FileNotFoundError:
            self._watched.pop(key, None)
            return False
        seen = self._watched.get(key)
        if seen is None or seen[:3] != (path, status.st_size, status.st_mtime_ns):
            self._watched[key] = (path, status.st_size, status.st_mtime_ns, now)
            return False
        return now - seen[3] >= self.settle_s

    @property
    def settling(self) -> int:
        """Files seen but not yet taken, waiting to keep their size and time for `settle_s`."""
        return len(self._watched)

    def finished(self) -> bool:
        """Whether the trainer has finished and every checkpoint it wrote is taken (see the
        module docstring).

        Returns:
            True when `run_logs/timers.json` has an end time and is newer than every checkpoint
                file, and `poll` has taken every checkpoint on disk.
        """
        timers = self.folder / TIMERS_FILE
        try:
            ended = json.loads(timers.read_text()).get("metadata", {}).get("end_time_seconds")
            written = timers.stat().st_mtime_ns
        except (OSError, ValueError, AttributeError):
            return False
        if ended is None:
            return False
        files = list(self.folder.glob("*/*-*.onnx")) + list(self.folder.glob("*/*-*.pt"))
        if written < max((_modified(file) for file in files), default=0):
            return False
        try:
            entries = list_checkpoints(self.folder)
        except (PolicyLoadError, OSError):  # a status file being rewritten: not yet
            return False
        return all(entry.path is None or (entry.behavior, entry.step) in self._taken
                   for entry in entries)


def _modified(path: Path) -> int:
    """A file's modification time in nanoseconds; 0 for one deleted meanwhile."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0
