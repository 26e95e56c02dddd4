"""The schedule of a tournament (`huggy tournament`), as pure functions over matches: no Ray, no
files. `Schedule.next_round` says which matches to play next; `simulate` runs a schedule against
a synthetic match sampler.

Rounds. A round is K(K - 1) matches for K policies: K(K - 1) / 2 couples, a couple being two
matches of one pair with the sides swapped (A as team 0 against B, then B as team 0 against A),
so each policy of a pair plays each side equally often and a side advantage cancels in its
score. Matches are numbered in schedule order and match i is seeded `seed + i`, so a result
depends on neither the runners nor retries. Only whole rounds are played: a budget that is not a
multiple of the round leaves the rest unspent.

- Round-robin: every round gives every pair one couple, pairs in label order.
- Adaptive (`adaptive=True`): after `round_robin_rounds` round-robin rounds, each round gives its
  couples to the candidate pairs (every pair; with `select_best`, the leader's pairs) in
  proportion to each pair's probability of being in the wrong order (`uncertain_shares`).
- Stopping (`select_best=True`, RULE): the tournament stops once the leader clears every other
  policy at a Bonferroni-corrected level (`leader_clears`; why the level bounds the error: the
  comment above `comparison_level`), or when the budget has no room for another round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from deploy.evaluation import ratings
from deploy.evaluation.plan import ENV_SEED_LIMIT

RULE = "leader-clears-all-bonferroni"
"""The stopping rule's name, as tournament.json's "selection" gives it."""


@dataclass(frozen=True)
class Fixture:
    """A scheduled match: `team0` plays team 0 against `team1`, in an arena reset with `seed`."""

    index: int
    seed: int
    team0: str
    team1: str

    def played(self, score: float, reward0: float | None = None, reward1: float | None = None,
               steps: int | None = None) -> ratings.Match:
        """The match with its result.

        Args:
            score: team 0's score: 1, 0.5 or 0.
            reward0: team 0's final reward, when known.
            reward1: team 1's final reward, when known.
            steps: decisions the episode took, when known.

        Returns:
            The match.

        Raises:
            ValueError: a score other than 1, 0.5 or 0.
        """
        return ratings.Match(self.index, self.seed, self.team0, self.team1, score, reward0,
                             reward1, steps)


def pairs_of(count: int) -> list[tuple[int, int]]:
    """Every pair of policies in label order.

    Args:
        count: how many policies.

    Returns:
        (i, j), i < j: (0, 1), (0, 2), ..., (1, 2), ...
    """
    return [(i, j) for i in range(count) for j in range(i + 1, count)]


def couples(labels: Sequence[str], pairs: Sequence[tuple[int, int]], seed: int, start: int
            ) -> list[Fixture]:
    """Two fixtures per pair, in order: labels[i] as team 0 against labels[j], then the sides swapped.

    Args:
        labels: the policies.
        pairs: (i, j) pairs of indices into `labels`, repeats allowed.
        seed: the tournament's seed.
        start: the first fixture's number.

    Returns:
        The fixtures, numbered from `start`, match k seeded `seed + k`.
    """
    fixtures: list[Fixture] = []
    for i, j in pairs:
        for team0, team1 in ((i, j), (j, i)):
            index = start + len(fixtures)
            fixtures.append(Fixture(index, seed + index, labels[team0], labels[team1]))
    return fixtures


def round_robin(labels: Sequence[str], rounds: int = 1, seed: int = 0, start: int = 0
                ) -> list[Fixture]:
    """Round-robin rounds: each gives every pair in label order one couple (see `couples`).

    Args:
        labels: the policies.
        rounds: how many rounds.
        seed: the tournament's seed.
        start: the first fixture's number.

    Returns:
        The fixtures, numbered from `start`, match k seeded `seed + k`.
    """
    return couples(labels, pairs_of(len(labels)) * rounds, seed, start)


def order_z(fit: ratings.EloFit, covariance: np.ndarray, pairs: Sequence[tuple[int, int]]
            ) -> np.ndarray:
    """How many standard errors apart the two policies of each pair are.

    Args:
        fit: the Bradley-Terry fit.
        covariance: its `ratings.elo_covariance`.
        pairs: (i, j) pairs of indices.

    Returns:
        z = |Elo_i - Elo_j| / se(Elo_i - Elo_j) per pair (0 where the standard error is 0).
    """
    found = []
    for i, j in pairs:
        error = ratings.difference_std_error(covariance, i, j)
        found.append(0.0 if error == 0 else abs(float(fit.elo[i] - fit.elo[j])) / error)
    return np.array(found)


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split a count in proportion to weights by largest remainders, ties to the earlier entry.

    Args:
        total: the count.
        weights: >= 0, not all 0.

    Returns:
        One whole share per weight, summing to `total`.
    """
    shares = np.asarray(weights, dtype=np.float64)
    exact = total * shares / shares.sum()
    counts = np.floor(exact).astype(int)
    remainders = exact - counts
    for k in sorted(range(len(shares)), key=lambda k: (-remainders[k], k))[:total - counts.sum()]:
        counts[k] += 1
    return [int(n) for n in counts]


