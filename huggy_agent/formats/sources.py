"""Policy sources: what a user names, turned into local files plus where they came from.

    Huggy.onnx, results/Huggy/Huggy-2000343.pt, results/Huggy     local paths, as they are
    hf://owner/repo                                               a repository on the Hub
    hf://owner/repo@revision/path/in/repo                         a file or a folder in it

Hub sources go through huggingface_hub's cache (`hf_hub_download` for a file, whose name ends in
a policy suffix; `snapshot_download` for a folder or the whole repository), so a second use
downloads nothing. `HF_HUB_OFFLINE=1` resolves from the cache alone and `HF_HUB_CACHE` names the
cache; both are read when a source is resolved. huggingface_hub is imported only then.

The provenance of a resolved file (repository and commit) can be read back from its cache path
(`hub_provenance`), so whoever holds the path can record the revision.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

HUB_SCHEME = "hf://"
POLICY_SUFFIXES = (".onnx", ".pt")
"""A Hub path ending in one of these is a file; anything else is a folder."""
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_CACHE_REPO = re.compile(r"^models--(?P<owner>.+?)--(?P<name>.+)$")


@dataclass(frozen=True)
class HubReference:
    """`hf://owner/repo[@revision][/path]`, parsed."""

    repo_id: str
    revision: str | None
    path: str

    def __str__(self) -> str:
        revision = f"@{self.revision}" if self.revision else ""
        return f"{HUB_SCHEME}{self.repo_id}{revision}" + (f"/{self.path}" if self.path else "")


@dataclass(frozen=True)
class PolicySource:
    """A policy source resolved to local files: `path` (a file or a folder); for a Hub source
    also the repository, the commit it resolved to and the path inside it."""

    name: str
    path: Path
    repo_id: str | None = None
    revision: str | None = None
    repo_path: str | None = None

    @property
    def from_hub(self) -> bool:
        return self.repo_id is not None

    def describe(self) -> str:
        """The source as a user names it.

        Returns:
            The local path for a local source; `hf://owner/repo@commit[/path]` for a Hub source.
        """
        if self.repo_id is None:
            return str(self.path)
        inner = f"/{self.repo_path}" if self.repo_path else ""
        return f"{HUB_SCHEME}{self.repo_id}@{self.revision}{inner}"


def is_hub_source(source: str | os.PathLike[str]) -> TypeGuard[str]:
    """Whether a source names a policy on the Hugging Face Hub.

    Args:
        source: a policy source.

    Returns:
        True for a string that starts with `hf://`.
    """
    return isinstance(source, str) and source.startswith(HUB_SCHEME)


def parse_hub_source(source: str) -> HubReference:
    """Split a Hub source into its parts.

    Args:
        source: `hf://owner/repo[@revision][/path]`.

    Returns:
        The repository id, the revision (None when not named) and the path inside the repository
            (empty for the whole repository).

    Raises:
        ValueError: `source` is not of that form, its repository id is not `Owner/Name`, it ends in
            an empty `@`, or its path leaves the repository (`..`).
    """
    if not is_hub_source(source):
        raise ValueError(f"expected hf://owner/repo[@revision][/path], got {source!r}")
    parts = source[len(HUB_SCHEME):].strip("/").split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ValueError(f"expected hf://owner/repo[@revision][/path], got {source!r}")
    name, _, revision = parts[1].partition("@")
    repo_id = f"{parts[0]}/{name}"
    if not _REPO_ID.match(repo_id) or (parts[1].endswith("@") and not revision):
        raise ValueError(f"expected hf://owner/repo[@revision][/path] with a repository id "
                         f"such as Owner/Name, got {source!r}")
    inner = "/".join(parts[2:])
    if ".." in inner.split("/"):
        raise ValueError(f"expected a path inside the repository, got {inner!r} in {source!r}")
    return HubReference(repo_id, revision or None, inner)


def hub_provenance(path: str | os.PathLike[str]) -> PolicySource | None:
    """The repository, commit and path inside it of a file in huggingface_hub's cache.

    Args:
        path: a local path, such as `.../models--OWNER--NAME/snapshots/COMMIT/path/in/repo`.

    Returns:
        The `PolicySource` of that file; None for a path outside such a snapshot.
    """
    parts = Path(path).parts
    for k in range(len(parts) - 2):
        match = _CACHE_REPO.match(parts[k])
        if match and parts[k + 1] == "snapshots":
            repo_id = f"{match['owner']}/{match['name']}"
            inner = "/".join(parts[k + 3:])
            return PolicySource(name=f"{HUB_SCHEME}{repo_id}@{parts[k + 2]}"
                                + (f"/{inner}" if inner else ""), path=Path(path),
                                repo_id=repo_id, revision=parts[k + 2], repo_path=inner)
    return None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _unreachable(error: BaseException) -> BaseException | None:
    """The network failure behind a huggingface_hub error (a refused or timed-out connection, a
    name that did not resolve, an HTTP client's transport error), or None: the Hub answered."""
    seen: BaseException | None = error
    while seen is not None:
        names = {kind.__name__ for kind in type(seen).__mro__}
        if (isinstance(seen, (ConnectionError, TimeoutError, socket.gaierror))
                or names & {"TransportError", "NetworkError", "TimeoutException"}):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _hub_reason(error: Exception, offline: bool) -> str:
    """Why huggingface_hub failed, in this project's terms: offline, what to do about it;
    online, the library's first line, without its advice about arguments (such as
    `local_files_only`) that this project's commands do not have."""
    if offline:
        return ("not downloaded yet: unset HF_HUB_OFFLINE and run once with network access to "
                "fill the cache")
    sentences = str(error).strip().splitlines()[0].split(". ") if str(error).strip() else []
    kept = ". ".join(part for part in sentences if "local_files_only" not in part)
    return f"{type(error).__name__}: {kept}" if kept else type(error).__name__


def resolve_policy_source(source: str | os.PathLike[str]) -> PolicySource:
    """Local files for a policy source.

    Args:
        source: a local path (returned as it is, not checked) or a Hub source, resolved through
            huggingface_hub's cache (from the cache alone where `HF_HUB_OFFLINE` is set).

    Returns:
        The local file or folder, with the repository, commit and path of a Hub source.

    Raises:
        ValueError: a malformed Hub source.
        FileNotFoundError: huggingface_hub is not installed, the Hub cannot be reached, or the
            repository, revision or path cannot be found (offline: is not in the cache).
    """
    if not is_hub_source(source):
        return PolicySource(name=os.fspath(source), path=Path(source))
    reference = parse_hub_source(source)
    try:
        from huggingface_hub import hf_hub_download, snapshot_download
    except ImportError as error:
        raise FileNotFoundError(f"policy {source}: hf:// sources need huggingface_hub "
                                "(pip install 'huggy-agent[hub]')") from error
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = _offline()
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    where = (f"in the cache {cache_dir or 'of huggingface_hub'} (HF_HUB_OFFLINE is set)" if offline
             else "on the Hub")
    try:
        if reference.path.endswith(POLICY_SUFFIXES):
            local = Path(hf_hub_download(reference.repo_id, reference.path,
                                         revision=reference.revision, cache_dir=cache_dir,
                                         local_files_only=offline))
        else:
            patterns = [f"{reference.path}/**"] if reference.path else None
            snapshot = Path(snapshot_download(reference.repo_id, revision=reference.revision,
                                              cache_dir=cache_dir, local_files_only=offline,
                                              allow_patterns=patterns))
            local = snapshot / reference.path if reference.path else snapshot
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as error:
        failure = None if offline else _unreachable(error)
        if failure is not None:
            endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
            raise FileNotFoundError(
                f"policy {source}: the Hub at {endpoint} could not be reached "
                f"({type(failure).__name__}: {failure}); check the network, or set "
                "HF_HUB_OFFLINE=1 to use what huggingface_hub has cached") from error
        raise FileNotFoundError(f"policy not found: {source}: no such repository, revision or "
                                f"file {where} ({_hub_reason(error, offline)})") from error
    if not local.exists():
        raise FileNotFoundError(f"policy not found: {source}: the repository has no "
                                f"{reference.path!r} {where}")
    found = hub_provenance(local)
    revision = found.revision if found is not None else reference.revision
    return PolicySource(name=source, path=local, repo_id=reference.repo_id, revision=revision,
                        repo_path=reference.path)


def policy_path(text: str) -> Path:
    """An argparse `type` for policy options: the local path of a policy source.

    Args:
        text: a local path or a Hub source (resolved; its provenance stays readable from the path
            through `hub_provenance`).

    Returns:
        The local path.

    Raises:
        argparse.ArgumentTypeError: `text` is empty (it would name the current folder), or it cannot
            be resolved (the message of `resolve_policy_source`'s error).
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a .onnx, a .pt, a results folder or "
                                         f"hf://owner/repo, got {text!r}")
    try:
        return resolve_policy_source(text).path
    except (ValueError, FileNotFoundError) as error:
        raise argparse.ArgumentTypeError(str(error)) from error
