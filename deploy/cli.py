"""`huggy evaluate` and `huggy serve`, contributed to the `huggy` command through the entry-point
group `huggy_agent.commands` (parsers only; the work is imported when a command runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envs.cli import add_env_parameter_option, positive_int

ACCELERATOR_CHOICES = ("auto", "cpu", "gpu", "npu")
PRECISION_CHOICES = ("fp32", "fp16", "bf16")


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
    parser.add_argument("--episodes", metavar="N", type=positive_int, default=36,
                        help="episodes per policy (default 36)")
    parser.add_argument("--episodes-per-item", metavar="N", type=positive_int, default=18,
                        help="episodes per work item, one environment reset each, spread over "
                             "the agent slots by per-slot quotas (default 18)")
    parser.add_argument("--runners", metavar="K", type=positive_int, default=1,
                        help="Ray runners, each with its own environment (default 1)")
    parser.add_argument("--instances-per-runner", metavar="K", type=positive_int, default=1,
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
    parser.add_argument("--num-agents", metavar="N", type=positive_int, default=None,
                        help="agents per environment (stand-in parameter; default the scene's 18)")
    parser.add_argument("--max-steps", metavar="N", type=positive_int, default=None,
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


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `huggy serve`."""
    parser = subparsers.add_parser(
        "serve", help="serve a policy over HTTP with Ray Serve until Ctrl-C or SIGTERM",
        description="Serve a policy over HTTP (POST /v1/act, GET /v1/healthz, /v1/info, "
                    "/v1/openapi.json) with Ray Serve and dynamic batching, until Ctrl-C or "
                    "SIGTERM.")
    parser.add_argument("--policy", default=None,
                        help="a .onnx, an ML-Agents .pt or a results folder (default: bundled)")
    parser.add_argument("--accelerator", choices=("auto", "cpu", "gpu", "npu"), default="auto",
                        help="what each replica is pinned to; auto: NPU, then GPU, then CPU, "
                             "whichever the cluster has (default: auto)")
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    scaling = parser.add_mutually_exclusive_group()
    scaling.add_argument("--replicas", type=int, default=1, help="fixed number of replicas")
    scaling.add_argument("--autoscale", action="store_true",
                         help="scale between 1 and --max-replicas replicas on load")
    parser.add_argument("--max-replicas", type=int, default=4)
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs each replica holds")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP host (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000)")
    parser.add_argument("--grpc-port", type=int, default=None,
                        help="also serve the gRPC ingress (/huggy.v1.Policy/Act) on this port")
    parser.add_argument("--address", default=None,
                        help="join this Ray cluster (e.g. 127.0.0.1:6379) instead of starting one")
    parser.add_argument("--ingress", choices=("haproxy", "proxy", "direct"), default="haproxy",
                        help="HTTP path into the replicas: haproxy (fastest, default), proxy "
                             "(Serve's Python proxy), or direct (each replica also listens on its "
                             "own port from 30000; --port stays Serve's proxy)")
    parser.add_argument("--max-batch-size", type=int, default=256,
                        help="most observations in one forward pass (default: 256)")
    parser.add_argument("--batch-wait-ms", type=float, default=0.0,
                        help="how long a batch waits for more requests (default: 0, take what "
                             "is queued)")
    parser.add_argument("--max-rows", type=int, default=256,
                        help="most observations in one request (default: 256)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--start-timeout", type=float, default=180.0,
                        help="seconds to wait for the replicas to start (default: 180)")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from deploy.runner import serve_forever
    from deploy.serve import AppArgs

    app_args = AppArgs(
        policy=args.policy, accelerator=args.accelerator, precision=args.precision,
        replicas=args.replicas, autoscale=args.autoscale, max_replicas=args.max_replicas,
        num_cpus=args.num_cpus, max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1000, max_rows=args.max_rows,
        max_body_bytes=args.max_body_bytes)
    return serve_forever(app_args, host=args.host, port=args.port, ingress=args.ingress,
                         address=args.address, start_timeout_s=args.start_timeout,
                         grpc_port=args.grpc_port)
