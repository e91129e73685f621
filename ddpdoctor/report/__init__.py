"""Every document ddpdoctor prints, in every format: a diagnosis (``diagnose``), a comparison (``compare``) and a
gate result (``gate``), as text / json / markdown / html. A renderer takes ``(result, stream)`` and nothing else.

``OutputFormat`` lists the formats and ``Document`` the documents; ``RENDERERS`` names the renderer of every
pair (a test renders each one). Renderers are imported when used, so a command loads only its own. JUnit XML and
GitHub Actions output of a gate result are ``report.junit`` and ``report.github``.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from typing import Any, TextIO


class OutputFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    MARKDOWN = "markdown"
    HTML = "html"


class Document(str, enum.Enum):
    DIAGNOSIS = "diagnosis"  # ddpdoctor.diagnosis.Diagnosis
    COMPARISON = "comparison"  # ddpdoctor.compare.Comparison
    GATE = "gate"  # ddpdoctor.compare.GateResult


Renderer = Callable[[Any, TextIO], None]

# document -> format -> "module:function" under ddpdoctor.report
RENDERERS: dict[Document, dict[OutputFormat, str]] = {
    Document.DIAGNOSIS: {
        OutputFormat.TEXT: "text:render",
        OutputFormat.JSON: "json_report:render",
        OutputFormat.MARKDOWN: "markdown:render",
        OutputFormat.HTML: "html:render",
    },
    Document.COMPARISON: {
        OutputFormat.TEXT: "compare_text:render",
        OutputFormat.JSON: "json_report:render_comparison",
        OutputFormat.MARKDOWN: "compare_markdown:render",
        OutputFormat.HTML: "compare_html:render",
    },
    Document.GATE: {
        OutputFormat.TEXT: "gate_text:render",
        OutputFormat.JSON: "json_report:render_gate",
        OutputFormat.MARKDOWN: "gate_text:render_markdown",
        OutputFormat.HTML: "gate_html:render",
    },
}


def renderer(document: Document | str, fmt: OutputFormat | str) -> Renderer:
    """The renderer of ``document`` in format ``fmt``."""
    module, function = RENDERERS[Document(document)][OutputFormat(fmt)].split(":")
    return getattr(importlib.import_module(f"ddpdoctor.report.{module}"), function)


def render(result: Any, fmt: OutputFormat | str, stream: TextIO, document: Document | str = Document.DIAGNOSIS) -> None:
    """Write ``result`` (a diagnosis unless ``document`` says otherwise) to ``stream`` in format ``fmt``."""
    renderer(document, fmt)(result, stream)


__all__ = ["Document", "OutputFormat", "RENDERERS", "render", "renderer"]
