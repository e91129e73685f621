"""The findings in TensorBoard's Text tab are inert text (issue 23, item 12): TensorBoard renders a text summary as
Markdown and lets some HTML through its sanitizer, so a user rule's ``<img src=x onerror=...>`` or
``[link](javascript:...)`` in a message would become a live element. ddpdoctor writes them escaped, as its other
Markdown output does; ddpdoctor's own markup (bold, lists) still renders."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from tensorboard import plugin_util
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddpdoctor.diagnosis.rules import builtin_rules_dir
from ddpdoctor.pipeline import RuleOptions
from ddpdoctor.tensorboard.events import write_events

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import CHROMIUM, chromium  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp_gloo_2rank"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason="recorded fixture ddp_gloo_2rank is missing")
IMG = "<img src=x onerror=alert(1)>"
LINK = "[click me](javascript:alert(1))"


@pytest.fixture(scope="module")
def findings_html(tmp_path_factory) -> str:
    """The HTML TensorBoard's text plugin serves for rank 0's findings, with a hostile user rule."""
    tmp = tmp_path_factory.mktemp("tb_escaped")
    run_dir = Path(shutil.copytree(FIXTURE, tmp / "run"))
    text = (Path(str(builtin_rules_dir())) / "poor-comm-compute-overlap.toml").read_text()
    text = text.replace('id = "DDP002"', 'id = "USR002"').replace(
        'name = "poor-comm-compute-overlap"', 'name = "my-overlap"'
    )
    text = re.sub(r'(?m)^message = "', f'message = "{IMG} **bold** ', text, count=1)
    text = re.sub(r'(?m)^recommendation = "', f'recommendation = "{LINK} <script>alert(2)</script> ', text, count=1)
    (tmp / "rules").mkdir()
    (tmp / "rules" / "my-overlap.toml").write_text(text)
    write_events(run_dir, rules=RuleOptions(rules_dirs=[str(tmp / "rules")], select=["my-overlap"]))
    acc = EventAccumulator(str(run_dir / "tensorboard" / "rank0"), size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("ddpdoctor/findings")
    markdown = event.tensor_proto.string_val[0].decode()
    assert "my-overlap" in markdown  # the rule fired: its message is in the text
    return plugin_util.markdown_to_safe_html(markdown)  # what the Text tab inserts into the page


def test_html_in_a_finding_is_shown_as_text(findings_html):
    assert "<img" not in findings_html and "<script" not in findings_html, findings_html
    assert "&lt;img src=x onerror=alert(1)&gt;" in findings_html  # the user reads what the rule says


def test_markdown_in_a_finding_is_shown_as_text(findings_html):
    assert "<a" not in findings_html and "**bold**" in findings_html, findings_html
    assert "[click me](javascript:alert(1))" in findings_html


def test_ddpdoctors_own_markup_still_renders(findings_html):
    assert "<strong>ddpdoctor findings for rank 0</strong>" in findings_html and "<li>" in findings_html


@pytest.mark.integration
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_chromium_shows_no_element_from_a_finding(findings_html, tmp_path):
    page = tmp_path / "text.html"
    page.write_text(f"<!doctype html><html><body><div id='text'>{findings_html}</div></body></html>")
    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert "<img" not in dom and "<script>alert" not in dom and "<a " not in dom and "<a>" not in dom, dom
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom
