"""Renderers of ``compare`` and ``gate`` results. A renderer takes ``(result, stream)`` and nothing else.

``COMPARE_RENDERERS`` maps every ``ddpdoctor.report.OutputFormat`` (text, json, markdown, html) to a
renderer of a ``Comparison``; ``GATE_RENDERERS`` maps every ``GateFormat`` (text, json, markdown) to a
renderer of a ``GateResult`` (tests check that every member has one). JUnit XML and GitHub Actions output
live in ``junit`` and ``github``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TextIO

from ddpdoctor.compare.render import compare_html, compare_markdown, compare_text, gate_text, json_out
from ddpdoctor.report import OutputFormat


class GateFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    MARKDOWN = "markdown"


Renderer = Callable[[Any, TextIO], None]

COMPARE_RENDERERS: dict[OutputFormat, Renderer] = {
    OutputFormat.TEXT: compare_text.render,
    OutputFormat.JSON: json_out.render_comparison,
    OutputFormat.MARKDOWN: compare_markdown.render,
    OutputFormat.HTML: compare_html.render,
}

GATE_RENDERERS: dict[GateFormat, Renderer] = {
    GateFormat.TEXT: gate_text.render,
    GateFormat.JSON: json_out.render_gate,
    GateFormat.MARKDOWN: gate_text.render_markdown,
}

__all__ = ["COMPARE_RENDERERS", "GATE_RENDERERS", "GateFormat", "OutputFormat"]
