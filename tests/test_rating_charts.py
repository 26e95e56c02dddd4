"""A tournament's figures (deploy.evaluation.rating_charts): what each draws, read back from the
matplotlib artists (lines, markers, texts, the colour bar), against the ratings and the matches
they were drawn from; no pixels."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

from deploy.evaluation import rating_charts as rc
from deploy.evaluation import ratings as rt
from deploy.evaluation.matchmaking import Fixture, ScheduleConfig, simulate

matplotlib.use("Agg")


def _played(elos: dict[str, float], budget: int) -> list[rt.Match]:
    """A round-robin schedule of `budget` matches against a Bradley-Terry arena of `elos`, a
    tenth of the matches drawn."""
    def sample(fixture: Fixture) -> float:
        rng = np.random.default_rng([0, fixture.seed])
        if rng.random() < 0.1:
            return 0.5
        return float(rng.random() < rt.expected_score(elos[fixture.team0], elos[fixture.team1]))

    return simulate(list(elos), ScheduleConfig(budget), sample)[1]


def _axes(figure, label: str):
    return next(axes for axes in figure.axes if axes.get_label() == label)


def test_label_lines_by_hand() -> None:
    assert rc.label_lines("hf://someone/SoccerTwos-poca@main/SoccerTwos.onnx") == \
        "hf://someone/\nSoccerTwos-poca@main/\nSoccerTwos.onnx"
    assert rc.label_lines("heuristic:chaser") == "heuristic:chaser"
    assert rc.label_lines("a" * 30, width=12) == "a" * 12 + "\n" + "a" * 12 + "\n" + "a" * 6


def test_figures_draw_ratings_curves_and_the_matrix(tmp_path) -> None:
    elos = {f"run@{k}": 1000 + 50.0 * k for k in range(1, 5)} | {"heuristic:random": 1050.0}
    found = rt.rate(_played(elos, 400), resamples=300)
    checkpoints = {f"run@{k}": ("run", 100_000 * k) for k in range(1, 5)}
    figure = rc.ratings_figure(found, checkpoints, title="builtin:soccertwos")
    labels = {axes.get_label() for axes in figure.axes}
    assert labels == {"policies", "curves"}
    curves = _axes(figure, "curves")
    lines = {line.get_label(): line for line in curves.lines}
    assert set(lines) == {"run", "heuristic:random"}  # the run's curve, the other as a reference
    assert lines["run"].get_xdata().tolist() == [100_000, 200_000, 300_000, 400_000]
    assert lines["run"].get_ydata().tolist() == [found.policies[f"run@{k}"].elo
                                                 for k in range(1, 5)]
    assert list(lines["heuristic:random"].get_ydata()) == \
        [found.policies["heuristic:random"].elo] * 2
    assert {axes.get_label() for axes in rc.ratings_figure(found).axes} == {"policies"}
    matrix = rc.win_rate_figure(found)
    cells = [text.get_text() for text in matrix.axes[0].texts]
    assert len(cells) == 5 * 4
    best = list(found.policies)
    pair = found.pair(best[0], best[1])
    assert pair.observed is not None
    assert cells[0].startswith(f"{pair.observed.value:.2f}\n[{pair.observed.low:.2f}, ")
    path = tmp_path / "ratings.png"
    figure.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SCRIPTED = {"heuristic:chaser": 1500.0, "heuristic:random": 1150.0, "heuristic:idle": 1100.0}


def test_the_ratings_figure_labels_its_dashed_line_and_names_its_intervals() -> None:
    """The dashed line is the mean, 1200, and says so on the plot and in the legend; anchored,
    it is the anchor's Elo and names the anchor. The title says what the bars are."""
    played = _played(SCRIPTED, 60)
    for anchor, at, meaning in ((None, 1200.0, "mean Elo 1200"),
                                ({"heuristic:idle": 1000.0}, 1000.0,
                                 "heuristic:idle anchored at 1000")):
        figure = rc.ratings_figure(rt.rate(played, anchor=anchor, resamples=200))
        policies = _axes(figure, "policies")
        (dashed,) = [line for line in policies.lines if line.get_linestyle() == "--"]
        assert list(dashed.get_xdata()) == [at, at] and dashed.get_label() == meaning
        assert meaning in [text.get_text() for text in policies.texts]
        legend = policies.get_legend()
        assert legend is not None and meaning in [t.get_text() for t in legend.get_texts()]
        assert "95% bootstrap percentile intervals" in figure.get_suptitle()
        assert "resampled within each pair" in figure.get_suptitle()


def test_the_win_rate_colour_is_the_observed_share_its_first_number_shows() -> None:
    """Cell (i, j): colour and first number are (wins + draws / 2) / matches of i against j,
    counted here from the matches; the colour bar names it; a pair that never played is grey
    (no colour) and says so. A and C never meet: 2 matches A-B, 3 matches B-C."""
    matches = [rt.Match(0, 0, "A", "B", 1.0), rt.Match(1, 1, "B", "A", 0.5),
               rt.Match(2, 2, "B", "C", 1.0), rt.Match(3, 3, "C", "B", 0.0),
               rt.Match(4, 4, "C", "B", 0.5)]
    found = rt.rate(matches, resamples=200)
    share = {("A", "B"): 0.75, ("B", "A"): 0.25, ("B", "C"): 5 / 6, ("C", "B"): 1 / 6}
    labels = list(found.policies)
    assert labels == ["A", "B", "C"]
    figure = rc.win_rate_figure(found)
    axes = _axes(figure, "win rate")
    (image,) = axes.images
    colours = np.ma.filled(image.get_array(), np.nan)
    (bar,) = [a for a in figure.axes if a is not axes]
    assert bar.get_ylabel().startswith("observed P(row beats column)")
    cells = {(round(text.get_position()[1]), round(text.get_position()[0])): text.get_text()
             for text in axes.texts}
    for i, row in enumerate(labels):
        for j, column in enumerate(labels):
            if i == j:
                assert np.isnan(colours[i, j]) and (i, j) not in cells
            elif (row, column) in share:
                assert colours[i, j] == pytest.approx(share[row, column])
                assert cells[i, j].split("\n")[0] == f"{share[row, column]:.2f}"
            else:
                assert np.isnan(colours[i, j]) and cells[i, j].startswith("no matches")
    assert "model" in cells[0, 1] and "(the colour)" in axes.get_title()

