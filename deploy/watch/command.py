"""The work behind `huggy watch` (its parser lives in deploy/cli.py): open the database, the
followers and the runners, take the served baseline, run the watch; or `--rollback`. A team scene
(`deploy.watch.teams.is_team_scene`) is watched with its pool (`deploy.watch.teams.PoolRating`)
in place of the single-behavior rule."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deploy.evaluation.on_ray import ray_session
from deploy.evaluation.plan import EnvSpec, EvalConfig
from deploy.evaluation.report import format_table, write_report
from deploy.evaluation.sinks import write_tensorboard
from deploy.evaluation.summary import build_report
from deploy.evaluation.tournament import TournamentConfig, TournamentEnv
from deploy.evaluation.tournament_command import report_tournament
from deploy.watch.decisions import RuleSettings, looks_for
from deploy.watch.execution import Executor, NoItems, PlainExecutor
from deploy.watch.follow import RunFollower
from deploy.watch.loop import REPORT_FOLDER, Watch, WatchOptions
from deploy.watch.on_ray import RayExecutor
from deploy.watch.promotion import Promoter, rollback
from deploy.watch.store import WatchStore, evaluation_result, settings_of
from deploy.watch.teams import (
    MatchPlayer,
    PlainMatchPlayer,
    PoolConfig,
    PoolRating,
    is_team_scene,
    opponent,
    tournament_result,
)
from deploy.watch.teams_ray import RayMatchPlayer
from huggy_agent_client.http_api import load_api_key

DB_FILE = "watch.db"
DEFAULT_OPPONENTS = ("heuristic:chaser",)
"""A team scene's fixed opponents when `--opponent` names none: the strongest scripted player,
so the first checkpoint has a match to play and every rating a fixed reference."""


def rule_settings(args: argparse.Namespace) -> RuleSettings:
    """The sequential rule a command line asks for.

    Args:
        args: the parsed `huggy watch` command line.

    Returns:
        The settings: `--looks` looks spaced geometrically up to `--budget-items`.

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
        ValueError: no RUN, `--rollback` without `--serve`, `--serve` with a team scene, a
            database of a watch with other settings, or settings the rule refuses.
        FileNotFoundError: the `--env` build not found.
    """
    db = args.db if args.db is not None else args.out / DB_FILE
    if args.rollback:
        if not args.serve:
            raise ValueError("--rollback changes the server of --serve URL, which was not given")
        store = WatchStore(db)
        try:
            print(rollback(args.serve, load_api_key(args.api_key_file), store))
        finally:
            store.close()
        return 0
    if not args.runs:
        raise ValueError("give the results folder of at least one run (RUN...), got none")
    if not args.env.startswith("builtin") and not Path(args.env).exists():
        raise FileNotFoundError(f"--env: Unity build not found: {args.env} (or use 'builtin' "
                                "or 'builtin:soccertwos')")
    if is_team_scene(args.env):
        return _watch_teams(args, db)
    if args.opponents:
        raise ValueError(f"--opponent plays matches in a team scene; --env {args.env} is a "
                         "single-behavior scene, rated by episodes: drop --opponent")
    api_key = load_api_key(args.api_key_file) if args.serve else None
    env = EnvSpec(file_name=None if args.env == "builtin" else args.env,
                  num_agents=args.num_agents, max_steps=args.max_steps,
                  parameters=dict(args.env_param), instances=args.instances_per_runner)
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
                          rule, WatchOptions(out=args.out, follow=not args.no_follow,
                                             report=not args.no_report), promoter,
                          api_key)
            if promoter is not None and not store.policies():
                _take_served(watch, promoter, args.serve)
            _announce(args, db)
            ended = watch.run()
        return 0 if ended else 130
    finally:
        store.close()


def _announce(args: argparse.Namespace, db: Path) -> None:
    print(f"huggy watch: following {', '.join(map(str, args.runs))}; "
          f"{'in this process' if args.no_ray else f'{args.runners} Ray runner(s)'}; "
          f"database {db}; {args.out / 'watch.json'}", file=sys.stderr, flush=True)


def pool_config(args: argparse.Namespace) -> PoolConfig:
    """A team scene's pool settings a command line asks for.

    Args:
        args: the parsed `huggy watch` command line.

    Returns:
        The schedule (`--rounds`, `--adaptive-rounds`, match i seeded `--seed` + i) and the
            ratings' settings (`--confidence`, `--anchor`).

    Raises:
        ValueError: settings the pool refuses (naming them).
    """
    return PoolConfig(seed=args.seed, rounds=args.rounds, adaptive_rounds=args.adaptive_rounds,
                      confidence=args.confidence,
                      anchor=None if args.anchor is None else dict([args.anchor]))


def _watch_teams(args: argparse.Namespace, db: Path) -> int:
    """Watch the runs of a team scene: each checkpoint joins the pool of `--opponent`s and the
    checkpoints before it, and the pool is refitted as its matches arrive."""
    if args.serve:
        raise ValueError(f"--serve promotes checkpoints of a single-behavior scene; --env "
                         f"{args.env} is a team scene, whose checkpoints are rated against a pool "
                         "and never promoted: drop --serve")
    config = pool_config(args)
    opponents = [opponent(source) for source in args.opponents or DEFAULT_OPPONENTS]
    env = TournamentEnv(file_name=args.env, arenas=args.arenas,
                        parameters=dict(args.env_param))
    if args.anchor is not None and args.anchor[0] not in [m.label for m in opponents]:
        raise ValueError(f"--anchor names {args.anchor[0]!r}; in a team scene it fixes an "
                         f"opponent's Elo: one of {[m.label for m in opponents]}")
    store = WatchStore(db)
    try:
        store.check_settings(_team_settings(config, env, [m.fingerprint for m in opponents]))
        with _match_player(args, env) as player:
            rating = PoolRating(opponents, player, config, report_dir=None if args.no_report
                                else args.out / REPORT_FOLDER)
            watch = Watch(store, [RunFollower(run) for run in args.runs], NoItems(),
                          EvalConfig(seed=args.seed, progress=False),
                          rule_settings(args), WatchOptions(out=args.out,
                                                            follow=not args.no_follow),
                          rate_teams=rating)
            _announce(args, db)
            ended = watch.run()
        return 0 if ended else 130
    finally:
        store.close()


def _team_settings(config: PoolConfig, env: TournamentEnv, opponents: list[str]
                   ) -> dict[str, Any]:
    """What decides a team scene's matches and ratings: the pool's settings, the scene, and the
    opponents' fingerprints in order (not the arenas: a match's result does not depend on the
    arena it is played in)."""
    parameters = {key: value for key, value in env.parameters.items() if key != "num_arenas"}
    return {**config.settings(), "env": {"file_name": env.file_name, "parameters": parameters},
            "opponents": opponents}


@contextlib.contextmanager
def _match_player(args: argparse.Namespace, env: TournamentEnv) -> Iterator[MatchPlayer]:
    """Where a team scene's matches run for the whole watch: in this process (`--no-ray`), else
    on Ray runners of one cluster."""
    if args.no_ray:
        plain = PlainMatchPlayer(env)
        try:
            yield plain
        finally:
            plain.close()
        return
    with ray_session(args.address):
        runners = RayMatchPlayer(TournamentConfig(runners=args.runners,
                                                  accelerator=args.accelerator), env)
        try:
            yield runners
        finally:
            runners.close()


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


def tournament_from_db(args: argparse.Namespace) -> int:
    """`huggy tournament --db PATH`: the usual report of every match a team scene's watch
    recorded, running nothing: the table, the report's files in `--out`, and the `--tensorboard`
    scalars and `--model-card`s asked for.

    Args:
        args: the parsed `huggy tournament` command line.

    Returns:
        0.

    Raises:
        ValueError: POLICY... beside --db, or a file that is no team scene's watch database.
        FileNotFoundError: no file at PATH.
    """
    if args.policies:
        raise ValueError("--db reports a watch's matches without playing any: give no POLICY... "
                         f"beside it, got {len(args.policies)}")
    if not args.db.is_file():
        raise FileNotFoundError(f"--db: no watch database at {args.db}")
    store = WatchStore(args.db)
    try:
        result, anchor = tournament_result(store)
    finally:
        store.close()
    report_tournament(result, anchor, args)
    return 0
