"""The work behind `huggy tournament` (its parser lives in deploy/cli.py): find the contenders,
play the matches (in this process, or on Ray runners), rate them once and render the report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.evaluation.tournament import (
    TournamentConfig,
    TournamentEnv,
    TournamentResult,
    check_budget,
    contenders,
    play_plain,
)
from deploy.evaluation.tournament_report import (
    build_tournament_report,
    format_tournament_table,
    write_model_cards,
    write_tensorboard,
    write_tournament_report,
)


def run_tournament(args: argparse.Namespace) -> int:
    """Run the tournament, print the table, write the report (and the TensorBoard scalars and model
    cards asked for).

    Args:
        args: the parsed `huggy tournament` command line.

    Returns:
        The exit code: 0, or 130 when interrupted (what was played is still reported).

    Raises:
        ValueError: an `--anchor` that is not a contender, too few contenders, a budget too small
            for one round, or settings the tournament refuses.
        FileNotFoundError: a policy or the `--env` build not found.
    """
    entrants = contenders(args.policies)
    if not args.env.startswith("builtin") and not Path(args.env).exists():
        raise FileNotFoundError(f"--env: Unity build not found: {args.env} (or use "
                                "'builtin:soccertwos')")
    if args.anchor is not None and args.anchor[0] not in [c.label for c in entrants]:
        raise ValueError(f"--anchor names {args.anchor[0]!r}, which is not among the policies "
                         f"{[c.label for c in entrants]}")
    config = TournamentConfig(matches=args.matches, seed=args.seed,
                              deterministic=args.deterministic, adaptive=args.adaptive,
                              select_best=args.select_best, confidence=args.confidence,
                              runners=args.runners, accelerator=args.accelerator,
                              precision=args.precision, progress=not args.no_progress)
    check_budget(entrants, config)  # a budget too small for one round fails before anything
    env = TournamentEnv(file_name=args.env, arenas=args.arenas,
                        parameters=dict(args.env_param))
    if args.no_ray:
        result = play_plain(entrants, config, env)
    else:
        from deploy.evaluation.tournament_ray import play_on_ray  # Ray: only where it runs

        result = play_on_ray(entrants, config, env, address=args.address)
    report_tournament(result, None if args.anchor is None else dict([args.anchor]), args)
    return 130 if result.interrupted else 0


def report_tournament(result: TournamentResult, anchor: dict[str, float] | None,
                      args: argparse.Namespace) -> None:
    """Rate what a tournament played, print the table, and write the report, with the
    TensorBoard scalars and model cards the command line asks for.

    Args:
        result: the matches played (by `huggy tournament`, or recorded by a watch).
        anchor: `{label: elo}` fixing one rating, or None (the mean at 1200).
        args: the parsed `huggy tournament` command line (`--out`, `--tensorboard`,
            `--model-card`).

    Raises:
        ValueError: an anchor that is not a contender.
    """
    report = build_tournament_report(result, anchor)
    print(format_tournament_table(report))
    paths = write_tournament_report(report, args.out)
    print("wrote " + ", ".join(str(path) for path in paths.values()), file=sys.stderr)
    if args.tensorboard is not None:
        folders = write_tensorboard(report, args.tensorboard)
        print("wrote TensorBoard scalars to " + (", ".join(map(str, folders)) or "nothing "
              "(no contender has a training step)"), file=sys.stderr)
    if args.model_card:
        cards = write_model_cards(report, args.out / "model_cards")
        print("wrote model cards " + (", ".join(map(str, cards)) or "(none: no policy file "
              "among the contenders)"), file=sys.stderr)
