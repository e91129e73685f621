"""The hang timeout's pieces (issue 24): the default timeout, one request per stall, when a job is stopped, how
ranks that failed because of a peer are told apart, and torchrun's failure block in one line per rank."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from ddpdoctor.capture import hang, manifest, torchrun_main
from ddpdoctor.capture.watchdog import should_stop
from ddpdoctor.cli import trace_args


def test_default_timeout_is_300_s_or_ten_slowest_steps() -> None:
    assert hang.timeout_s(None, [10.0, 20_000.0, 10.0]) == 300.0  # a 20 s compile-like first step is no hang
    assert hang.timeout_s(None, [60_000.0]) == 600.0  # 60 s steps: 10 minutes
    assert hang.timeout_s(None, []) == 300.0
    assert hang.timeout_s(7.5, [60_000.0]) == 7.5  # --hang-timeout is taken as given


def test_hang_timeout_off_and_default() -> None:
    assert trace_args._parse_own(["--hang-timeout", "off"]).hang_timeout == trace_args.HANG_OFF
    assert trace_args._parse_own(["--hang-timeout", "0"]).hang_timeout == trace_args.HANG_OFF
    assert trace_args._parse_own([]).hang_timeout is None
    assert "off" in hang.describe(None, True) and "300 s or 10x" in hang.describe(None, False)


def test_one_request_per_stall(tmp_path) -> None:
    """Every rank's watchdog fires in a stall; the first writes the request, the others join it."""
    stall_began = time.time() - 20
    first, written = hang.request_hang(tmp_path, by="rank 0 (no step for 20 s after step 6)", since=stall_began)
    assert written and hang.read_request(tmp_path)["reason"] == "hang"
    again, written_again = hang.request_hang(tmp_path, by="rank 1", since=stall_began)
    assert (again, written_again) == (first, False)
    time.sleep(0.01)
    later, written_later = hang.request_hang(tmp_path, by="rank 1", since=time.time())  # a new stall
    assert written_later and later != first


@pytest.mark.parametrize(
    ("kind", "explicit", "stop"),
    [("hang", False, False), ("desync", False, True), ("crash", False, True), ("ok", False, False),
     ("undecided", False, False), ("hang", True, True), ("ok", True, True), ("undecided", True, True)],
)  # fmt: skip
def test_default_timeout_stops_only_on_evidence(kind: str, explicit: bool, stop: bool) -> None:
    """No step for 300 s in a long evaluation with no rank waiting in a collective is not a hang; one rank in a long
    checkpoint while the others wait is reported, not stopped, under the default (only --hang-timeout stops it)."""
    assert should_stop(SimpleNamespace(kind=kind), explicit=explicit) is stop


def _entry(rank: int, status: str, reason: str | None) -> dict:
    return {"rank": rank, "status": status, "reason": reason}


def test_a_rank_whose_peer_died_is_a_consequence() -> None:
    entries = [
        _entry(0, "failed", "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:9654. GLHF"),
        _entry(1, "failed", "RuntimeError: injected failure on rank 1 at step 8"),
    ]
    manifest.mark_consequences(entries)
    assert entries[0]["consequence_of"] == [1] and "consequence_of" not in entries[1]


def test_ctrl_c_of_every_rank_has_no_cause() -> None:
    entries = [_entry(0, "interrupted", "KeyboardInterrupt"), _entry(1, "interrupted", "KeyboardInterrupt")]
    manifest.mark_consequences(entries)
    assert not any("consequence_of" in e for e in entries)


def test_torchrun_failure_in_one_line_per_rank(tmp_path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {
        0: ProcessFailure(local_rank=0, pid=101, exitcode=-15, error_file=""),
        1: ProcessFailure(local_rank=1, pid=102, exitcode=1, error_file=""),
    }
    failures[1].timestamp, failures[0].timestamp = 1, 2
    lines = torchrun_main.failure_lines(ChildFailedError("train", failures), tmp_path / "node0.log")
    assert lines[0] == "torchrun: rank 1 (local rank 1, pid 102) exited with code 1 (the first to fail)"
    assert lines[1] == "torchrun: rank 0 (local rank 0, pid 101) ended by SIGTERM (stopped by torchrun after rank 1)"
    assert lines[2].endswith("node0.log") and len(lines) == 3


def test_dump_of_a_finished_run_or_a_plain_folder_is_one_line(tmp_path) -> None:
    from helpers import run_cli

    from ddpdoctor import rundir

    (tmp_path / "plain").mkdir()
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    rundir.atomic_write_json(run / "ranks" / "rank0.json", {"rank": 0, "status": "ok", "world_size": 1})
    for folder, why in ((tmp_path / "plain", "not a ddpdoctor run directory"), (run, "no rank of this run")):
        result = run_cli("dump", str(folder), timeout=60)
        assert result.returncode == 2 and why in result.stderr, result.stderr
        assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
        assert not (folder / "dumps").exists()  # nothing written to a run that cannot answer
