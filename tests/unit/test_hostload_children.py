"""The job's own child processes (DataLoader workers) are its load, not another's: ``children_cpu_s`` of each
profiled window, left out of ``other_cpu_cores`` (a 2-rank job with 2 CPU-bound workers per rank on 2 CPUs read
"other processes used 1.1 CPUs" with nothing else running)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_hostload import _captures, _rows, _window

from ddpdoctor.capture import hostload as capture
from ddpdoctor.metrics import hostload


def test_a_processs_stat_is_read_after_its_commands_parentheses() -> None:
    line = b"4242 (pt (data) worker 1) R 4200 4200 1 0 -1 4194304 10 0 0 0 37 5 0 0 20 0 1 0 99 0 0\n"
    assert capture.parse_pid_stat(line) == (4200, 42)
    assert capture.parse_pid_stat(b"7 (x) S") is None


def test_descendants_are_children_and_their_children_only() -> None:
    parents = {10: (1, 5), 11: (10, 7), 12: (11, 3), 13: (1, 100), 14: (10, 2)}
    assert capture.descendants(10, parents) == {11: 7, 12: 3, 14: 2}
    assert capture.descendants(99, parents) == {}


def test_children_cpu_counts_only_the_window() -> None:
    tick = capture._TICK
    # 10 ran 50 ticks in the window, 12 was born in it (30 ticks), 11 was reaped in it: its 50 ticks before the
    # window are taken out of what RUSAGE_CHILDREN gained (0.8 s)
    got = capture.children_cpu_s({10: 100, 11: 50}, {10: 150, 12: 30}, reaped_start=1.0, reaped_end=1.8)
    assert got == pytest.approx((50 + 30 - 50) / tick + 0.8)
    assert capture.children_cpu_s({10: 100}, {10: 90}, 0.0, 0.0) == 0.0  # never negative


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")
def test_a_window_records_a_busy_childs_cpu_time() -> None:
    load = capture.HostLoad()
    load.step(3, recording=True)
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"]
    )
    try:
        child.wait(timeout=60)
    finally:
        child.kill()
    time.sleep(0.05)
    load.step(4, recording=False)
    (window,) = load.windows
    assert window["children_cpu_s"] >= 0.3, window  # its 0.4 s of CPU (reaped: RUSAGE_CHILDREN), ticks rounded


def test_the_ranks_children_are_not_other_processes() -> None:
    """Two ranks of 0.156 CPUs each and their workers of 0.6 CPUs each on a host 1.9 CPUs busy: 0.5 other."""
    a, b = _window(0.13, 0.38), _window(0.13, 0.08)
    a["children_cpu_s"] = b["children_cpu_s"] = 0.6
    rows = _rows(30.0, 0.0)
    run, _ = hostload.hostload_metrics(_captures(a, b), rows)
    assert rows[0]["job_children_cpu_cores"] == pytest.approx(1.2)
    assert rows[0]["other_cpu_cores"] == pytest.approx(1.9 - 2 * 0.156 - 1.2, abs=0.01)
    assert (
        "other processes used 0.4 CPUs; the ranks' DataLoader workers and other child processes 1.2 CPUs"
        in (run["host_load_summary"])
    )
    # a capture from before the measure: the workers count as other processes, as they did
    rows = _rows(30.0, 0.0)
    hostload.hostload_metrics(_captures(_window(0.13, 0.38), _window(0.13, 0.08)), rows)
    assert rows[0]["other_cpu_cores"] == pytest.approx(1.9 - 2 * 0.156, abs=0.01)
    assert rows[0]["job_children_cpu_cores"] is None


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")
def test_a_live_workers_window_time_counts_and_only_the_start_reads_all_of_proc(monkeypatch) -> None:
    """A worker alive through the window (a persistent DataLoader worker): its ticks in the window count; the pass
    over every process is made where the window starts (before its first step's clock), not where it ends."""
    listed: list[str] = []
    real = os.listdir

    def count_listings() -> None:
        monkeypatch.setattr(capture.os, "listdir", lambda path=".": listed.append(path) or real(path))

    window = _window_beside_a_busy_process(before=count_listings)
    assert listed.count("/proc") == 1, listed
    assert window["children_cpu_s"] >= 0.3 * window["wall_s"], window  # busy for all of it, ticks rounded


def test_ddpdoctors_helpers_are_not_the_jobs_children(monkeypatch) -> None:
    """The GIL probe (gilwatch) is a child process of every traced rank: its CPU is ddpdoctor's, recorded apart
    (``probe_cpu_s``), so that a job with no child process is not said to have "DataLoader workers and other child
    processes 0.2 CPUs"."""
    monkeypatch.setattr(capture, "_OWN_HELPERS", {20})
    tick = capture._TICK
    start, end = {20: 100, 21: 10}, {20: 103, 21: 15, 22: 2}  # 20: the probe; 21 a worker; 22 born in the window
    assert capture.probe_cpu_s(start, end) == pytest.approx(3 / tick)
    assert capture.children_cpu_s(start, end, 0.0, 0.0) == pytest.approx((3 + 5 + 2) / tick)  # all of them
    monkeypatch.setattr(capture, "_OWN_HELPERS", set())
    assert capture.probe_cpu_s(start, end) == 0.0


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")
def test_a_window_records_a_busy_helper_apart_from_the_children() -> None:
    window = _window_beside_a_busy_process(helper=True)
    assert window["probe_cpu_s"] >= 0.3 * window["wall_s"], window  # busy for all of it, ticks rounded
    assert window["children_cpu_s"] <= 0.02, window  # no child of the job's ran


def test_the_probe_is_neither_the_jobs_children_nor_another_process() -> None:
    a, b = _window(0.13, 0.38), _window(0.13, 0.08)
    a["probe_cpu_s"] = b["probe_cpu_s"] = 0.15
    a["children_cpu_s"] = b["children_cpu_s"] = 0.0
    rows = _rows(30.0, 0.0)
    run, _ = hostload.hostload_metrics(_captures(a, b), rows)
    assert rows[0]["probe_cpu_cores"] == pytest.approx(0.3)
    assert rows[0]["job_children_cpu_cores"] == 0.0
    assert rows[0]["other_cpu_cores"] == pytest.approx(1.9 - 2 * 0.156 - 0.3, abs=0.01)
    assert "ddpdoctor's GIL probe 0.3 CPUs" in run["host_load_summary"]
    assert "child processes" not in run["host_load_summary"]


def _window_beside_a_busy_process(before=None, helper: bool = False) -> dict:  # noqa: ANN001
    """The window of a ``HostLoad`` (0.5 s) beside a child process busy on a CPU all through it, registered as
    ddpdoctor's helper where ``helper``; ``before()`` runs just before the ``HostLoad`` is made."""
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass"
    child = subprocess.Popen([sys.executable, "-c", code])
    if helper:
        capture.own_helper(child.pid)
    try:
        time.sleep(0.2)
        if before is not None:
            before()
        load = capture.HostLoad()
        load.step(3, recording=True)
        time.sleep(0.5)
        load.step(4, recording=False)
        assert child.poll() is None, "the child ended inside the window: the test measures a live one"
    finally:
        child.kill()
        child.wait()
        capture.own_helper_gone(child.pid)
    (window,) = load.windows
    return window
