"""Command lines of the Unity-side helper processes: the instance workers and the stand-in.

They run `envs` code without `envs/__init__.py`, which imports Gymnasium and the vector env and
registers the Gymnasium id, none of which a worker or the stand-in uses: `bare_command` gives
`python -c CODE ROOT ...`, where CODE installs a bare `envs` package (only its `__path__`, under
ROOT, the folder that holds this copy of `envs/`, whatever the working directory), runs `setup`,
then `main`. A worker then imports numpy, grpc and mlagents-envs only, a stand-in numpy and
mlagents-envs' messages, which takes less memory than `import envs` and starts faster.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
"""The folder that holds `envs/`."""

WORKER_SETUP = "from envs import compat; compat.apply(own_distutils=True)"
"""An instance worker needs all of `envs.compat`; nothing in it needs the real distutils."""
STANDIN_SETUP = "from envs import compat; compat.install_protobuf_modules()"
"""The stand-in only encodes and parses mlagents-envs' messages."""


def bare_command(setup: str, main: str) -> list[str]:
    """The command line of a helper process that runs `envs` code without `envs/__init__.py`.

    Args:
        setup: Python statements run first (such as `WORKER_SETUP`).
        main: the Python statements of the process.

    Returns:
        `[python, "-c", CODE, ROOT]`: arguments appended after it reach `main` as `sys.argv[1:]`.
    """
    code = ("import os, sys, types; root = sys.argv.pop(1); "
            "envs = types.ModuleType('envs'); envs.__path__ = [os.path.join(root, 'envs')]; "
            f"sys.modules['envs'] = envs; {setup}; {main}")
    return [sys.executable, "-c", code, str(PACKAGE_ROOT)]
