"""Adaptive selection of the best policy (`huggy evaluate --select-best`), as pure functions over
episodes grouped by work item: no Ray, no files. Scheduling asks `Selection.next_round` which
items to run next; `simulate` runs the same rule on synthetic policies.

The rule (RULE): successive elimination with Bonferroni-corrected one-sided tests.
- Rounds: every remaining policy gets `round_items` more whole work items (item i of a policy has
  seed `seed + i`, as in the uniform plan), so each policy's episodes are a prefix of its uniform
  plan, counted with per-slot quotas.
- After each round, once every remaining policy has `MIN_ITEMS` items: the leader L is the policy
  with the highest statistic (mean, median or IQM of the return). Policy i is dropped when
  `stat_L - stat_i - z * sqrt(se_L^2 + se_i^2) > 0`, z the standard normal's (1 - alpha')
  quantile, se the standard error of the statistic over i's items (for the mean the stratified
  estimator's, sqrt(sum_j s_j^2 n_j) / N with s_j item j's sample std; otherwise the stratified
  bootstrap's), and alpha' = (1 - confidence) / ((K - 1) R): K policies, R the most rounds the
  budget allows (`max_rounds`).
- It stops when one policy remains, or when the next round does not fit in the budget (the
  `--episodes` of all policies together); the pick is the leader among the remaining.

Why the best is dropped with probability at most 1 - confidence: see the comment above
`comparison_level`, and docs/evaluation.md ("Picking the best checkpoint").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from deploy.evaluation import statistics as stats
from deploy.evaluation.plan import EvalConfig, WorkItem
from huggy_agent.tables import plural

RULE = "successive-elimination-bonferroni"
"""The decision rule's name, as evaluation.json's "selection" gives it."""
MIN_ITEMS = 2
"""Items each remaining policy needs before any policy is dropped (two estimates of spread)."""
SE_RESAMPLES = 2_000
"""Resamples behind the bootstrap standard error of the median and the IQM."""


def max_rounds(num_policies: int, budget_items: int, round_items: int) -> int:
    """The most rounds a budget allows: the first round costs `num_policies * round_items` items,
    every later one at least `2 * round_items` (two policies remain, or it stops).

    Args:
        num_policies: K.
        budget_items: the work items of the budget.
        round_items: items per remaining policy per round.

    Returns:
        The rounds; 0 when not even the first round fits.
    """
    first = num_policies * round_items
    if budget_items < first:
        return 0
    return 1 + (budget_items - first) // (2 * round_items)


# Error bound: a policy with the highest true statistic is dropped only if one of at most (K - 1) R
# one-sided tests "leader > it" rejects falsely: policy i's k-th item is the same whatever the
# schedule, so each test's outcome is fixed in advance and the union bound applies. With each test
# at its nominal level alpha', P(the best is ever dropped) <= 1 - confidence. When one policy
# remains, it is the best with at least that probability; when the budget ends first, the best is
# among the remaining with at least that probability. The tests are normal approximations, which
# the simulations in the tests check at the stated rate.
def comparison_level(confidence: float, num_policies: int, rounds: int) -> float:
    """The level of each one-sided test.

    Args:
        confidence: the probability that the best policy is never dropped.
        num_policies: K.
        rounds: R, the most rounds the budget allows.

    Returns:
        alpha' = (1 - confidence) / ((K - 1) R), K - 1 and R counted as at least 1.
    """
    return (1.0 - confidence) / (max(1, num_policies - 1) * max(1, rounds))


def standard_error(strata: stats.Strata, statistic: str, seed: int = 0) -> float:
    """The standard error of a statistic over a policy's items.

    Args:
        strata: the policy's returns grouped by work item.
        statistic: "mean", "median" or "iqm".
        seed: seeds the bootstrap of the median and the IQM.

    Returns:
        For the mean, the stratified estimator's sqrt(sum_j s_j^2 n_j) / N (s_j item j's sample
            std, 0 for a one-episode item); otherwise the std of its stratified bootstrap
            distribution (`SE_RESAMPLES` resamples).
    """
    if statistic == "mean":
        sizes = np.array([len(item) for item in strata])
        values = np.concatenate([np.asarray(item, dtype=np.float64) for item in strata])
        values = values - values.mean()
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        sums = np.add.reduceat(values, starts)
        squares = np.add.reduceat(values * values, starts) - sums * sums / sizes  # s_j^2 (n_j-1)
        several = sizes > 1
        spread = np.sum(np.maximum(squares[several], 0.0) * sizes[several] / (sizes[several] - 1))
        return math.sqrt(float(spread)) / int(sizes.sum())
    draws = stats.bootstrap_distribution(strata, stats.METRICS[statistic], SE_RESAMPLES, seed)
    return float(np.std(draws, ddof=1))


@dataclass(frozen=True)
class Standing:
    """A policy's statistic and its standard error after a round."""

    value: float
    std_error: float


