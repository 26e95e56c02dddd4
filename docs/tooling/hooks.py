"""MkDocs hooks of the site (`hooks:` in mkdocs.yml):

- `on_files` adds the pages generated from the code (`docs_reference`): the CLI reference, the
  HTTP API and its `openapi.json`;
- `on_page_markdown` checks every fenced code block's marker (`docs_examples`) and warns, which
  fails `mkdocs build --strict`, for a block without one;
- `on_page_content` warns when a guide page renders more code blocks than it has fenced ones
  (an indented code block, which could carry no marker).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import docs_examples
import docs_reference

log = logging.getLogger("mkdocs.plugins.huggy_docs")

API_PAGES = "reference/python/"
"""Pages rendered by mkdocstrings, whose code blocks are signatures and docstrings."""

_fenced: dict[str, int] = {}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in docs_reference.generated_pages().items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    blocks = docs_examples.blocks_of(markdown, page.file.src_uri)
    for block in blocks:
        problem = docs_examples.marker_problem(block)
        if problem:
            log.warning(problem)
    _fenced[page.file.src_uri] = len(blocks)
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    uri = page.file.src_uri
    if not uri.startswith(API_PAGES):
        rendered = html.count("<pre")
        if rendered != _fenced.get(uri, 0):
            log.warning(f"{uri}: {rendered} code blocks on the page but {_fenced.get(uri, 0)} "
                        "fenced ones: write code as a fenced block with a marker "
                        "(see docs/tooling/docs_examples.py), not indented")
    return html
