"""Benchmark of `huggy evaluate`: agent-steps/s of 1 and 2 Ray runners against the plain loop.

All three run the same work items (same policy, same seeds, so the same episodes, which is
checked) in one process run; the plain single-process loop is the baseline. Ray starts once,
before the timed parts (`ray.init` is reported on its own). Rounds of (plain, 1 runner,
2 runners) are interleaved and the fastest of each mode counts, so load from other programs
hits every mode alike. Two rates per mode:
- end to end: the whole evaluation call (runner start-up: actor process, imports, environment;
  every item; shutdown);
- steady: from the moment the first runner was ready to the end.

    .venv/bin/python bench/bench_evaluate.py [--items 24] [--max-steps 300] [--rounds 2]

Targets: Ray at 1 runner within 15% of the plain loop; 2 runners >= 1.6x 1 runner.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from deploy.evaluation.on_ray import evaluate_on_ray
from deploy.evaluation.plan import EnvSpec, EvalConfig
from deploy.evaluation.results import EvaluationResult
from deploy.evaluation.scheduling import evaluate_plain
from deploy.evaluation.sources import policy_specs

REPO = Path(__file__).resolve().parents[1]


def _steps_per_s(result: EvaluationResult, seconds: float) -> float:
    steps = sum(item.agent_steps for policy in result.policies for item in policy.items)
    return steps / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default=str(REPO / "tests" / "fixtures" / "huggy"
                                                / "ppo_baseline" / "Huggy.onnx"))
    parser.add_argument("--items", type=int, default=24, help="work items of 18 episodes")
    parser.add_argument("--max-steps", type=int, default=300, help="decisions per episode cap")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of (plain, x1, x2); the fastest of each mode counts")
    args = parser.parse_args()

    import ray

    from deploy.cluster import init_ray

    specs = policy_specs([args.policy])
    env = EnvSpec(max_steps=args.max_steps)
    base = dict(episodes=18 * args.items, episodes_per_item=18, accelerator="cpu",
                progress=False)

    started = time.perf_counter()
    init_ray(None, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    init_s = time.perf_counter() - started
    best: dict[str, tuple[EvaluationResult, float]] = {}
    try:
        for _ in range(args.rounds):  # interleaved, so load from elsewhere hits every mode
            for mode, run in (
                    ("plain loop", lambda: evaluate_plain(specs, EvalConfig(**base), env)),
                    ("ray x1", lambda: evaluate_on_ray(specs, EvalConfig(**base), env)),
                    ("ray x2", lambda: evaluate_on_ray(specs, EvalConfig(**base, runners=2),
                                                       env))):
                started = time.perf_counter()
                result = run()
                wall = time.perf_counter() - started
                if mode not in best or wall < best[mode][1]:
                    best[mode] = (result, wall)
    finally:
        ray.shutdown()

    plain = best["plain loop"][0]
    same = all([i.returns for i in best[mode][0].policies[0].ordered_items()]
               == [i.returns for i in plain.policies[0].ordered_items()]
               for mode in ("ray x1", "ray x2"))
    rows = best
    steps = sum(item.agent_steps for item in plain.policies[0].items)
    print(f"policy {specs[0].label}: {args.items} items x 18 episodes, {steps} agent-steps, "
          f"max_steps {args.max_steps}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; ray.init {init_s:.1f} s (untimed); best of {args.rounds}")
    print("end to end: the whole call; steady: after the first runner was ready (start-up: "
          "actor process, imports, environment)")
    print(f"{'mode':<11} {'wall s':>7} {'start-up s':>10} {'steps/s e2e':>12} {'vs plain':>9} "
          f"{'vs x1':>6} {'steps/s steady':>15} {'vs plain':>9} {'vs x1':>6}")
    e2e = {m: _steps_per_s(r, w) for m, (r, w) in rows.items()}
    steady = {m: _steps_per_s(r, w - r.startup_seconds) for m, (r, w) in rows.items()}
    for mode, (result, wall) in rows.items():
        print(f"{mode:<11} {wall:>7.2f} {result.startup_seconds:>10.2f} {e2e[mode]:>12.0f} "
              f"{e2e[mode] / e2e['plain loop']:>9.2f} {e2e[mode] / e2e['ray x1']:>6.2f} "
              f"{steady[mode]:>15.0f} {steady[mode] / steady['plain loop']:>9.2f} "
              f"{steady[mode] / steady['ray x1']:>6.2f}")
    print(f"identical episodes in all three: {same}")
    for name, rate in (("end to end", e2e), ("steady", steady)):
        print(f"{name}: Ray overhead at 1 runner {100 * (1 - rate['ray x1'] / rate['plain loop']):.1f}%"
              f" (target < 15%); 2 runners vs 1: {rate['ray x2'] / rate['ray x1']:.2f}x "
              "(target >= 1.6x)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
