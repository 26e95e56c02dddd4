"""What this machine's processes show of themselves in `/proc` (Linux): whether a child of this
process has ended, and which processes run a program on a configuration file of a folder."""

from __future__ import annotations

import itertools
import os
from pathlib import Path


def a_child_process_ended() -> bool:
    """Whether a child process of this one has ended and not yet been waited for (a zombie). For a
    cluster that this process started, whose head processes (GCS, raylet, dashboard) are its
    children and live until `ray.shutdown`, that means the cluster is ending: a signal sent to the
    whole process group (`kill -TERM -PGID`, `timeout`, a shell's `kill %1`) reached them too.

    Returns:
        True when one has (Linux, `/proc`); False otherwise, and elsewhere.
    """
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # after the command name in parentheses, which may hold spaces: state, parent
            state, parent = stat.read_text().rpartition(")")[2].split()[:2]
        except (OSError, ValueError):  # the process ended meanwhile
            continue
        if int(parent) == me and state == "Z":
            return True
    return False


def processes_configured_in(folder: Path) -> set[int]:
    """The live processes whose command line names a configuration file (`-f FILE`) under a folder.

    Args:
        folder: the folder.

    Returns:
        Their process ids (a process that has exited has an empty command line, and is left out).
    """
    prefix = f"{folder}/".encode()
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            arguments = proc.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if any(flag == b"-f" and value.startswith(prefix)
               for flag, value in itertools.pairwise(arguments)):
            found.add(int(proc.name))
    return found
