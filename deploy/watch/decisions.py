"""The sequential rule of `huggy watch` for single-behavior scenes, as pure functions over episode
returns grouped by work item: no Ray, no files, no clock.

The rule (RULE):
- Policies come in the order the watch took them. The first is the baseline: the served policy
  (`--serve`), else the first checkpoint. It is rated at the first look and becomes the best.
- Each later policy X is the k-th comparison (k = 1, 2, ...) against the best B of that moment.
  Looks happen when X has the first n_1 < n_2 < ... < n_L work items of its plan (`looks`; item
  i of every policy is seeded `seed + i`, as in `huggy evaluate`), B's first n_j items beside
  them. At look j the difference d = stat(X) - stat(B) of the ranking statistic (IQM by default)
  gets the interval d +- z(1 - level_kj) sqrt(se_X^2 + se_B^2), se the statistic's standard
  error over the items (`deploy.evaluation.selection.standard_error`), with
  level_kj = alpha_k n_j / (n_1 + ... + n_L) and alpha_k = alpha 6 / (pi^2 k^2),
  alpha = 1 - confidence.
- The first look whose interval says so decides: "better" (its lower bound above 0: X becomes the
  best), "tied" (inside [-margin, +margin]) or "not better" (its upper bound below the margin);
  none by the last look: "undecided" (never the best). The two stops, which promote nothing, are
  read at level alpha n_j / (n_1 + ... + n_L) (`stop_level`), spending none of the watch's error.
Decisions depend only on the items by index, never on which runner finished first or when: a
watch restarted from its database decides the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from deploy.evaluation import statistics as stats
from deploy.evaluation.plan import check_ranking
from deploy.evaluation.selection import standard_error
from deploy.evaluation.summary import BOOTSTRAP_RESAMPLES, CONFIDENCE

RULE = "sequential-comparison-alpha-spending"
"""The decision rule's name, as watch.json gives it."""
VERDICTS = ("better", "tied", "not better")
"""What a look can decide; "undecided" when no look did."""
BASELINE_VERDICTS = ("served", "first")
"""The decision of the baseline: the served policy, else the first checkpoint."""


@dataclass(frozen=True)
class RuleSettings:
    """The sequential rule's settings (module docstring).

    Raises:
        ValueError: an unknown statistic, a confidence outside (0, 1), a negative margin, or looks
            that are not increasing item counts >= 1.
    """

    statistic: str = "iqm"
    """What compares policies: iqm (default), mean or median of the return."""
    confidence: float = 0.95
    """1 - the chance, over a whole watch, that a policy not better than the best is promoted."""
    margin: float = 0.1
    """In return units: differences within +-margin count as a tie."""
    looks: tuple[int, ...] = (4, 6, 8, 11, 14, 19, 26, 35, 48, 64)
    """Work items of a compared policy at each look (`looks_for(64, 10)`); the last is its
    budget."""
    seed: int = 0
    """Seeds the bootstraps (the watch's `--seed`)."""

    def __post_init__(self) -> None:
        check_ranking(self.statistic, self.confidence)
        if not self.margin >= 0.0:
            raise ValueError(f"margin must be >= 0, got {self.margin!r}")
        looks = list(self.looks)
        if not looks or any(isinstance(n, bool) or not isinstance(n, int) for n in looks) \
                or looks[0] < 1 or looks != sorted(set(looks)):
            raise ValueError(f"looks must be increasing item counts >= 1, got {self.looks!r}")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    def as_dict(self) -> dict[str, Any]:
        """The settings, JSON-ready.

        Returns:
            Every field, and the rule's name.
        """
        return {**asdict(self), "looks": list(self.looks), "rule": RULE}


def looks_for(budget_items: int, count: int) -> tuple[int, ...]:
    """`count` looks spaced geometrically from a sixteenth of a budget (at least 1 item) to the
    budget, rounded up.

    Geometric spacing looks often while a look's items are few and cheap, so a comparison stops
    soon after its evidence suffices (doubling overshot by up to half the items); the first look
    at budget/16 spends little of the error where only a large difference could be decided.

    Args:
        budget_items: the items of the last look.
        count: how many looks, >= 1.

    Returns:
        The increasing item counts (fewer than `count` where rounding makes two equal).

    Raises:
        ValueError: a budget or a count below 1.
    """
    if budget_items < 1 or count < 1:
        raise ValueError(f"expected a budget and a number of looks >= 1, got {budget_items} "
                         f"items and {count} looks")
    if count == 1:
        return (budget_items,)
    first = max(1.0, budget_items / 16)
    looks = {math.ceil(first * (budget_items / first) ** (j / (count - 1)) - 1e-9)
             for j in range(count)}
    return tuple(sorted(looks))


