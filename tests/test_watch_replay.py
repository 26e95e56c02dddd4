"""The sequential rule of `huggy watch` replayed over a training run of known quality: a run's
checkpoints (tests/fixtures/watch/generate.py: a real Huggy policy blended toward a weak network),
each with its truth of 3,600 episodes on the stand-in, kept in tests/fixtures/watch/truth.json.

At each of 3 seeds, the watch's items of a checkpoint are truth items drawn without replacement by
a seeded permutation (item i of the watch is truth item perm[i]), so the draws are reproducible.
Checked against the truth's own IQM over all 3,600 episodes: no checkpoint is promoted that is not
better than the best it was compared with, and the best at the end is the true best or within the
margin of it. The episodes the watch used are compared with those of the fixed-budget test it
replaces: one look at the watch's whole budget for every checkpoint, at the same error levels,
which must promote the same checkpoints; the watch must use at most half its episodes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from deploy.watch.decisions import Candidate, Decider, Decision, RuleSettings

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "watch"))
from generate import CHECKPOINTS, EPISODES_PER_ITEM, TRUTH_ITEMS, load_truth

SEEDS = (0, 1, 2)
SETTINGS = RuleSettings()  # the watch's defaults: IQM, 95%, margin 0.1, looks 2..64 items


def interquartile_mean(values: list[float]) -> float:
    """The mean of the middle half, by hand: a quarter (rounded down) cut from each end."""
    ordered = np.sort(np.asarray(values))
    cut = len(ordered) // 4
    return float(ordered[cut:len(ordered) - cut].mean())


@pytest.fixture(scope="module")
def truth() -> dict[int, list[tuple[tuple[float, ...], tuple[int, ...]]]]:
    return load_truth()


@pytest.fixture(scope="module")
def true_iqm(truth: dict) -> dict[int, float]:
    return {step: interquartile_mean([r for returns, _ in items for r in returns])
            for step, items in truth.items()}


def replay(truth: dict, seed: int, settings: RuleSettings) -> list[Decision]:
    """The decisions of a watch over the run's checkpoints in training order (the first one the
    served baseline), item i of each drawn from its truth by a seeded permutation."""
    rng = np.random.default_rng(seed)
    order = {str(step): rng.permutation(TRUTH_ITEMS) for step, _ in CHECKPOINTS}

    def strata_of(fingerprint: str, count: int) -> list[tuple[float, ...]]:
        return [truth[int(fingerprint)][i][0] for i in order[fingerprint][:count]]

    candidates = [Candidate(f"run@{step}", str(step), served=index == 0)
                  for index, (step, _) in enumerate(CHECKPOINTS)]
    progress = Decider(settings).run(candidates, strata_of)
    assert progress.pending is None
    return progress.decisions


def items_run(decisions: list[Decision]) -> int:
    """Items the watch ran: each policy's most items used, as the compared one or as the best."""
    most: dict[str, int] = {}
    for decision in decisions:
        most[decision.label] = max(most.get(decision.label, 0), decision.items)
        if decision.against is not None:
            most[decision.against] = max(most[decision.against], decision.items)
    return sum(most.values())


def test_the_truth_is_a_run_with_a_regression_and_close_calls(true_iqm: dict) -> None:
    assert len(true_iqm) == len(CHECKPOINTS)
    steps = [step for step, _ in CHECKPOINTS]
    unblended = next(step for step, blend in CHECKPOINTS if blend == 0.0)
    assert max(steps, key=true_iqm.__getitem__) == unblended  # the trained policy is the best
    assert true_iqm[steps[2]] < true_iqm[steps[1]]  # the regression
    # close calls: a checkpoint within the margin of the one before it
    assert any(abs(true_iqm[a] - true_iqm[b]) < SETTINGS.margin
               for a, b in zip(steps, steps[1:], strict=False))


@pytest.mark.statistics
@pytest.mark.parametrize("seed", SEEDS)
def test_a_replayed_watch_promotes_only_better_checkpoints_and_saves_episodes(
        truth: dict, true_iqm: dict, seed: int) -> None:
    settings = RuleSettings(seed=seed)
    decisions = replay(truth, seed, settings)
    truths = {f"run@{step}": value for step, value in true_iqm.items()}
    for decision in decisions[1:]:
        if decision.verdict == "better":
            assert truths[decision.label] > truths[decision.against], decision
    best = decisions[-1].best
    assert truths[best] >= max(truths.values()) - settings.margin
    used = items_run(decisions)
    budget = settings.looks[-1]
    fixed = replay(truth, seed, RuleSettings(looks=(budget,), seed=seed))
    assert [d.promoted for d in fixed] == [d.promoted for d in decisions], (fixed, decisions)
    fixed_items = budget * len(CHECKPOINTS)
    print(f"seed {seed}: {[d.verdict for d in decisions]}, best {best}; the watch ran "
          f"{used * EPISODES_PER_ITEM} episodes, one look at the budget "
          f"{fixed_items * EPISODES_PER_ITEM} ({[d.verdict for d in fixed]}): "
          f"{used / fixed_items:.0%}")
    assert used <= fixed_items / 2
