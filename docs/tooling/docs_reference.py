"""Reference pages generated from the code when the site is built, so they cannot drift:

- the CLI reference, from the argparse parsers (`huggy_agent.cli.build_parser`): each command's
  help exactly as `huggy COMMAND --help` prints it at `HELP_COLUMNS` columns;
- the HTTP API, from the OpenAPI document the server answers on `GET /v1/openapi.json`
  (`deploy.serving.openapi.openapi_document`) for the bundled policy at the default settings.

Neither needs Ray running (nor imports Ray). `docs/tooling/hooks.py` adds the pages to the site;
`tests/test_docs_reference.py` compares them with `huggy COMMAND --help` and a live server.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HELP_COLUMNS = 100
"""Terminal width the help is formatted for (argparse reads `$COLUMNS`)."""

CLI_PAGE = "reference/cli.md"
HTTP_PAGE = "reference/http-api.md"
OPENAPI_FILE = "reference/openapi.json"


@contextmanager
def help_width(columns: int = HELP_COLUMNS) -> Iterator[None]:
    """argparse formats help for `$COLUMNS` columns: set it for the duration."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(action for action in parser._actions
                if isinstance(action, argparse._SubParsersAction))


def command_summaries() -> dict[str, str]:
    """Every `huggy` command (core and contributed) with its one-line help, in `huggy --help` order."""
    from huggy_agent.cli import build_parser  # the CLI imports torch: only when a page is built

    subcommands = _subcommands(build_parser())
    return {choice.dest: choice.help or "" for choice in subcommands._choices_actions}


def command_help(command: str | None) -> str:
    """What `huggy COMMAND --help` prints (`huggy --help` for None), from the parser itself."""
    from huggy_agent.cli import build_parser  # the CLI imports torch: only when a page is built

    argv = [] if command is None else [command]
    with help_width():
        parser = build_parser(argv)
        if command is None:
            return parser.format_help()
        return _subcommands(parser).choices[command].format_help()


def cli_markdown() -> str:
    """The CLI reference page."""
    summaries = command_summaries()
    lines = [
        "# CLI reference",
        "",
        "Generated from the command's own argparse parsers when this site is built, so it shows "
        f"exactly what `huggy COMMAND --help` prints (at {HELP_COLUMNS} columns); a test compares "
        "the two for every command. Policy commands take `--policy` (default: the bundled "
        "policy), `--device`, `--precision` and `--engine`; those whose output is data take "
        "`--json`. `rollout` comes from `envs`, `evaluate`, `serve` and `tournament` from "
        "`deploy`, through the entry-point group `huggy_agent.commands`.",
        "",
        "| command | what it does |",
        "|---|---|",
        *[f"| [`huggy {name}`](#huggy-{name}) | {summary} |" for name, summary in summaries.items()],
        "",
        "## huggy",
        "",
        "<!-- example: output -->",
        "```text",
        command_help(None).rstrip("\n"),
        "```",
    ]
    for name in summaries:
        lines += ["", f"## huggy {name}", "", "<!-- example: output -->", "```text",
                  command_help(name).rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def bundled_openapi() -> dict[str, Any]:
    """The OpenAPI document `huggy serve` (the bundled policy, default settings, no API key)
    answers on `GET /v1/openapi.json`, built as its replicas build it."""
    # deploy imports pydantic and the serving rules (never Ray): only when a page is built
    from deploy.serving.openapi import openapi_document
    from deploy.serving.settings import AppArgs
    from huggy_agent_client.spec import ActorSpec

    args = AppArgs()
    served = args.policy_set()
    settings = args.batch_settings()
    interfaces = {entry.id: ActorSpec.from_dict(entry.spec) for entry in served.entries}
    return openapi_document(interfaces[served.default], settings.max_rows, settings.max_body_bytes,
                            False, interfaces, [served.default])


def _schema_name(reference: str) -> str:
    return reference.rsplit("/", 1)[-1]


def _schema_link(schema: dict[str, Any]) -> str:
    """A schema as a link to its section, or its type in words."""
    if "$ref" in schema:
        name = _schema_name(schema["$ref"])
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in schema or "oneOf" in schema:
        return " or ".join(_schema_link(part) for part in schema.get("anyOf", schema.get("oneOf")))
    kind = schema.get("type", "object")
    return f"`{kind}`" + (f" ({', '.join(schema['required'])})" if schema.get("required") else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def http_markdown(document: dict[str, Any]) -> str:
    """The HTTP API page: every route with its request, parameters and answers, then every
    schema as JSON."""
    components = document.get("components", {})
    responses = components.get("responses", {})
    lines = [
        "# HTTP API",
        "",
        "Generated when this site is built from the OpenAPI document that `huggy serve` answers "
        "on `GET /v1/openapi.json` for the bundled Huggy policy at the default settings "
        "(`deploy.serving.openapi.openapi_document`; a test compares this page's document with a "
        "live server's). A server with other policies, limits or an API key describes itself "
        "the same way: ask it. The whole document: [openapi.json](openapi.json). "
        "The guide is [Serving](../serving.md).",
        "",
        f"**{document['info']['title']}**: {_cell(document['info'].get('description', ''))}",
        "",
        "| method | path | summary |",
        "|---|---|---|",
    ]
    routes = [(path, method, operation) for path, item in document["paths"].items()
              for method, operation in item.items()]
    for path, method, operation in routes:
        lines.append(f"| `{method.upper()}` | `{path}` | {_cell(operation.get('summary', ''))} |")
    for path, method, operation in routes:
        lines += ["", f"## `{method.upper()} {path}`", "", operation.get("summary", ""), ""]
        if operation.get("security") == []:
            lines += ["Open without the API key.", ""]
        for parameter in operation.get("parameters", []):
            lines += [f"Parameter `{parameter['name']}` (in {parameter['in']}, "
                      f"{'required' if parameter.get('required') else 'optional'}): "
                      f"{_cell(parameter.get('description', ''))}; "
                      f"schema `{json.dumps(parameter.get('schema', {}))}`.", ""]
        body = operation.get("requestBody")
        if body:
            schema = body["content"]["application/json"]["schema"]
            lines += [f"Request body (JSON): {_schema_link(schema)}.", ""]
        lines += ["| status | meaning | body |", "|---|---|---|"]
        for status, answer in operation["responses"].items():
            if "$ref" in answer:
                answer = responses[_schema_name(answer["$ref"])]
            content = answer.get("content", {}).get("application/json", {})
            schema_text = _schema_link(content["schema"]) if "schema" in content else ""
            headers = ", ".join(f"header `{name}`" for name in answer.get("headers", {}))
            lines.append(f"| {status} | {_cell(answer.get('description', ''))} | "
                         f"{schema_text}{'; ' + headers if headers else ''} |")
    lines += ["", "## Schemas"]
    for name, schema in components.get("schemas", {}).items():
        lines += ["", f"### {name}", ""]
        if schema.get("description"):
            lines += [_cell(schema["description"]), ""]
        lines += ["<!-- example: output -->", "```json", json.dumps(schema, indent=2), "```"]
    security = components.get("securitySchemes")
    if security:
        lines += ["", "## Security schemes", "", "<!-- example: output -->", "```json",
                  json.dumps(security, indent=2), "```"]
    return "\n".join(lines) + "\n"


def generated_pages() -> dict[str, str]:
    """Site path -> content of every generated file."""
    document = bundled_openapi()
    return {
        CLI_PAGE: cli_markdown(),
        HTTP_PAGE: http_markdown(document),
        OPENAPI_FILE: json.dumps(document, indent=2) + "\n",
    }
