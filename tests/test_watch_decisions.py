"""The sequential rule of `huggy watch` (deploy/watch/decisions.py): its error spending, the interval
of a difference and what it decides, worked out by hand; the decisions over recorded items."""

from __future__ import annotations

import math

import pytest

from deploy.evaluation import statistics as stats
from deploy.watch.decisions import (
    Candidate,
    Decider,
    Need,
    RuleSettings,
    comparison_alpha,
    describe,
    difference,
    look_level,
    looks_for,
    stop_level,
    verdict,
)


def test_the_spending_sums_to_at_most_alpha_over_any_number_of_comparisons() -> None:
    assert comparison_alpha(1, 0.05) == pytest.approx(0.05 * 6 / math.pi**2)
    assert comparison_alpha(3, 0.05) == pytest.approx(0.05 * 6 / (9 * math.pi**2))
    assert sum(comparison_alpha(k, 0.05) for k in range(1, 100_000)) < 0.05
    assert sum(comparison_alpha(k, 0.05) for k in range(1, 100_000)) > 0.05 * 0.9999
    with pytest.raises(ValueError, match="from 1"):
        comparison_alpha(0, 0.05)


def test_a_comparisons_looks_share_its_error_in_proportion_to_their_items() -> None:
    settings = RuleSettings(looks=(2, 6), confidence=0.9)
    # alpha_2 = 0.1 * 6 / (4 pi^2); the looks take 2/8 and 6/8 of it
    alpha_2 = 0.1 * 6 / (4 * math.pi**2)
    assert look_level(2, 0, settings) == pytest.approx(alpha_2 / 4)
    assert look_level(2, 1, settings) == pytest.approx(alpha_2 * 3 / 4)


def test_looks_are_spaced_geometrically_from_a_sixteenth_of_the_budget() -> None:
    # 4 * 16^(j/9), rounded up: 4, 5.44, 7.41, 10.08, 13.72, 18.66, 25.40, 34.56, 47.03, 64
    assert looks_for(64, 10) == (4, 6, 8, 11, 14, 19, 26, 35, 48, 64)
    assert looks_for(64, 2) == (4, 64)
    assert looks_for(64, 1) == (64,)
    # a sixteenth of 10 is under one item: from 1, 1 * 10^(1/2) = 3.16 -> 4
    assert looks_for(10, 3) == (1, 4, 10)
    assert looks_for(2, 5) == (1, 2)  # rounding makes looks equal: fewer of them
    with pytest.raises(ValueError, match="items and 0 looks"):
        looks_for(8, 0)


