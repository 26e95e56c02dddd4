"""The work behind `huggy evaluate` (its parser lives in deploy/cli.py): find the policies, run
the items (in this process, or on Ray runners), then build the one report and render it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.evaluation.datasets import dataset_ids, write_datasets
from deploy.evaluation.plan import EnvSpec, EvalConfig, SelectionConfig
from deploy.evaluation.replays import check_renderable, record_replays
from deploy.evaluation.report import format_table, write_report
from deploy.evaluation.scheduling import evaluate_plain
from deploy.evaluation.selection import check_budget
from deploy.evaluation.sinks import plan_model_cards, write_model_cards, write_tensorboard
from deploy.evaluation.sources import policy_specs, served_policy_specs, stand_in_behavior
from deploy.evaluation.summary import EvaluationReport, build_report
from envs.teams import check_builtin_parameters
from huggy_agent_client.http_api import load_api_key


def run_evaluate(args: argparse.Namespace) -> int:
    """Run the evaluation, print the table, write the report (and the datasets, videos, TensorBoard
    scalars and model cards asked for).

    Args:
        args: the parsed `huggy evaluate` command line.

    Returns:
        The exit code: 0 when every policy was evaluated (and every video asked for written), 1
            when one failed, 130 when interrupted (what finished is still reported).

    Raises:
        ValueError: both or neither of POLICY... and `--policy-url`, `--policy-id` without
            `--policy-url`, `--select-best` with one policy, a scene flag the stand-in would
            ignore, a budget too small for one round, or settings the evaluation refuses.
        FileNotFoundError: a policy or the `--env` build not found.
    """
    if bool(args.policies) == bool(args.policy_url):
        raise ValueError("give either POLICY... or --policy-url URL (exactly one of them), got "
                         f"{len(args.policies)} policies and policy-url={args.policy_url!r}")
    if args.policy_id is not None and not args.policy_url:
        raise ValueError(f"--policy-id {args.policy_id!r} names a policy served at --policy-url, "
                         "which was not given")
    if args.policies:
        specs = policy_specs(args.policies)
    else:
        specs = served_policy_specs(args.policy_url, args.policy_id,
                                    load_api_key(args.api_key_file))
    if args.env != "builtin" and not Path(args.env).exists():
        raise FileNotFoundError(f"--env: Unity build not found: {args.env} (or use 'builtin')")
    file_name = None if args.env == "builtin" else args.env
    behavior_spec = stand_in_behavior(specs) if args.env == "builtin" else None
    check_scene_flags(args, file_name, behavior_spec)
    env = EnvSpec(file_name=file_name, num_agents=args.num_agents, max_steps=args.max_steps,
                  parameters=dict(args.env_param), instances=args.instances_per_runner,
                  behavior_spec=behavior_spec)
    if args.video is not None:
        check_renderable(env)  # before any work
    dataset_names = (None if args.dataset is None
                     else dataset_ids(args.dataset, [spec.label for spec in specs]))
    selection = None
    if args.select_best:
        if len(specs) < 2:
            raise ValueError(f"--select-best chooses among two or more policies, got "
                             f"{len(specs)}: evaluate a single policy without it")
        selection = SelectionConfig(statistic=args.select_by, confidence=args.confidence,
                                    round_items=args.round_items)
    config = EvalConfig(episodes=args.episodes, episodes_per_item=args.episodes_per_item,
                        seed=args.seed, stochastic=args.stochastic, runners=args.runners,
                        accelerator=args.accelerator, precision=args.precision,
                        progress=not args.no_progress, selection=selection,
                        keep_episodes=dataset_names is not None)
    if selection is not None:
        check_budget(len(specs), config)  # a budget too small for one round fails before Ray
    if args.no_ray:
        result = evaluate_plain(specs, config, env)
    else:
        from deploy.evaluation.on_ray import evaluate_on_ray  # Ray: only where it runs

        result = evaluate_on_ray(specs, config, env, address=args.address)
    report = build_report(result)
    print(format_table(report))
    paths = write_report(report, args.out)
    print("wrote " + ", ".join(str(path) for path in paths.values()), file=sys.stderr)
    if dataset_names is not None:
        for dataset in write_datasets(result, dataset_names):
            print(f"Minari dataset: {dataset.spec.dataset_id} ({dataset.total_episodes} "
                  f"episodes, {dataset.total_steps} steps)")
    videos_ok, replays = _replays(report, args)
    _write_sinks(report, args, replays)
    if result.interrupted:
        return 130
    failed = any(policy.failed for policy in result.policies)
    return 1 if failed or not videos_ok else 0


def check_scene_flags(args: argparse.Namespace, file_name: str | None,
                      behavior_spec: dict | None) -> None:
    """Refuse `--num-agents` or `--max-steps` where the built-in stand-in would ignore its scene
    parameter (the spec-driven one, for policies other than Huggy, has no max_steps), naming the
    flag where `EnvSpec` would name the parameter only.

    Args:
        args: the parsed command line.
        file_name: the Unity build, or None for the stand-in.
        behavior_spec: what the stand-in plays, or None.

    Raises:
        ValueError: naming the flag and the parameter.
    """
    for flag, key, value in (("--num-agents", "num_agents", args.num_agents),
                             ("--max-steps", "max_steps", args.max_steps)):
        if value is not None:
            try:
                check_builtin_parameters(file_name, behavior_spec, [(key, value)])
            except ValueError as error:
                raise ValueError(f"{flag} {value} (the scene parameter {key}): {error}") from None


def _replays(report: EvaluationReport, args: argparse.Namespace) -> tuple[bool, dict[str, Path]]:
    """The replay videos --video asks for (every policy) or --model-card wants (each card's
    last checkpoint), printed one per line; (whether --video got all it asked, label -> MP4).
    A model card without a replay is no failure: its environment may not render."""
    result = report.result
    if result.interrupted or (args.video is None and not args.model_card):
        return True, {}
    if args.video is None:
        wanted = {plan.final.label for plan in plan_model_cards(report, args.out / "model_cards")}
        indices = [i for i, p in enumerate(result.policies) if p.spec.label in wanted]
        try:
            check_renderable(result.env)
        except ValueError as error:
            print(f"model cards without replay.mp4: {error}", file=sys.stderr)
            return True, {}
    else:
        indices = list(range(len(result.policies)))
    folder = Path(args.video) if args.video else args.out / "videos"
    try:
        replays = record_replays(result, folder, indices)
    except (ValueError, RuntimeError) as error:  # a Unity build without a camera, say
        print(f"huggy evaluate: no replay videos: {error}", file=sys.stderr)
        return args.video is None, {}
    for replay in replays:
        print(replay.describe())
    return True, {replay.label: replay.path for replay in replays}


def _write_sinks(report: EvaluationReport, args: argparse.Namespace,
                 replays: dict[str, Path]) -> None:
    """TensorBoard scalars (--tensorboard) and model cards (--model-card, with the replays of
    their last checkpoints), when asked for."""
    if args.tensorboard is None and not args.model_card:
        return
    if args.tensorboard is not None:
        folders, skipped = write_tensorboard(report.summaries, args.tensorboard)
        print("wrote TensorBoard scalars to " + (", ".join(map(str, folders)) or "nothing")
              + (f" (no training step: {', '.join(skipped)})" if skipped else ""),
              file=sys.stderr)
    if args.model_card:
        cards = write_model_cards(report, args.out / "model_cards", replays)
        print("wrote model cards " + (", ".join(map(str, cards)) or "(none)"), file=sys.stderr)
