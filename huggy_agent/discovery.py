"""Policy discovery: what a user names (files, ML-Agents results folders, `hf://` sources) turned
into a list of labelled policy files, the same way for every command (`huggy rollout`, `serve`,
`evaluate` and what is built on them).

    found = find_policies(["results/Huggy", "b/Huggy.onnx", "hf://owner/repo"])
    [(p.label, p.path, p.step) for p in found]
    # [("Huggy@500000", ".../Huggy-500000.onnx", 500000), ..., ("b/Huggy.onnx", ..., None), ...]

A file is one policy, labelled `parent/file`; a results folder gives every checkpoint on disk,
by step, labelled `run@step` (`run/Behavior@step` where a run trained several behaviors); a folder
with only its final export gives that export. Repeated labels are made unique by `unique_labels`,
the one rule every command uses. Nothing is loaded here: files are found, not read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from huggy_agent.formats.loaded import step_from_filename
from huggy_agent.formats.results import list_checkpoints
from huggy_agent.formats.sources import resolve_policy_source


@dataclass(frozen=True)
class FoundPolicy:
    """One policy file a source named, and where it came from."""

    label: str
    """Short and unique within one call of `find_policies`: `run@step` for a checkpoint of a
    results folder, `parent/file` for a file."""
    path: str
    """The policy file (.pt or .onnx)."""
    run: str | None = None
    """The results folder (run id) a checkpoint came from."""
    step: int | None = None
    """The training step, when known (from the checkpoint's file name)."""
    folder: str | None = None
    """The results folder it was found in, when named as one."""
    source: str | None = None
    """What the user named when it was not a local path (`hf://owner/repo@commit/path`)."""
    revision: str | None = None
    """The commit a Hub source resolved to."""


def short_label(path: str | os.PathLike[str]) -> str:
    """A label that tells files apart in a table or a chart, never a whole absolute path.

    Args:
        path: a file.

    Returns:
        `parent/file`, such as `ppo_gamma_0.8/Huggy.onnx` (the parent of the resolved path);
            the file name alone where there is no parent.
    """
    path = Path(path)
    parent = path.resolve().parent.name
    return f"{parent}/{path.name}" if parent else path.name


def unique_labels(labels: Sequence[str]) -> list[str]:
    """The one rule every command uses to make repeated labels unique.

    Args:
        labels: labels, possibly repeated.

    Returns:
        `labels` in order, each repeat suffixed `#2`, `#3`, ... (the first keeps its label).
    """
    seen: dict[str, int] = {}
    unique = []
    for label in labels:
        count = seen.get(label, 0)
        seen[label] = count + 1
        unique.append(label if count == 0 else f"{label}#{count + 1}")
    return unique


def _in_folder(path: Path, run: str) -> list[FoundPolicy]:
    """Every checkpoint on disk of the results folder `path` (of run `run`), by step; a folder
    with only its final export gives that export."""
    entries = [entry for entry in list_checkpoints(path) if entry.path is not None]
    if not entries:  # a folder with only its final export (such as a shared policy)
        finals = sorted(path.glob("*.onnx"))
        if not finals:
            raise ValueError(f"no checkpoint or export files found in results folder {path}")
        return [FoundPolicy(label=f"{run}/{final.name}", path=str(final), folder=str(path))
                for final in finals]
    behaviors = {entry.behavior for entry in entries}
    found = []
    for entry in entries:
        name = run if len(behaviors) == 1 else f"{run}/{entry.behavior}"
        found.append(FoundPolicy(label=f"{name}@{entry.step}", path=str(entry.path), run=name,
                                 step=entry.step, folder=str(path)))
    return found


def find_policies(sources: Sequence[str | os.PathLike[str]]) -> list[FoundPolicy]:
    """One policy per file that `sources` name, in order; nothing is loaded.

    Sources on the Hugging Face Hub (`hf://owner/repo[@revision][/path]`) are fetched through its
    cache first, and keep the source and the commit it resolved to.

    Args:
        sources: policy files, ML-Agents results folders (every checkpoint on disk, by step; a folder
            with only its final export gives that export) and Hub sources.

    Returns:
        The policies found, labels made unique by `unique_labels`.

    Raises:
        ValueError: `sources` is empty, a results folder holds no policy file, or a Hub source is
            malformed.
        FileNotFoundError: a path does not exist, or a Hub repository, revision or path cannot be
            found (offline: is not in the cache).
    """
    if not sources:
        raise ValueError("expected at least one policy (a .pt, an .onnx or a results folder)")
    found: list[FoundPolicy] = []
    for source in sources:
        resolved = resolve_policy_source(source)
        path = resolved.path
        if path.is_dir():
            run = (resolved.repo_id.split("/")[1]
                   if resolved.repo_id is not None and not resolved.repo_path
                   else path.resolve().name)
            named = _in_folder(path, run)
        elif path.is_file():
            label = short_label(path)
            if resolved.from_hub:  # the repository's name, not the commit, as the parent
                label = "/".join(f"{resolved.repo_id}/{resolved.repo_path}".split("/")[-2:])
            named = [FoundPolicy(label=label, path=str(path), step=step_from_filename(path))]
        else:
            raise FileNotFoundError(f"policy not found: {path} (expected a .pt, an .onnx or a "
                                    "results folder)")
        if resolved.from_hub:
            named = [replace(policy, source=resolved.describe(), revision=resolved.revision)
                     for policy in named]
        found += named
    labels = unique_labels([policy.label for policy in found])
    return [replace(policy, label=label) for policy, label in zip(found, labels, strict=True)]
