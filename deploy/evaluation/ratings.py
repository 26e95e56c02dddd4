"""Ratings of policies from two-team matches, as pure functions over matches: no Ray, no files,
no figures (those are `deploy.evaluation.rating_charts`).

A match is one episode of one arena, one policy as team 0 and another as team 1; its result is
team 0's score: 1 for a win, 0.5 for a draw, 0 for a loss, from the sign of team 0's final
(group) reward, as ML-Agents' ghost trainer decides a self-play match (`score_from_reward`).

Ratings are Bradley-Terry maximum-likelihood strengths on the Elo scale, fitted in batch from all
matches as OpenSpiel's `open_spiel/evaluation/elo.cc` does (Hunter's MM algorithm with a smoothing
pseudo-count; `fit_elo` states the objective). `rate` adds, per policy, a stratified-bootstrap
percentile interval (matches resampled within each pair of policies), the wins, draws and
losses, and for every pair P(A beats B) from the model and from the counts. `elo_covariance` is
the model's large-sample covariance, which the schedule (`deploy.evaluation.matchmaking`) uses to
decide which pairs to play and when to stop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from deploy.evaluation import statistics as stats

ELO_SCALE = 400.0
"""Elo points per factor of 10 in the odds of winning."""
MEAN_ELO = 1200.0
"""The mean rating when no policy is anchored (the Hugging Face leaderboard's start)."""
SMOOTHING = 0.01
"""Pseudo-wins each policy gets against every other (OpenSpiel's default smoothing factor)."""
MAX_ITERATIONS = 2000
"""Most MM iterations per fit (OpenSpiel's default)."""
CONVERGENCE_DELTA = 1e-10
"""The fit stops when no normalised strength (they sum to 1) moves by this much in an iteration
(OpenSpiel's default)."""
DEFAULT_RESAMPLES = stats.DEFAULT_RESAMPLES
DEFAULT_CONFIDENCE = stats.DEFAULT_CONFIDENCE
BOOTSTRAP_STRATA = "pairs"
"""What the bootstrap resamples within: each pair of policies keeps its match count."""
SCORES = (0.0, 0.5, 1.0)
"""Team 0's score for a loss, a draw and a win."""


def score_from_reward(final_reward: float) -> float:
    """Team 0's score from the sign of its final reward, as ML-Agents' ghost trainer (mlagents 1.1.0,
    `GhostTrainer._process_trajectory`) scores a self-play episode. That trainer skips episodes
    interrupted at the step limit; a tournament counts such a match, final reward 0 in SoccerTwos,
    as a draw.

    Args:
        final_reward: an agent's reward plus group reward of its last step.

    Returns:
        1 if positive, 0 if negative, 0.5 for exactly 0.

    Raises:
        ValueError: a reward that is not finite.
    """
    if not math.isfinite(final_reward):
        raise ValueError(f"expected a finite final reward, got {final_reward!r}")
    return 1.0 if final_reward > 0 else 0.0 if final_reward < 0 else 0.5


def expected_score(elo: float | np.ndarray, opponent: float | np.ndarray) -> Any:
    """The model's P(a policy rated `elo` beats one rated `opponent`), a draw counting half.

    Args:
        elo: a rating, or an array of them.
        opponent: the opponent's rating, or an array of them.

    Returns:
        1 / (1 + 10^((opponent - elo) / 400)), elementwise on arrays.
    """
    return 1.0 / (1.0 + np.power(10.0, (np.asarray(opponent) - np.asarray(elo)) / ELO_SCALE))


@dataclass(frozen=True)
class Match:
    """One played match: one episode of one arena with fixed seed, `team0` playing team 0."""

    index: int
    """The match's place in the schedule (match i is seeded `seed + i` of the tournament)."""
    seed: int
    """The arena's reset seed."""
    team0: str
    """The label of the policy playing team 0."""
    team1: str
    """The label of the policy playing team 1."""
    score: float
    """Team 0's score: 1 win, 0.5 draw, 0 loss (`score_from_reward`)."""
    reward0: float | None = None
    """Team 0's final reward (what `score_from_reward` read), when known."""
    reward1: float | None = None
    """Team 1's final reward, when known."""
    steps: int | None = None
    """Decisions the episode took, when known."""

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"match {self.index}: score must be 1 (team 0 won), 0.5 (draw) or 0 "
                             f"(team 0 lost), got {self.score!r}")
        for side, label in (("team0", self.team0), ("team1", self.team1)):
            if not isinstance(label, str) or not label:
                raise ValueError(f"match {self.index}: {side} must be a policy label (a "
                                 f"non-empty string), got {label!r}")


