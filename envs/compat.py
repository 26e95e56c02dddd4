"""Make mlagents-envs 1.1.0 run on a current stack (Python 3.11+, protobuf 5-7, numpy 2).

`apply()` is called once by `import envs` (and by the instance workers, `envs.bootstrap`); it
imports nothing from `mlagents_envs.envs` (which would fetch a registry over the network and
import gym/pettingzoo). It does three things:

1. **Protobuf.** The `*_pb2.py` modules of mlagents-envs use the pre-3.20 generated-code style that
   protobuf >= 4.21 rejects. Each embeds its serialized file descriptor; we read those bytes from
   the module source (without executing it), add them to the default descriptor pool and build the
   message classes with `google.protobuf.internal.builder`, exactly as current protoc output does.
   The rebuilt modules are installed in `sys.modules` under their original names.
2. **distutils.** `mlagents_envs.environment` imports `distutils.version.StrictVersion`, gone from
   Python 3.12; when it is missing a minimal equivalent is installed.
3. **The step path.** mlagents-envs' per-step functions are swapped for those of
   `envs.fast_step` (same results, checked against the originals in tests), and a half-built
   `UnityEnvironment` no longer fails at exit (`_install_close_guard`).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import threading
import types
from pathlib import Path
from typing import Any

from envs import fast_step

_PACKAGE = "mlagents_envs.communicator_objects"
_applied = False
_lock = threading.Lock()


def apply(own_distutils: bool = False) -> None:
    """Apply every fix once (idempotent, thread-safe).

    Args:
        own_distutils: install the distutils shim even where Python has distutils, which saves
            importing it: only for processes where nothing else needs distutils, such as the
            instance workers (`envs.bootstrap`).
    """
    global _applied
    with _lock:
        if _applied:
            return
        _install_distutils_shim(own_distutils)
        _install_protobuf_modules()
        fast_step.install()
        _install_environment_patches()
        _applied = True


def install_protobuf_modules() -> None:
    """Only part 1: mlagents-envs' message classes, for processes that just encode and parse
    messages (the stand-in). Idempotent."""
    with _lock:
        _install_protobuf_modules()


# --- 1. protobuf --------------------------------------------------------------------------------


def _serialized_descriptor(source: str, path: Path) -> bytes:
    """The descriptor bytes of a generated module, read with `ast` (never executed).

    Old-style modules pass them as `serialized_pb=_b('...')`, newer ones (mlagents-envs ships one)
    to `AddSerializedFile(b'...')`.
    """
    for node in ast.walk(ast.parse(source, filename=str(path))):
        value = None
        if isinstance(node, ast.keyword) and node.arg == "serialized_pb":
            value = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
        ):
            value = node
        if value is not None:
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]
            if isinstance(value, ast.Constant) and isinstance(value.value, (str, bytes)):
                raw = value.value
                return raw.encode("latin1") if isinstance(raw, str) else raw
    raise RuntimeError(f"no serialized_pb descriptor found in {path}")


def _install_protobuf_modules() -> None:
    """Rebuild every `mlagents_envs.communicator_objects.*_pb2` module for the installed protobuf."""
    if f"{_PACKAGE}.unity_message_pb2" in sys.modules:
        return  # already imported (by us, or by an old protobuf that accepts the originals)
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.internal import builder

    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "mlagents-envs is not installed; install it with "
            "`pip install --no-deps --ignore-requires-python mlagents-envs==1.1.0`"
        )
    package = importlib.import_module(_PACKAGE)
    folder = Path(next(iter(spec.submodule_search_locations)))
    files: dict[str, tuple[str, bytes]] = {}  # proto file name -> (module name, descriptor bytes)
    for path in sorted(folder.glob("*_pb2.py")):
        data = _serialized_descriptor(path.read_text(encoding="utf-8"), path)
        proto = descriptor_pb2.FileDescriptorProto.FromString(data)
        files[proto.name] = (f"{_PACKAGE}.{path.stem}", data)

    pool = descriptor_pool.Default()
    done: set[str] = set()

    def add(name: str) -> None:
        if name in done or name not in files:
            return  # google/protobuf/*.proto dependencies are in the pool already
        module_name, data = files[name]
        for dependency in descriptor_pb2.FileDescriptorProto.FromString(data).dependency:
            add(dependency)
        try:
            file_descriptor = pool.FindFileByName(name)
        except KeyError:
            file_descriptor = pool.AddSerializedFile(data)
        module = types.ModuleType(module_name)
        module.__file__ = str(folder / f"{module_name.rsplit('.', 1)[1]}.py")
        namespace = module.__dict__
        namespace["DESCRIPTOR"] = file_descriptor
        builder.BuildMessageAndEnumDescriptors(file_descriptor, namespace)
        builder.BuildTopDescriptorsAndMessages(file_descriptor, module_name, namespace)
        sys.modules[module_name] = module
        setattr(package, module_name.rsplit(".", 1)[1], module)
        done.add(name)

    for name in files:
        add(name)


# --- 2. distutils -------------------------------------------------------------------------------


class StrictVersion:
    """The part of distutils' StrictVersion that mlagents-envs uses: `.version` as ints.

    Args:
        text: `MAJOR.MINOR[.PATCH]`.

    Raises:
        ValueError: `text` is not of that form.
    """

    def __init__(self, text: str) -> None:
        match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
        if match is None:
            raise ValueError(f"invalid version number {text!r}")
        self.version = tuple(int(part or 0) for part in match.groups())


def _install_distutils_shim(own: bool = False) -> None:
    """Provide `distutils.version.StrictVersion` where Python (3.12+) no longer has it, or, with
    `own`, wherever distutils is not imported yet."""
    if not own or "distutils" in sys.modules:
        try:
            from distutils.version import StrictVersion as _  # noqa: F401

            return
        except ImportError:
            pass
    distutils = sys.modules.get("distutils") or types.ModuleType("distutils")
    version = types.ModuleType("distutils.version")
    version.StrictVersion = StrictVersion  # type: ignore[attr-defined]
    distutils.version = version  # type: ignore[attr-defined]
    sys.modules["distutils"] = distutils
    sys.modules["distutils.version"] = version


# --- 3. the environment -------------------------------------------------------------------------


def _install_environment_patches() -> None:
    """Our `StrictVersion` in `mlagents_envs.environment` (the same result, without distutils'
    deprecation warning), and a close guard: `UnityEnvironment.__init__` registers its `_close`
    with atexit before it binds its port; when the port is taken it raises, and at exit `_close`
    fails on the missing communicator with a traceback. The guard closes only an environment
    that got that far."""
    from mlagents_envs import environment
    from mlagents_envs.environment import UnityEnvironment

    environment.StrictVersion = StrictVersion
    close = UnityEnvironment._close

    def close_if_built(self: Any, timeout: int | None = None) -> None:
        if hasattr(self, "_communicator"):
            close(self, timeout)

    UnityEnvironment._close = close_if_built