# Error bound: a policy is promoted only when a look of its comparison finds the lower bound of the
# difference above 0. Comparison k looks at most L times, look j at level level_kj, so it promotes a
# policy that is not better than its baseline with probability at most sum_j level_kj = alpha_k
# (union bound over its looks; each look's interval is a normal approximation, which the replay
# tests check). The bound holds whatever chose the baseline: the compared policy's items are used
# by no earlier decision, and the baseline's earlier items were kept for looking good (it was
# promoted, or it held), which can only make the compared policy look worse against it. Over the
# whole watch, P(any such promotion) <= sum_k alpha_k = alpha (6 / pi^2) sum_k 1/k^2 < alpha, however
# many checkpoints come. Within a comparison the error goes to the looks in proportion to their
# items: an early look decides only a large difference anyway, and the last look, where the close
# calls are made, keeps about half of alpha_k.
def comparison_alpha(k: int, alpha: float) -> float:
    """The error spent on the k-th comparison of a watch.

    Args:
        k: 1 for the first comparison, 2 for the second, ...
        alpha: the watch's error, 1 - confidence.

    Returns:
        alpha 6 / (pi^2 k^2); these sum to alpha over all k.

    Raises:
        ValueError: k < 1.
    """
    if k < 1:
        raise ValueError(f"comparisons count from 1, got k={k}")
    return alpha * 6.0 / (math.pi**2 * k * k)


def look_level(k: int, look: int, settings: RuleSettings) -> float:
    """The level of each side of look `look` of the k-th comparison.

    Args:
        k: the comparison, from 1.
        look: the look, from 0.
        settings: the rule.

    Returns:
        comparison_alpha(k) n_look / sum(n).
    """
    return comparison_alpha(k, settings.alpha) * settings.looks[look] / sum(settings.looks)


def stop_level(look: int, settings: RuleSettings) -> float:
    """The level of each side of the interval that stops a comparison without a promotion ("tied"
    or "not better") at look `look`.

    A stop promotes nothing, so it spends none of the watch's error: its level is the
    comparison's own, alpha n_look / sum(n), bounding at alpha the chance that a policy better
    than the best by more than the margin is called tied or not better.

    Args:
        look: the look, from 0.
        settings: the rule.

    Returns:
        alpha n_look / sum(n).
    """
    return settings.alpha * settings.looks[look] / sum(settings.looks)


def spread(x: stats.Strata, y: stats.Strata, statistic: str, seed: int = 0
           ) -> tuple[float, float]:
    """stat(X) - stat(Y) and the spread of its normal approximation, sqrt(se_X^2 + se_Y^2), X and
    Y independent: what every interval of the difference is made of (`interval`).

    Args:
        x: X's returns grouped by work item.
        y: Y's returns grouped by work item.
        statistic: "iqm", "mean" or "median".
        seed: seeds the bootstrap standard errors (of the IQM and the median).

    Returns:
        (difference, spread).

    Raises:
        ValueError: no episodes on a side.
    """
    metric = stats.METRICS[statistic]
    value = float(metric(_values(x)[None, :])[0] - metric(_values(y)[None, :])[0])
    return value, math.hypot(standard_error(x, statistic, seed), standard_error(y, statistic, seed))


def interval(value: float, scale: float, level: float) -> stats.Estimate:
    """value +- z(1 - level) scale: each side's error is `level` under the normal approximation.

    Args:
        value: the difference.
        scale: its spread (`spread`).
        level: the error of each side, in (0, 0.5).

    Returns:
        The difference with its interval.

    Raises:
        ValueError: a level outside (0, 0.5).
    """
    if not 0.0 < level < 0.5:
        raise ValueError(f"level must be in (0, 0.5), got {level!r}")
    half = NormalDist().inv_cdf(1.0 - level) * scale
    return stats.Estimate(value, value - half, value + half)


def difference(x: stats.Strata, y: stats.Strata, statistic: str, level: float, seed: int = 0
               ) -> stats.Estimate:
    """stat(X) - stat(Y) with the interval d +- z(1 - level) sqrt(se_X^2 + se_Y^2): each side's
    error is `level` under the normal approximation, X and Y independent.

    Args:
        x: X's returns grouped by work item.
        y: Y's returns grouped by work item.
        statistic: "iqm", "mean" or "median".
        level: the error of each side, in (0, 0.5).
        seed: seeds the bootstrap standard errors (of the IQM and the median).

    Returns:
        The difference with its interval.

    Raises:
        ValueError: no episodes on a side, or a level outside (0, 0.5).
    """
    return interval(*spread(x, y, statistic, seed), level)


