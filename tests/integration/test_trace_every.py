"""Issue 28 items 2-3 on real 2-rank CPU jobs traced with ``--every``: the windows are there (and ``--keep`` bounds
them), a straggler introduced halfway through the run is reported with when it started, a memory leak is projected
to its out-of-memory step; a straggler that moves between ranks is said to move, and that job (its step time and
memory steady) shows no drift and no leak.

Two traced jobs (module-scoped, shared by the asserts), each 80 short steps with 4 windows of 8 steps.
"""

from __future__ import annotations

import html
import json
import os
import re
import statistics
import urllib.request

import pytest
from helpers import CHROMIUM, DashboardView, chromium, read_json, run_cli, write_script

from ddpdoctor.capture.series import read_series
from ddpdoctor.report import over_time

pytestmark = [pytest.mark.integration]

JOB = """
import os, time, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo"); rank = dist.get_rank(); torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow_from = int(os.environ.get("SLOW_FROM", "-1")); move = int(os.environ.get("MOVE_EVERY", "0"))
leak_bytes = int(os.environ.get("LEAK", "0")); leak = []
for step in range(80):
    time.sleep(float(os.environ.get("STEP_S", "0.01")))
    slow = (step // move) % 2 if move else (1 if 0 <= slow_from <= step else -1)
    if rank == slow:
        time.sleep(0.15)  # the straggler: 150 ms more per step
    if leak_bytes:
        leak.append(b"\\x01" * leak_bytes)  # written: resident, RSS grows
    loss = model(torch.randn(16, 128)).square().mean(); opt.zero_grad(); loss.backward(); opt.step()
dist.barrier(); dist.destroy_process_group()
"""
WINDOWS = ["--wait", "1", "--warmup", "1", "--active", "8", "--every", "20"]  # steps 3-10, 23-30, 43-50, 63-70
LEAK = 2 * 2**20  # per rank per step
SLOW_FROM = 36


def _trace(tmp, name, env, *extra):
    script = write_script(tmp / f"{name}.py", JOB)
    out = tmp / name
    traced = run_cli(
        "trace",
        "--out",
        str(out),
        *WINDOWS,
        *extra,
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        timeout=400,
        env={**os.environ, **env},
    )
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    return out, traced.stderr, json.loads(diagnosed.stdout)


@pytest.fixture(scope="module")
def halfway(tmp_path_factory):
    """A straggler from step 36 and a leak of 2 MiB per rank per step; the newest 3 windows kept."""
    tmp = tmp_path_factory.mktemp("every")
    return _trace(tmp, "halfway", {"SLOW_FROM": str(SLOW_FROM), "LEAK": str(LEAK)}, "--keep", "3")


@pytest.fixture(scope="module")
def moving(tmp_path_factory):
    """Rank 0 slow in steps 0-19 and 40-59, rank 1 in 20-39 and 60-79: a different rank in each window."""
    tmp = tmp_path_factory.mktemp("every")
    return _trace(tmp, "moving", {"MOVE_EVERY": "20"})


@pytest.fixture(scope="module")
def by_time(tmp_path_factory):
    """--every 1s: a 2-rank job of 80 steps of ~55 ms (about 4.5 s), a window of 8 steps at each new second."""
    tmp = tmp_path_factory.mktemp("every")
    args = ["--wait", "1", "--warmup", "1", "--active", "8", "--every", "1s"]
    script = write_script(tmp / "by_time.py", JOB)
    out = tmp / "by_time"
    traced = run_cli(
        "trace", "--out", str(out), *args, "--standalone", "--nproc-per-node", "2", str(script),
        timeout=400, env={**os.environ, "STEP_S": "0.05"},
    )  # fmt: skip
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    return out, traced.stderr, json.loads(diagnosed.stdout)


def _record(report, name):
    found = report["run"]["over_time"]["findings"]
    assert found["evaluated"], found
    return next((r for r in found["findings"] if r["name"] == name), None)


