"""A window `--keep` removes is summarised first (capture/window_summary.py): the link its summariser reads, the
summary it writes, what the rank file says when it fails, and the run layout that `--force` accepts."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from helpers import SAMPLES

from ddpdoctor import owned, runfiles
from ddpdoctor.capture import window_summary
from ddpdoctor.capture.rank_file import own_files
from ddpdoctor.metrics.overtime import kept_windows, summarized_windows

STRAGGLER = SAMPLES / "recorded" / "ddp_straggler"


def _run_with_trace(tmp_path: Path) -> tuple[Path, Path]:
    """A run directory holding rank 0's capture file and one trace of it (the straggler sample's)."""
    out = tmp_path / "run"
    (out / "ranks").mkdir(parents=True)
    trace = sorted(STRAGGLER.glob("rank0.*.pt.trace.json.gz"))[0]
    (out / trace.name).write_bytes(trace.read_bytes())
    (out / "ranks" / "rank0.json").write_bytes((STRAGGLER / "ranks" / "rank0.json").read_bytes())
    return out, out / trace.name


def _steps(trace: Path) -> list[int]:
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    names = [e.get("name", "") for e in doc["traceEvents"]]
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


def test_a_removed_window_is_summarised_from_its_link_and_the_link_is_gone(tmp_path):
    out, trace = _run_with_trace(tmp_path)
    steps = _steps(trace)
    first, last = steps[0], steps[-1]
    entry = {"first_step": first, "last_step": last, "file": trace.name}
    pending = window_summary.link_for(out, 0, (first, last), trace, entry)
    assert pending is not None and pending.link.name.startswith(".rank0.window") and pending.link.exists()
    assert entry["summary"] == f"rank0.window{first}-{last}.summary.json"
    trace.unlink()  # the rank removes the trace's own name at once; the link keeps its data
    window_summary.start(out, 0, pending)
    assert window_summary.reap([pending], wait_s=120) == []
    assert "summary_error" not in entry, entry
    assert not pending.link.exists()
    data, why = runfiles.read_summary_again(str(out / "ranks" / entry["summary"]))
    assert why is None and data["rank"] == 0 and data["files"] == []
    assert data["metrics"]["steps_analyzed"] >= 1
    # the run layout that --force walks holds the summary (and would hold the link while it lasted)
    assert owned.own_entries(out).foreign is None
    assert out / "ranks" / entry["summary"] in own_files(out, 0)


def test_a_summariser_that_fails_says_why_in_the_entry_and_removes_its_link(tmp_path):
    out, trace = _run_with_trace(tmp_path)
    broken = out / "broken.json"
    broken.write_text('{"traceEvents": [')  # cut short
    entry = {"first_step": 5, "last_step": 9, "file": "x"}
    pending = window_summary.link_for(out, 0, (5, 9), broken, entry)
    assert pending is not None and entry["summary"] == "rank0.window5-9.summary.json"
    window_summary.start(out, 0, pending)
    assert window_summary.reap([pending], wait_s=120) == []
    assert "summary" not in entry and entry["summary_error"], entry
    assert "\n" not in entry["summary_error"] and len(entry["summary_error"]) <= 400
    assert not pending.link.exists() and not (out / "ranks" / "rank0.window5-9.summary.json").exists()


def test_one_still_running_at_the_end_is_stopped_and_said_so(tmp_path):
    out, trace = _run_with_trace(tmp_path)
    entry = {"first_step": 1, "last_step": 2, "file": "x"}
    pending = window_summary.link_for(out, 0, (1, 2), trace, entry)
    pending.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stderr=subprocess.PIPE)
    assert window_summary.reap([pending]) == [pending]  # not waited for while the run goes on
    assert window_summary.reap([pending], wait_s=0.5) == []
    assert "summary" not in entry and entry["summary_error"].startswith("still summarising after")
    assert not pending.link.exists() and pending.proc.returncode is not None


def test_a_window_without_steps_or_link_goes_without_a_summary_and_says_why(tmp_path):
    out, trace = _run_with_trace(tmp_path)
    entry: dict = {"first_step": None, "last_step": None, "file": "x"}
    assert window_summary.link_for(out, 0, None, trace, entry) is None
    assert entry["summary_error"] == "the window's steps are not known"
    entry = {"first_step": 1, "last_step": 2, "file": "x"}
    assert window_summary.link_for(out, 0, (1, 2), out / "gone.json", entry) is None
    assert entry["summary_error"].startswith("its trace could not be kept to be summarised")


def test_removed_windows_with_summaries_are_matched_across_ranks_and_kept_ones_are_not():
    def cap(dropped, profiled):
        return {"schedule": {"active": 5, "dropped": dropped}, "steps": {"profiled": profiled}}

    captures = {
        0: cap(
            [{"first_step": 3, "last_step": 7, "summary": "rank0.window3-7.summary.json"},
             {"first_step": 15, "last_step": 19, "summary_error": "boom"}],
            [[3, 7], [15, 19], [27, 31]],
        ),
        1: cap(
            [{"first_step": 4, "last_step": 8, "summary": "rank1.window4-8.summary.json"},
             {"first_step": 15, "last_step": 19, "summary": "rank1.window15-19.summary.json"}],
            [[4, 8], [15, 19], [27, 31]],
        ),
    }  # fmt: skip
    assert kept_windows(captures) == [(27, 31)]
    assert summarized_windows(captures) == [
        (3, 8, {0: "rank0.window3-7.summary.json", 1: "rank1.window4-8.summary.json"}),
        (15, 19, {1: "rank1.window15-19.summary.json"}),  # rank 0 has none: diagnose leaves this window out
    ]
