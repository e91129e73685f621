"""A rich console for a stream: colour only on a terminal, never markup/emoji/highlighting of our strings."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console

from ddpdoctor.report import console as report_console

WIDTH_NOT_A_TERMINAL = 130


def console(stream: TextIO) -> Console:
    return report_console.console(stream, WIDTH_NOT_A_TERMINAL)


t = report_console.text