@pytest.mark.timeout(600)
def test_every_takes_the_windows_and_keep_bounds_them(halfway):
    out, stderr, _ = halfway
    assert "a window every 20 steps: steps 3-10, 23-30, ..." in stderr
    assert "removed the oldest window's trace (steps 3-10)" in stderr
    for rank in (0, 1):
        cap = read_json(out / "ranks" / f"rank{rank}.json")
        assert cap["steps"]["profiled"] == [[3, 10], [23, 30], [43, 50], [63, 70]]
        assert [(d["first_step"], d["last_step"]) for d in cap["schedule"]["dropped"]] == [(3, 10)]
        # summarised before it went (capture/window_summary.py): its summary stays, its link is gone
        (dropped,) = cap["schedule"]["dropped"]
        assert dropped.get("summary") == f"rank{rank}.window3-10.summary.json", dropped
        assert (out / "ranks" / dropped["summary"]).is_file()
        assert len(cap["trace_files"]) == 3 and all((out / f).is_file() for f in cap["trace_files"])
        assert len(list(out.glob(f"rank{rank}.*.pt.trace.json*"))) == 3  # the dropped one is gone from disk
    assert not list((out / "ranks").glob(".*pending*"))
    # the always-on series holds every step of both ranks, windows or not (the dropped window's steps too)
    series = read_series(out)
    assert sorted(series) == [0, 1]
    for rank, s in series.items():
        count = read_json(out / "ranks" / f"rank{rank}.json")["steps"]["count"]
        assert count == 80 and [r["step"] for r in s.rows] == list(range(count)) and s.bad_lines == 0, rank
    # the straggler's 150 ms a step from step 36 on is in the series of every step, not only in the windows
    walls = [r["wall_s"] for r in series[1].rows]
    before = statistics.median(w for w in walls[1 : SLOW_FROM - 2] if w is not None)
    after = statistics.median(w for w in walls[SLOW_FROM + 2 :] if w is not None)
    assert before < 0.15 < after, (before, after)


@pytest.mark.timeout(600)
def test_a_straggler_from_halfway_is_reported_with_when_it_started(halfway):
    _, _, report = halfway
    ot = report["run"]["over_time"]
    # every window, the one --keep removed (3-10) from the summaries the ranks made of it before it went
    assert ot["findings"]["window_steps"] == [[3, 10], [23, 30], [43, 50], [63, 70]]
    rec = _record(report, "rank-straggler")
    assert rec is not None, ot["findings"]
    assert rec["culprit"] == 1 and rec["pattern"] == "started", rec
    # held in the windows after step 36 (43-50, 63-70), not in the two before (3-10, 23-30)
    assert (rec["since_step"], rec["absent_until_step"], rec["held_windows"]) == (43, 30, [3, 4]), rec
    # (on this loaded host a window before may name another rank too: said as "also rank 0 in window 1")
    assert all(o["window"] in (1, 2) and 1 not in o["ranks"] for o in rec.get("other_ranks") or [])
    # the always-on series puts the start at the step the step time jumped (the straggler began at step 36)
    drift = ot["step_time"]
    assert drift["drift"] is True and abs(drift["jump_step"] - SLOW_FROM) <= 2, drift
    assert rec["started_step"] == drift["jump_step"] and "the step time jumped at step" in rec["text"]
    assert rec["started_time"].endswith("UTC")


@pytest.mark.timeout(600)
def test_a_window_read_from_its_summaries_is_the_window_read_from_its_trace(halfway, tmp_path):
    """What a removed window's summaries give (capture/window_summary.py) is what its trace gave: a kept window
    (63-70) summarised the way --keep summarises one, against the same window of the traces."""
    import os
    import shutil

    from ddpdoctor import rundir, runfiles
    from ddpdoctor.capture.window_summary import summarize_window
    from ddpdoctor.diagnosis import evaluate, load_rules
    from ddpdoctor.load import load
    from ddpdoctor.load.loader import window_from_summaries
    from ddpdoctor.metrics.analysis import analyze

    out = tmp_path / "run"
    shutil.copytree(halfway[0], out)
    run = load(out, use_summaries=False, summarize=False)
    traced = analyze(run, steps=(63, 70))
    summaries = {}
    for rank in (0, 1):
        last = read_json(out / "ranks" / f"rank{rank}.json")["trace_files"][-1]  # the newest window: 63-70
        link = rundir.window_pending_file(out, rank, 63, 70, last)
        os.link(out / last, link)
        path = summarize_window(out, rank, 63, 70, link)
        assert not link.exists()
        summaries[rank], why = runfiles.read_summary_again(str(path))
        assert why is None, why
    summarized = analyze(window_from_summaries(run, summaries))
    rules = load_rules()
    names = [(f.name, f.ranks) for f in evaluate(rules, traced).findings]
    assert [(f.name, f.ranks) for f in evaluate(rules, summarized).findings] == names and names
    for a, b in zip(traced.ranks, summarized.ranks, strict=True):
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=0.01, abs=1e-6), (a["rank"], key)
            else:
                assert b[key] == value, (a["rank"], key)


@pytest.mark.timeout(600)
def test_a_leak_is_projected_to_its_out_of_memory_step(halfway):
    _, _, report = halfway
    mem = report["run"]["over_time"]["memory"]
    assert mem["leak"] is True, mem
    (dev,) = mem["devices"]
    rate = dev["bytes_per_1000_steps"] / 1000
    assert rate == pytest.approx(2 * LEAK, rel=0.3), dev  # two ranks on this host, 2 MiB each per step
    expected = dev["last_step"] + (dev["capacity_bytes"] - dev["end_bytes"]) / rate
    assert mem["oom_step"] == pytest.approx(expected, rel=0.05)
    assert f"at step ~{mem['oom_step']:,}" in dev["text"]