@dataclass(frozen=True)
class Tally:
    """The matches of a tournament counted by pairing: `outcomes[i, j]` holds (wins, draws,
    losses) of `labels[i]` as team 0 against `labels[j]` as team 1."""

    labels: tuple[str, ...]
    outcomes: np.ndarray
    """(K, K, 3) int64; the diagonal is zero."""

    @property
    def scores(self) -> np.ndarray:
        """(K, K) float64: W[i, j] = wins of i over j + half the draws between them, both sides."""
        return _scores(self.outcomes)

    @property
    def matches(self) -> np.ndarray:
        """(K, K) int64: matches between i and j, both sides (symmetric)."""
        played = self.outcomes.sum(axis=-1)
        return played + played.T


def _scores(outcomes: np.ndarray) -> np.ndarray:
    """W[..., i, j] = wins of i over j + half their draws, from outcomes (..., K, K, 3) of team 0:
    i's wins as team 0 against j, plus j's losses as team 0 against i."""
    wins, draws, losses = (outcomes[..., k].astype(np.float64) for k in range(3))
    return wins + np.swapaxes(losses, -1, -2) + 0.5 * (draws + np.swapaxes(draws, -1, -2))


def tally(matches: Sequence[Match], labels: Sequence[str] | None = None) -> Tally:
    """Count matches by pairing.

    Args:
        matches: the matches.
        labels: the policies and their order; None: in order of first appearance.

    Returns:
        The counts.

    Raises:
        ValueError: no matches, repeated labels, a match whose policy is not among `labels`, a
            match of a policy against itself, or a policy without a match.
    """
    if not matches:
        raise ValueError("expected at least one match, got none")
    if labels is None:
        labels = list(dict.fromkeys(label for m in matches for label in (m.team0, m.team1)))
    labels = tuple(labels)
    index = {label: k for k, label in enumerate(labels)}
    if len(index) != len(labels):
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        raise ValueError(f"expected distinct policy labels, got {repeated} more than once")
    outcomes = np.zeros((len(labels), len(labels), 3), dtype=np.int64)
    for match in matches:
        for label in (match.team0, match.team1):
            if label not in index:
                raise ValueError(f"match {match.index}: unknown policy {label!r}; expected one "
                                 f"of {list(labels)}")
        if match.team0 == match.team1:
            raise ValueError(f"match {match.index}: {match.team0!r} against itself tells nothing "
                             f"about its rating; give the second copy its own label")
        outcomes[index[match.team0], index[match.team1], 2 - int(2 * match.score)] += 1
    played = outcomes.sum(axis=(1, 2)) + outcomes.sum(axis=(0, 2))
    if (played == 0).any():
        idle = [label for label, count in zip(labels, played, strict=True) if count == 0]
        raise ValueError(f"every policy needs at least one match; none for {idle}")
    return Tally(labels, outcomes)


