"""`huggy evaluate` and `huggy serve`, contributed to the `huggy` command through the entry-point
group `huggy_agent.commands` (parsers only; the work is imported when a command runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envs.cli import add_env_parameter_option

ACCELERATOR_CHOICES = ("auto", "cpu", "gpu", "npu")
PRECISION_CHOICES = ("fp32", "fp16", "bf16")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def add_evaluate_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `huggy evaluate`."""
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate policies on many environments with Ray: table, CSV, JSON, learning curve",
        description=(
            "Evaluate each POLICY (a .pt checkpoint, an .onnx file, or an ML-Agents results "
            "folder: every checkpoint in it, by step) on the Huggy environment with Ray runners. "
            "Item i of every policy runs with seed S+i (--seed S), so the numbers do not depend on "
            "--runners or --instances-per-runner. Writes evaluation.csv, evaluation.json and "
            "learning_curve.png to --out."),
    )
    parser.add_argument("policies", nargs="*", metavar="POLICY",
                        help="checkpoint, ONNX file or results folder (omit with --policy-url)")
    parser.add_argument("--env", metavar="builtin|PATH", default="builtin",
                        help="'builtin' (the headless stand-in, default) or a Unity build's path")
    parser.add_argument("--episodes", metavar="N", type=_positive_int, default=36,
                        help="episodes per policy (default 36)")
    parser.add_argument("--episodes-per-item", metavar="N", type=_positive_int, default=18,
                        help="episodes per work item, one environment reset each, spread over "
                             "the agent slots by per-slot quotas (default 18)")
    parser.add_argument("--runners", metavar="K", type=_positive_int, default=1,
                        help="Ray runners, each with its own environment (default 1)")
    parser.add_argument("--instances-per-runner", metavar="K", type=_positive_int, default=1,
                        help="Unity processes per runner, each running one work item at a time "
                             "(items, seeds and numbers do not depend on K; default 1)")
    parser.add_argument("--address", metavar="ADDRESS", default=None,
                        help="Ray cluster to use: 'auto', HOST:PORT or ray://HOST:PORT "
                             "(default: $RAY_ADDRESS, else a cluster started with `ray start` "
                             "here, else a new local Ray, stopped at the end)")
    parser.add_argument("--accelerator", choices=ACCELERATOR_CHOICES, default="auto",
                        help="Ray resource per runner: auto (npu, else gpu, else cpu), cpu, gpu "
                             "(num_gpus=1) or npu (NPU: 1)")
    parser.add_argument("--precision", choices=PRECISION_CHOICES, default="fp32",
                        help="precision of the runners' policy copies (default fp32)")
    parser.add_argument("--stochastic", action="store_true",
                        help="sample actions (seeded per step) instead of the mean action")
    parser.add_argument("--seed", metavar="S", type=int, default=0,
                        help="base seed: item i of every policy uses S+i (default 0)")
    parser.add_argument("--out", metavar="DIR", type=Path, default=Path("out/evaluate"),
                        help="folder for evaluation.csv, evaluation.json, learning_curve.png "
                             "(default out/evaluate)")
    parser.add_argument("--policy-url", metavar="URL", default=None,
                        help="evaluate the policy a `huggy serve` deployment serves at this URL "
                             "(runners query it instead of loading a copy)")
    parser.add_argument("--num-agents", metavar="N", type=_positive_int, default=None,
                        help="agents per environment (stand-in parameter; default the scene's 18)")
    parser.add_argument("--max-steps", metavar="N", type=_positive_int, default=None,
                        help="decisions per episode before it is cut (stand-in parameter)")
    add_env_parameter_option(parser)
    parser.add_argument("--no-ray", action="store_true",
                        help="run every item in this process on one environment, without Ray")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(handler=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    """Run the evaluation, print the table, write the report. Exit code 0 when every policy was
    evaluated, 1 when one failed, 130 when interrupted (what finished is still reported)."""
    from deploy.evaluation import (
        EnvSpec,
        EvalConfig,
        PolicySpec,
        evaluate_on_ray,
        evaluate_plain,
        expand_policies,
        stand_in_behavior,
    )
    from deploy.report import format_table, write_report

    if bool(args.policies) == bool(args.policy_url):
        raise ValueError("give either POLICY... or --policy-url URL (exactly one of them), got "
                         f"{len(args.policies)} policies and policy-url={args.policy_url!r}")
    specs = (expand_policies(args.policies) if args.policies
             else [PolicySpec(label=args.policy_url, url=args.policy_url)])
    if args.env != "builtin" and not Path(args.env).exists():
        raise FileNotFoundError(f"--env: Unity build not found: {args.env} (or use 'builtin')")
    env = EnvSpec(file_name=None if args.env == "builtin" else args.env,
                  num_agents=args.num_agents, max_steps=args.max_steps,
                  parameters=dict(args.env_param), instances=args.instances_per_runner,
                  behavior_spec=stand_in_behavior(specs) if args.env == "builtin" else None)
    config = EvalConfig(episodes=args.episodes, episodes_per_item=args.episodes_per_item,
                        seed=args.seed, stochastic=args.stochastic, runners=args.runners,
                        accelerator=args.accelerator, precision=args.precision,
                        progress=not args.no_progress)
    if args.no_ray:
        result = evaluate_plain(specs, config, env)
    else:
        result = evaluate_on_ray(specs, config, env, address=args.address)
    print(format_table(result))
    paths = write_report(result, args.out)
    print("wrote " + ", ".join(str(path) for path in paths.values()), file=sys.stderr)
    if result.interrupted:
        return 130
    return 1 if any(policy.failed for policy in result.policies) else 0
