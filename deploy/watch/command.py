"""The work behind `huggy watch` (its parser lives in deploy/cli.py): open the database, the
followers and the runners, take the served baseline, run the watch; or `--rollback`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from deploy.evaluation.on_ray import ray_session
from deploy.evaluation.plan import EnvSpec, EvalConfig
from deploy.evaluation.report import format_table, write_report
from deploy.evaluation.sinks import write_tensorboard
from deploy.evaluation.summary import build_report
from deploy.watch.decisions import RuleSettings, looks_for
from deploy.watch.execution import Executor, PlainExecutor
from deploy.watch.follow import RunFollower
from deploy.watch.loop import Watch, WatchOptions
from deploy.watch.on_ray import RayExecutor
from deploy.watch.promotion import Promoter, rollback
from deploy.watch.store import WatchStore, evaluation_result, settings_of
from huggy_agent_client.http_api import load_api_key

DB_FILE = "watch.db"


def rule_settings(args: argparse.Namespace) -> RuleSettings:
    """The sequential rule a command line asks for.

    Args:
        args: the parsed `huggy watch` command line.

    Returns:
        The settings: looks that double up to `--budget-items`, `--looks` of them.

    Raises:
        ValueError: settings the rule refuses (naming them).
    """
    return RuleSettings(statistic=args.statistic, confidence=args.confidence, margin=args.margin,
                        looks=looks_for(args.budget_items, args.looks), seed=args.seed)


def run_watch(args: argparse.Namespace) -> int:
    """Watch the runs (or roll back with `--rollback`).

    Args:
        args: the parsed `huggy watch` command line.

    Returns:
        The exit code: 0 when the watch ended by itself (every trainer finished, every
            checkpoint decided), 130 when stopped with Ctrl-C.

    Raises:
        ValueError: no RUN, `--rollback` without `--serve`, a database of a watch with other
            settings, or settings the rule refuses.
        FileNotFoundError: the `--env` build not found.
    """
    db = args.db if args.db is not None else args.out / DB_FILE
    api_key = load_api_key(args.api_key_file) if args.serve else None
    if args.rollback:
        if not args.serve:
            raise ValueError("--rollback changes the server of --serve URL, which was not given")
        store = WatchStore(db)
        try:
            print(rollback(args.serve, api_key, store))
        finally:
            store.close()
        return 0
    if not args.runs:
        raise ValueError("give the results folder of at least one run (RUN...), got none")
    if args.env != "builtin" and not Path(args.env).exists():
        raise FileNotFoundError(f"--env: Unity build not found: {args.env} (or use 'builtin')")
    env = EnvSpec(file_name=None if args.env == "builtin" else args.env,
                  num_agents=args.num_agents, max_steps=args.max_steps,
                  instances=args.instances_per_runner)
    rule = rule_settings(args)
    config = EvalConfig(episodes=rule.looks[-1] * args.episodes_per_item,
                        episodes_per_item=args.episodes_per_item, seed=args.seed,
                        stochastic=args.stochastic, runners=args.runners,
                        accelerator=args.accelerator, progress=False)
    store = WatchStore(db)
    try:
        store.check_settings(settings_of(config, env, rule.as_dict()))
        promoter = None if not args.serve else Promoter(
            args.serve, api_key, store, args.canary_share, args.canary_s)
        with _executor(args, config, env) as executor:
            watch = Watch(store, [RunFollower(run) for run in args.runs], executor, config,
                          rule, WatchOptions(out=args.out, follow=not args.no_follow), promoter, api_key)
            if promoter is not None and not store.policies():
                _take_served(watch, promoter, args.serve)
            print(f"huggy watch: following {', '.join(map(str, args.runs))}; "
                  f"{'in this process' if args.no_ray else f'{args.runners} Ray runner(s)'}; "
                  f"database {db}; {args.out / 'watch.json'}", file=sys.stderr, flush=True)
            ended = watch.run()
        return 0 if ended else 130
    finally:
        store.close()


@contextlib.contextmanager
def _executor(args: argparse.Namespace, config: EvalConfig, env: EnvSpec) -> Iterator[Executor]:
    """The runners for the whole watch: in this process (`--no-ray`), else on one Ray cluster."""
    if args.no_ray:
        plain = PlainExecutor(config, env)
        try:
            yield plain
        finally:
            plain.close()
        return
    with ray_session(args.address):
        runners = RayExecutor(config, env)
        try:
            yield runners
        finally:
            runners.close()


def _take_served(watch: Watch, promoter: Promoter, url: str) -> None:
    """Take the server's default policy as the first baseline: runners load its file where this
    machine can read it, else query the server."""
    served = promoter.served()
    default = served["default"]
    model = next(model for model in served["models"] if model["id"] == default)
    path = model.get("path")
    watch.take_served(default, model["fingerprint"], url, default, model.get("step"),
                      path if path and Path(path).is_file() else None)


def evaluate_from_db(args: argparse.Namespace) -> int:
    """`huggy evaluate --db PATH`: the usual report of every episode a watch recorded, running
    nothing: the table, the report's files in `--out`, and `--tensorboard` scalars.

    Args:
        args: the parsed `huggy evaluate` command line.

    Returns:
        0.

    Raises:
        ValueError: POLICY... or --policy-url beside --db, or a file that is no watch database.
        FileNotFoundError: no file at PATH.
    """
    if args.policies or args.policy_url:
        raise ValueError("--db reports a watch's episodes without running anything: give no "
                         f"POLICY... or --policy-url beside it, got {len(args.policies)} "
                         f"policies and policy-url={args.policy_url!r}")
    if not args.db.is_file():
        raise FileNotFoundError(f"--db: no watch database at {args.db}")
    store = WatchStore(args.db)
    try:
        report = build_report(evaluation_result(store))
    finally:
        store.close()
    print(format_table(report))
    paths = write_report(report, args.out)
    print("wrote " + ", ".join(str(path) for path in paths.values()), file=sys.stderr)
    if args.tensorboard is not None:
        folders, _ = write_tensorboard(report.summaries, args.tensorboard)
        print("wrote TensorBoard scalars to " + (", ".join(map(str, folders)) or "nothing"),
              file=sys.stderr)
    return 0
