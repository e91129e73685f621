"""``--format json`` of every document: the diagnosis (``report.document``), a comparison and a gate result
(``report.compare_document``), strict JSON (no NaN)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TextIO

from ddpdoctor.diagnosis.findings import Diagnosis
from ddpdoctor.report.document import build

if TYPE_CHECKING:  # a diagnosis renders without the comparison machinery
    from ddpdoctor.compare.diff import Comparison
    from ddpdoctor.compare.gate import GateResult


def _dump(doc: dict[str, Any], stream: TextIO) -> None:
    text = json.dumps(doc, indent=2, allow_nan=False, ensure_ascii=False)
    # a lone surrogate (JSON allows "\ud800") cannot be written as UTF-8: keep it as its JSON escape
    stream.write(text.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")


def render(result: Diagnosis, stream: TextIO) -> None:
    """Write the JSON document of ``result`` to ``stream``."""
    json.dump(build(result), stream, indent=2, allow_nan=False)
    stream.write("\n")


def render_comparison(c: Comparison, stream: TextIO) -> None:
    from ddpdoctor.report import compare_document

    _dump(compare_document.comparison(c), stream)


def render_gate(result: GateResult, stream: TextIO) -> None:
    from ddpdoctor.report import compare_document

    _dump(compare_document.gate(result), stream)