@pytest.mark.parametrize(("settings", "match"), [
    ({"statistic": "max"}, "statistic must be one of"),
    ({"confidence": 1.0}, r"confidence must be in \(0, 1\), got 1.0"),
    ({"margin": -0.1}, "margin must be >= 0"),
    ({"looks": (4, 2)}, "looks must be increasing"),
    ({"looks": ()}, "looks must be increasing"),
    ({"looks": (0, 2)}, "looks must be increasing"),
])
def test_settings_refuse_what_the_rule_cannot_use(settings: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RuleSettings(**settings)  # type: ignore[arg-type]


def test_the_difference_of_means_by_hand() -> None:
    # X = items [1, 2], [3, 4]: mean 2.5; each item's s^2 = 0.5 over 2 episodes, so the
    # stratified standard error is sqrt(0.5 * 2 + 0.5 * 2) / 4 = sqrt(2) / 4; Y alike, mean 0.5.
    x = [(1.0, 2.0), (3.0, 4.0)]
    y = [(0.0, 1.0), (1.0, 0.0)]
    found = difference(x, y, "mean", 0.025)
    half = 1.959963984540054 * math.hypot(math.sqrt(2) / 4, math.sqrt(2) / 4)
    assert found.value == pytest.approx(2.0)
    assert found.low == pytest.approx(2.0 - half)
    assert found.high == pytest.approx(2.0 + half)
    with pytest.raises(ValueError, match="level must be in"):
        difference(x, y, "mean", 0.5)
    with pytest.raises(ValueError, match="expected episodes, got none"):
        difference(x, [()], "mean", 0.025)


@pytest.mark.parametrize(("low", "high", "expected"), [
    (0.01, 0.5, "better"),
    (-0.05, 0.08, "tied"),
    (-0.1, 0.1, "tied"),
    (-0.6, 0.05, "not better"),
    (-0.6, 0.0999, "not better"),
    (-0.05, 0.3, None),
    (-0.2, 0.1, None),
])
def test_what_an_interval_decides(low: float, high: float, expected: str | None) -> None:
    interval = stats.Estimate((low + high) / 2, low, high)
    assert verdict(interval, interval, 0.1) == expected


def test_better_is_read_on_the_promotion_interval_and_stops_on_the_stopping_one() -> None:
    # the same difference, 0.05: its narrow stopping interval says tied, its wide promotion one
    # nothing; a wide promotion interval above 0 says better whatever the other says
    narrow, wide = stats.Estimate(0.05, -0.02, 0.09), stats.Estimate(0.05, -0.15, 0.25)
    assert verdict(wide, narrow, 0.1) == "tied"
    assert verdict(wide, wide, 0.1) is None
    assert verdict(stats.Estimate(0.3, 0.01, 0.6), stats.Estimate(0.3, 0.2, 0.4), 0.1) == "better"


def test_a_stop_spends_the_comparisons_own_error_not_the_watchs() -> None:
    settings = RuleSettings(looks=(2, 6), confidence=0.9)
    assert stop_level(0, settings) == pytest.approx(0.1 / 4)
    assert stop_level(1, settings) == pytest.approx(0.1 * 3 / 4)
    # wider than any comparison's promotion level: 6 / (pi^2 k^2) < 1 for every k
    assert stop_level(1, settings) > look_level(1, 1, settings)


def _items(value: float, count: int, spread: float = 0.1) -> list[tuple[float, ...]]:
    """`count` items of 4 episodes each: value -+ spread and value -+ spread / 2 (mean, median and
    IQM all `value`)."""
    return [(value - spread, value - spread / 2, value + spread / 2, value + spread)] * count


def test_decisions_follow_the_recorded_items_and_ask_for_what_they_need() -> None:
    settings = RuleSettings(statistic="mean", looks=(2, 8), margin=0.1)
    candidates = [Candidate("run@1", "a", served=True), Candidate("run@2", "b"),
                  Candidate("run@3", "c")]
    recorded = {"a": _items(0.0, 8), "b": _items(2.0, 2), "c": []}

    def strata_of(fingerprint: str, count: int) -> list[tuple[float, ...]] | None:
        items = recorded[fingerprint]
        return items[:count] if len(items) >= count else None

    progress = Decider(settings).run(candidates, strata_of)
    # the baseline, then b: 2.0 above a, with a half-width near 0.1 at the first look
    assert [d.verdict for d in progress.decisions] == ["served", "better"]
    assert progress.decisions[1].look == 1
    assert progress.decisions[1].comparison == 1
    assert progress.decisions[1].episodes == 8
    assert progress.best == candidates[1]
    assert progress.pending == candidates[2]
    assert progress.needs == [Need("c", 2), Need("b", 2)]
    # c equal to b: the first look (2 items, half-width ~ 0.14) cannot tell a tie; 8 can (0.06)
    recorded["c"] = _items(2.0, 2)
    progress = Decider(settings).run(candidates, strata_of)
    assert progress.needs == [Need("c", 8), Need("b", 8)]
    recorded["c"] = _items(2.0, 8)
    recorded["b"] = _items(2.0, 8)
    progress = Decider(settings).run(candidates, strata_of)
    assert [d.verdict for d in progress.decisions] == ["served", "better", "tied"]
    assert progress.best == candidates[1]
    assert progress.pending is None and progress.needs == []
    line = describe(progress.decisions[2], settings)
    assert line.startswith("run@3: mean 2.00 [")
    assert "tied with run@2 within +-0.1" in line
    assert line.endswith("after 32 episodes")


def test_nothing_recorded_asks_for_every_policys_first_look() -> None:
    progress = Decider(RuleSettings(looks=(3, 6))).run(
        [Candidate("r@1", "a"), Candidate("r@2", "b")], lambda fingerprint, count: None)
    assert progress.decisions == [] and progress.best is None
    assert progress.needs == [Need("a", 3), Need("b", 3)]
