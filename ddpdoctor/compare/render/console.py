"""A rich console for a stream: colour only on a terminal, never markup/emoji/highlighting of our strings."""

from __future__ import annotations

from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from ddpdoctor.report import fmt

WIDTH_NOT_A_TERMINAL = 130


def console(stream: TextIO) -> Console:
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return Console(
        file=stream,
        force_terminal=tty,
        color_system="auto" if tty else None,
        width=None if tty else WIDTH_NOT_A_TERMINAL,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=False,
    )


def t(value: Any, style: str = "") -> Text:
    """Text from a run or a file, with control characters escaped."""
    return Text(fmt.plain(value), style=style)
