"""The `huggy` command line.

Each group of subcommands lives in its own module and only declares its arguments here; the work
is done by functions imported when the subcommand runs, so `huggy --help` and `huggy info` start
fast and never import Ray or mlagents-envs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from huggy_agent.cli import deploy_commands, env_commands, evaluate_commands, policy_commands

COMMAND_GROUPS = (policy_commands, env_commands, deploy_commands, evaluate_commands)


def build_parser() -> argparse.ArgumentParser:
    """The full `huggy` parser: every subcommand of every group."""
    parser = argparse.ArgumentParser(
        prog="huggy",
        description="Run a trained Unity ML-Agents policy (Huggy the Dog first) outside Unity.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in COMMAND_GROUPS:
        group.add_parsers(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `huggy`; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"huggy {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
