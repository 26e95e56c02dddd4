"""`builtin_huggy_path()` and `builtin_soccertwos_path()`: files that start the stand-in exactly as
a Unity player is started, playing Huggy or SoccerTwos (`builtin_path(scene)` for either)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from envs.bootstrap import STANDIN_SETUP, bare_command


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "huggy-agent"


SCENES = ("huggy", "soccertwos")
"""The stand-in's built-in scenes (its `--scene` argument)."""
_PLAYER_FILES = {"huggy": "Huggy.x86_64", "soccertwos": "SoccerTwos.x86_64"}


def launcher_script(python: str = sys.executable, scene: str = "huggy") -> str:
    """The POSIX shell text of the launcher of a scene.

    It runs the stand-in on a bare `envs` package (`envs.bootstrap`), which imports only numpy and
    the messages (its gRPC client is `envs.http2.UnaryClient`).

    Args:
        python: the interpreter the launcher runs.
        scene: one of `SCENES`.

    Returns:
        The script's text.
    """
    _, _, code, root = bare_command(STANDIN_SETUP,
                                    "from envs.standin.client import main; sys.exit(main())")
    scene_args = "" if scene == "huggy" else f" --scene {shlex.quote(scene)}"
    return (
        "#!/bin/sh\n"
        f"# {Path(_PLAYER_FILES[scene]).stem} stand-in (huggy-agent): started like a Unity "
        "player,\n"
        "#   FILE --mlagents-port N [-nographics -batchmode] [-logFile PATH]\n"
        f'exec {shlex.quote(python)} -c {shlex.quote(code)} {shlex.quote(root)}{scene_args} "$@"\n'
    )


HUGGY_SPEC = {"inputs": [{"name": "obs_0", "shape": [59], "kind": "vector"}],
              "continuous_size": 21, "discrete_branches": []}
"""The interface of the built-in Huggy stand-in (`ActorSpec.as_dict()` fields)."""


def standin_behavior(spec: dict, behavior: str = "Agent") -> dict | None:
    """What the built-in stand-in should play for a policy.

    Args:
        spec: the policy's interface, as `ActorSpec.as_dict()`.
        behavior: the behavior's name in the spec-driven mode.

    Returns:
        None for Huggy's own interface (the Huggy stand-in), else `spec` with the behavior's name,
            for the spec-driven mode (`UnityVectorEnv(behavior_spec=...)`).
    """
    if all(spec.get(key) == value for key, value in HUGGY_SPEC.items()):
        return None
    return {**spec, "behavior": behavior}


def spec_arguments(behavior_spec: Any) -> tuple[str, ...]:
    """The stand-in's command-line arguments that make it play a behavior spec (spec-driven mode).

    Args:
        behavior_spec: a policy file or results folder (its spec, and its name as the behavior's),
            a `huggy_agent_client.spec.ActorSpec`, an `ActorSpec.as_dict()` (with an optional
            "behavior"), or a list of those dicts for several behaviors in one scene (each with its
            "behavior", "team" and "agents", see `envs.standin.spec_client`).

    Returns:
        `("--behavior-spec", JSON)`.

    Raises:
        FileNotFoundError: a policy path that does not exist.
        PolicyLoadError: a policy file that cannot be loaded.
    """
    if isinstance(behavior_spec, (list, tuple)):
        return ("--behavior-spec", json.dumps([_spec_data(entry) for entry in behavior_spec]))
    return ("--behavior-spec", json.dumps(_spec_data(behavior_spec)))


def _spec_data(behavior_spec: Any) -> dict:
    if isinstance(behavior_spec, (str, os.PathLike)):
        from huggy_agent.formats import load_policy

        loaded = load_policy(Path(behavior_spec))
        name = loaded.origin.stem.split("-")[0] if loaded.origin.suffix == ".onnx" \
            else loaded.origin.parent.name
        return {**loaded.spec.as_dict(), "behavior": name}
    if hasattr(behavior_spec, "as_dict"):
        return dict(behavior_spec.as_dict())
    return dict(behavior_spec)


def builtin_path(scene: str = "huggy") -> str:
    """The executable launcher of the built-in stand-in playing a scene, created on first use.

    `UnityEnvironment(file_name=builtin_path(...))` starts it like a Unity build. The launcher
    runs the current interpreter; it lives in `$XDG_CACHE_HOME/huggy-agent` (else ~/.cache, else
    the temp folder), named after the scene, the interpreter and the package location so
    installs don't collide.

    Args:
        scene: one of `SCENES`.

    Returns:
        The launcher's path.

    Raises:
        ValueError: an unknown scene.
        RuntimeError: neither the cache nor the temp folder can hold the launcher.
    """
    if scene not in SCENES:
        raise ValueError(f"unknown stand-in scene {scene!r}; expected one of {list(SCENES)}")
    text = launcher_script(scene=scene)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / "huggy-agent"):
        path = folder / f"{scene}-standin-{digest}" / _PLAYER_FILES[scene]
        try:
            if path.is_file() and os.access(path, os.X_OK) and path.read_text() == text:
                return str(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            staging = path.with_name(f".{path.name}.{os.getpid()}")
            staging.write_text(text)
            staging.chmod(0o755)
            os.replace(staging, path)  # atomic: parallel callers never see a partial file
            return str(path)
        except OSError:
            continue
    raise RuntimeError("cannot write the stand-in launcher to the cache or the temp folder")


def builtin_huggy_path() -> str:
    """The built-in Huggy stand-in's launcher (`builtin_path("huggy")`).

    Returns:
        Its path.
    """
    return builtin_path("huggy")


def builtin_soccertwos_path() -> str:
    """The built-in SoccerTwos stand-in's launcher (`builtin_path("soccertwos")`): behaviors
    `SoccerTwos?team=0` and `?team=1`, see `envs/standin/soccer/README.md`.

    Returns:
        Its path.
    """
    return builtin_path("soccertwos")
