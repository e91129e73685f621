"""Option types for argparse (``type=``): whole numbers and seconds, within bounds; files a command will write.

``float`` alone takes ``nan``, ``inf`` and ``1e300``, and ``nan`` compares false with every limit, so a check such
as ``value <= 0`` lets it through (``--hang-timeout nan`` ended a healthy job at once); ``int`` alone takes any
number of digits. These refuse both with the option's name and the range, through argparse's own error.
"""

from __future__ import annotations

import argparse
import math
import os
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


def output_file(text: str) -> str:
    """A file the command can write once its work is done: not a folder, under folders that are folders (missing
    ones are made) and, where the nearest existing one is, writable. Checked when the options are read, so that a
    mistyped ``--output`` is said at once, not after minutes of reading traces (the file is still written
    atomically at the end, where a full disk or a folder removed meanwhile is said as it happens)."""
    if not text:
        raise argparse.ArgumentTypeError("must name a file, not ''")
    path = os.path.abspath(text)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text} is a folder; name the file to write in it")
    folder = os.path.dirname(path)
    while not os.path.exists(folder):
        if os.path.lexists(folder):  # a dangling link where a folder should be
            raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} is a broken link")
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: no permission to write in {folder}")
    return text
