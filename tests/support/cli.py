"""`huggy` run in the test's own process, as its entry point runs it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from huggy_agent.cli import main


def huggy_in_process(capsys: pytest.CaptureFixture[str], argv: Sequence[str]) -> tuple[int, str]:
    """`huggy ARGV` in this process.

    Args:
        capsys: pytest's capture of the test's output.
        argv: the command line without the program name.

    Returns:
        (exit code, what it wrote to stderr); argparse's refusals exit through SystemExit, whose
        code is returned.
    """
    try:
        code = main(list(argv))
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    return code, capsys.readouterr().err
