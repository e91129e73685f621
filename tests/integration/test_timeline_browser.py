"""The step timeline of the HTML report, laid out by headless Chromium: in the straggler sample the late-arrival
mark stands in the straggler's lane (rank 1) and the wait it causes in the other rank's, for the median step and,
once its radio button is chosen, for the worst step. The report itself runs no script: the test adds one to a copy
to read where the browser put things."""

from __future__ import annotations

import json
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

RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"

# Where the browser drew each mark: the box of every visible mark and of its rank's lane group, per panel.
PROBE = """
<script>
function boxes() {
  const out = [];
  for (const panel of document.querySelectorAll(".tl-panel")) {
    if (getComputedStyle(panel).display === "none") continue;
    const lanes = {};
    for (const g of panel.querySelectorAll("g.tl-rank")) {
      const r = g.querySelector("rect").getBoundingClientRect();  // the rank's upper row (its whole step)
      lanes[g.dataset.rank] = {top: r.top, bottom: g.getBoundingClientRect().bottom};
    }
    for (const m of panel.querySelectorAll("g.tl-mark")) {
      const shape = m.querySelector("line, rect").getBoundingClientRect();
      out.push({step: panel.dataset.step, rule: m.dataset.rule, rank: m.dataset.rank, part: m.dataset.part,
                y: (shape.top + shape.bottom) / 2, lanes});
    }
  }
  return out;
}
const result = {median: boxes()};
document.querySelectorAll(".tl > input")[1].checked = true;
result.worst = boxes();
const pre = document.createElement("pre");
pre.id = "probe";
pre.textContent = JSON.stringify(result);
document.body.appendChild(pre);
</script>
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("timeline")
    out = tmp / "report.html"
    # --steps: from the traces, so a sample recorded before the timeline existed has one too
    result = run_cli("diagnose", str(RECORDED), "--steps", "0..", "--format", "html", "--output", str(out), timeout=120)
    assert result.returncode == 0, result.stderr
    return out


def _in_lane(mark: dict) -> str | None:
    """The rank whose lane (upper row to the bottom of its group) holds the mark's middle."""
    return next((r for r, box in mark["lanes"].items() if box["top"] <= mark["y"] <= box["bottom"]), None)


def test_straggler_marks_are_on_the_stragglers_lane_in_both_steps(report, tmp_path):
    html = report.read_text()
    assert "<script" not in html  # the report needs none; the probe below is the test's
    assert 'data-rule="rank-straggler"' in html
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("</body>", PROBE + "</body>"))
    dom = chromium(tmp_path / "profile", "--window-size=1300,1000", "--dump-dom", probed.as_uri())
    result = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    steps = set()
    for panel in ("median", "worst"):
        marks = [m for m in result[panel] if m["rule"] == "rank-straggler"]
        late = [m for m in marks if m["part"] == "late-arrival"]
        waits = [m for m in marks if m["part"] == "wait-caused"]
        assert len(late) == 1 and late[0]["rank"] == "1" and _in_lane(late[0]) == "1", (panel, marks)
        assert waits and all(m["rank"] == "0" and _in_lane(m) == "0" for m in waits), (panel, marks)
        steps.add(late[0]["step"])
    assert len(steps) == 2  # the radio button showed the other step

    page = tmp_path / "timeline.html"  # the timeline alone, for the docs' screenshot
    start = html.index("<h2>Step timeline</h2>")
    style = re.search(r"<style>.*?</style>", html, re.S).group(0)
    page.write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8">{style}</head><body>'
        f"{html[start : html.index('<h2>', start + 5)]}</body></html>"
    )
    shot = tmp_path / "timeline.png"
    chromium(tmp_path / "profile", "--window-size=1000,460", f"--screenshot={shot}", page.as_uri())
    assert shot.stat().st_size > 10_000
    if os.environ.get("DDPDOCTOR_SCREENSHOT_DIR"):  # e.g. to refresh docs/timeline.png
        shutil.copy(shot, Path(os.environ["DDPDOCTOR_SCREENSHOT_DIR"]) / shot.name)
