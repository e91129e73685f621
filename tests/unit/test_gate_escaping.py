"""Strings from traces and baseline files reach the gate's output escaped for each sink (issue 13, item 7):
the same hostile strings go through the terminal text, GitHub workflow commands, the Markdown step summary,
JUnit XML and JSON. A newline must not start a workflow command (``::error``, ``::add-mask::``) in the CI log,
a backtick must not leave a Markdown code span, control characters must not reach a terminal or XML."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from html import unescape

import pytest
from markdown_it import MarkdownIt

from ddpdoctor import escape
from ddpdoctor.compare.gate import gate
from ddpdoctor.compare.snapshot import Snapshot
from ddpdoctor.compare.thresholds import load_config
from ddpdoctor.report import Document, OutputFormat, github, junit, renderer

INJECT = "x\n::error title=pwned::injected\r::add-mask::secret"
SPACED = "a" * 70 + " ::error::wrapped " + "b" * 70  # a terminal wrapping at a space would start a line with ::
TICK = "runs/a` <b>bold</b> [link](http://evil.example) | `x"
CONTROL = "\x1b[31mred\x1b]0;title\x07\x00nul\u202eevil\u2028sep\ud800"
HOSTILE = [INJECT, SPACED, TICK, CONTROL]
_BAD_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u2028\u2029\u202a-\u202e\ud800-\udfff]")

ENV = {"mode": "ddp", "world_size": 2, "backend": "gloo", "devices": ["cpu"], "torch_version": "2.13.0"}


def _result(hostile: str):
    steps = [30.0, 30.5, 29.5, 30.2, 29.8, 30.1]
    finding = {"id": "X1", "name": "rule-" + hostile, "severity": "error", "ranks": [0], "message": hostile}
    base = Snapshot(
        source="perf/" + hostile + ".json",
        origin=hostile,
        environment={**ENV, "torch_version": hostile},
        metrics={"step_ms.median": 30.0},
        samples={"step_ms": steps},
        findings=[],
        rules_evaluated=[],
        notes=[hostile],
        created_at=hostile,
        is_baseline=True,
    )
    cur = Snapshot(
        source=hostile,
        environment=dict(ENV),
        metrics={"step_ms.median": 30.0},
        samples={"step_ms": steps},
        findings=[finding],
        rules_evaluated=[],
        notes=[hostile],
        incomplete=[hostile],
    )
    return gate(cur, base, load_config(cwd="/"))


def _render(result, fmt: OutputFormat) -> str:
    out = io.StringIO()
    renderer(Document.GATE, fmt)(result, out)
    return out.getvalue()


@pytest.mark.parametrize("hostile", HOSTILE)
def test_terminal_text(hostile):
    text = _render(_result(hostile), OutputFormat.TEXT)
    assert not _BAD_CHARS.search(text)
    assert "\r" not in text
    assert not [line for line in text.splitlines() if line.lstrip().startswith("::")], text
    text.encode("utf-8")  # printable: no lone surrogate


@pytest.mark.parametrize("hostile", HOSTILE)
def test_workflow_commands(hostile):
    result = _result(hostile)
    lines = github.annotations(result)
    assert lines
    for line in lines:
        assert "\n" not in line and "\r" not in line and not _BAD_CHARS.search(line)
        m = re.match(r"^::(error|warning) title=([^:]*)::(.*)$", line)
        assert m, line
        assert "," not in m.group(2)  # a property value cannot add properties
    stream = io.StringIO()
    github.write_annotations(result, stream)
    assert all(line.startswith(("::error title=", "::warning title=")) for line in stream.getvalue().splitlines())


@pytest.mark.parametrize("hostile", HOSTILE)
def test_markdown_summary(hostile, tmp_path):
    result = _result(hostile)
    summary = tmp_path / "summary.md"
    github.append_step_summary(result, str(summary))
    for text in (summary.read_text(encoding="utf-8"), _render(result, OutputFormat.MARKDOWN)):
        assert not _BAD_CHARS.search(text)
        html = MarkdownIt("commonmark").enable("table").render(text)
        assert "<b>" not in html and "<a " not in html and "<script" not in html
        assert not [line for line in text.splitlines() if line.lstrip().startswith("::")]
        # the run paths stay inside their code spans: each code span's text is the whole escaped path
        codes = [unescape(c) for c in re.findall(r"<code>(.*?)</code>", html, flags=re.S)]
        assert escape.terminal(hostile) in codes, codes


@pytest.mark.parametrize("hostile", HOSTILE)
def test_junit_xml(hostile):
    data = junit.to_bytes(_result(hostile))
    root = ET.fromstring(data)  # well-formed: no control characters XML 1.0 forbids, no lone surrogates
    values = [x for el in root.iter() for x in (el.text or "", *el.attrib.values())]
    assert not any(_BAD_CHARS.search(v) for v in values)
    assert any("run incomplete" == (el.get("type") or "") for el in root.iter("failure"))


@pytest.mark.parametrize("hostile", HOSTILE)
def test_json(hostile):
    text = _render(_result(hostile), OutputFormat.JSON)
    text.encode("utf-8")
    doc = json.loads(text)
    assert doc["result"] == "fail"


def test_each_sink_has_one_helper_that_is_idempotent_on_safe_text():
    safe = "runs/ci step_ms.median 31.2 ms"
    assert escape.terminal(safe) == safe and escape.xml(safe) == safe
    assert escape.workflow_data(safe) == safe
    assert escape.workflow_property("a: b, c") == "a%3A b%2C c"
    assert escape.markdown_code("a`b") == "`` a`b ``"
