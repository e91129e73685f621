"""A disk that fills up while a window is exported (issue 23, item 11): the profiler's exporter logs the failed
write and returns, leaving no complete trace. Nothing is renamed into place, the window is said to be lost with
the cause, the rank file ends with its real status and the capture error, and no temporary file is left. A 600 KB
tmpfs holding a file that leaves ~48 KB free (room for the rank files, not for a trace); needs root with
CAP_SYS_ADMIN, skipped elsewhere. ~10 s."""

from __future__ import annotations

import pytest
from helpers import read_json, run_cli, write_script
from test_trace_disk import TRAIN, tmpfs  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_a_trace_cut_short_by_a_full_disk_is_not_put_in_place(tmp_path, tmpfs) -> None:  # noqa: F811
    disk = tmpfs("full", size="600k")
    (disk / "other-data").write_bytes(bytes(552 << 10))  # someone else's file: ~48 KB left
    script = write_script(tmp_path / "train.py", TRAIN)
    out = disk / "run"
    result = run_cli("trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", str(script))
    assert "trained" in result.stdout and "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr  # the script's own exit status
    assert "window 1 written" not in result.stderr, result.stderr  # not announced as written
    lost = [line for line in result.stderr.splitlines() if "profiled window 1" in line]
    assert lost and "not written" in lost[0] and "No space left on device" in lost[0], result.stderr
    assert not list(out.glob("*.pt.trace.json*"))  # no empty or truncated trace in place
    assert not [p.name for p in out.rglob(".*") if p.is_file()]  # no temporary file left behind
    assert (disk / "other-data").stat().st_size == 552 << 10  # nothing of the user's touched
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["status"] == "ok" and rank["trace_files"] == []  # the rank file was finished, not left "running"
    errors = [e for e in rank["capture_errors"] if "profiled window 1" in e]
    assert errors and "No space left on device" in errors[0], rank["capture_errors"]
    errors = [line for line in result.stderr.splitlines() if line.startswith("ddpdoctor: error: ")]
    assert errors and f"cannot write the run directory {out}: No space left on device" in errors[-1], result.stderr
