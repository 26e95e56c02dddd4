"""The reference pages the site generates from the code (`docs/tooling/docs_reference.py`): the
CLI reference shows exactly what `huggy COMMAND --help` prints for every command, run as a user
runs it; the HTTP API page renders every route and schema of the OpenAPI document. (The
document itself is compared with a live server's in tests/test_docs_examples.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.fixtures import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "docs" / "tooling"))
import docs_reference
from docs_examples import blocks_of


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return docs_reference.generated_pages()


def huggy_help(command: str | None) -> str:
    """`huggy [COMMAND] --help` from the installed entry point, at the reference's width."""
    script = Path(sys.executable).with_name("huggy")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "huggy_agent.cli"]
    env = {**os.environ, "COLUMNS": str(docs_reference.HELP_COLUMNS),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([*launcher, *([command] if command else []), "--help"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def page_sections(page: str) -> dict[str, str]:
    """`## huggy ...` heading -> the text block under it."""
    sections: dict[str, str] = {}
    heading = None
    lines = page.splitlines()
    for block in blocks_of(page, docs_reference.CLI_PAGE):
        heading = next(line[3:] for line in reversed(lines[:block.line - 1])
                       if line.startswith("## "))
        sections[heading] = block.code
    return sections


@pytest.mark.docs
def test_the_cli_reference_is_what_help_prints_for_every_command(pages: dict[str, str]) -> None:
    sections = page_sections(pages[docs_reference.CLI_PAGE])
    top = huggy_help(None)
    listed = re.findall(r"^    ([a-z][a-z-]+)(?:\s|$)", top, flags=re.MULTILINE)
    assert len(listed) >= 15 and set(listed) <= set(docs_reference.command_summaries())
    assert sorted(sections) == sorted(["huggy", *(f"huggy {name}" for name in listed)])
    with ThreadPoolExecutor(4) as pool:
        printed = dict(zip(listed, pool.map(huggy_help, listed), strict=True))
    assert sections["huggy"] == top
    for name, text in printed.items():
        assert sections[f"huggy {name}"] == text, f"huggy {name} --help differs from the page"


def test_the_http_page_renders_every_route_and_schema(pages: dict[str, str]) -> None:
    document = json.loads(pages[docs_reference.OPENAPI_FILE])
    page = pages[docs_reference.HTTP_PAGE]
    headings = set(re.findall(r"^## `([A-Z]+ \S+)`$", page, flags=re.MULTILINE))
    assert headings == {f"{method.upper()} {path}" for path, item in document["paths"].items()
                        for method in item}
    assert {"/v1/act", "/v1/healthz", "/v1/info", "/v1/openapi.json"} <= set(document["paths"])
    shown = {name: json.loads(block.code) for name, block in zip(
        re.findall(r"^### (\S+)$", page, flags=re.MULTILINE),
        [b for b in blocks_of(page, docs_reference.HTTP_PAGE)], strict=False)}
    assert shown == document["components"]["schemas"]


@pytest.mark.docs
def test_generating_the_reference_imports_no_ray() -> None:
    """A docs build must not need Ray: generating the pages in a fresh interpreter leaves Ray
    unimported."""
    code = ("import sys; sys.path.insert(0, 'docs/tooling'); import docs_reference; "
            "docs_reference.generated_pages(); print(sorted(m for m in sys.modules if m == 'ray' "
            "or m.startswith('ray.')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
