"""Findings + metrics -> text / json / markdown / html. A renderer takes ``(result, stream)`` and nothing
else.

``OutputFormat`` is the list of formats; ``RENDERERS`` maps each to its renderer (a test checks that every
member has one)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TextIO

from ddpdoctor.diagnosis.findings import Diagnosis
from ddpdoctor.report import html, json_report, markdown, text


class OutputFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    MARKDOWN = "markdown"
    HTML = "html"


Renderer = Callable[[Diagnosis, TextIO], None]

RENDERERS: dict[OutputFormat, Renderer] = {
    OutputFormat.TEXT: text.render,
    OutputFormat.JSON: json_report.render,
    OutputFormat.MARKDOWN: markdown.render,
    OutputFormat.HTML: html.render,
}


def render(result: Diagnosis, fmt: OutputFormat | str, stream: TextIO) -> None:
    """Write ``result`` to ``stream`` in format ``fmt``."""
    RENDERERS[OutputFormat(fmt)](result, stream)


__all__ = ["OutputFormat", "RENDERERS", "render"]