@pytest.mark.timeout(600)
def test_a_moving_straggler_is_said_to_move_and_a_steady_job_has_no_drift_or_leak(moving):
    _, _, report = moving
    rec = _record(report, "rank-straggler")
    assert rec is not None and rec["pattern"] == "moved", report["run"]["over_time"]["findings"]
    assert "the rank changes between windows" in rec["text"] and "not at a node" in rec["text"]
    arr = report["run"]["over_time"]["arrivals"]  # the series says so too, stretch by stretch
    assert arr["pattern"] == "moved" and arr["ranks"] == [0, 1], arr
    assert [s["rank"] for s in arr["stretches"]] == [0, 1, 0, 1], arr["stretches"]
    ot = report["run"]["over_time"]
    assert ot["step_time"]["evaluated"] and ot["step_time"]["drift"] is False, ot["step_time"]
    assert ot["memory"]["evaluated"] and ot["memory"]["leak"] is False, ot["memory"]
    assert "oom_step" not in ot["memory"]


@pytest.mark.timeout(600)
def test_the_section_in_text_markdown_and_html(halfway):
    out, _, _ = halfway
    text = run_cli("diagnose", str(out), timeout=120)
    assert text.returncode == 0 and "Over time" in text.stdout and "rank-straggler: rank 1 in" in text.stdout
    md = run_cli("diagnose", str(out), "--format", "markdown", timeout=120)
    assert md.returncode == 0 and "## Over time" in md.stdout and "per 1,000 steps" in md.stdout
    page = run_cli("diagnose", str(out), "--format", "html", timeout=120)
    assert page.returncode == 0 and '<ul class="over-time">' in page.stdout
    assert "rank-straggler: rank 1 in" in page.stdout


@pytest.mark.timeout(400)
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_the_section_in_the_dashboard(halfway, tmp_path):
    """`ddpdoctor view`'s dashboard shows the text report's "Over time" lines, a finding's windows under it."""
    out, _, report = halfway
    view = DashboardView(out, tmp_path / "view.log")
    try:
        served = json.loads(urllib.request.urlopen(f"{view.url}data/plugin/ddpdoctor/report?run=.", timeout=120).read())
        dom = chromium(tmp_path / "profile", "--window-size=1400,1000", "--dump-dom",
                       f"{view.url}data/plugin/ddpdoctor/dashboard.html?run=.")  # fmt: skip
    finally:
        view.stop()
    assert served["over_time_lines"] == over_time.lines(report)  # the lines diagnose shows, for this run
    assert 'data-state="ready"' in dom, dom[-3000:]
    section = dom[dom.index('data-section="over-time"') :]
    section = section[: section.index("</section>")]
    assert "<h2>Over time</h2>" in section
    items = [html.unescape(i) for i in re.findall(r"<li data-over-time=\"\">(.*?)</li>", section)]
    assert any(i.startswith("rank-straggler: rank 1 in") for i in items), section[:3000]
    assert "per 1,000 steps" in section


@pytest.mark.timeout(60)
def test_bad_every_is_one_line_and_exit_2(tmp_path):
    script = write_script(tmp_path / "s.py", "print('never run')\n")
    for bad, says in (("6", "a window takes 9 steps"), ("10x", "a duration with a unit")):
        r = run_cli("trace", "--active", "8", "--warmup", "1", "--every", bad, str(script), timeout=60)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(600)
def test_every_duration_takes_a_window_each_new_second_the_same_on_both_ranks(by_time):
    out, stderr, report = by_time
    assert "a window every 1 s: steps 3-10, then at the first step of each new 1 s of the clock" in stderr
    windows = [read_json(out / "ranks" / f"rank{r}.json")["steps"]["profiled"] for r in (0, 1)]
    # ~4.5 s of steps: the first window, then one per new second after it (a window's own 8 steps take ~0.5 s)
    assert len(windows[0]) >= 3 and windows[0][0] == [3, 10], windows
    # the ranks leave each step together (DDP's all-reduce): the same windows, or one a step later at most
    assert len(windows[0]) == len(windows[1]), windows
    for a, b in zip(*windows, strict=True):
        assert abs(a[0] - b[0]) <= 1 and b[1] - b[0] == a[1] - a[0], windows
    # 8 steps each, but a last one the job's end cut short (it ended at step 79)
    assert all(w[1] - w[0] == 7 for w in windows[0][:-1]) and (
        windows[0][-1][1] - windows[0][-1][0] == 7 or windows[0][-1][1] == 79
    ), windows
    starts = [w[0] for w in windows[0]]
    # no window before the last one ended
    assert all(b - a >= 8 for a, b in zip(starts, starts[1:], strict=False)), starts
    found = report["run"]["over_time"]["findings"]
    assert found["evaluated"] and found["windows"] == len(windows[0]), found
