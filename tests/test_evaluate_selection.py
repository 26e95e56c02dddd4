"""The adaptive selection rule (deploy.evaluation.selection) as pure functions, and simulated on
synthetic policies whose true means are known. Pure Python: no Ray, no stand-in."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from deploy.evaluation import statistics as st
from deploy.evaluation.plan import EvalConfig, SelectionConfig, WorkItem, plan_items
from deploy.evaluation.selection import (
    RULE,
    Selection,
    Standing,
    comparison_level,
    eliminate,
    max_rounds,
    simulate,
    standard_error,
)


def _config(budget: int, seed: int = 0, **selection: object) -> EvalConfig:
    return EvalConfig(episodes=budget, episodes_per_item=18, seed=seed, progress=False,
                      selection=SelectionConfig(**selection))


def _normal_policies(means: list[float], sd: float, trial: int):
    """Item returns drawn from N(mean, sd), a function of (trial, policy, item) alone."""
    def sample(item: WorkItem) -> list[float]:
        rng = np.random.default_rng([trial, item.policy_index, item.index])
        return rng.normal(means[item.policy_index], sd, item.episodes).tolist()
    return sample


def _stick_policies(shares: list[float], trial: int):
    """Huggy-like returns: 2 + noise when the episode reaches the stick (with the policy's
    share), else noise around 0: bimodal, far from normal. True mean 2 * share."""
    def sample(item: WorkItem) -> list[float]:
        rng = np.random.default_rng([trial, item.policy_index, item.index, 7])
        reached = rng.random(item.episodes) < shares[item.policy_index]
        return (2.0 * reached + rng.normal(0.0, 0.3, item.episodes)).tolist()
    return sample


def test_rounds_and_level_by_hand() -> None:
    # 7 policies, 35 items: round 1 costs 7, every later one at least 2: 1 + 28 // 2 rounds.
    assert max_rounds(7, 35, 1) == 15
    assert max_rounds(7, 6, 1) == 0 and max_rounds(2, 10, 2) == 1 + 6 // 4
    assert comparison_level(0.95, 7, 15) == pytest.approx(0.05 / 90)
    assert comparison_level(0.9, 1, 3) == pytest.approx(0.1 / 3)


def test_eliminate_by_hand() -> None:
    found = {0: Standing(1.0, 0.1), 1: Standing(0.5, 0.1), 2: Standing(0.9, 0.1)}
    # level 0.025: z = 1.96; policy 1: 0.5 - 1.96 * 0.1414 = 0.223 > 0; policy 2: 0.1 - 0.277 < 0
    assert eliminate(found, 0.025) == [1]
    # z(1 - 1e-6) = 4.75: 0.5 < 4.75 * 0.1414, nothing is dropped
    assert eliminate(found, 1e-6) == []
    assert NormalDist().inv_cdf(1 - 1e-6) * math.hypot(0.1, 0.1) > 0.5


def test_standard_error_of_mean_by_hand() -> None:
    # Items {0, 2} and {1, 1, 4}: s^2 = 2 and 3; sqrt(2 * 2 + 3 * 3) / 5
    assert standard_error([[0.0, 2.0], [1.0, 1.0, 4.0]], "mean") == pytest.approx(
        math.sqrt(13) / 5, abs=1e-12)
    # The median's bootstrap standard error of a one-item sample equals scipy's bootstrap's
    # within Monte Carlo error (2,000 resamples: about 3%).
    from scipy import stats as scipy_stats
    sample = np.random.default_rng(2).normal(0, 1, 80)
    theirs = scipy_stats.bootstrap((sample,), np.median, n_resamples=4000, random_state=1)
    assert standard_error([sample], "median") == pytest.approx(theirs.standard_error, rel=0.12)


def test_rounds_are_whole_items_of_the_uniform_plan() -> None:
    config = _config(budget=18 * 9)  # 9 items for 3 policies
    selection = Selection(3, config)
    first = selection.next_round({})
    assert first == [WorkItem(p, 0, 0, 18) for p in range(3)]
    strata = {p: [[float(p)] * 18] for p in range(3)}  # one item each: no test yet (MIN_ITEMS)
    second = selection.next_round(strata)
    assert [(item.policy_index, item.index, item.seed) for item in second] == \
        [(0, 1, 1), (1, 1, 1), (2, 1, 1)]
    uniform = set(plan_items(3, EvalConfig(episodes=54, episodes_per_item=18)))
    assert set(first + second) <= uniform  # each policy's items: a prefix of its uniform plan
    # A failed policy gets no more items; 6 of 9 items spent, the next round of 2 fits.
    strata = {p: [[0.0, 1.0] * 9] * 2 for p in range(3)}
    third = selection.next_round(strata, failed=[1])
    assert [(item.policy_index, item.index) for item in third] == [(0, 2), (2, 2)]
    assert selection.next_round({0: strata[0] * 2, 2: strata[2] * 2}) == []  # budget spent
    assert selection.scheduled_episodes() == [54, 36, 54]
    with pytest.raises(ValueError, match=r"--episodes 40 \(the budget of all policies together\) "
                                         r"is too small for one round: 3 policies x 1 item x 18 "
                                         r"episodes need 54"):
        Selection(3, _config(budget=40))


def test_selection_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="statistic must be one of mean, median, iqm, got 'max'"):
        SelectionConfig(statistic="max")
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 1.0"):
        SelectionConfig(confidence=1.0)
    with pytest.raises(ValueError, match="round_items must be an integer >= 1, got 0"):
        SelectionConfig(round_items=0)


def _run(means: list[float] | None, trials: int, budget: int, statistic: str = "mean",
         shares: list[float] | None = None) -> dict[str, float]:
    """Selection over `trials` independent worlds: how often it picked the true best, kept it,
    ended with one policy; mean episodes spent."""
    truth = means if means is not None else [2 * share for share in shares]
    best = int(np.argmax(truth))
    picked = kept = alone = spent = 0
    for trial in range(trials):
        sample = (_normal_policies(means, 0.45, trial) if means is not None
                  else _stick_policies(shares, trial))
        selection, strata = simulate(len(truth), _config(budget, seed=trial * 100,
                                                         statistic=statistic), sample)
        picked += selection.best(strata) == best
        kept += best in selection.active
        alone += len(selection.active) == 1
        spent += sum(len(item) for items in strata.values() for item in items)
    return {"picked": picked / trials, "kept": kept / trials, "alone": alone / trials,
            "spent": spent / trials}


def test_large_gaps_pick_the_best_always_and_spend_a_fraction_of_the_uniform_budget() -> None:
    # Seven policies 0.25 apart (std 0.45), 1,260 episodes: uniform gives each 180.
    means = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    found = _run(means, trials=100, budget=7 * 180)
    assert found["picked"] == 1.0 and found["alone"] == 1.0
    assert found["spent"] < 0.5 * 7 * 180  # it stopped with one policy, well inside the budget


@pytest.mark.statistics
def test_close_gaps_keep_the_best_at_the_stated_rate() -> None:
    """The best is never dropped in at least 95% of worlds (the rule's bound), even where the
    budget cannot separate the top two (0.1 apart)."""
    means = [0.6, 0.8, 0.9, 1.0]
    found = _run(means, trials=200, budget=4 * 180)
    assert found["kept"] >= 0.95
    assert found["picked"] >= found["kept"] - 0.4  # the leader among the kept: no promise
    assert found["spent"] <= 4 * 180


@pytest.mark.statistics
def test_equal_policies_are_rarely_dropped() -> None:
    """All four equally good: any drop is a false rejection, at most 5% of worlds for each."""
    drops = np.zeros(4)
    for trial in range(150):
        selection, _ = simulate(4, _config(4 * 126, seed=trial),
                                _normal_policies([1.0] * 4, 0.45, trial))
        drops[list(selection.dropped)] += 1
    assert drops.max() / 150 <= 0.05


@pytest.mark.statistics
def test_bimodal_returns_and_iqm_ranking() -> None:
    """Huggy-like bimodal returns (reached the stick or not), ranked by mean and by IQM."""
    shares = [0.2, 0.4, 0.6, 0.9]
    by_mean = _run(None, trials=100, budget=4 * 180, shares=shares)
    assert by_mean["picked"] >= 0.95 and by_mean["spent"] < 0.6 * 4 * 180
    by_iqm = _run(None, trials=20, budget=4 * 180, statistic="iqm", shares=shares)
    assert by_iqm["kept"] >= 0.95


def test_outcome_names_the_rule_and_spending() -> None:
    config = _config(budget=7 * 180, seed=3)
    means = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    selection, strata = simulate(7, config, _normal_policies(means, 0.45, 3))
    labels = [f"run@{k}" for k in range(7)]
    outcome = selection.outcome(labels, strata)
    assert outcome.best == "run@6" and outcome.rule == RULE == \
        "successive-elimination-bonferroni"
    assert outcome.budget == 1260 and outcome.confidence == 0.95
    assert outcome.remaining == ["run@6"]
    assert outcome.dropped == {labels[p]: 18 * len(strata[p]) for p in range(6)}
    assert outcome.episodes_spent == sum(18 * len(items) for items in strata.values())
    assert outcome.comparison_level == pytest.approx(0.05 / (6 * outcome.max_rounds))
    best = st.mean(np.concatenate(strata[6])[None])[0]
    assert best > max(st.mean(np.concatenate(strata[p])[None])[0] for p in range(6))
