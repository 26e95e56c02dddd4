"""Evaluation statistics and adaptive selection, measured (not part of the test suite).

1. The vectorised stratified bootstrap (mean, median and IQM from one set of resamples, and the
   probability of improvement) against a plain loop over resamples, in the same run.
2. `--select-best` on synthetic policies with known true means, against the uniform plan with
   the same budget: how often each picks the true best, and the episodes each spends.

    python bench/bench_selection.py [--trials 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.stats import mannwhitneyu, trim_mean

from deploy.evaluation import statistics as st
from deploy.evaluation.plan import EvalConfig, SelectionConfig, WorkItem
from deploy.evaluation.selection import simulate
from huggy_agent.tables import format_table

PER_ITEM = 18


def _strata(episodes: int, seed: int) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [rng.normal(1.0, 0.45, PER_ITEM).tolist() for _ in range(episodes // PER_ITEM)]


def _plain_loop(strata: list[list[float]], resamples: int, rng: np.random.Generator) -> None:
    items = [np.asarray(item) for item in strata]
    for _ in range(resamples):
        sample = np.concatenate([rng.choice(item, item.size) for item in items])
        sample.mean(), np.median(sample), trim_mean(sample, 0.25)


def _plain_improvement(x: list[list[float]], y: list[list[float]], resamples: int,
                       rng: np.random.Generator) -> None:
    xs, ys = [np.asarray(i) for i in x], [np.asarray(i) for i in y]
    for _ in range(resamples):
        a = np.concatenate([rng.choice(i, i.size) for i in xs])
        b = np.concatenate([rng.choice(i, i.size) for i in ys])
        mannwhitneyu(a, b)


def bootstrap_table() -> str:
    rows = []
    st.bootstrap_estimates(_strata(90, 0), resamples=100)  # imports
    for episodes in (90, 900, 3600):
        strata, other = _strata(episodes, 1), _strata(episodes, 2)
        started = time.perf_counter()
        st.bootstrap_estimates(strata, resamples=10_000, seed=0)
        ours = time.perf_counter() - started
        loop_resamples = 300
        started = time.perf_counter()
        _plain_loop(strata, loop_resamples, np.random.default_rng(0))
        loop = (time.perf_counter() - started) * 10_000 / loop_resamples
        started = time.perf_counter()
        st.improvement_interval(strata, other, resamples=10_000, seed=0)
        ours_p = time.perf_counter() - started
        started = time.perf_counter()
        _plain_improvement(strata, other, loop_resamples, np.random.default_rng(0))
        loop_p = (time.perf_counter() - started) * 10_000 / loop_resamples
        rows.append((str(episodes), f"{ours:.3f}", f"{loop:.2f}", f"{loop / ours:.0f}x",
                     f"{ours_p:.3f}", f"{loop_p:.2f}", f"{loop_p / ours_p:.0f}x"))
    return format_table(("episodes", "mean+median+IQM 10k s", "plain loop s", "speed-up",
                         "P(X>Y) 10k s", "plain loop s", "speed-up"), rows)


SCENARIOS = {
    "7 policies 0.25 apart": [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5],
    "7 like the fixture runs (top two 0.07 apart)": [0.2, 0.45, 0.6, 0.75, 0.9, 1.0, 1.07],
    "4 policies 0.1 apart": [0.7, 0.8, 0.9, 1.0],
}


def selection_table(trials: int, per_policy: int) -> str:
    rows = []
    for name, means in SCENARIOS.items():
        budget = per_policy * len(means)
        best = int(np.argmax(means))
        picked = kept = spent = uniform_picked = 0
        for trial in range(trials):
            def sample(item: WorkItem, trial: int = trial, means: list[float] = means
                       ) -> list[float]:
                rng = np.random.default_rng([trial, item.policy_index, item.index])
                return rng.normal(means[item.policy_index], 0.45, item.episodes).tolist()

            config = EvalConfig(episodes=budget, episodes_per_item=PER_ITEM, seed=trial,
                                progress=False, selection=SelectionConfig())
            selection, strata = simulate(len(means), config, sample)
            picked += selection.best(strata) == best
            kept += best in selection.active
            spent += sum(len(i) for items in strata.values() for i in items)
            # The uniform plan: the same items for every policy, the highest mean wins.
            uniform = [np.mean([sample(WorkItem(p, i, i, PER_ITEM))
                                for i in range(per_policy // PER_ITEM)]) for p in range(len(means))]
            uniform_picked += int(np.argmax(uniform)) == best
        rows.append((name, str(budget), f"{picked / trials:.1%}", f"{kept / trials:.1%}",
                     f"{spent / trials:.0f} ({spent / trials / budget:.0%})",
                     f"{uniform_picked / trials:.1%}"))
    return format_table(("scenario (std 0.45)", "budget", "select-best picks best",
                         "keeps best", "episodes spent (of budget)", "uniform picks best"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--per-policy", type=int, default=540,
                        help="uniform episodes per policy; the budget is this times the policies")
    args = parser.parse_args()
    print(bootstrap_table())
    print()
    print(selection_table(args.trials, args.per_policy))


if __name__ == "__main__":
    main()
