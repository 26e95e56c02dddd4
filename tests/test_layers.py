"""Layers point down: `huggy_agent_client` (client/) imports no other package of this repository
and no torch, onnx or onnxruntime; `huggy_agent` never imports `envs` or `deploy`, and `envs`
never imports Ray or `deploy`, at module level or lazily inside a function (every import statement
is read from the source); importing every module of each package loads none of what it must not
import."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fixtures import REPO_ROOT

FORBIDDEN = {"huggy_agent_client": {"huggy_agent", "envs", "deploy", "ray", "torch", "onnx",
                                    "onnxruntime"},
             "huggy_agent": {"envs", "deploy", "ray"}, "envs": {"deploy", "ray"}}
FOLDER = {"huggy_agent_client": REPO_ROOT / "client" / "huggy_agent_client",
          "huggy_agent": REPO_ROOT / "huggy_agent", "envs": REPO_ROOT / "envs"}


def imported_packages(path: Path) -> set[str]:
    """The top-level package of every absolute import statement in `path`, wherever it sits."""
    packages = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            packages.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.split(".")[0])
    return packages


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_statement_points_up(package: str) -> None:
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(imported_packages(path) & FORBIDDEN[package])
        for path in sorted(FOLDER[package].rglob("*.py"))
    }
    assert {path: found for path, found in offenders.items() if found} == {}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_every_module_loads_no_upper_layer(package: str) -> None:
    code = (
        f"import importlib, json, pkgutil, sys, {package}\n"
        f"names = [m.name for m in pkgutil.walk_packages({package}.__path__, '{package}.')]\n"
        "for name in [n for n in names if not n.endswith('__main__')]:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert package in loaded
    assert not loaded & FORBIDDEN[package]