def uncertain_shares(total: int, z: np.ndarray) -> list[int]:
    """Split a round's couples among pairs by how uncertain their order is.

    Each pair's weight is Phi(-z), with z = |Elo_A - Elo_B| / se(Elo_A - Elo_B) from the
    Bradley-Terry fit of all matches so far and its large-sample covariance
    (`ratings.elo_covariance`): the posterior probability, under a flat prior and the normal
    approximation, that the better-rated one is the worse. Couples are apportioned by largest
    remainders (ties to the pair first in label order), so a pair whose order is clear gets none,
    and a pair of equals takes nearly all. Computed in log space, so pairs that are all far apart
    still get their shares by how far.

    Args:
        total: the round's couples.
        z: each candidate pair's z (`order_z`).

    Returns:
        Couples per pair.
    """
    from scipy.special import log_ndtr

    logs = log_ndtr(-np.asarray(z, dtype=np.float64))
    return apportion(total, np.exp(logs - logs.max()))


def max_rounds(num_policies: int, budget: int) -> int:
    """Whole rounds of K(K - 1) matches that a budget allows.

    Args:
        num_policies: K.
        budget: matches in all.

    Returns:
        The rounds.
    """
    return budget // (num_policies * (num_policies - 1))


def first_look(num_policies: int, budget: int, round_robin_rounds: int) -> int:
    """The round after which the stopping rule first looks.

    Args:
        num_policies: K.
        budget: matches in all.
        round_robin_rounds: the round-robin rounds.

    Returns:
        `round_robin_rounds`, or the last round when the budget allows fewer.
    """
    return min(round_robin_rounds, max_rounds(num_policies, budget))


def max_looks(num_policies: int, budget: int, round_robin_rounds: int) -> int:
    """The looks of the stopping rule that a budget allows: after the first look's round
    (`first_look`) and after every later round.

    Args:
        num_policies: K.
        budget: matches in all.
        round_robin_rounds: the round-robin rounds.

    Returns:
        R, the looks.
    """
    return max_rounds(num_policies, budget) - first_look(num_policies, budget,
                                                         round_robin_rounds) + 1


# Error bound: let B be the strongest policy (highest Bradley-Terry strength). The rule names a
# policy L != B only if the one-sided test "L above B" rejects falsely at some look; there are at
# most (K - 1) R such tests (K - 1 candidates for L, R looks), each at level alpha', so by the union
# bound P(the rule stops and names a policy that is not the strongest) <= 1 - confidence. The
# tests are normal approximations of the maximum-likelihood fit given the matches each pair has
# had; with adaptive rounds those counts depend on earlier results, and the simulations in the
# tests check the stated rate. When the budget ends first, no claim is made: the pick is the
# leader, with no guarantee beyond its interval. Bradley-Terry assumes transitive strengths:
# where policies beat each other in a circle, the model, and so the bound, describes them only on
# average.
def comparison_level(confidence: float, num_policies: int, looks: int) -> float:
    """The level of each one-sided test.

    Args:
        confidence: the probability that the rule does not name a policy that is not the
            strongest.
        num_policies: K.
        looks: R, the most looks the budget allows.

    Returns:
        alpha' = (1 - confidence) / ((K - 1) R), K - 1 and R counted as at least 1.
    """
    return (1.0 - confidence) / (max(1, num_policies - 1) * max(1, looks))


