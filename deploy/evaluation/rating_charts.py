"""A tournament's figures (matplotlib, imported where drawn): the ratings with their intervals
(ratings.png) and the matrix of P(row beats column) (win_rate.png). They draw what
`deploy.evaluation.ratings.rate` computed and compute nothing of their own.

A module apart from `deploy.evaluation.charts`, which draws an evaluation's report (returns per
episode): the two draw different results, with different label rules (these figures break a
long policy label onto lines, `label_lines`; the evaluation's cut it to its end).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from deploy.evaluation.ratings import MEAN_ELO, PolicyRating, Ratings

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MATRIX_TEXT_LIMIT = 8
"""Policies up to which the win-rate matrix writes the intervals, counts and the model's P into
its cells (beyond, only the observed share)."""
LABEL_LINE_CHARS = 24
"""Figures break policy labels into lines of at most this many characters."""
OBSERVED_LABEL = "observed P(row beats column): (wins + draws / 2) / matches"
"""The win-rate matrix's colour bar: what the colour of a cell means."""


def label_lines(label: str, width: int = LABEL_LINE_CHARS) -> str:
    """A label broken into lines for a figure; every character is kept.

    Args:
        label: the label.
        width: the most characters per line.

    Returns:
        The lines joined by newlines, broken after a "/" or "@" where it can be and inside a part
            longer than `width` where it must.
    """
    lines = [""]
    for part in re.split(r"(?<=[/@])", label):
        while part:
            room = width - len(lines[-1])
            if len(part) > room and lines[-1]:
                lines.append("")
                continue
            lines[-1] += part[:width]
            part = part[width:]
            if part:
                lines.append("")
    return "\n".join(lines)


def reference_text(found: Ratings) -> tuple[float, str]:
    """Where the ratings figure's dashed line stands and what it says.

    Args:
        found: the tournament's ratings.

    Returns:
        (Elo, text): the mean, 1200, as "mean Elo 1200" when no policy is anchored, else the
            anchored policy's Elo as "<label> anchored at <Elo>".
    """
    if found.anchor is None:
        return MEAN_ELO, f"mean Elo {MEAN_ELO:.0f}"
    (label, value), = found.anchor.items()
    return value, f"{label} anchored at {value:.0f}"


