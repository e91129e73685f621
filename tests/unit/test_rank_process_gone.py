"""A rank file that still says "running" is read for what it is (issue 24): where its process is gone from this
host (kill -9, the OOM killer, a reboot, the whole trace killed so no launcher wrote the manifest), the rank died
without finishing and `diagnose` and `gate` say so; where the process is still there (a run in progress) or ran
on another host, it stays "running": `diagnose` notes a run in progress, `gate` says it has not finished."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor import liveness, runfiles
from ddpdoctor.compare.inputs import read_input
from ddpdoctor.pipeline import analyze_run

RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: no process has this pid until the kernel hands it out again
    return proc.pid


def _run(tmp_path: Path, rank1: dict, manifest: bool = False) -> Path:
    """The recorded straggler run with rank 1's file rewritten as a rank still running (``rank1``: the fields
    changed), and without the manifest a launcher writes at the end (the trace was killed, or is still going)."""
    run = Path(shutil.copytree(RECORDED, tmp_path / "run"))
    if not manifest:
        (run / "manifest.json").unlink()
    path = run / "ranks" / "rank1.json"
    data = json.loads(path.read_text())
    data.update({"status": "running", "exit_code": None, "error": None, "hostname": socket.gethostname(), **rank1})
    path.write_text(json.dumps(data))
    return run


def test_a_rank_whose_process_is_gone_died_without_finishing(tmp_path):
    pid = _dead_pid()
    run = _run(tmp_path, {"pid": pid})
    captures, _, notes = runfiles.read_run_files(run)
    assert captures[1]["status"] == "running", captures[1]  # as written: the capture side reads it so too
    assert captures[1][runfiles.PROCESS_GONE] == (
        f"no process {pid} on {socket.gethostname()} any more (killed, or ended by a fatal signal)"
    )
    assert captures[0]["status"] == "ok" and runfiles.PROCESS_GONE not in captures[0]
    # the capture side (the launcher's manifest, the hang watchdog) reads the file as it is
    assert runfiles.PROCESS_GONE not in runfiles.read_rank_captures(run)[0][1]
    # the file itself is left as it was: the verdict is the reader's, not a rewrite of the user's data
    assert json.loads((run / "ranks" / "rank1.json").read_text())["status"] == "running"


def test_diagnose_leads_with_the_dead_rank_and_gate_says_it_died(tmp_path):
    run = _run(tmp_path, {"pid": _dead_pid()})
    analysis = analyze_run(run)
    first = analysis.diagnosis.findings[0]
    assert first.name == "rank-died" and str(first.severity) == "error", [f.name for f in analysis.diagnosis.findings]
    health = analysis.metrics.run["health"]
    assert not any("still running" in n for n in health["notes"]), health["notes"]
    assert health["ranks"][1]["steps"] is None  # its file was last written before the kill: a lower bound only
    snapshot = read_input(str(run))
    assert any(r.startswith("rank 1 died without finishing (no process ") for r in snapshot.incomplete), snapshot


def test_a_rank_still_running_here_is_a_run_in_progress(tmp_path):
    run = _run(tmp_path, {"pid": os.getpid()})  # this process: alive, and started before the file was written
    captures, _, _ = runfiles.read_run_files(run)
    assert captures[1]["status"] == "running" and runfiles.PROCESS_GONE not in captures[1]
    analysis = analyze_run(run)
    assert not [f for f in analysis.diagnosis.findings if str(f.severity) == "error"]
    assert any("still running" in n for n in analysis.metrics.run["health"]["notes"])
    snapshot = read_input(str(run))
    assert any(r.startswith("rank 1 has not finished: its rank file still says running") for r in snapshot.incomplete)


def test_a_pid_now_held_by_a_later_process_is_not_the_rank(tmp_path):
    run = _run(tmp_path, {"pid": os.getpid()})
    os.utime(run / "ranks" / "rank1.json", (1_000_000_000, 1_000_000_000))  # written in 2001, before this process
    data = json.loads((run / "ranks" / "rank1.json").read_text())
    why = liveness.rank_process_gone(data, run / "ranks" / "rank1.json")
    assert why is not None and ("restarted" in why or "started later" in why), why


def test_another_hosts_rank_cannot_be_told_and_stays_running(tmp_path):
    run = _run(tmp_path, {"pid": _dead_pid(), "hostname": socket.gethostname() + "-elsewhere"})
    captures, _, _ = runfiles.read_run_files(run)
    assert captures[1]["status"] == "running" and runfiles.PROCESS_GONE not in captures[1]
    assert liveness.rank_process_gone(captures[1]) is None


def test_a_rank_in_another_pid_namespace_cannot_be_told(tmp_path):
    """A container with the host's network (and so its host name) has pids of its own: a pid missing here says
    nothing of it. The rank file names its pid namespace; another one than the reader's stays "running"."""
    run = _run(tmp_path, {"pid": _dead_pid(), "pid_ns": "pid:[1]"})
    assert runfiles.PROCESS_GONE not in runfiles.read_run_files(run)[0][1]
    same = _run(tmp_path / "same", {"pid": _dead_pid(), "pid_ns": liveness.pid_namespace()})
    assert runfiles.PROCESS_GONE in runfiles.read_run_files(same)[0][1]
