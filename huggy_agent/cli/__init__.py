"""The `huggy` command line.

The core commands (about the policy itself) live in `policy_commands`. Other packages contribute
their own subcommands through the entry-point group `huggy_agent.commands`: each entry is named
after its command and points to a function `add_parser(subparsers)` (for example `rollout =
"envs.cli:add_rollout_parser"` in pyproject.toml), so this package imports nothing above it.
Only the plugin of the command being run is imported (all of them for `huggy --help`), so
`huggy info` never imports Ray or mlagents-envs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points

from huggy_agent import __version__
from huggy_agent.cli import policy_commands

ENTRY_POINT_GROUP = "huggy_agent.commands"


def plugin_commands() -> dict[str, EntryPoint]:
    """The subcommands other installed packages contribute.

    Returns:
        Their entry points (group `huggy_agent.commands`) by command name.
    """
    return {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def _command_word(argv: Sequence[str]) -> str | None:
    """The subcommand named in `argv` (its first word not starting with '-'), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `huggy` parser.

    Args:
        argv: the command line, without the program name: the plugin subcommand it names is loaded
            (every plugin subcommand when it names none, for `huggy --help`); the other plugin
            subcommands get a placeholder (all of them for `huggy --version`).

    Returns:
        The parser, with every core subcommand.

    Raises:
        RuntimeError: a plugin redefines a core command.
    """
    parser = argparse.ArgumentParser(
        prog="huggy",
        description="Run a trained Unity ML-Agents policy (Huggy the Dog first) outside Unity.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    policy_commands.add_parsers(subparsers)
    core = set(subparsers.choices)
    wanted = _command_word(argv)
    load_all = wanted is None and "--version" not in argv
    for name, entry in sorted(plugin_commands().items()):
        if name in core:
            raise RuntimeError(f"entry point {entry.value!r} of group {ENTRY_POINT_GROUP!r} "
                               f"redefines the core command {name!r}")
        if load_all or wanted == name:
            entry.load()(subparsers)
        else:
            subparsers.add_parser(name, help=f"(from {entry.value.split(':')[0]})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `huggy`.

    Args:
        argv: the command line without the program name; None reads `sys.argv`.

    Returns:
        The exit code: the command's; 2 for a ValueError, OSError or RuntimeError (its message
            printed); 130 when interrupted; 141 when the reader of the output left.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a reader that left (`huggy stats | head`) shows here, not at exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left: stop quietly, as `cat` does (128 + SIGPIPE)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except (ValueError, OSError, RuntimeError) as error:  # OSError: a path that cannot be used
        print(f"huggy {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