def standings(strata_by_policy: Mapping[int, stats.Strata], statistic: str, seed: int = 0
              ) -> dict[int, Standing]:
    """Each policy's statistic over all its episodes and its standard error.

    Args:
        strata_by_policy: {policy index: returns grouped by work item}.
        statistic: "mean", "median" or "iqm".
        seed: seeds the bootstrap standard errors.

    Returns:
        {policy index: standing}.
    """
    metric = stats.METRICS[statistic]
    found = {}
    for index, strata in strata_by_policy.items():
        values = np.concatenate([np.asarray(item, dtype=np.float64) for item in strata])
        found[index] = Standing(float(metric(values[None, :])[0]),
                                standard_error(strata, statistic, seed))
    return found


def leader_of(found: Mapping[int, Standing]) -> int:
    """The policy with the highest statistic (the lowest index among equals).

    Args:
        found: {policy index: standing}.

    Returns:
        Its index.
    """
    return min(found, key=lambda index: (-found[index].value, index))


def eliminate(found: Mapping[int, Standing], level: float) -> list[int]:
    """The policies worse than the leader at a one-sided level each: those with
    stat_L - stat_i - z(1 - level) sqrt(se_L^2 + se_i^2) > 0.

    Args:
        found: {policy index: standing}.
        level: each test's level, alpha'.

    Returns:
        Their indices.
    """
    leader = leader_of(found)
    z = NormalDist().inv_cdf(1.0 - level)
    best = found[leader]
    return [index for index, other in found.items() if index != leader
            and best.value - other.value - z * math.hypot(best.std_error, other.std_error) > 0]