def _values(strata: stats.Strata) -> np.ndarray:
    values = [np.asarray(item, dtype=np.float64) for item in strata if len(item)]
    if not values:
        raise ValueError("expected episodes, got none")
    return np.concatenate(values)


def verdict(promote: stats.Estimate, stop: stats.Estimate, margin: float) -> str | None:
    """What the intervals of the difference decide.

    Args:
        promote: X - best, with its interval at the promotion level (`look_level`).
        stop: the same difference, with its interval at the stopping level (`stop_level`).
        margin: the tie margin.

    Returns:
        "better" (promote.low > 0), "tied" (stop inside [-margin, margin]), "not better"
            (stop.high < margin), or None (look again).
    """
    if promote.low > 0:
        return "better"
    if -margin <= stop.low and stop.high <= margin:
        return "tied"
    if stop.high < margin:
        return "not better"
    return None


@dataclass(frozen=True)
class Candidate:
    """A policy the watch rates, in the order it was taken."""

    label: str
    fingerprint: str
    served: bool = False
    """The policy `--serve` served when the watch began (the first baseline)."""


@dataclass(frozen=True)
class Decision:
    """What the rule decided of one policy."""

    seq: int
    """The policy's place in the order taken."""
    label: str
    fingerprint: str
    verdict: str
    """"served" or "first" (the baseline), else one of VERDICTS, or "undecided"."""
    items: int
    """The policy's items behind the decision."""
    episodes: int
    estimate: stats.Estimate
    """Its statistic with its 95% stratified-bootstrap interval (as `huggy evaluate` reports)."""
    statistic: str
    best: str
    """The best policy after this decision."""
    against: str | None = None
    """The best it was compared with."""
    difference: stats.Estimate | None = None
    """Its statistic minus the best's, with the interval that decided."""
    comparison: int = 0
    """k: 1 for the first comparison of the watch (0 for the baseline)."""
    look: int = 0
    """The look that decided, from 1 (0 for the baseline)."""
    level: float | None = None
    """The error of each side of the deciding interval."""

    @property
    def promoted(self) -> bool:
        """Whether the policy became the best."""
        return self.verdict in ("better", *BASELINE_VERDICTS)

    def record(self) -> dict[str, Any]:
        """The decision as watch.json and the database keep it.

        Returns:
            Every field; intervals as {"value", "ci"}.
        """
        def shown(estimate: stats.Estimate | None) -> dict[str, Any] | None:
            return None if estimate is None else {"value": estimate.value,
                                                  "ci": estimate.as_list()}

        return {"seq": self.seq, "label": self.label, "fingerprint": self.fingerprint,
                "decision": self.verdict, "items": self.items, "episodes": self.episodes,
                "statistic": self.statistic, "estimate": shown(self.estimate),
                "best": self.best, "against": self.against,
                "difference": shown(self.difference), "comparison": self.comparison,
                "look": self.look, "level": self.level}


def describe(decision: Decision, settings: RuleSettings) -> str:
    """The progress line of a decision.

    Args:
        decision: the decision.
        settings: the rule.

    Returns:
        For example "Huggy@1200000: IQM 2.91 [2.80, 3.02], better than Huggy@1000000 with
            P >= 0.95 after 162 episodes".
    """
    estimate = decision.estimate
    name = {"iqm": "IQM", "mean": "mean", "median": "median"}[decision.statistic]
    head = (f"{decision.label}: {name} {estimate.value:.2f} [{estimate.low:.2f}, "
            f"{estimate.high:.2f}]")
    after = f"after {decision.episodes} episodes"
    if decision.verdict == "served":
        return f"{head}, the served policy: the baseline, {after}"
    if decision.verdict == "first":
        return f"{head}, the first checkpoint: the best so far, {after}"
    assert decision.difference is not None
    diff = decision.difference
    shown = f"(difference {diff.value:+.2f} [{diff.low:+.2f}, {diff.high:+.2f}])"
    against = decision.against
    text = {
        "better": f"better than {against} with P >= {settings.confidence:g}",
        "tied": f"tied with {against} within +-{settings.margin:g}",
        "not better": f"not better than {against} by more than {settings.margin:g}",
        "undecided": f"undecided against {against} at the budget: not promoted",
    }[decision.verdict]
    return f"{head}, {text} {shown} {after}"


StrataOf = Callable[[str, int], "stats.Strata | None"]
"""A policy's returns of its first n items (by fingerprint), or None until all n are recorded."""


@dataclass(frozen=True)
class Need:
    """Items a decision waits for: the first `items` items of the policy `fingerprint`."""

    fingerprint: str
    items: int


