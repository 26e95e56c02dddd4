"""The work behind `huggy evaluate` (its parser lives in deploy/cli.py): find the policies, run
the items (in this process, or on Ray runners), then build the one report and render it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.evaluation.plan import EnvSpec, EvalConfig, SelectionConfig
from deploy.evaluation.report import format_table, write_report
from deploy.evaluation.scheduling import evaluate_plain
from deploy.evaluation.selection import check_budget
from deploy.evaluation.sinks import write_model_cards, write_tensorboard
from deploy.evaluation.sources import policy_specs, served_policy_specs, stand_in_behavior
from deploy.evaluation.summary import EvaluationReport, build_report
from huggy_agent.http_api import load_api_key


def run_evaluate(args: argparse.Namespace) -> int:
    """Run the evaluation, print the table, write the report. Exit code 0 when every policy was
    evaluated, 1 when one failed, 130 when interrupted (what finished is still reported)."""
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
    env = EnvSpec(file_name=None if args.env == "builtin" else args.env,
                  num_agents=args.num_agents, max_steps=args.max_steps,
                  parameters=dict(args.env_param), instances=args.instances_per_runner,
                  behavior_spec=stand_in_behavior(specs) if args.env == "builtin" else None)
    selection = None
    if args.select_best:
        selection = SelectionConfig(statistic=args.select_by, confidence=args.confidence,
                                    round_items=args.round_items)
    config = EvalConfig(episodes=args.episodes, episodes_per_item=args.episodes_per_item,
                        seed=args.seed, stochastic=args.stochastic, runners=args.runners,
                        accelerator=args.accelerator, precision=args.precision,
                        progress=not args.no_progress, selection=selection)
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
    _write_sinks(report, args)
    if result.interrupted:
        return 130
    return 1 if any(policy.failed for policy in result.policies) else 0


def _write_sinks(report: EvaluationReport, args: argparse.Namespace) -> None:
    """TensorBoard scalars (--tensorboard) and model cards (--model-card), when asked for."""
    if args.tensorboard is None and not args.model_card:
        return
    if args.tensorboard is not None:
        folders, skipped = write_tensorboard(report.summaries, args.tensorboard)
        print("wrote TensorBoard scalars to " + (", ".join(map(str, folders)) or "nothing")
              + (f" (no training step: {', '.join(skipped)})" if skipped else ""),
              file=sys.stderr)
    if args.model_card:
        cards = write_model_cards(report, args.out / "model_cards")
        print("wrote model cards " + (", ".join(map(str, cards)) or "(none)"), file=sys.stderr)