def bradley_terry(scores: np.ndarray, smoothing: float = SMOOTHING,
                  max_iterations: int = MAX_ITERATIONS, delta: float = CONVERGENCE_DELTA,
                  start: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bradley-Terry strengths by Hunter's MM algorithm (his equation 4), as OpenSpiel's
    `ComputeRatingsFromMatrices`, for a batch of score matrices at once.

    Args:
        scores: (..., K, K) with W[i, j] the wins of i over j plus half their draws; the
            diagonal is ignored.
        smoothing: added to every W[i, j], i != j, played or not.
        max_iterations: it stops after this many iterations at most.
        delta: ... or at the first iteration in which no normalised strength moves by `delta`
            or more.
        start: (..., K) positive strengths to start from (default: all equal).

    Returns:
        gamma: (..., K) strengths normalised to sum 1 (no smaller than the smallest positive
            float), the fixed point gamma_i = W_i / sum_j N_ij / (gamma_i + gamma_j) with
            W_i = sum_j W[i, j] and N_ij = W[i, j] + W[j, i];
        iterations: (...,) MM iterations taken;
        converged: (...,) whether it stopped on `delta` rather than on `max_iterations`.
    """
    scores = np.asarray(scores, dtype=np.float64)
    batch, size = scores.shape[:-2], scores.shape[-1]
    off = ~np.eye(size, dtype=bool)
    won = scores.reshape(-1, size, size) * off + smoothing * off
    paired = won + np.swapaxes(won, -1, -2)
    totals = won.sum(axis=-1)
    gamma = (np.full((won.shape[0], size), 1.0 / size) if start is None
             else np.array(start, dtype=np.float64).reshape(-1, size))
    gamma /= gamma.sum(axis=-1, keepdims=True)
    iterations = np.zeros(won.shape[0], dtype=np.int64)
    converged = np.zeros(won.shape[0], dtype=bool)
    active = np.arange(won.shape[0])
    tiny = np.finfo(np.float64).smallest_subnormal
    for _ in range(max_iterations):
        current = gamma[active]
        updated = totals / np.sum(paired / (current[:, :, None] + current[:, None, :]), axis=-1)
        updated /= updated.sum(axis=-1, keepdims=True)
        np.maximum(updated, tiny, out=updated)
        done = np.max(np.abs(updated - current), axis=-1) < delta
        gamma[active] = updated
        iterations[active] += 1
        if done.any():  # rows that converged stop; the rest go on without them
            converged[active[done]] = True
            keep = ~done
            active, paired, totals = active[keep], paired[keep], totals[keep]
            if not active.size:
                break
    return (gamma.reshape(*batch, size), iterations.reshape(batch),
            converged.reshape(batch))


def _connected(scores: np.ndarray) -> bool:
    """Whether every policy reaches every other along "won or drew against" (Zermelo's and
    Ford's condition for finite maximum-likelihood strengths without smoothing)."""
    reach = (scores > 0) | np.eye(len(scores), dtype=bool)
    for _ in range(max(1, math.ceil(math.log2(len(scores))))):
        reach = (reach.astype(np.int64) @ reach.astype(np.int64)) > 0
    return bool(reach.all())


def _check_anchor(labels: Sequence[str], anchor: Mapping[str, float] | None) -> None:
    if anchor is None:
        return
    if len(anchor) != 1:
        raise ValueError(f"anchor: expected one policy and its Elo (LABEL=ELO), got {dict(anchor)}")
    (label, value), = anchor.items()
    if label not in labels:
        raise ValueError(f"anchor: unknown policy {label!r}; expected one of {list(labels)}")
    if not math.isfinite(value):
        raise ValueError(f"anchor: expected a finite Elo for {label!r}, got {value!r}")


def _to_elo(gamma: np.ndarray, labels: Sequence[str], anchor: Mapping[str, float] | None
            ) -> np.ndarray:
    """400 log10(gamma), shifted so the mean is 1200 or the anchor has its value (last axis)."""
    raw = ELO_SCALE * np.log10(gamma)
    if anchor is None:
        return raw - raw.mean(axis=-1, keepdims=True) + MEAN_ELO
    (label, value), = anchor.items()
    return raw - raw[..., [labels.index(label)]] + value


@dataclass(frozen=True)
class EloFit:
    """A point fit: `elo[k]` is the rating of `tally.labels[k]`."""

    tally: Tally
    elo: np.ndarray
    gamma: np.ndarray
    """The normalised strengths (sum 1) behind `elo`."""
    smoothing: float
    anchor: dict[str, float] | None
    iterations: int
    converged: bool

    @property
    def labels(self) -> tuple[str, ...]:
        return self.tally.labels


def fit_elo(matches: Sequence[Match], labels: Sequence[str] | None = None,
            anchor: Mapping[str, float] | None = None, smoothing: float = SMOOTHING,
            start: np.ndarray | None = None) -> EloFit:
    """Bradley-Terry maximum-likelihood ratings on the Elo scale from all matches.

    The objective: with W[i, j] = s + (wins of i over j) + (draws between i and j) / 2 over the
    matches on either side, for every ordered pair i != j (played or not) and s = `smoothing`,
    the fit maximises

        L(gamma) = sum_{i != j} W[i, j] log(gamma_i / (gamma_i + gamma_j))

    over positive strengths gamma (determined up to a common factor), by Hunter's MM algorithm
    (`bradley_terry`). That is the likelihood of every match under P(i beats j) = gamma_i /
    (gamma_i + gamma_j), a draw counting as half a win and half a loss, times the pseudo-matches
    of the smoothing: with s > 0 every rating is finite, even that of a policy that won every
    match. Elo_i = 400 log10(gamma_i) + c, with c putting the mean at 1200 or, with
    `anchor={label: elo}`, that policy at `elo`. So P(i beats j) = 1 / (1 + 10^((Elo_j - Elo_i)
    / 400)), and with s = 0 and two policies, w wins and l losses, Elo_1 - Elo_2 = 400
    log10(w / l).

    Args:
        matches: the matches.
        labels: the policies and their order; None: in order of first appearance.
        anchor: `{label: elo}` to fix one policy's rating; None centres the mean at 1200.
        smoothing: s, >= 0.
        start: a previous fit's `gamma`; it only shortens the iteration.

    Returns:
        The fit.

    Raises:
        ValueError: bad matches (see `tally`), a bad anchor, a negative smoothing, or smoothing 0
            where some policies never won or drew against the rest (no finite maximum).
    """
    found = tally(matches, labels)
    _check_anchor(found.labels, anchor)
    if not (math.isfinite(smoothing) and smoothing >= 0):
        raise ValueError(f"smoothing must be a finite number >= 0, got {smoothing!r}")
    scores = found.scores
    if smoothing == 0 and not _connected(scores):
        raise ValueError("without smoothing the ratings are finite only when no group of policies "
                         "won every match it played against the others; use a smoothing > 0")
    gamma, iterations, converged = bradley_terry(scores, smoothing, start=start)
    return EloFit(found, _to_elo(gamma, found.labels, anchor), gamma, smoothing,
                  None if anchor is None else dict(anchor), int(iterations), bool(converged))


def elo_covariance(fit: EloFit) -> np.ndarray:
    """The large-sample covariance of the Elo ratings around a mean that is held fixed.

    It is (400 / ln 10)^2 times the pseudo-inverse of the information matrix of the penalised
    likelihood at the fit, I = sum_{i<j} N_ij p_ij p_ji (e_i - e_j)(e_i - e_j)^T with N_ij =
    W[i, j] + W[j, i] (smoothing included) and p_ij the model's P(i beats j). The variance of a
    difference, Var(Elo_i - Elo_j) = C_ii + C_jj - 2 C_ij, holds whatever the centring or anchor.
    A draw counts as a half win in N_ij p_ij p_ji, the binomial variance, which is at least the
    variance of a score in [0, 1] with the same mean: with draws it errs on the wide side.

    Args:
        fit: the point fit.

    Returns:
        (K, K) covariance.
    """
    scores = fit.tally.scores
    size = len(scores)
    off = ~np.eye(size, dtype=bool)
    won = scores * off + fit.smoothing * off
    gamma = fit.gamma
    p = gamma[:, None] / (gamma[:, None] + gamma[None, :])
    weights = (won + won.T) * p * p.T * off
    information = np.diag(weights.sum(axis=1)) - weights
    return (ELO_SCALE / math.log(10.0)) ** 2 * np.linalg.pinv(information, hermitian=True)


def difference_std_error(covariance: np.ndarray, first: int, second: int) -> float:
    """The standard error of a difference of two ratings.

    Args:
        covariance: from `elo_covariance`.
        first: the first policy's index.
        second: the second's.

    Returns:
        The standard error of Elo[first] - Elo[second].
    """
    variance = covariance[first, first] + covariance[second, second] - 2 * covariance[first, second]
    return math.sqrt(max(float(variance), 0.0))


@dataclass(frozen=True)
class PolicyRating:
    """One policy's rating and record over all its matches, on either side."""

    label: str
    elo: float
    elo_ci: tuple[float, float]
    """The stratified-bootstrap percentile interval of `elo` (zero width for the anchor)."""
    wins: int
    draws: int
    losses: int
    matches: int

    @property
    def score(self) -> float:
        """(wins + draws / 2) / matches."""
        return (self.wins + 0.5 * self.draws) / self.matches


@dataclass(frozen=True)
class PairRating:
    """P(`label` beats `opponent`), a draw counting half, and their record."""

    label: str
    opponent: str
    matches: int
    wins: int
    """Wins of `label` (either side)."""
    draws: int
    losses: int
    model: stats.Estimate
    """From the Elo difference (`expected_score`), with the percentile interval of the
    bootstrapped difference."""
    observed: stats.Estimate | None
    """(wins + draws / 2) / matches with its Wilson score interval; None without matches."""

    def flipped(self) -> PairRating:
        """The same pair seen from `opponent`.

        Returns:
            The mirrored rating: wins and losses swapped, probabilities and intervals reflected.
        """
        def mirror(estimate: stats.Estimate) -> stats.Estimate:
            return stats.Estimate(1.0 - estimate.value, 1.0 - estimate.high, 1.0 - estimate.low)

        return PairRating(self.opponent, self.label, self.matches, self.losses, self.draws,
                          self.wins, mirror(self.model),
                          None if self.observed is None else mirror(self.observed))


def wilson_interval(score: float, matches: int, confidence: float = DEFAULT_CONFIDENCE
                    ) -> stats.Estimate:
    """A score with its Wilson score interval (no continuity correction). A score may count draws as
    halves: the binomial variance p(1 - p) is the largest a score in [0, 1] with mean p can have,
    so with draws the interval errs wide.

    Args:
        score: wins plus half the draws.
        matches: the matches played, >= 1.
        confidence: the interval's coverage.

    Returns:
        `score / matches` with the interval, clipped to [0, 1].

    Raises:
        ValueError: no match.
    """
    if matches < 1:
        raise ValueError(f"expected at least one match, got {matches}")
    z = NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    p = score / matches
    denominator = 1.0 + z * z / matches
    center = (p + z * z / (2 * matches)) / denominator
    half = z * math.sqrt(p * (1 - p) / matches + z * z / (4 * matches * matches)) / denominator
    return stats.Estimate(p, max(0.0, center - half), min(1.0, center + half))


@dataclass(frozen=True)
class Ratings:
    """Everything a report renders about a tournament's ratings."""

    policies: dict[str, PolicyRating]
    """By label, best first."""
    pairs: tuple[PairRating, ...]
    """Every pair of policies once, the better-rated one as `label`, in rating order."""
    best: str
    """The highest-rated policy."""
    confidence: float
    resamples: int
    seed: int
    smoothing: float
    anchor: dict[str, float] | None
    iterations: int
    """MM iterations of the point fit."""
    converged: bool
    """Whether the point fit met the convergence test within MAX_ITERATIONS."""
    unconverged_resamples: int
    """Bootstrap resamples whose fit hit MAX_ITERATIONS (0 in all but degenerate cases)."""
    team0_score: float
    """Team 0's mean score over all matches: 0.5 where the sides are fair."""

    def pair(self, label: str, opponent: str) -> PairRating:
        """The rating of a pair, seen from one side.

        Args:
            label: the policy whose side it is.
            opponent: the other.

        Returns:
            The pair's rating.

        Raises:
            KeyError: a pair that is not rated.
        """
        for found in self.pairs:
            if (found.label, found.opponent) == (label, opponent):
                return found
            if (found.label, found.opponent) == (opponent, label):
                return found.flipped()
        raise KeyError(f"no rated pair {label!r} and {opponent!r}")

    def as_dict(self) -> dict[str, Any]:
        """The JSON form.

        Returns:
            "ratings" {label: {"elo", "elo_ci", "wins", "draws", "losses", "matches"}}, "pairs"
                [{"label", "opponent", "matches", "wins", "draws", "losses", "p_model", "p_model_ci",
                "p_observed", "p_observed_ci"}], "best" and "fit" (how).
        """
        def interval(estimate: stats.Estimate | None) -> list[float] | None:
            return None if estimate is None else estimate.as_list()

        return {
            "ratings": {label: {"elo": p.elo, "elo_ci": list(p.elo_ci), "wins": p.wins,
                                "draws": p.draws, "losses": p.losses, "matches": p.matches}
                        for label, p in self.policies.items()},
            "pairs": [{"label": p.label, "opponent": p.opponent, "matches": p.matches,
                       "wins": p.wins, "draws": p.draws, "losses": p.losses,
                       "p_model": p.model.value, "p_model_ci": interval(p.model),
                       "p_observed": None if p.observed is None else p.observed.value,
                       "p_observed_ci": interval(p.observed)} for p in self.pairs],
            "best": self.best,
            "fit": {"model": "bradley-terry", "algorithm": "mm", "scale": ELO_SCALE,
                    "mean": MEAN_ELO if self.anchor is None else None, "anchor": self.anchor,
                    "smoothing": self.smoothing, "iterations": self.iterations,
                    "converged": self.converged, "bootstrap": {
                        "method": stats.BOOTSTRAP_METHOD, "strata": BOOTSTRAP_STRATA,
                        "resamples": self.resamples, "seed": self.seed,
                        "confidence": self.confidence,
                        "unconverged": self.unconverged_resamples},
                    "team0_score": self.team0_score},
        }


def bootstrap_elo(fit: EloFit, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
                  ) -> tuple[np.ndarray, int]:
    """Elo ratings of stratified resamples of the fit's matches.

    Within each pair of policies (both sides together), a resample draws as many matches as the
    pair had, with replacement: the schedule fixed those counts, only the results are random,
    so every resample keeps each pair's number of matches (an unstratified resample would move
    matches between pairs, and could leave a pair unplayed). The sides are pooled because the
    model has no side: a round gives each side of a pair one match, and strata of one match
    would give intervals of zero width. Drawing n matches with replacement from a pair's
    (wins, draws, losses) is a multinomial draw of the counts, which is how it is done: one
    `Generator.multinomial` per pair, in label order, from `numpy.random.default_rng(seed)`, in
    chunks of `CHUNK_ELEMENTS // K^2` resamples (a number fixed by the input, so equal inputs and
    seed give equal draws). Each resample is fitted as the point fit is, started from the point
    fit's strengths.

    Args:
        fit: the point fit, with smoothing > 0.
        resamples: how many, >= 1.
        seed: seeds the draws.

    Returns:
        (resamples, K) ratings, and how many resamples hit MAX_ITERATIONS.

    Raises:
        ValueError: `resamples` < 1, or smoothing 0 (a resample can leave a policy undefeated,
            whose rating would then be infinite).
    """
    stats._check(0.5, resamples)
    if fit.smoothing <= 0:
        raise ValueError("the bootstrap needs smoothing > 0: a resample can leave a policy "
                         "undefeated, whose rating would then be infinite")
    outcomes = fit.tally.outcomes
    size = len(fit.labels)
    # each pair's record from the first policy's side: its matches as team 0, and as team 1
    # (a loss of the other side is its win)
    pooled = outcomes + np.swapaxes(outcomes, 0, 1)[..., ::-1]
    pairings = [(i, j, pooled[i, j]) for i in range(size) for j in range(i + 1, size)
                if pooled[i, j].sum()]
    rng = np.random.default_rng(seed)
    rows = max(1, stats.CHUNK_ELEMENTS // (size * size))
    elo = np.empty((resamples, size))
    unconverged = 0
    for start in range(0, resamples, rows):
        chunk = slice(start, min(resamples, start + rows))
        count = chunk.stop - chunk.start
        drawn = np.zeros((count, size, size, 3), dtype=np.int64)
        for i, j, played in pairings:
            drawn[:, i, j] = rng.multinomial(played.sum(), played / played.sum(), size=count)
        gamma, _, converged = bradley_terry(_scores(drawn), fit.smoothing,
                                            start=np.broadcast_to(fit.gamma, (count, size)))
        elo[chunk] = _to_elo(gamma, fit.labels, fit.anchor)
        unconverged += int((~converged).sum())
    return elo, unconverged


def rate(matches: Sequence[Match], labels: Sequence[str] | None = None,
         anchor: Mapping[str, float] | None = None, smoothing: float = SMOOTHING,
         confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
         seed: int = 0) -> Ratings:
    """The ratings of a tournament: `fit_elo` of all matches, each Elo with its stratified-bootstrap
    percentile interval (`bootstrap_elo`), each policy's record, and for every pair P(A beats B)
    from the model (with the interval of the bootstrapped Elo difference) and from the counts
    (with the Wilson interval).

    Args:
        matches: the matches.
        labels: the policies and their order; None: in order of first appearance.
        anchor: `{label: elo}` to fix one policy's rating; None centres the mean at 1200.
        smoothing: > 0.
        confidence: the intervals' coverage, in (0, 1).
        resamples: the bootstrap's resamples, >= 1.
        seed: seeds the bootstrap.

    Returns:
        The ratings, best first.

    Raises:
        ValueError: bad matches (see `tally`), a bad anchor, smoothing <= 0, a confidence outside
            (0, 1), or `resamples` < 1.
    """
    stats._check(confidence, resamples)
    if not (math.isfinite(smoothing) and smoothing > 0):
        raise ValueError(f"smoothing must be a finite number > 0 for the bootstrap, got "
                         f"{smoothing!r}")
    fit = fit_elo(matches, labels, anchor, smoothing)
    draws, unconverged = bootstrap_elo(fit, resamples, seed)
    labels = fit.labels
    outcomes = fit.tally.outcomes
    # Record of i against j over both sides: as team 0 (wins, draws, losses) plus as team 1.
    record = outcomes + np.swapaxes(outcomes, 0, 1)[..., ::-1]
    order = sorted(range(len(labels)), key=lambda k: (-fit.elo[k], k))
    policies = {}
    for k in order:
        low, high = stats.percentile_interval(draws[:, k], confidence)
        wins, ties, losses = (int(n) for n in record[k].sum(axis=0))
        policies[labels[k]] = PolicyRating(labels[k], float(fit.elo[k]), (low, high), wins, ties,
                                           losses, wins + ties + losses)
    pairs = []
    for rank, i in enumerate(order):
        for j in order[rank + 1:]:
            low, high = stats.percentile_interval(draws[:, i] - draws[:, j], confidence)
            model = stats.Estimate(float(expected_score(fit.elo[i], fit.elo[j])),
                                   float(expected_score(low, 0.0)), float(expected_score(high, 0.0)))
            wins, ties, losses = (int(n) for n in record[i, j])
            played = wins + ties + losses
            observed = wilson_interval(wins + 0.5 * ties, played, confidence) if played else None
            pairs.append(PairRating(labels[i], labels[j], played, wins, ties, losses, model,
                                    observed))
    team0 = float(np.sum(outcomes * np.array([1.0, 0.5, 0.0])) / outcomes.sum())
    return Ratings(policies, tuple(pairs), labels[order[0]], confidence, resamples, seed,
                   smoothing, fit.anchor, fit.iterations, fit.converged, unconverged, team0)
