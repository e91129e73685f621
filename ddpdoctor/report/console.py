"""The one rich console setup every terminal report uses: colour only on a terminal, and never markup, emoji or
highlighting of our strings (they carry names from traces, which may hold ``[red]`` or escape sequences)."""

from __future__ import annotations

from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from ddpdoctor.report import fmt


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit 1 here, the code for "findings found"; the CLI ends a broken pipe with 141 instead
        self.quiet = True
        raise BrokenPipeError


WIDE = 130  # compare and gate tables: more columns than the diagnosis report


def console(stream: TextIO, width_not_a_terminal: int = 100) -> Console:
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return _Console(
        file=stream,
        force_terminal=tty,
        color_system="auto" if tty else None,
        width=None if tty else width_not_a_terminal,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=False,
    )


def text(value: Any, style: str = "") -> Text:
    """Text from a run or a file, with control characters escaped."""
    return Text(fmt.plain(value), style=style)
