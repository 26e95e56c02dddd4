"""`huggy rollout`, contributed to the `huggy` command through the entry-point group
`huggy_agent.commands` (parser only; the work in `envs.commands` is imported when it runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from huggy_agent.cli.arguments import port_number, positive_int, whole_number


def env_parameter(text: str) -> tuple[str, float]:
    """An argparse type: one `KEY=VALUE` of `--env-param`.

    Args:
        text: the option's value.

    Returns:
        (KEY, VALUE as a float), for ML-Agents' EnvironmentParameters channel.

    Raises:
        argparse.ArgumentTypeError: not `KEY=NUMBER`.
    """
    key, sep, value = text.partition("=")
    try:
        if not sep or not key:
            raise ValueError
        return key, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}") from None


worker_id = whole_number(0, 65535)
"""An ML-Agents worker id: a port offset, 0 to 65535 (its sum with the base port is checked
where both are known)."""
scene_seed = whole_number(0, 2**24 - 1, "0 to 2**24 - 1")
"""A scene's seed: 0 to 2**24 - 1 (seeds travel as float32 on ML-Agents' side channel)."""


def output_file(text: str) -> Path:
    """An argparse type: a file to write, refused at once rather than after the work whose results
    it would keep.

    Args:
        text: the path.

    Returns:
        The path.

    Raises:
        argparse.ArgumentTypeError: an empty path, a folder, or a file in a folder that does not
            exist.
    """
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError("expected a file to write, got "
                                         + (f"the folder {text!r}" if text else "an empty path"))
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, got {text!r} "
                                         f"(no folder {str(path.absolute().parent)!r})")
    return path


def output_folder(text: str) -> Path:
    """An argparse type: a folder to write into (made later if missing).

    Args:
        text: the path.

    Returns:
        The path.

    Raises:
        argparse.ArgumentTypeError: an empty path, or a file of that name exists.
    """
    path = Path(text)
    if not text or (path.exists() and not path.is_dir()):
        raise argparse.ArgumentTypeError("expected a folder to write into, got "
                                         + (f"the file {text!r}" if text else "an empty path"))
    return path


def add_env_parameter_option(parser: argparse.ArgumentParser) -> None:
    """Add `--env-param KEY=VALUE` (repeatable), collected into `args.env_param` as a list.

    Args:
        parser: the command's parser.
    """
    parser.add_argument("--env-param", metavar="KEY=VALUE", type=env_parameter, action="append",
                        default=[], help="a float sent on ML-Agents' EnvironmentParameters side "
                        "channel, as a training config's environment_parameters; repeatable "
                        "(the stand-in reads num_agents, max_steps, arena_size, episode_length, "
                        "episode_length_step)")


def _rollout(args: argparse.Namespace) -> int:
    from envs.commands import run_rollout

    return run_rollout(args)


def add_rollout_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `huggy rollout`."""
    text = "drive every agent of an ML-Agents environment with a policy and summarise the episodes"
    parser = subparsers.add_parser("rollout", help=text, description=text)
    parser.add_argument("--env", default="builtin",
                        help="'builtin' (the headless stand-in: Huggy, or the policy's own "
                             "interface for any other policy; default), 'builtin:soccertwos' "
                             "(the stand-in SoccerTwos) or a Unity executable")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--policy", metavar="[KEY=]POLICY", action="append", default=None,
                        help="a .onnx, a .pt or a results folder, local or "
                             "hf://owner/repo[@revision][/path] (default: the bundled policy). "
                             "In a scene of several behaviors or teams, repeat it as KEY=POLICY, "
                             "KEY a behavior (Goalie), a behavior with its team "
                             "(SoccerTwos?team=1) or team=N, POLICY also heuristic:NAME or a "
                             "served policy http://HOST:PORT[#POLICY_ID]; a lone POLICY plays "
                             "every behavior it fits")
    source.add_argument("--policy-url", default=None,
                        help="use a policy served by `huggy serve` at this URL instead")
    parser.add_argument("--api-key-file", type=Path, default=None,
                        help="file whose first line is the API key of --policy-url (default: "
                             "$HUGGY_API_KEY)")
    parser.add_argument("--episodes", type=int, default=20,
                        help="episodes to count, spread evenly over the agent slots (default 20; see "
                             "docs/environments.md, 'Which episodes count')")
    parser.add_argument("--stochastic", action="store_true",
                        help="sample actions instead of taking the mean")
    parser.add_argument("--seed", type=scene_seed, default=0,
                        help="seed of the environment and of the stochastic noise (default 0)")
    parser.add_argument("--record", type=output_file, default=None,
                        help="write one JSON line per episode to this .jsonl file")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda[:N] or npu[:N]")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--instances", metavar="K", type=positive_int, default=1,
                        help="Unity processes stepped together, each from its own worker "
                             "process; slots are their agents concatenated (default 1)")
    parser.add_argument("--pin-cores", action="store_true",
                        help="with several instances, pin instance i's worker and Unity process "
                             "to CPU core i (faster on a machine of your own; see "
                             "docs/environments.md, 'Several Unity processes')")
    parser.add_argument("--worker-id", type=worker_id, default=0,
                        help="port offset from the base port (busy ports move on; instance i "
                             "starts at worker id + i)")
    parser.add_argument("--base-port", type=port_number, default=None,
                        help="first gRPC port (default ML-Agents' 5005)")
    parser.add_argument("--timeout-wait", type=positive_int, default=60,
                        help="seconds to wait for the environment to connect (default 60)")
    add_env_parameter_option(parser)
    parser.add_argument("--video", metavar="DIR", type=Path, default=None,
                        help="write MP4 videos of agent slot 0's first episodes to DIR, one "
                             "file per episode (needs the stand-in playing Huggy, or a camera "
                             "observation)")
    parser.add_argument("--video-episodes", metavar="N", type=positive_int, default=1,
                        help="how many of slot 0's episodes --video writes (default 1; an "
                             "episode still running when the rollout ends is not written)")
    parser.add_argument("--demo", metavar="PATH.demo", type=output_file, default=None,
                        help="write the counted episodes of every slot as an ML-Agents "
                             "demonstration, for mlagents-learn's behavioral_cloning or gail")
    parser.add_argument("--dataset", metavar="NAME", default=None,
                        help="write the counted episodes as the Minari dataset NAME "
                             "(namespace/name-v0; in $MINARI_DATASETS_PATH; needs the data "
                             "extra)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(handler=_rollout)
