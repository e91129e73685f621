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
    assert "rank-straggler" in dom and "Rank 1 is a straggler" in dom
    assert dom.count("<svg") >= 2  # the charts were drawn
    assert "run &lt;script&gt;alert(1)&lt;/script&gt;" in dom

    shot = tmp_path / "html-report.png"
    chromium(tmp_path / "profile", "--window-size=1300,2000", f"--screenshot={shot}", report.as_uri())
    assert shot.stat().st_size > 10_000
    if os.environ.get("DDPDOCTOR_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["DDPDOCTOR_SCREENSHOT_DIR"]) / shot.name)
