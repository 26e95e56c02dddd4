"""`huggy evaluate`, `huggy tournament`, `huggy watch` and `huggy serve`, contributed to the `huggy`
command through the entry-point group `huggy_agent.commands` (parsers only; the work is imported
when a command runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from deploy.serving.limits import parse_limit
from envs.cli import add_env_parameter_option, output_folder
from huggy_agent.cli.arguments import number, port_number, positive_int

ACCELERATOR_CHOICES = ("auto", "cpu", "gpu", "npu")
PRECISION_CHOICES = ("fp32", "fp16", "bf16")
SELECT_BY_CHOICES = ("mean", "median", "iqm")


def add_evaluate_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `huggy evaluate`."""
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate policies on many environments with Ray: table, CSV, JSON, learning curve",
        description=(
            "Evaluate each POLICY (a .pt checkpoint, an .onnx file, an ML-Agents results "
            "folder: every checkpoint in it, by step, or hf://owner/repo[@revision][/path]) on "
            "an ML-Agents environment with Ray runners. Item i of every policy runs with seed S+i "
            "(--seed S), so the numbers do not depend on --runners or --instances-per-runner. "
            "Writes evaluation.csv, evaluation.json, learning_curve.png, "
            "probability_of_improvement.png and performance_profile.png to --out; on request "
            "replay videos, Minari datasets, TensorBoard scalars and model cards."),
    )
    parser.add_argument("policies", nargs="*", metavar="POLICY",
                        help="checkpoint, ONNX file, results folder or "
                             "hf://owner/repo[@revision][/path] (omit with --policy-url)")
    parser.add_argument("--env", metavar="builtin|PATH", default="builtin",
                        help="'builtin' (the headless stand-in, default) or a Unity build's path")
    parser.add_argument("--episodes", metavar="N", type=positive_int, default=36,
                        help="episodes per policy (default 36); with --select-best, the budget "
                             "of all policies together")
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
    parser.add_argument("--out", metavar="DIR", type=output_folder, default=Path("out/evaluate"),
                        help="folder for evaluation.csv, evaluation.json and the three PNGs "
                             "(default out/evaluate)")
    parser.add_argument("--policy-url", metavar="URL", default=None,
                        help="evaluate the policies a `huggy serve` deployment serves at this "
                             "URL, every one of them (a live A/B split as deployed) unless "
                             "--policy-id names one (runners query it instead of loading a copy)")
    parser.add_argument("--policy-id", metavar="ID", default=None,
                        help="with --policy-url: evaluate only this served policy (an id of "
                             "GET /v1/models)")
    parser.add_argument("--api-key-file", metavar="PATH", type=Path, default=None,
                        help="file whose first line is the API key of --policy-url (default: "
                             "$HUGGY_API_KEY); the runners get it with each served policy")
    parser.add_argument("--num-agents", metavar="N", type=positive_int, default=None,
                        help="agents per environment (stand-in parameter; default the scene's 18)")
    parser.add_argument("--max-steps", metavar="N", type=positive_int, default=None,
                        help="decisions per episode before it is cut (stand-in parameter)")
    add_env_parameter_option(parser)
    selection = parser.add_argument_group(
        "adaptive selection",
        "Rounds of work items: after each, a policy worse than the leader with confidence "
        "--confidence (Bonferroni-corrected for the policies and rounds) gets no more items; "
        "stops at one policy or when --episodes (the total budget) is spent.")
    selection.add_argument("--select-best", action="store_true",
                           help="spend the budget adaptively on the policies that may be best")
    selection.add_argument("--select-by", choices=SELECT_BY_CHOICES, default="mean",
                           help="statistic that ranks policies: mean (what a shipped policy earns "
                                "on average; default), median or iqm")
    selection.add_argument("--confidence", metavar="P", type=float, default=0.95,
                           help="probability that the best policy is never dropped (default 0.95)")
    selection.add_argument("--round-items", metavar="N", type=positive_int, default=1,
                           help="work items per remaining policy per round (default 1)")
    parser.add_argument("--tensorboard", metavar="DIR", type=Path, default=None,
                        help="also write TensorBoard scalars per checkpoint step to DIR/<run>/ "
                             "(point it at ML-Agents' results folder to see them beside training)")
    parser.add_argument("--model-card", action="store_true",
                        help="write a Hugging Face model card (README.md with model-index "
                             "results) into each evaluated run's folder, with replay.mp4 (the "
                             "replay of its last checkpoint's median episode, also kept in "
                             "--out/videos) where the environment renders")
    parser.add_argument("--video", metavar="DIR", nargs="?", const="", default=None,
                        help="write, per policy, an MP4 replay of its median-return episode, "
                             "played again from its item's seed, to DIR (default --out/videos); "
                             "needs the built-in stand-in playing Huggy or a camera observation")
    parser.add_argument("--dataset", metavar="NAME", default=None,
                        help="write the counted episodes as a Minari dataset "
                             "(NAME = (namespace/)name-vN; several policies: one dataset each, "
                             "NAME's stem/<policy>-vN); needs the data extra")
    parser.add_argument("--no-ray", action="store_true",
                        help="run every item in this process on one environment, without Ray")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--db", metavar="PATH", type=Path, default=None,
                        help="run nothing: write the report (and --tensorboard scalars) of "
                             "every episode in a huggy watch database, instead of POLICY...")
    parser.set_defaults(handler=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    """`huggy evaluate` (`deploy.evaluation.command.run_evaluate`).

    Args:
        args: the parsed command line.

    Returns:
        The exit code: 0 when every policy was evaluated (or, with --db, reported), 1 when one
            failed, 130 when interrupted.
    """
    if args.db is not None:
        # start-up time: only `huggy evaluate --db` imports the watch
        from deploy.watch.command import evaluate_from_db

        return evaluate_from_db(args)
    # start-up time: `huggy --help` and the other commands import none of the evaluation
    from deploy.evaluation.command import run_evaluate as run

    return run(args)


def anchor(text: str) -> tuple[str, float]:
    """An argparse type: `LABEL=ELO` of `--anchor` (the label may hold '=': the last one separates
    the number).

    Args:
        text: the option's value.

    Returns:
        (LABEL, ELO).

    Raises:
        argparse.ArgumentTypeError: not `LABEL=NUMBER`.
    """
    label, separator, value = text.rpartition("=")
    try:
        if not separator or not label:
            raise ValueError
        return label, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LABEL=ELO, got {text!r}") from None


def add_tournament_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `huggy tournament`."""
    parser = subparsers.add_parser(
        "tournament",
        help="rate policies by matches in a two-team scene (SoccerTwos): Elo with intervals",
        description=(
            "Play matches between POLICY... in a scene whose two teams share a behavior (the "
            "stand-in SoccerTwos, or a SoccerTwos build), each match one episode of one arena "
            "with policy A as team 0 and B as team 1, sides swapped within each pair; match i "
            "is seeded S+i (--seed S). Rates them by Bradley-Terry maximum likelihood on the "
            "Elo scale with 95% bootstrap intervals. Writes tournament.json, tournament.csv, "
            "ratings.png and win_rate.png to --out."))
    parser.add_argument("policies", nargs="*", metavar="POLICY",
                        help="a .onnx, a .pt, a results folder (every checkpoint), "
                             "hf://owner/repo[@revision][/path], or a scripted player: "
                             "heuristic:idle, heuristic:random, heuristic:chaser")
    parser.add_argument("--env", metavar="builtin:soccertwos|PATH",
                        default="builtin:soccertwos",
                        help="the scene: the stand-in SoccerTwos (default) or a Unity build")
    parser.add_argument("--matches", metavar="N", type=positive_int, default=120,
                        help="the budget: matches of all pairs together, played in whole rounds "
                             "of K(K-1) for K policies (default 120)")
    parser.add_argument("--seed", metavar="S", type=int, default=0,
                        help="match i is seeded S+i (default 0)")
    parser.add_argument("--deterministic", action="store_true",
                        help="play each policy's most likely action (default: sample, as Unity's "
                             "inference does)")
    parser.add_argument("--adaptive", action="store_true",
                        help="after two round-robin rounds, give each round to the pairs whose "
                             "order is least certain")
    parser.add_argument("--select-best", action="store_true",
                        help="stop once the leader's lower bound clears every other policy's "
                             "upper bound (see docs/evaluation.md for the error statement)")
    parser.add_argument("--confidence", metavar="P", type=float, default=0.95,
                        help="with --select-best: the probability that the rule does not name "
                             "a policy that is not the strongest (default 0.95)")
    parser.add_argument("--anchor", metavar="LABEL=ELO", type=anchor, default=None,
                        help="fix one policy's Elo (default: the mean is 1200)")
    parser.add_argument("--arenas", metavar="K", type=positive_int, default=None,
                        help="matches a runner plays at once, one per arena (default: for the "
                             "stand-in 8, its num_arenas; for a build, every arena its scene "
                             "has, counted when a runner starts)")
    parser.add_argument("--runners", metavar="K", type=positive_int, default=1,
                        help="Ray runners, each with its own environment (default 1)")
    parser.add_argument("--address", metavar="ADDRESS", default=None,
                        help="Ray cluster to use (as for huggy evaluate)")
    parser.add_argument("--accelerator", choices=ACCELERATOR_CHOICES, default="auto",
                        help="Ray resource per runner (as for huggy evaluate)")
    parser.add_argument("--precision", choices=PRECISION_CHOICES, default="fp32")
    parser.add_argument("--out", metavar="DIR", type=output_folder, default=Path("out/tournament"),
                        help="folder for the report (default out/tournament)")
    parser.add_argument("--tensorboard", metavar="DIR", type=Path, default=None,
                        help="also write Evaluation/Elo per checkpoint step to DIR/<run>/")
    parser.add_argument("--model-card", action="store_true",
                        help="write the Elo and its interval into each run's model card "
                             "(README.md with model-index results)")
    parser.add_argument("--no-ray", action="store_true",
                        help="play every match in this process, without Ray")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--db", metavar="PATH", type=Path, default=None,
                        help="play nothing: write the report (and --tensorboard scalars, "
                             "--model-card) of every match in a team scene's huggy watch "
                             "database, instead of POLICY...")
    add_env_parameter_option(parser)
    parser.set_defaults(handler=run_tournament)


def run_tournament(args: argparse.Namespace) -> int:
    """`huggy tournament` (`deploy.evaluation.tournament_command.run_tournament`).

    Args:
        args: the parsed command line.

    Returns:
        The exit code: 0, or 130 when interrupted.
    """
    if args.db is not None:
        # start-up time: only `huggy tournament --db` imports the watch
        from deploy.watch.command import tournament_from_db

        return tournament_from_db(args)
    # start-up time: `huggy --help` and the other commands import none of the tournament
    from deploy.evaluation.tournament_command import run_tournament as run

    return run(args)


def add_watch_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `huggy watch`."""
    parser = subparsers.add_parser(
        "watch",
        help="follow training runs, rate each checkpoint as it lands, promote a proven better one",
        description=(
            "Follow each RUN (an ML-Agents results/<run_id> folder, written by mlagents-learn "
            "now or later) and rate every complete checkpoint as it lands against the best so "
            "far: work items as huggy evaluate runs them (item i seeded S+i), compared at looks "
            "spaced geometrically from 1/16 of --budget-items to all of it, until the "
            "difference's interval says better, tied within --margin, or not better. Over a "
            "whole watch, the chance that a checkpoint is "
            "promoted though it is not better than the best is at most 1 - --confidence. Every "
            "episode goes into an SQLite database (--db), so a watch started again resumes with "
            "the same decisions. Writes --out/watch.json after each decision and TensorBoard "
            "scalars (Evaluation/IQM and its bounds) beside the trainer's. With --serve, a "
            "better checkpoint goes to that huggy serve: a canary share of the sessions, then "
            "all. Ends when every trainer has finished and every checkpoint is decided, or on "
            "Ctrl-C once the running work is back. In a team scene (SoccerTwos: two teams "
            "sharing a behavior, as huggy tournament plays), each checkpoint instead plays "
            "matches against a pool (the --opponent players, then every earlier checkpoint), "
            "refitted as they arrive: Evaluation/Elo and its bounds, the pool in watch.json."))
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="results folder of a run (results/<run_id>); several at once")
    parser.add_argument("--env", metavar="builtin|builtin:soccertwos|PATH", default="builtin",
                        help="'builtin' (the headless stand-in playing Huggy, default), "
                             "'builtin:soccertwos' (the stand-in SoccerTwos, a team scene) or a "
                             "Unity build's path (a team scene where its two teams share a "
                             "behavior)")
    parser.add_argument("--out", metavar="DIR", type=output_folder, default=Path("out/watch"),
                        help="folder for watch.json, watch.db and the checkpoints' copies "
                             "(default out/watch)")
    parser.add_argument("--db", metavar="PATH", type=Path, default=None,
                        help="the SQLite database (default DIR/watch.db of --out); a watch "
                             "started again on it resumes")
    parser.add_argument("--no-follow", action="store_true",
                        help="rate the checkpoints there now and end once they are decided, "
                             "without waiting for the trainers to finish")
    parser.add_argument("--no-report", action="store_true",
                        help="do not rewrite the report (OUT/report: huggy evaluate's, or in a "
                             "team scene huggy tournament's: JSON, CSV, "
                             "figures) and the runs' model cards after each decision")
    parser.add_argument("--confidence", metavar="P", type=float, default=0.95,
                        help="1 - the chance over the whole watch that a checkpoint not better "
                             "than the best is promoted (default 0.95)")
    parser.add_argument("--margin", metavar="M", type=float, default=0.1,
                        help="differences within +-M (return units) count as a tie "
                             "(default 0.1)")
    parser.add_argument("--statistic", choices=SELECT_BY_CHOICES, default="iqm",
                        help="what compares checkpoints: iqm (default), mean or median return")
    parser.add_argument("--budget-items", metavar="N", type=positive_int, default=64,
                        help="work items a checkpoint gets at most; undecided then, never "
                             "promoted (default 64)")
    parser.add_argument("--looks", metavar="L", type=positive_int, default=10,
                        help="looks per comparison, spaced geometrically from N/16 to N items "
                             "(default 10)")
    parser.add_argument("--episodes-per-item", metavar="N", type=positive_int, default=18,
                        help="episodes per work item, one environment reset each (default 18)")
    parser.add_argument("--seed", metavar="S", type=int, default=0,
                        help="item i of every checkpoint uses S+i (default 0)")
    parser.add_argument("--stochastic", action="store_true",
                        help="sample actions (seeded per step) instead of the mean action")
    parser.add_argument("--runners", metavar="K", type=positive_int, default=2,
                        help="Ray runners, kept for the whole watch (default 2)")
    parser.add_argument("--instances-per-runner", metavar="K", type=positive_int, default=1,
                        help="Unity processes per runner (default 1)")
    parser.add_argument("--address", metavar="ADDRESS", default=None,
                        help="Ray cluster to use (as for huggy evaluate)")
    parser.add_argument("--accelerator", choices=ACCELERATOR_CHOICES, default="auto",
                        help="Ray resource per runner (as for huggy evaluate)")
    parser.add_argument("--no-ray", action="store_true",
                        help="run every item in this process on one environment, without Ray")
    parser.add_argument("--num-agents", metavar="N", type=positive_int, default=None,
                        help="agents per environment (stand-in parameter)")
    parser.add_argument("--max-steps", metavar="N", type=positive_int, default=None,
                        help="decisions per episode before it is cut (stand-in parameter)")
    add_env_parameter_option(parser)
    teams = parser.add_argument_group(
        "team scenes", "How checkpoints of a team scene are rated: matches as huggy tournament "
        "plays them, match i seeded S+i (--seed S), Bradley-Terry Elo with bootstrap intervals "
        "at --confidence.")
    teams.add_argument("--opponent", metavar="SOURCE", dest="opponents", action="append",
                       default=[],
                       help="a fixed member of the pool, ahead of the checkpoints: "
                            "heuristic:idle, heuristic:random, heuristic:chaser or a policy "
                            "file; repeatable (default: heuristic:chaser)")
    teams.add_argument("--rounds", metavar="N", type=positive_int, default=2,
                       help="round-robin rounds each new checkpoint plays against every member "
                            "before it, one match per side each (default 2)")
    teams.add_argument("--adaptive-rounds", metavar="N", type=int, default=2,
                       help="further rounds per checkpoint, given to its pairs whose order is "
                            "least certain (default 2)")
    teams.add_argument("--anchor", metavar="LABEL=ELO", type=anchor, default=None,
                       help="fix an --opponent's Elo, so checkpoints stay comparable as the "
                            "pool grows (default: the pool's mean is 1200)")
    teams.add_argument("--arenas", metavar="K", type=positive_int, default=None,
                       help="matches a runner plays at once, one per arena (as for huggy "
                            "tournament)")
    serving = parser.add_argument_group(
        "promotion", "Change a running huggy serve (PUT /v1/policies, behind its API key): the "
        "server must be able to read --out, where the watch keeps its copies of checkpoints.")
    serving.add_argument("--serve", metavar="URL", default=None,
                         help="the huggy serve to promote into; its default policy is the first "
                              "baseline (single-behavior scenes only)")
    serving.add_argument("--api-key-file", metavar="PATH", type=Path, default=None,
                         help="file whose first line is the server's API key (default: "
                              "$HUGGY_API_KEY)")
    serving.add_argument("--canary-share", metavar="F", type=float, default=0.1,
                         help="share of the sessions a promoted checkpoint gets first "
                              "(default 0.1)")
    serving.add_argument("--canary-s", metavar="SECONDS", type=float, default=60.0,
                         help="how long the canary runs before it takes all (default 60)")
    serving.add_argument("--rollback", action="store_true",
                         help="return --serve to the policy served before the last promotion "
                              "logged in --db, and exit")
    parser.set_defaults(handler=run_watch)


