"""The code blocks of the documentation, and the marker that says how each one is checked.

Every fenced code block on the site (and in README.md) carries a marker, an HTML comment on the
line directly above its opening fence (invisible on the site and on GitHub):

    <!-- example: run -->              executed by the tests (no stand-in, no Ray)
    <!-- example: run standin -->      executed by the tests; starts the stand-in (lane `standin`)
    <!-- example: run ray -->          executed by the tests on the session's Ray cluster (`ray`)
    <!-- example: run http-start -->   a `huggy serve` command: the tests start it and keep it up
    <!-- example: run http -->         executed by the tests against that server (lane `ray`)
    <!-- example: output -->           output, a request body or a file's text: nothing to run
    <!-- example: needs REASON -->     not executed; REASON is one of `NEEDS`

Blocks marked `run ...` must be Python (`python`) or shell (`bash`). Blocks that are not run are
still checked where they can be: Python compiles, shell passes `bash -n`, every `huggy ...`
command line parses with the real CLI parser, YAML loads. `tests/test_docs_examples.py` runs
and checks them; `docs/tooling/hooks.py` fails the site's build (a warning under `--strict`)
when a block has no marker or an unknown one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = REPO_ROOT / "docs"

RUN_LANES = ("fast", "standin", "ray", "http-start", "http")
"""Where a `run` block is executed (`run` alone is "fast")."""

NEEDS = {
    "unity-build": "a real Unity build (the stand-in plays Huggy and SoccerTwos only)",
    "gpu": "a CUDA GPU",
    "npu": "an Ascend NPU with torch-npu and CANN",
    "cluster": "a Ray cluster of several machines",
    "kubernetes": "a Kubernetes cluster with KubeRay",
    "hub": "the Hugging Face Hub (network)",
    "trainer": "ML-Agents' trainer (mlagents-learn in a venv of its own; minutes to hours)",
    "server": "runs until stopped (its `huggy` command lines are parsed by the CLI's parser)",
    "own-venv": "installs packages, in a virtual environment of its own",
    "minutes": "takes many minutes (the test suite, benchmarks, the docs figures)",
}
"""Why a block is not executed."""

RUNNABLE_LANGUAGES = ("python", "bash")
CHECKED_LANGUAGES = ("python", "bash", "yaml", "json", "text")
"""Languages a block may be written in (a fence without a language is refused)."""

MARKER = re.compile(r"^\s*<!-- example: (?P<kind>run|output|needs)(?: (?P<arg>[a-z-]+))? -->\s*$")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Marker:
    """How a block is checked: `kind` run, output or needs; `arg` the lane or the reason."""

    kind: str
    arg: str | None

    @property
    def lane(self) -> str | None:
        """The lane of a `run` block ("fast" when none is named); None for other blocks."""
        return (self.arg or "fast") if self.kind == "run" else None


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    """The page's path relative to the repository root (or a generated page's site path)."""
    line: int
    """Line of the opening fence, 1-based."""
    language: str
    code: str
    marker: Marker | None
    marker_text: str | None
    """The comment line above the fence, when it looks like a marker (even a wrong one)."""

    @property
    def name(self) -> str:
        """`page:line`, as test ids and messages name the block."""
        return f"{self.page}:{self.line}"


def blocks_of(text: str, page: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, each with the marker above it (if any)."""
    lines = text.splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        language = opening["info"].strip().split(" ")[0].strip("{}.") if opening["info"] else ""
        body: list[str] = []
        end = index + 1
        closing = re.compile(rf"^ {{0,{indent + 3}}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while end < len(lines) and not closing.match(lines[end]):
            line = lines[end]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            end += 1
        above = lines[index - 1] if index else ""
        match = MARKER.match(above)
        looks_like_marker = "<!-- example" in above
        found.append(Block(page, index + 1, language, "\n".join(body) + "\n",
                           Marker(match["kind"], match["arg"]) if match else None,
                           above.strip() if looks_like_marker else None))
        index = end + 1
    return found


def marker_problem(block: Block) -> str | None:
    """What is wrong with a block's marker, in words; None when it is well marked."""
    where = f"{block.name}: the {block.language or 'unlabelled'} block"
    if not block.language:
        return f"{where} has no language after its fence; expected one of {list(CHECKED_LANGUAGES)}"
    if block.language not in CHECKED_LANGUAGES:
        return f"{where} has the language {block.language!r}; expected one of {list(CHECKED_LANGUAGES)}"
    if block.marker is None:
        found = f" (found {block.marker_text!r})" if block.marker_text else ""
        return (f"{where} has no marker{found}: put `<!-- example: run [LANE] -->`, "
                "`<!-- example: output -->` or `<!-- example: needs REASON -->` on the line above "
                "its fence (see docs/tooling/docs_examples.py)")
    kind, arg = block.marker.kind, block.marker.arg
    if kind == "run":
        if block.language not in RUNNABLE_LANGUAGES:
            return f"{where} is marked run, but only {list(RUNNABLE_LANGUAGES)} blocks can run"
        if block.marker.lane not in RUN_LANES:
            return f"{where} names the lane {arg!r}; expected one of {list(RUN_LANES)}"
    elif kind == "needs":
        if arg not in NEEDS:
            return f"{where} needs {arg!r}; expected one of {sorted(NEEDS)}"
    elif arg is not None:
        return f"{where} is marked output, which takes no argument (found {arg!r})"
    return None


def guide_pages() -> list[Path]:
    """The Markdown files whose blocks are checked: README.md and every page under docs/."""
    return [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def all_blocks(generated: dict[str, str] | None = None) -> list[Block]:
    """Every block of `guide_pages()`, then of the `generated` pages (site path -> Markdown)."""
    blocks = [block for path in guide_pages()
              for block in blocks_of(path.read_text(), str(path.relative_to(REPO_ROOT)))]
    for page, text in (generated or {}).items():
        blocks.extend(blocks_of(text, page))
    return blocks


SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"$', re.MULTILINE)


def expand_snippets(code: str) -> str:
    """`code` with each `--8<-- "path"` line (pymdownx.snippets, paths from the repository
    root) replaced by the file it includes, as the site shows it."""
    return SNIPPET.sub(lambda match: (REPO_ROOT / match["path"]).read_text().rstrip("\n"), code)


def command_lines(code: str) -> Iterator[list[str]]:
    """The `huggy ...` commands of a shell block, as argument lists: continuation lines joined,
    comments dropped, leading `NAME=value` assignments skipped, a trailing `&` and anything after
    a pipe or `&&`/`;` removed."""
    for line in code.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words and words[-1] == "&":
            words = words[:-1]
        for index, word in enumerate(words):
            if word in ("|", "||", "&&", ";"):
                words = words[:index]
                break
        if words and words[0] == "huggy":
            yield words[1:]