def ratings_figure(found: Ratings, checkpoints: Mapping[str, tuple[str, int]] | None = None,
                   title: str = "Tournament") -> Figure:
    """Elo with its interval per policy, best at the top, each with its record.

    The title names the intervals (the confidence, and that they are stratified-bootstrap
    percentile intervals); each policy's mark is labelled with its Elo and wins-draws-losses; a
    dashed vertical line, labelled on the plot and in the legend (`reference_text`), marks the
    mean (1200) or the anchor.

    Args:
        found: the tournament's ratings.
        checkpoints: label -> (run, training step). Every run with two or more rated
            checkpoints is drawn beside the ratings as a curve of Elo against training step
            with its interval as a band, the other policies as dotted horizontal lines.
        title: the first part of the figure's title.

    Returns:
        The figure; its axes carry the labels "policies" and, with curves, "curves".
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    runs: dict[str, list[tuple[int, PolicyRating]]] = {}
    for label, (run, step) in (checkpoints or {}).items():
        if label in found.policies:
            runs.setdefault(run, []).append((step, found.policies[label]))
    runs = {run: sorted(points, key=lambda point: point[0])
            for run, points in runs.items() if len(points) >= 2}
    policies = list(found.policies.values())
    names = [label_lines(p.label) for p in policies]
    height = max(3.4, 0.2 * sum(max(2, name.count("\n") + 1) for name in names) + 2.0)
    width = 7.0 + (6.0 if runs else 0.0)
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    figure.suptitle(f"{title}: Bradley-Terry Elo\nbars: {found.confidence:.0%} bootstrap "
                    "percentile intervals (matches resampled within each pair)", fontsize=11)
    if runs:
        axes, curves = figure.subplots(1, 2, gridspec_kw={"width_ratios": [7.0, 6.0]})
    else:
        axes, curves = figure.add_subplot(), None
    axes.set_label("policies")
    rows = np.arange(len(policies))[::-1]
    elos = np.array([p.elo for p in policies])
    errors = np.array([[p.elo - p.elo_ci[0] for p in policies],
                       [p.elo_ci[1] - p.elo for p in policies]])
    # a percentile interval need not hold its point estimate to the last bit (an anchor)
    axes.errorbar(elos, rows, xerr=np.clip(errors, 0.0, None), fmt="o", color="C0", capsize=4,
                  markersize=5, label=f"Elo, {found.confidence:.0%} interval")
    for row, policy in zip(rows, policies, strict=True):
        axes.annotate(f"{policy.elo:.0f}  ({policy.wins}-{policy.draws}-{policy.losses})",
                      (policy.elo_ci[1], row), xytext=(6, 0), textcoords="offset points",
                      va="center", fontsize=8)
    reference, meaning = reference_text(found)
    axes.axvline(reference, color="grey", linestyle="--", linewidth=1, label=meaning)
    axes.annotate(meaning, (reference, 1.0), xycoords=("data", "axes fraction"),
                  xytext=(3, -3), textcoords="offset points", ha="left", va="top", fontsize=8,
                  color="dimgrey")
    axes.set_yticks(rows, names, fontsize=8)
    low, high = min(p.elo_ci[0] for p in policies), max(p.elo_ci[1] for p in policies)
    span = max(high - low, 50.0)
    axes.set_xlim(min(low, reference) - 0.05 * span, max(high, reference) + 0.3 * span)
    axes.set_ylim(-0.7, len(policies) - 0.1)  # room above the top policy for the line's label
    axes.set_xlabel("Elo (wins-draws-losses)")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2, fontsize=8,
                frameon=False)
    axes.grid(alpha=0.3, axis="x")
    if curves is not None:
        in_runs = {policy.label for points in runs.values() for _, policy in points}
        _draw_curves(curves, runs, [p for p in policies if p.label not in in_runs])
        curves.xaxis.set_major_locator(MaxNLocator(nbins=5))
        curves.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    return figure


def _draw_curves(curves: Axes, runs: Mapping[str, list[tuple[int, PolicyRating]]],
                 others: Sequence[PolicyRating]) -> None:
    """Elo against training step, one line with its interval band per run, and the other
    policies as dotted horizontal references."""
    curves.set_label("curves")
    for k, policy in enumerate(others):
        curves.axhline(policy.elo, color=f"C{(len(runs) + k) % 10}", linestyle=":",
                       linewidth=1.2, label=label_lines(policy.label))
    for k, (run, points) in enumerate(runs.items()):
        steps = [step for step, _ in points]
        color = f"C{k % 10}"
        curves.fill_between(steps, [p.elo_ci[0] for _, p in points],
                            [p.elo_ci[1] for _, p in points], color=color, alpha=0.2, linewidth=0)
        curves.plot(steps, [p.elo for _, p in points], marker="o", markersize=4, color=color,
                    label=run)
    curves.legend(title="run (dotted: other policies)" if others else "run", fontsize=8,
                  title_fontsize=8)
    curves.set_xlabel("training step")
    curves.set_ylabel("Elo")
    curves.set_title("checkpoints by training step (band: the interval)", fontsize=9)
    curves.grid(alpha=0.3)


def observed_matrix(found: Ratings) -> np.ndarray:
    """The observed share of every ordered pair, policies in rating order (best first).

    Args:
        found: the tournament's ratings.

    Returns:
        (K, K) float64: cell (i, j) is (wins + draws / 2) / matches of policy i against
            policy j, NaN on the diagonal and for a pair that played no match.
    """
    labels = list(found.policies)
    matrix = np.full((len(labels), len(labels)), np.nan)
    for i, row in enumerate(labels):
        for j, column in enumerate(labels):
            observed = None if i == j else found.pair(row, column).observed
            if observed is not None:
                matrix[i, j] = observed.value
    return matrix


def win_rate_figure(found: Ratings, title: str = "Tournament") -> Figure:
    """The matrix of P(row beats column), a draw counting half, policies in rating order (best
    first).

    One channel, one meaning: a cell's colour and its first number are both the observed share
    (`observed_matrix`), which the colour bar names; a pair without matches is grey and says
    so. With at most MATRIX_TEXT_LIMIT policies a cell also writes the share's Wilson interval,
    the match count and, labelled "model", the Bradley-Terry P from the Elo difference.

    Args:
        found: the tournament's ratings.
        title: the first line of the title.

    Returns:
        The figure; its matrix axes carry the label "win rate".
    """
    from matplotlib.figure import Figure

    labels = list(found.policies)
    size = len(labels)
    detailed = size <= MATRIX_TEXT_LIMIT
    side = max(5.5, (1.3 if detailed else 0.65) * size + 2.2)
    figure = Figure(figsize=(side + 1.2, side), dpi=100, layout="constrained")
    axes = figure.add_subplot(label="win rate")
    matrix = observed_matrix(found)
    image = axes.imshow(matrix, cmap="RdBu", vmin=0.0, vmax=1.0)
    axes.set_facecolor("0.9")  # the diagonal and unplayed pairs (no value) in grey
    figure.colorbar(image, ax=axes, label=OBSERVED_LABEL, shrink=0.8)
    for i, row in enumerate(labels):
        for j, column in enumerate(labels):
            if i == j:
                continue
            pair = found.pair(row, column)
            if pair.observed is None:
                text = f"no matches\nmodel {pair.model.value:.2f}" if detailed else "-"
            elif not detailed:
                text = f"{pair.observed.value:.2f}"
            else:
                text = (f"{pair.observed.value:.2f}\n[{pair.observed.low:.2f}, "
                        f"{pair.observed.high:.2f}]\nn={pair.matches}, model "
                        f"{pair.model.value:.2f}")
            dark = not np.isnan(matrix[i, j]) and abs(matrix[i, j] - 0.5) > 0.3
            axes.text(j, i, text, ha="center", va="center", fontsize=8 if detailed else 7,
                      color="white" if dark else "black")
    names = [label_lines(label) for label in labels]
    axes.set_xticks(range(size), names, rotation=30, ha="right", rotation_mode="anchor",
                    fontsize=8)
    axes.set_yticks(range(size), names, fontsize=8)
    axes.set_xlabel("column (opponent)")
    axes.set_ylabel("row")
    what = (f"observed share (the colour), its {found.confidence:.0%} Wilson interval,\n"
            "matches n, the Bradley-Terry model's P" if detailed
            else "observed share (the colour)")
    axes.set_title(f"{title}\nP(row beats column), a draw counting half\ncells: {what}",
                   fontsize=10)
    return figure