def run_watch(args: argparse.Namespace) -> int:
    """`huggy watch` (`deploy.watch.command.run_watch`).

    Args:
        args: the parsed command line.

    Returns:
        The exit code: 0 when the watch ended by itself, 130 when stopped.
    """
    # start-up time: `huggy --help` and the other commands import none of the watch
    from deploy.watch.command import run_watch as run

    return run(args)


def limit_setting(text: str) -> tuple[str, int | float]:
    """An argparse type: one `--limit NAME=VALUE` (`deploy.serving.limits.parse_limit`).

    Args:
        text: the option's value.

    Returns:
        (NAME, the value as an int where it is written as one, else a float).

    Raises:
        argparse.ArgumentTypeError: not NAME=NUMBER.
    """
    try:
        return parse_limit(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `huggy serve`."""
    parser = subparsers.add_parser(
        "serve", help="serve policies over HTTP with Ray Serve until Ctrl-C or SIGTERM",
        description="Serve one policy or many over HTTP (POST /v1/act, POST /v1/models/ID/act, "
                    "GET /v1/models, /v1/healthz, /v1/info, /v1/openapi.json) with Ray Serve "
                    "and dynamic batching, until Ctrl-C or SIGTERM. Each POLICY is a file, a "
                    "results folder (every checkpoint in it) or an hf:// source; ids are "
                    "labelled as `huggy evaluate` labels them (RUN@STEP, PARENT/FILE).")
    parser.add_argument("policies", nargs="*", metavar="POLICY",
                        help=".onnx, .pt, results folder (every checkpoint) or hf:// source "
                             "(default: the bundled policy)")
    parser.add_argument("--policy", default=None,
                        help="one policy: a .onnx, an ML-Agents .pt or a results folder (its "
                             "final export) instead of POLICY...")
    parser.add_argument("--default", metavar="ID", default=None,
                        help="policy that /v1/act answers with (default: the first)")
    parser.add_argument("--split", metavar="ID=WEIGHT,...", default=None,
                        help="A/B split of /v1/act by weight; a request's \"session\" key keeps "
                             "it on one policy (change it live with `serve deploy`)")
    parser.add_argument("--models-per-replica", metavar="N", type=positive_int, default=None,
                        help="most policies a replica holds, least recently used evicted "
                             "(default: all)")
    parser.add_argument("--accelerator", choices=("auto", "cpu", "gpu", "npu"), default="auto",
                        help="what each replica is pinned to; auto: NPU, then GPU, then CPU, "
                             "whichever the cluster has (default: auto)")
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    scaling = parser.add_mutually_exclusive_group()
    scaling.add_argument("--replicas", type=positive_int, default=1,
                         help="fixed number of replicas (default: 1)")
    scaling.add_argument("--autoscale", action="store_true",
                         help="scale between 1 and --max-replicas replicas on load")
    parser.add_argument("--max-replicas", type=positive_int, default=4,
                        help="most replicas with --autoscale, which starts from 1 (default: 4)")
    parser.add_argument("--num-cpus", type=number(0), default=1.0, help="CPUs each replica holds")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP host (default: 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8000,
                        help="HTTP port (default: 8000)")
    parser.add_argument("--grpc-port", type=port_number, default=None,
                        help="also serve gRPC (/huggy.v1.Policy/Act) on this port")
    parser.add_argument("--grpc-ingress", choices=("replica", "serve"), default="replica",
                        help="who answers --grpc-port: replica (each replica's own gRPC server, "
                             "on --host; reaches the replicas on this machine; fastest, default) "
                             "or serve (Serve's gRPC ingress on the head node; reaches every "
                             "replica of the cluster)")
    parser.add_argument("--address", default=None,
                        help="join this Ray cluster (e.g. 127.0.0.1:6379) instead of starting one")
    parser.add_argument("--ingress", choices=("haproxy", "proxy", "direct"), default="haproxy",
                        help="HTTP path into the replicas: haproxy (fastest, default), proxy "
                             "(Serve's Python proxy), or direct (each replica also listens on its "
                             "own port from 30000; --port stays Serve's proxy)")
    parser.add_argument("--max-batch-size", type=positive_int, default=256,
                        help="most observations in one forward pass (default: 256)")
    parser.add_argument("--batch-wait-ms", type=number(0, 10_000), default=0.0,
                        help="how long a batch waits for more requests, 0 to 10000 (default: "
                             "0, take what is queued)")
    parser.add_argument("--max-rows", type=positive_int, default=256,
                        help="most observations in one request (default: 256)")
    parser.add_argument("--max-body-bytes", type=positive_int, default=1 << 20,
                        help="largest request body, HTTP or gRPC message (default: 1048576)")
    parser.add_argument("--limit", metavar="NAME=VALUE", dest="limits", action="append",
                        type=limit_setting, default=[],
                        help="a cap of the replicas' own gRPC server and HTTP listener, e.g. "
                             "max_concurrent_streams=50 or idle_timeout_s=120; repeatable "
                             "(the names and defaults: docs/serving.md, Limits)")
    parser.add_argument("--start-timeout", type=number(0, above=True), default=180.0,
                        help="seconds to wait for the replicas to start (default: 180)")
    parser.add_argument("--api-key-file", metavar="PATH", default=None,
                        help="require the key on this file's first line as 'Authorization: "
                             "Bearer <key>' (gRPC: 'authorization' metadata) on every route but "
                             "/v1/healthz (default: $HUGGY_API_KEY; unset: no key)")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    """`huggy serve` (`deploy.serving.server`)."""
    # start-up time: `huggy --help` and the other commands never import Ray Serve
    from deploy.serving.server import serve_command

    return serve_command(args)
