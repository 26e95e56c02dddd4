"""argparse types shared by the `huggy` commands (the core ones and those other packages
contribute): whole numbers and finite numbers in a range, each refusal naming the range and
what came."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole_number(low: int, high: int | None = None, shown: str | None = None,
                 what: str = "a whole number") -> Callable[[str], int]:
    """An argparse type: a whole number in a range.

    Args:
        low: the smallest accepted.
        high: the largest accepted; None for no upper bound.
        shown: the range as refusals word it where its numbers are long (default "low to high").
        what: what a refusal says was expected.

    Returns:
        The parser of one argument, which raises `argparse.ArgumentTypeError` naming the range and
            what came.
    """
    expected = (f"{what} >= {low}" if high is None else f"{what}, {shown or f'{low} to {high}'}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


def number(low: float, high: float | None = None, above: bool = False
           ) -> Callable[[str], float]:
    """An argparse type: a finite number in a range (NaN and infinities are refused).

    Args:
        low: the lower bound.
        high: the largest accepted; None for no upper bound.
        above: whether `low` itself is refused.

    Returns:
        The parser of one argument, which raises `argparse.ArgumentTypeError` naming the range and
            what came.
    """
    expected = f"a number {'>' if above else '>='} {low:g}" + (
        "" if high is None else f" and <= {high:g}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not (math.isfinite(value) and (value > low if above else value >= low)
                and (high is None or value <= high)):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    return parse


positive_int = whole_number(1)
"""A count: a whole number >= 1 (`--instances`, `--count`, `--rounds`, ...)."""
seed64 = whole_number(0, 2**64 - 1, "0 to 2**64 - 1")
"""A seed of the policy's noise: 0 to 2**64 - 1."""
port_number = whole_number(1, 65535, what="a port")
"""A TCP port: 1 to 65535."""