def check_budget(num_policies: int, config: EvalConfig) -> int:
    """The most rounds the selection of `num_policies` policies can run within `config`'s budget.

    Args:
        num_policies: K.
        config: the evaluation's settings, `selection` set.

    Returns:
        The rounds, at least 1.

    Raises:
        ValueError: not even one round fits (with the numbers).
    """
    assert config.selection is not None
    round_items = config.selection.round_items
    rounds = max_rounds(num_policies, config.episodes // config.episodes_per_item, round_items)
    if rounds == 0:
        need = num_policies * round_items * config.episodes_per_item
        raise ValueError(f"--episodes {config.episodes} (the budget of all policies together) "
                         f"is too small for one round: {plural(num_policies, 'policy', 'policies')}"
                         f" x {plural(round_items, 'item')} x "
                         f"{plural(config.episodes_per_item, 'episode')} need {need}")
    return rounds


@dataclass(frozen=True)
class SelectionOutcome:
    """What the adaptive selection decided: evaluation.json's "selection" (`asdict`)."""

    best: str | None
    """The leader among the remaining policies (None: no policy finished an episode)."""
    statistic: str
    confidence: float
    episodes_spent: int
    budget: int
    dropped: dict[str, int]
    """Dropped policy -> episodes it had when dropped."""
    remaining: list[str]
    rounds: int
    max_rounds: int
    comparison_level: float
    rule: str = RULE

    def text(self) -> str:
        """The selection in one line: its pick, spending and drops.

        Returns:
            The line.
        """
        dropped = ", ".join(f"{label} after {episodes}" for label, episodes
                            in self.dropped.items()) or "none"
        verdict = ("one policy left" if len(self.remaining) == 1
                   else f"budget spent with {len(self.remaining)} policies left")
        return (f"selection ({self.rule}, confidence {self.confidence}): {self.best}; {verdict}; "
                f"{self.episodes_spent} of {self.budget} episodes in {self.rounds} rounds; "
                f"dropped: {dropped}")


class Selection:
    """The state of one adaptive selection.

    Args:
        num_policies: K.
        config: the evaluation's settings, `selection` set; `config.episodes` is the budget of all
            policies together.

    Raises:
        ValueError: `config.selection` is None, or not even one round fits the budget.
    """

    def __init__(self, num_policies: int, config: EvalConfig) -> None:
        if config.selection is None:
            raise ValueError("expected an EvalConfig with selection set")
        self.config = config
        self.settings = config.selection
        self.num_policies = num_policies
        self.budget_items = config.episodes // config.episodes_per_item
        self.rounds_max = check_budget(num_policies, config)
        self.level = comparison_level(self.settings.confidence, num_policies, self.rounds_max)
        self.active = list(range(num_policies))
        self.items_given = [0] * num_policies
        self.dropped: dict[int, int] = {}
        """Dropped policy -> episodes it had when dropped."""
        self.rounds = 0
        self.spent_items = 0

    def next_round(self, strata_by_policy: Mapping[int, stats.Strata],
                   failed: Sequence[int] = ()) -> list[WorkItem]:
        """After a round (or before the first, with no episodes): drop what the rule drops, then give the
        items of the next round.

        Args:
            strata_by_policy: every policy's returns so far, by item.
            failed: policies that failed and leave the selection.

        Returns:
            The next round's items; [] when one policy remains or the budget is spent.
        """
        self.active = [index for index in self.active if index not in failed]
        counted = {index: [item for item in strata_by_policy.get(index, ()) if len(item)]
                   for index in self.active}
        if len(self.active) > 1 and all(len(items) >= MIN_ITEMS for items in counted.values()):
            for index in eliminate(standings(counted, self.settings.statistic,
                                             self.config.seed), self.level):
                self.dropped[index] = sum(len(item) for item in counted[index])
                self.active.remove(index)
        cost = len(self.active) * self.settings.round_items
        if len(self.active) <= 1 or self.spent_items + cost > self.budget_items:
            return []
        items = []
        for index in self.active:
            for _ in range(self.settings.round_items):
                number = self.items_given[index]
                items.append(WorkItem(index, number, self.config.seed + number,
                                      self.config.episodes_per_item))
                self.items_given[index] += 1
        self.rounds += 1
        self.spent_items += cost
        return items

    def scheduled_episodes(self) -> list[int]:
        """The episodes scheduled for each policy so far.

        Returns:
            One count per policy.
        """
        return [count * self.config.episodes_per_item for count in self.items_given]

    def best(self, strata_by_policy: Mapping[int, stats.Strata]) -> int | None:
        """The leader among the remaining policies with episodes.

        Args:
            strata_by_policy: every policy's returns, by item.

        Returns:
            Its index; None if none has any.
        """
        counted = {index: [item for item in strata_by_policy.get(index, ()) if len(item)]
                   for index in self.active}
        counted = {index: items for index, items in counted.items() if items}
        if not counted:
            return None
        return leader_of(standings(counted, self.settings.statistic, self.config.seed))

    def outcome(self, labels: Sequence[str], strata_by_policy: Mapping[int, stats.Strata]
                ) -> SelectionOutcome:
        """What the selection decided, by label.

        Args:
            labels: the policies' labels.
            strata_by_policy: every policy's returns, by item.

        Returns:
            The outcome.
        """
        best = self.best(strata_by_policy)
        return SelectionOutcome(
            best=None if best is None else labels[best], statistic=self.settings.statistic,
            confidence=self.settings.confidence,
            episodes_spent=sum(len(item) for strata in strata_by_policy.values()
                               for item in strata),
            budget=self.config.episodes,
            dropped={labels[index]: episodes for index, episodes in self.dropped.items()},
            remaining=[labels[index] for index in self.active], rounds=self.rounds,
            max_rounds=self.rounds_max, comparison_level=self.level)


Sampler = Callable[[WorkItem], Sequence[float]]
"""The returns of one work item (a function of the item alone)."""


def simulate(num_policies: int, config: EvalConfig, sample: Sampler
             ) -> tuple[Selection, dict[int, list[Sequence[float]]]]:
    """Run the selection to its end with `sample` as the environment.

    Args:
        num_policies: K.
        config: the evaluation's settings, `selection` set.
        sample: the returns of one work item (a function of the item alone).

    Returns:
        The selection, and every policy's returns by item.

    Raises:
        ValueError: as `Selection` raises.
    """
    selection = Selection(num_policies, config)
    strata: dict[int, list[Sequence[float]]] = {index: [] for index in range(num_policies)}
    items = selection.next_round(strata)
    while items:
        for item in items:
            strata[item.policy_index].append(sample(item))
        items = selection.next_round(strata)
    return selection, strata