def leader_clears(fit: ratings.EloFit, covariance: np.ndarray, level: float
                  ) -> tuple[int, float]:
    """The stopping rule at one look (after each round from round `round_robin_rounds` on, or after
    the last round when the budget allows fewer): the leader L is the policy with the highest Elo,
    and the tournament stops when the leader's lower bound clears every other policy's upper bound,
    in the pairwise form

        Elo_L - Elo_i - z(1 - alpha') se(Elo_L - Elo_i) > 0 for every i != L,
        alpha' = (1 - confidence) / ((K - 1) R),

    se from the model's covariance, K the number of policies and R the most looks the budget
    allows (`max_looks`).

    Args:
        fit: the Bradley-Terry fit of all matches so far.
        covariance: its `ratings.elo_covariance`.
        level: alpha'.

    Returns:
        The leader (highest Elo, the first in label order among equals) and its smallest margin
            min_i Elo_L - Elo_i - z(1 - level) se(Elo_L - Elo_i): positive when it clears every
            other.
    """
    leader = min(range(len(fit.labels)), key=lambda k: (-fit.elo[k], k))
    z = NormalDist().inv_cdf(1.0 - level)
    margin = min(float(fit.elo[leader] - fit.elo[i])
                 - z * ratings.difference_std_error(covariance, leader, i)
                 for i in range(len(fit.labels)) if i != leader)
    return leader, margin


