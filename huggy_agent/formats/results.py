"""ML-Agents results folders (`results/<run_id>/`): the final export, checkpoints and their rewards."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from huggy_agent.errors import PolicyLoadError
from huggy_agent.formats.loaded import step_from_filename

STATUS_FILE = Path("run_logs") / "training_status.json"


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint of a run: its step, the local file (None when absent) and recorded reward;
    `listed` when the trainer's status file lists it (its files were complete when listed)."""

    behavior: str
    step: int
    path: Path | None
    reward: float | None
    final: bool = False
    listed: bool = False


def _local_file(folder: Path, behavior: str, recorded: list[str]) -> Path | None:
    """The recorded checkpoint files as they lie in this copy of the folder (.onnx, else .pt)."""
    names = [Path(p).name for p in recorded]
    for name in sorted(names, key=lambda n: not n.endswith(".onnx")):
        for candidate in (folder / behavior / name, folder / name):
            if candidate.is_file():
                return candidate
    return None


def list_checkpoints(folder: str | Path) -> list[CheckpointEntry]:
    """Every checkpoint of a results folder.

    Args:
        folder: an ML-Agents `results/<run_id>/` folder.

    Returns:
        The checkpoints recorded in `run_logs/training_status.json` (with their reward; `path` None
            where the file is gone) and any `<Behavior>/<Behavior>-<step>.{onnx,pt}` on disk that
            the status file does not list, sorted by behavior and step.

    Raises:
        FileNotFoundError: `folder` is not a folder.
        PolicyLoadError: the status file is not JSON, not an object, or lists a checkpoint without
            an integer `steps` and a `file_path`.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"results folder not found: {folder}")
    entries: dict[tuple[str, int], CheckpointEntry] = {}
    status_path = folder / STATUS_FILE
    if status_path.is_file():
        try:
            status = json.loads(status_path.read_text())
        except json.JSONDecodeError as error:
            raise PolicyLoadError(f"{status_path}: not valid JSON ({error})") from error
        if not isinstance(status, dict):
            raise PolicyLoadError(f"{status_path}: expected a JSON object of behaviors, "
                                  f"received {type(status).__name__}")
        for behavior, record in status.items():
            if behavior == "metadata" or not isinstance(record, dict):
                continue
            for index, item in enumerate(record.get("checkpoints", [])):
                try:
                    files = [item["file_path"], *item.get("auxillary_file_paths", [])]
                    steps = int(item["steps"])
                except (TypeError, KeyError, ValueError, AttributeError):
                    raise PolicyLoadError(
                        f"{status_path}: checkpoint {index} of {behavior}: expected an object "
                        f"with 'steps' (an integer) and 'file_path', received {item!r:.80}"
                        ) from None
                entries[(behavior, steps)] = CheckpointEntry(
                    behavior, steps, _local_file(folder, behavior, files), item.get("reward"),
                    listed=True)
    for file in sorted(folder.glob("*/*-*.onnx")) + sorted(folder.glob("*/*-*.pt")):
        step = step_from_filename(file)
        if step is not None and (file.parent.name, step) not in entries:
            entries[(file.parent.name, step)] = CheckpointEntry(file.parent.name, step, file, None)
    return sorted(entries.values(), key=lambda e: (e.behavior, e.step))


def resolve_results_folder(folder: str | Path) -> Path:
    """The policy file a results folder stands for.

    Args:
        folder: an ML-Agents `results/<run_id>/` folder.

    Returns:
        Its final `<Behavior>.onnx`, else its newest checkpoint on disk (`<Behavior>/checkpoint.pt`
            counts only when nothing is numbered).

    Raises:
        PolicyLoadError: the folder holds several final exports, or its status file is unreadable.
        FileNotFoundError: it holds no export and no checkpoint.
    """
    folder = Path(folder)
    finals = sorted(folder.glob("*.onnx"))
    if len(finals) == 1:
        return finals[0]
    if len(finals) > 1:
        raise PolicyLoadError(f"{folder}: several final exports {[f.name for f in finals]}; "
                              "name the one to load")
    available = [e for e in list_checkpoints(folder) if e.path is not None]
    if available:
        return max(available, key=lambda e: e.step).path  # type: ignore[return-value]
    latest = sorted(folder.glob("*/checkpoint.pt"))
    if latest:
        return latest[0]
    raise FileNotFoundError(f"{folder}: no <Behavior>.onnx and no checkpoint found; expected an "
                            "ML-Agents results/<run_id>/ folder")
