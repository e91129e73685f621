"""The HTML report, opened in headless Chromium as a user would open it: findings and charts render, nothing from
the trace runs as markup, and it needs no network (one self-contained file)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from helpers import CHROMIUM, chromium, run_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed"),
]

# A real recorded 2-rank gloo run in which rank 1 sleeps every step (see tests/fixtures/make_ddp_gloo_2rank.py).
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"


def test_html_report_renders_in_chromium(tmp_path):
    run = tmp_path / "run <script>alert(1)</script>"
    shutil.copytree(FIXTURE, run)
    report = tmp_path / "report.html"
    result = run_cli("diagnose", str(run), "--format", "html", "--output", str(report), timeout=120)
    assert result.returncode == 0, result.stderr
    html = report.read_text()
    assert "<script>alert(1)</script>" not in html  # the run's name is text, not markup
    assert not re.search(r"""(src|href)=["']?https?://""", html), "the report must not load anything remote"

    dom = chromium(tmp_path / "profile", "--window-size=1300,1000", "--dump-dom", report.as_uri())
    assert "poor-comm-compute-overlap" in dom and "rank-straggler" in dom  # a finding, and one not evaluated
    assert dom.count("<svg") >= 2  # the charts were drawn
    assert "run &lt;script&gt;alert(1)&lt;/script&gt;" in dom

    shot = tmp_path / "html-report.png"
    chromium(tmp_path / "profile", "--window-size=1300,2000", f"--screenshot={shot}", report.as_uri())
    assert shot.stat().st_size > 10_000
    if os.environ.get("DDPDOCTOR_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["DDPDOCTOR_SCREENSHOT_DIR"]) / shot.name)


RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"


def test_html_report_explains_itself(tmp_path):
    """What a first-time reader of the page needs (issue 19, point 5): where --output went, code shown as code and
    not as literal backticks, column headings in words, and why the bars' numbers differ from the table's p50."""
    report = tmp_path / "report.html"
    result = run_cli("diagnose", str(RECORDED), "--format", "html", "--output", str(report), timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"wrote the html report to {report}" in result.stderr

    dom = chromium(tmp_path / "profile", "--window-size=1300,1000", "--dump-dom", report.as_uri())
    body = re.sub(r"<style>.*?</style>", "", dom, flags=re.S)
    text = re.sub(r"<[^>]+>", "", body)
    assert "ddpdoctor trace" in text and "`" not in text, "Markdown code spans must render as code"
    assert "<code>ddpdoctor trace</code>" in body
    headings = re.findall(r"<th[^>]*>([^<]*)</th>", body)
    assert "busbw (GB/s)" in headings and not [h for h in headings if "_" in h], headings
    assert "ms mean" in body and "median" in text  # bar totals are means, the table's p50 a median: said so

    shot = tmp_path / "html-report-explained.png"
    chromium(tmp_path / "profile", "--window-size=1300,2400", f"--screenshot={shot}", report.as_uri())
    assert shot.stat().st_size > 10_000
    if os.environ.get("DDPDOCTOR_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["DDPDOCTOR_SCREENSHOT_DIR"]) / shot.name)
