"""Elastic restarts (issue 26 item 8): torchrun ``--max-restarts 1`` and a crash in attempt 0. Each attempt keeps its
own files (``attempts/attempt<k>/``, nothing overwritten), the manifest records the restarts, ``diagnose`` reads the
last attempt and says so and how the earlier one failed, and never merges the attempts' traces (``--steps 0..``
too). One real traced 2-rank gloo job, shared by the asserts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import read_json, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

JOB = str(Path(__file__).with_name("restart_job.py"))
CRASH_LINE = next(i for i, line in enumerate(Path(JOB).read_text().splitlines(), 1) if "raise ValueError" in line)


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    out = tmp_path_factory.mktemp("restart") / "run"
    traced = run_cli(
        "trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "3",
        "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", JOB,
        env={"STEPS": "10", "CRASH_STEP": "6"}, timeout=240,
    )  # fmt: skip
    return out, traced


def _diagnose(path: Path, *args: str) -> dict:
    result = run_cli("diagnose", str(path), "--format", "json", *args, timeout=120)
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def test_each_attempt_keeps_its_files_and_the_manifest_records_the_restart(restarted):
    out, traced = restarted
    assert traced.returncode == 0, traced.stderr[-3000:]
    assert traced.stdout.count("attempt 1 finished 10 steps") == 2, traced.stdout
    first = read_json(out / "attempts" / "attempt0" / "ranks" / "rank1.json")
    last = read_json(out / "attempts" / "attempt1" / "ranks" / "rank1.json")
    assert first["status"] == "failed" and "ValueError: corrupt batch at step 6" in first["error"], first["status"]
    assert last["status"] == "ok" and last["steps"]["count"] == 10
    for k in (0, 1):  # each attempt's own profiled window, in its own folder
        assert len(list((out / "attempts" / f"attempt{k}").glob("rank*.pt.trace.json*"))) == 2, k
    assert not list(out.glob("rank*.pt.trace.json*"))  # none at the top level to be merged
    manifest = read_json(out / "manifest.json")
    attempts = manifest["attempts"]
    assert [(a["attempt"], a["status"]) for a in attempts] == [(0, "failed"), (1, "ok")], attempts
    assert "rank 1" in attempts[0]["summary"] and "ValueError" in attempts[0]["summary"], attempts[0]
    assert f"restart_job.py:{CRASH_LINE}" in attempts[0]["summary"], attempts[0]
    assert [r["status"] for r in manifest["ranks"]] == ["ok", "ok"]  # the last attempt's ranks
    assert any("restarted" in n and "attempt 0 failed" in n for n in manifest["notes"]), manifest["notes"]
    assert "attempt 0 failed" in traced.stderr, traced.stderr[-2000:]


def test_diagnose_reads_the_last_attempt_and_says_which(restarted):
    out, _ = restarted
    for args in ((), ("--steps", "0..")):  # a step range never merges the attempts either
        report = _diagnose(out, *args)
        notes = report["run"]["notes"]
        said = next((n for n in notes if "attempt 1 of 2 diagnosed" in n), None)
        assert said is not None, notes
        assert "attempt 0 failed: rank 1" in said and "ValueError" in said, said
        assert f"restart_job.py:{CRASH_LINE}" in said, said
        names = {f["name"] for f in report["findings"]}
        assert not names & {"rank-crashed", "rank-died", "collective-hang"}, names  # the last attempt ended well
        assert report["run"]["steps_analyzed"] == 3, (args, report["run"]["steps_analyzed"])
        for rank in report["ranks"]:
            assert rank["step_ms"]["p90"] < 500, rank  # no step of the crashed attempt


def test_the_failed_attempt_is_diagnosed_on_its_own(restarted):
    out, _ = restarted
    report = _diagnose(out / "attempts" / "attempt0")
    first = report["findings"][0]
    assert (first["name"], first["ranks"]) == ("rank-crashed", [1]), first
    assert "ValueError: corrupt batch at step 6" in first["message"]
    assert f"check_batch (restart_job.py:{CRASH_LINE})" in first["message"], first["message"]
