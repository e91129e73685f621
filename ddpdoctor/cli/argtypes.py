"""Numeric option types for argparse (``type=``): whole numbers and seconds, within bounds.

``float`` alone takes ``nan``, ``inf`` and ``1e300``, and ``nan`` compares false with every limit, so a check such
as ``value <= 0`` lets it through (``--hang-timeout nan`` ended a healthy job at once); ``int`` alone takes any
number of digits. These refuse both with the option's name and the range, through argparse's own error.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

MAX_COUNT = 1_000_000_000  # steps, windows: far beyond any job, small enough for every consumer of the number
MAX_SECONDS = 10_000_000.0  # ~115 days; threading and select refuse timeouts above ~9.2e9 s
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII digits only: int() also reads '٣', '+4', '1_0'


def count(minimum: int, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """A whole number from ``minimum`` to ``maximum``."""

    def parse(text: str) -> int:
        value = text.strip()
        if not _DIGITS.fullmatch(value) or not minimum <= int(value) <= maximum:
            raise argparse.ArgumentTypeError(f"must be a whole number from {minimum} to {maximum}, not {text!r}")
        return int(value)

    return parse


def seconds(maximum: float = MAX_SECONDS) -> Callable[[str], float]:
    """A finite number of seconds above 0, at most ``maximum``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= maximum):
            raise argparse.ArgumentTypeError(
                f"must be a number of seconds above 0, at most {maximum:.0f}, not {text!r}"
            )
        return value

    return parse
