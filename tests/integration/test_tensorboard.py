"""A real 2-rank DDP run opened with `ddpdoctor view`: TensorBoard's profiler plugin, ddpdoctor's event files
and the ddpdoctor dashboard, queried over HTTP and rendered in headless Chromium. One server for the
module."""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from helpers import CHROMIUM, chromium, read_json, run_cli, write_script
from helpers import DashboardView as View

TRY_RESULTS = Path(__file__).resolve().parents[1] / "fixtures" / "try_results" / "results.json"

pytestmark = [pytest.mark.integration]

# A real user mistake the capture files alone reveal: find_unused_parameters=True with every parameter used
# except one head. The script frees the DDP model before tearing the process group down: with ddpdoctor's
# profiler running, gloo's destructor can otherwise deadlock on the GIL at exit (reported to capture).
SCRIPT = """
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        self.unused_head = nn.Linear(256, 10)  # never called

    def forward(self, x):
        return self.body(x)


dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(Net(), find_unused_parameters=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(8):
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
del model, opt
dist.barrier()
dist.destroy_process_group()
"""
# A run directory name a browser must show as text, never as markup.
RUN_NAME = "run <img src=x onerror=alert(1)>"
FAST = ["--wait", "1", "--warmup", "1", "--active", "3"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")


def wait_for(fetch, ok, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    script = write_script(root / "train_unused.py", SCRIPT)
    out = root / RUN_NAME
    result = run_cli(
        "trace", "--out", str(out), *FAST, "--standalone", "--nproc-per-node", "2", str(script), timeout=180
    )
    assert result.returncode == 0, result.stderr
    # a trial of this run, as `ddpdoctor try` leaves it beside the run (real output, tests/fixtures/try_results)
    (root / f"{RUN_NAME}.trials" / "1").mkdir(parents=True)
    shutil.copy(TRY_RESULTS, root / f"{RUN_NAME}.trials" / "1" / "results.json")
    return out


@pytest.fixture(scope="module")
def view(run_dir, tmp_path_factory):
    server = View(run_dir, tmp_path_factory.mktemp("logs") / "view.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def profiler_run(view):
    runs = wait_for(lambda: view.get("data/plugin/pytorch_profiler/runs"), lambda r: r["runs"] and not r["loading"])
    assert runs["runs"] == [RUN_NAME]
    return q(RUN_NAME)


def test_view_writes_event_files_per_rank_and_tensorboard_reads_them(view, run_dir):
    assert "ddpdoctor: wrote TensorBoard event files" in "".join(view.stdout)
    assert all(any((run_dir / "tensorboard" / f"rank{r}").glob("events.out.tfevents.*")) for r in (0, 1))
    tags = wait_for(lambda: view.get("data/plugin/scalars/tags"), lambda t: len(t) == 2)
    assert set(tags) == {"tensorboard/rank0", "tensorboard/rank1"}
    for run in tags.values():
        assert {
            "time/step_ms",
            "gil/contention",
            "time/forward_ms",
            "comm/exposed_comm_ms",
            "comm/overlap_ratio",
            "comm/busbw_gbps",
        } <= set(run)
    # the step times are the capture's own numbers, every step
    points = view.get(f"data/plugin/scalars/scalars?run={q('tensorboard/rank0')}&tag={q('time/step_ms')}")
    capture = read_json(run_dir / "ranks" / "rank0.json")["steps"]
    assert [p[1] for p in points] == list(range(capture["first"], capture["first"] + len(capture["wall_ms"])))
    assert [p[2] for p in points] == pytest.approx(capture["wall_ms"], rel=1e-5)
    assert view.get("data/plugin/text/tags") == {f"tensorboard/rank{r}": ["ddpdoctor/findings"] for r in (0, 1)}
    (entry,) = view.get(f"data/plugin/text/text?run={q('tensorboard/rank1')}&tag={q('ddpdoctor/findings')}")
    assert "find-unused-parameters-cost" in entry["text"] and "Recommendation" in entry["text"]


def test_profiler_plugin_shows_one_worker_per_rank_with_its_views(view, profiler_run):
    views = view.get(f"data/plugin/pytorch_profiler/views?run={profiler_run}")
    assert {"Overview", "Operator", "Trace", "Memory"} <= set(views)
    for name in ("Overview", "Operator", "Trace", "Memory"):
        assert view.get(f"data/plugin/pytorch_profiler/workers?run={profiler_run}&view={name}") == [
            "rank0",
            "rank1",
        ]
    overview = view.get(f"data/plugin/pytorch_profiler/overview?run={profiler_run}&worker=rank1&span=1")
    assert overview["steps"]["rows"]  # per-step breakdown of rank 1's profiled steps


def test_profiler_plugin_builds_the_distributed_view(view, profiler_run):
    assert "Distributed" in view.get(f"data/plugin/pytorch_profiler/views?run={profiler_run}")
    overlap = view.get(f"data/plugin/pytorch_profiler/distributed/overlap?run={profiler_run}&worker=All&span=1")
    assert set(overlap["data"]["all"]) == {"rank0", "rank1"}
    ops = view.get(f"data/plugin/pytorch_profiler/distributed/commops?run={profiler_run}&worker=All&span=1")
    assert [row[0] for row in ops["data"]["rank0"]["rows"]] == ["gloo:all_reduce"]


def test_tensorboard_lists_the_ddpdoctor_dashboard_as_an_active_plugin(view):
    listing = view.get("data/plugins_listing")
    entry = listing["ddpdoctor"]
    assert entry["enabled"] is True
    assert entry["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/ddpdoctor/index.js"}
    assert listing["pytorch_profiler"]["enabled"] is True


def test_report_route_gives_the_diagnosis_and_chart_tables(view):
    runs = view.get("data/plugin/ddpdoctor/runs")["runs"]
    assert runs == [{"run": ".", "label": RUN_NAME}]
    report = view.get("data/plugin/ddpdoctor/report?run=.")
    assert report["schema_version"] == 1 and report["run"]["world_size"] == 2 and report["run"]["name"] == RUN_NAME
    assert "find-unused-parameters-cost" in [f["name"] for f in report["findings"]]
    assert {r["rank"] for r in report["steps"]} == {0, 1} and {r["rank"] for r in report["per_step"]} == {
        0,
        1,
    }
    # the parts of a step that took time (this script has no DataLoader: no data-loading part)
    assert {"forward_ms", "backward_ms", "optimizer_ms"} <= set(report["components"])
    assert "dataloader_ms" not in report["components"]
    assert [c["kind"] for c in report["collectives"] if c["rank"] == 0] == ["all_reduce"]
    assert view.status("data/plugin/ddpdoctor/report?run=..") == 404


def _chromium(tmp_path, *args):
    return chromium(tmp_path / "chromium-profile", *args)


def _assert_dashboard(dom: str, report: dict) -> None:
    assert 'data-state="ready"' in dom, dom[-3000:]
    findings = re.findall(r'<article class="finding [^"]*" data-finding="([^"]+)"', dom)
    assert findings == [f["name"] for f in report["findings"]] and findings
    assert "Recommendation:" in dom
    charts = set(re.findall(r'<figure class="chart" data-chart="([\w-]+)"', dom))
    assert {"breakdown", "step-time", "overlap", "busbw", "skew"} <= charts
    assert dom.count("<svg") >= len(charts) and dom.count('class="bar"') >= 6
    # the trial of this run is shown next to it
    assert 'data-section="trials"' in dom and "ddp.bucket_cap_mb=1" in dom
    # the run's name is text, not markup
    assert "<img" not in dom and "&lt;img src=x onerror=alert(1)&gt;" in dom
    # the step timeline of the HTML report (issue 27): a lane group per rank, median and worst step to choose
    timeline = dom[dom.index('data-section="timeline"') :]
    assert set(re.findall(r'<g class="tl-rank" data-rank="(\d+)"', timeline)) == {"0", "1"}, timeline[:3000]
    assert timeline.count('type="radio"') in (1, 2) and 'data-lane="backward"' in timeline
    # one colour per step part, the palette's (ddpdoctor/report/palette.py), in the dashboard's bars too
    forward = re.search(r'<rect [^>]*fill="(#[0-9a-f]{6})" class="bar" data-series="forward"', dom)
    assert forward and forward.group(1) == report["phase_colors"]["forward_ms"], forward


@needs_chromium
def test_dashboard_renders_findings_and_charts_in_chromium(view, tmp_path):
    report = view.get("data/plugin/ddpdoctor/report?run=.")
    page = f"{view.url}data/plugin/ddpdoctor/dashboard.html?run=."
    _assert_dashboard(_chromium(tmp_path, "--window-size=1400,1000", "--dump-dom", page), report)
    shot = tmp_path / "tensorboard-dashboard.png"
    _chromium(tmp_path, "--window-size=1400,2300", f"--screenshot={shot}", page)
    assert shot.stat().st_size > 20_000
    if os.environ.get("DDPDOCTOR_SCREENSHOT_DIR"):  # e.g. to refresh docs/tensorboard-dashboard.png
        shutil.copy(shot, Path(os.environ["DDPDOCTOR_SCREENSHOT_DIR"]) / shot.name)


@needs_chromium
def test_dashboard_renders_in_tensorboards_plugin_frame(view, tmp_path):
    # The page TensorBoard puts in the dashboard's iframe, with TensorBoard's own Content-Security-Policy.
    report = view.get("data/plugin/ddpdoctor/report?run=.")
    dom = _chromium(
        tmp_path, "--window-size=1400,1000", "--dump-dom", f"{view.url}data/plugin_entry.html?name=ddpdoctor"
    )
    _assert_dashboard(dom, report)


def test_view_prints_no_tensorboard_data_loading_note(view):
    """TensorBoard's "experimental fast data loading" note is not ddpdoctor's to show (issue 19, point 7)."""
    log = Path(view.log.name).read_text()
    assert "TensorBoard at http" in "".join(view.stdout)
    assert "fast data loading" not in log and "load_fast" not in log, log


def test_ctrl_c_stops_view_and_frees_the_port(run_dir, tmp_path):
    server = View(run_dir, tmp_path / "view.log")
    port = urllib.parse.urlparse(server.url).port
    assert server.url.startswith("http://127.0.0.1:")
    assert server.stop(timeout=30) == 0
    assert "TensorBoard stopped" in "".join(server.stdout)
    with socket.socket() as probe:  # the port is free again
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


STRAGGLER = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"


@pytest.fixture(scope="module")
def straggler_view(tmp_path_factory):
    run = tmp_path_factory.mktemp("straggler") / "ddp_straggler"
    shutil.copytree(STRAGGLER, run)
    server = View(run, tmp_path_factory.mktemp("logs") / "straggler_view.log")
    yield server
    server.stop()


def _lane_of(y: float, lanes: dict[str, tuple[float, float]]) -> str | None:
    return next((rank for rank, (top, bottom) in lanes.items() if top <= y <= bottom), None)


@needs_chromium
def test_dashboard_timeline_marks_the_straggler_on_its_own_lane_in_both_steps(straggler_view, tmp_path):
    """Issue 27: the dashboard's step timeline, as Chromium built it from the report route, marks rank 1's late
    arrival in rank 1's lane and the wait it causes in rank 0's, in the median and the worst step (the SVG's own
    coordinates: the lane groups' data-y / data-h, the mark's line)."""
    page = f"{straggler_view.url}data/plugin/ddpdoctor/dashboard.html?run=."
    dom = _chromium(tmp_path, "--window-size=1400,1000", "--virtual-time-budget=15000", "--dump-dom", page)
    assert 'data-state="ready"' in dom, dom[-2000:]
    panels = re.split(r'class="tl-panel" data-step="', dom)[1:]
    assert len(panels) == 2, len(panels)
    steps = set()
    for panel in panels:
        step = panel[: panel.index('"')]
        lanes = {
            r: (float(y), float(y) + float(h))
            for r, y, h in re.findall(
                r'<g class="tl-rank" data-rank="(\d+)" data-y="([\d.]+)" data-h="([\d.]+)"', panel
            )
        }
        assert set(lanes) == {"0", "1"}, lanes
        marks = []  # (rank, step, part, the middle of its shape's height)
        for rank, mstep, part, body in re.findall(
            r'<g class="tl-mark" data-rule="rank-straggler" data-rank="(\d+)" data-step="(\d+)" '
            r'data-part="([\w-]+)">(.*?)</g>',
            panel,
        ):
            line = re.search(r'<line [^>]*y1="([\d.]+)" y2="([\d.]+)"', body)
            box = re.search(r'<rect [^>]*\by="([\d.]+)"[^>]*\bheight="([\d.]+)"', body)
            top, bottom = (float(line[1]), float(line[2])) if line else (float(box[1]), float(box[1]) + float(box[2]))
            marks.append((rank, mstep, part, (top + bottom) / 2))
        late = [m for m in marks if m[2] == "late-arrival"]
        waits = [m for m in marks if m[2] == "wait-caused"]
        assert len(late) == 1 and late[0][:2] == ("1", step) and _lane_of(late[0][3], lanes) == "1", (late, lanes)
        assert waits and all(m[:2] == ("0", step) and _lane_of(m[3], lanes) == "0" for m in waits), (waits, lanes)
        steps.add(step)
    assert len(steps) == 2  # the median and the worst step are different steps
