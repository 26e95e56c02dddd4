"""`huggy` subcommands of the env group (parsers only; work is imported when a command runs)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _rollout(args: argparse.Namespace) -> int:
    from envs.commands import run_rollout

    return run_rollout(args)


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Register this group's subcommands."""
    text = "drive every agent of a Huggy environment with a policy and summarise the episodes"
    parser = subparsers.add_parser("rollout", help=text, description=text)
    parser.add_argument("--env", default="builtin",
                        help="'builtin' (the headless stand-in, default) or a Unity executable")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--policy", type=Path, default=None,
                        help="a .onnx, a .pt or a results folder (default: the bundled policy)")
    source.add_argument("--policy-url", default=None,
                        help="use a policy served by `huggy serve` at this URL instead")
    parser.add_argument("--episodes", type=int, default=20,
                        help="finished episodes to collect (default 20)")
    parser.add_argument("--stochastic", action="store_true",
                        help="sample actions instead of taking the mean")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the environment and of the stochastic noise (default 0)")
    parser.add_argument("--record", type=Path, default=None,
                        help="write one JSON line per episode to this .jsonl file")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda[:N] or npu[:N]")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--worker-id", type=int, default=0,
                        help="port offset from the base port (busy ports move on)")
    parser.add_argument("--base-port", type=int, default=None,
                        help="first gRPC port (default ML-Agents' 5005)")
    parser.add_argument("--timeout-wait", type=int, default=60,
                        help="seconds to wait for the environment to connect (default 60)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(handler=_rollout)
