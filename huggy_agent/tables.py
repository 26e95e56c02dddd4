"""Plain-text tables for the command line."""

from __future__ import annotations

from collections.abc import Sequence

MISSING = "-"
"""How a table shows a missing value (None)."""


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: columns padded to their widest cell.

    Args:
        headers: one title per column.
        rows: one value per column each. Floats are written with 4 decimals (3 significant
            digits in scientific notation when tiny or huge), integers with thousands
            separators, None as MISSING ("-"), anything else as `str` writes it.

    Returns:
        The header line, a rule and one line per row, joined by newlines, without trailing
            spaces; a column whose values are all numbers or None is right-aligned, any other
            left-aligned.
    """
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    numeric = [any(_is_number(row[i]) for row in rows)
               and all(_is_number(row[i]) or row[i] is None for row in rows)
               for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule, *(line(row) for row in cells)])


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value: object) -> str:
    if value is None:
        return MISSING
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3e}"
        return f"{value:.4f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def plural(count: int, noun: str, many: str | None = None) -> str:
    """A count and a noun as English says it: "1 item", "2 items".

    Args:
        count: how many.
        noun: the singular.
        many: an irregular plural (such as "policies"); None adds an "s".

    Returns:
        The count, a space and the noun, singular for 1.
    """
    return f"{count} {noun if count == 1 else many or noun + 's'}"
