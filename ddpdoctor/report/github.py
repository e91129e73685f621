"""GitHub Actions output of ``ddpdoctor gate`` (when ``GITHUB_ACTIONS`` is set): ``::error``/``::warning``
workflow commands (annotations on the run) and a Markdown table appended to ``$GITHUB_STEP_SUMMARY``."""

from __future__ import annotations

from typing import TextIO

from ddpdoctor import escape
from ddpdoctor.compare.gate import FAIL, WARN, GateResult
from ddpdoctor.report.gate_text import env_lines, incomplete_lines, markdown_lines

_data, _prop = escape.workflow_data, escape.workflow_property


def annotations(result: GateResult) -> list[str]:
    """One ``::error`` per failure, one ``::warning`` per warning and per environment difference."""
    out = [
        f"::error title={_prop('ddpdoctor gate: run incomplete')}::{_data(line)}" for line in incomplete_lines(result)
    ]
    for check in (*result.metrics, *result.rules):
        if check.outcome in (FAIL, WARN):
            name = getattr(check, "metric", None) or getattr(check, "rule", "")
            level = "error" if check.outcome == FAIL else "warning"
            out.append(f"::{level} title={_prop('ddpdoctor gate: ' + name)}::{_data(check.message)}")
    level = "error" if result.env_failed else "warning"
    out += [f"::{level} title={_prop('ddpdoctor gate: environment')}::{_data(line)}" for line in env_lines(result)]
    # a baseline too noisy to see its thresholds (issue 25): said where CI readers look, not only in the summary
    out += [
        f"::warning title={_prop('ddpdoctor gate: noisy baseline')}::{_data(note)}"
        for note in result.notes
        if "cannot detect a change smaller than" in note
    ]
    return out


def write_annotations(result: GateResult, stream: TextIO) -> None:
    for line in annotations(result):
        stream.write(line + "\n")
    stream.flush()


def append_step_summary(result: GateResult, path: str) -> None:
    """Append the Markdown table to the job summary file (appending: other steps write there too)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(markdown_lines(result)) + "\n")