@dataclass
class Progress:
    """Where the rule stands over the policies taken so far."""

    decisions: list[Decision] = field(default_factory=list)
    """One per decided policy, in the order taken."""
    needs: list[Need] = field(default_factory=list)
    """The items to run next, most urgent first: what the pending decision waits for, then the
    first look of every later policy (needed whatever the pending decision gives)."""
    best: Candidate | None = None
    pending: Candidate | None = None
    """The policy being decided; None when every policy taken is decided."""


class Decider:
    """Decisions over the policies taken so far, recomputed from their items whenever asked
    (`run`), each look computed once.

    Args:
        settings: the rule.
    """

    def __init__(self, settings: RuleSettings) -> None:
        self.settings = settings
        self._estimates: dict[tuple[str, int], stats.Estimate] = {}
        self._spreads: dict[tuple[str, str, int], tuple[float, float]] = {}

    def run(self, candidates: Sequence[Candidate], strata_of: StrataOf) -> Progress:
        """Decide what the recorded items decide.

        Args:
            candidates: the policies in the order taken.
            strata_of: the returns of a policy's first n items, or None until they are recorded.

        Returns:
            The decisions, the best, the pending policy and the items it needs.
        """
        looks = self.settings.looks
        progress = Progress()
        if not candidates:
            return progress
        first = candidates[0]
        strata = strata_of(first.fingerprint, looks[0])
        if strata is None:
            progress.pending = first
            progress.needs = [Need(c.fingerprint, looks[0]) for c in candidates]
            return progress
        progress.best = first
        progress.decisions.append(Decision(
            0, first.label, first.fingerprint, "served" if first.served else "first", looks[0],
            _episodes(strata), self.estimate(first.fingerprint, strata), self.settings.statistic,
            first.label))
        for seq, candidate in enumerate(candidates[1:], start=1):
            decision, need = self._compare(seq, candidate, progress.best, strata_of)
            if decision is None:
                progress.pending = candidate
                progress.needs = [*need, *(Need(c.fingerprint, looks[0])
                                           for c in candidates[seq + 1:])]
                return progress
            if decision.promoted:
                progress.best = candidate
            progress.decisions.append(decision)
        return progress

    def _compare(self, seq: int, candidate: Candidate, best: Candidate, strata_of: StrataOf
                 ) -> tuple[Decision | None, list[Need]]:
        """The decision of the k-th comparison (k = seq), or the items its next look needs."""
        settings = self.settings
        for look, items in enumerate(settings.looks):
            mine = strata_of(candidate.fingerprint, items)
            theirs = strata_of(best.fingerprint, items)
            if mine is None or theirs is None:
                return None, [Need(candidate.fingerprint, items), Need(best.fingerprint, items)]
            levels = look_level(seq, look, settings), stop_level(look, settings)
            promote, stop = (self._difference(candidate, best, mine, theirs, level)
                             for level in levels)
            found = verdict(promote, stop, settings.margin)
            if found is None and look < len(settings.looks) - 1:
                continue
            diff, level = (promote, levels[0]) if found == "better" else (stop, levels[1])
            winner = candidate.label if found == "better" else best.label
            return Decision(seq, candidate.label, candidate.fingerprint, found or "undecided",
                            items, _episodes(mine),
                            self.estimate(candidate.fingerprint, mine), settings.statistic,
                            winner, best.label, diff, seq, look + 1, level), []
        raise AssertionError("the last look always decides")

    def _difference(self, candidate: Candidate, best: Candidate, mine: stats.Strata,
                    theirs: stats.Strata, level: float) -> stats.Estimate:
        """The difference of two policies' first items at a level; its spread (two bootstraps)
        computed once for every level."""
        key = (candidate.fingerprint, best.fingerprint, len(mine))
        if key not in self._spreads:
            self._spreads[key] = spread(mine, theirs, self.settings.statistic, self.settings.seed)
        return interval(*self._spreads[key], level)

    def estimate(self, fingerprint: str, strata: stats.Strata) -> stats.Estimate:
        """A policy's statistic with its 95% stratified-bootstrap interval, computed once.

        Args:
            fingerprint: the policy.
            strata: the returns of its first items.

        Returns:
            The estimate, as `huggy evaluate` reports it.
        """
        key = (fingerprint, len(strata))
        if key not in self._estimates:
            self._estimates[key] = stats.bootstrap_interval(
                strata, stats.METRICS[self.settings.statistic], CONFIDENCE, BOOTSTRAP_RESAMPLES,
                self.settings.seed)
        return self._estimates[key]


def _episodes(strata: stats.Strata) -> int:
    return sum(len(item) for item in strata)