@dataclass(frozen=True)
class ScheduleConfig:
    """How a tournament spends its matches.

    Raises:
        ValueError: `matches` or `round_robin_rounds` not an integer >= 1, a seed for which
            seed + matches passes the environment's seed range, a confidence outside (0, 1), or a
            smoothing that is not a finite number > 0.
    """

    matches: int
    """The budget: matches of all pairs together (whole rounds of K(K - 1) only)."""
    seed: int = 0
    """Match i is seeded `seed + i`."""
    adaptive: bool = False
    """After the round-robin rounds, give each round to the pairs whose order is least certain."""
    select_best: bool = False
    """Stop once the leader clears every other policy (RULE)."""
    confidence: float = 0.95
    """With `select_best`: the probability that the rule does not name a policy that is not the
    strongest."""
    round_robin_rounds: int = 2
    """Round-robin rounds before the first adaptive round and the first look."""
    smoothing: float = ratings.SMOOTHING
    """The fit's smoothing (see `ratings.fit_elo`)."""

    def __post_init__(self) -> None:
        for name in ("matches", "round_robin_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0 \
                or self.seed + self.matches > ENV_SEED_LIMIT:
            raise ValueError(f"seed must be an integer >= 0 with seed + matches <= "
                             f"{ENV_SEED_LIMIT} (environment seeds travel as float32), got seed "
                             f"{self.seed!r} and {self.matches} matches")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")
        if not (math.isfinite(self.smoothing) and self.smoothing > 0):
            raise ValueError(f"smoothing must be a finite number > 0, got {self.smoothing!r}")


class Schedule:
    """The state of one tournament's schedule.

    Args:
        labels: the policies, two or more, distinct.
        config: how the tournament spends its matches.

    Raises:
        ValueError: fewer than two labels, repeated labels, or a budget too small for one round.
    """

    def __init__(self, labels: Sequence[str], config: ScheduleConfig) -> None:
        self.labels = tuple(labels)
        if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"expected two or more distinct policy labels, got {list(labels)}")
        self.config = config
        size = len(self.labels)
        self.round_matches = size * (size - 1)
        self.rounds_max = max_rounds(size, config.matches)
        if self.rounds_max == 0:
            raise ValueError(f"--matches {config.matches} is too small for one round: {size} "
                             f"policies play {self.round_matches} matches a round (every pair, "
                             f"both sides)")
        self.first_look = first_look(size, config.matches, config.round_robin_rounds)
        self.looks_max = max_looks(size, config.matches, config.round_robin_rounds)
        self.level = comparison_level(config.confidence, size, self.looks_max)
        self.fixtures: list[Fixture] = []
        self.rounds = 0
        self.looks = 0
        self.cleared = False
        """Whether the stopping rule stopped the tournament."""
        self.margin: float | None = None
        """The leader's smallest margin at the last look (see `leader_clears`)."""
        self._gamma: np.ndarray | None = None

    def _fit(self, played: Sequence[ratings.Match]) -> tuple[ratings.EloFit, np.ndarray]:
        fit = ratings.fit_elo(played, self.labels, smoothing=self.config.smoothing,
                              start=self._gamma)
        self._gamma = fit.gamma
        return fit, ratings.elo_covariance(fit)

    def _check_played(self, played: Sequence[ratings.Match]) -> None:
        """Raise ValueError unless `played` holds each scheduled fixture's result once."""
        if sorted(match.index for match in played) != list(range(len(self.fixtures))):
            raise ValueError(f"expected the results of all {len(self.fixtures)} scheduled "
                             f"matches (indices 0 to {len(self.fixtures) - 1}, each once), got "
                             f"{len(played)} matches")
        for match in played:
            fixture = self.fixtures[match.index]
            if (fixture.seed, fixture.team0, fixture.team1) != \
                    (match.seed, match.team0, match.team1):
                raise ValueError(f"match {match.index} ({match.team0!r} vs {match.team1!r}, seed "
                                 f"{match.seed}) is not the scheduled {fixture}")

    def next_round(self, played: Sequence[ratings.Match]) -> list[Fixture]:
        """After a round (or before the first, with no matches): the fixtures of the next round.

        Args:
            played: the results of every fixture scheduled so far.

        Returns:
            The next round's fixtures; [] when the stopping rule is met or the budget has no room for
                another round.

        Raises:
            ValueError: `played` does not hold each scheduled fixture's result exactly once, or a
                result is not of its fixture.
        """
        self._check_played(played)
        config = self.config
        looking = config.select_best and self.rounds >= self.first_look
        adapting = config.adaptive and self.rounds >= config.round_robin_rounds
        if looking or adapting:
            fit, covariance = self._fit(played)
        if looking:
            self.looks += 1
            leader, self.margin = leader_clears(fit, covariance, self.level)
            self.cleared = self.margin > 0
            if self.cleared:
                return []
        if self.rounds >= self.rounds_max:
            return []
        start = len(self.fixtures)
        if adapting:
            if config.select_best:
                candidates = [(min(leader, i), max(leader, i))
                              for i in range(len(self.labels)) if i != leader]
            else:
                candidates = pairs_of(len(self.labels))
            shares = uncertain_shares(self.round_matches // 2,
                                      order_z(fit, covariance, candidates))
            chosen = [pair for pair, count in zip(candidates, shares, strict=True)
                      for _ in range(count)]
            fixtures = couples(self.labels, chosen, config.seed, start)
        else:
            fixtures = round_robin(self.labels, 1, config.seed, start)
        self.fixtures += fixtures
        self.rounds += 1
        return fixtures

    def matches_by_pair(self) -> dict[tuple[str, str], int]:
        """The matches scheduled so far for each pair, both sides.

        Returns:
            {(label, label) in label order: matches}.
        """
        counts = {(self.labels[i], self.labels[j]): 0 for i, j in pairs_of(len(self.labels))}
        order = {label: k for k, label in enumerate(self.labels)}
        for fixture in self.fixtures:
            first, second = sorted((fixture.team0, fixture.team1), key=order.__getitem__)
            counts[(first, second)] += 1
        return counts

    def outcome(self, played: Sequence[ratings.Match]) -> dict[str, Any]:
        """The "selection" entry of tournament.json.

        Args:
            played: every match played.

        Returns:
            How the budget was spent and, with `select_best`, what the rule decided ("best" is the
                leader of all `played`).
        """
        found: dict[str, Any] = {
            "mode": "adaptive" if self.config.adaptive else "round-robin",
            "budget": self.config.matches,
            "matches_spent": len(played),
            "rounds": self.rounds,
            "max_rounds": self.rounds_max,
            "round_robin_rounds": min(self.config.round_robin_rounds, self.rounds),
            "seed": self.config.seed,
        }
        if self.config.select_best:
            leader = None
            if played:
                fit = ratings.fit_elo(played, self.labels, smoothing=self.config.smoothing)
                leader = self.labels[int(np.argmax(fit.elo))]
            found.update({"best": leader, "cleared": self.cleared, "margin": self.margin,
                          "confidence": self.config.confidence, "looks": self.looks,
                          "max_looks": self.looks_max, "comparison_level": self.level,
                          "rule": RULE})
        return found


Sampler = Callable[[Fixture], float]
"""Team 0's score in one fixture (a function of the fixture alone)."""


def simulate(labels: Sequence[str], config: ScheduleConfig, sample: Sampler
             ) -> tuple[Schedule, list[ratings.Match]]:
    """Run the schedule to its end with `sample` as the arena.

    Args:
        labels: the policies.
        config: how the tournament spends its matches.
        sample: team 0's score in one fixture (a function of the fixture alone).

    Returns:
        The schedule and every match.

    Raises:
        ValueError: as `Schedule` raises.
    """
    schedule = Schedule(labels, config)
    played: list[ratings.Match] = []
    fixtures = schedule.next_round(played)
    while fixtures:
        played += [fixture.played(sample(fixture)) for fixture in fixtures]
        fixtures = schedule.next_round(played)
    return schedule, played
