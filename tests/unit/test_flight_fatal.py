"""A rank ended by a fatal signal (gloo's SIGABRT on a size mismatch) cannot dump; its faulthandler record
(``dumps/rank<R>.fatal-<pid>.txt``) still says where its main thread was, and the verdict names the mismatch with
both sides. Real faulthandler output of a process that aborts inside a function named as torch's collective."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddpdoctor.capture.flight import FATAL_HEADER, fatal_path
from ddpdoctor.flight import analyze, find_dumps
from ddpdoctor.flight.read import read_fatal_record
from ddpdoctor.runfile_types import DumpException, FlightDump, FlightEntry, FlightRecord, Frame, ThreadStack

ABORTING = """
import faulthandler, json, os, sys, threading
sys.path.insert(0, sys.argv[2])
from torch.distributed import distributed_c10d
f = open(sys.argv[1], "a")
f.write({header!r} + json.dumps({{"rank": 0, "world_size": 2, "pid": os.getpid(),
        "main": threading.main_thread().ident}}) + "\\n")
f.flush()
faulthandler.enable(file=f, all_threads=True)

def sync_metric():
    distributed_c10d.all_reduce()

sync_metric()
"""


def _fatal_record(tmp_path: Path) -> Path:
    fake = tmp_path / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "distributed_c10d.py").write_text("import os\n\ndef all_reduce():\n    os.abort()\n")
    script = tmp_path / "train.py"
    script.write_text(ABORTING.format(header=FATAL_HEADER))
    record = tmp_path / "run" / "dumps" / "rank0.fatal-1.txt"
    record.parent.mkdir(parents=True)
    subprocess.run([sys.executable, str(script), str(record), str(tmp_path / "fake")], timeout=60, check=False,
                   capture_output=True)  # fmt: skip
    return record


def test_a_fatal_record_gives_the_signal_and_the_main_thread_stack(tmp_path):
    dump = read_fatal_record(_fatal_record(tmp_path))
    assert dump is not None and (dump.rank, dump.world_size, dump.reason) == (0, 2, "fatal")
    assert dump.exception.type == "SIGABRT" and "Aborted" in dump.exception.message
    main = next(t for t in dump.threads if t.main)
    names = [f.name for f in main.frames]  # outermost first
    assert names[-2:] == ["sync_metric", "all_reduce"], names
    assert main.frames[-2].file.endswith("train.py") and main.frames[-2].line == 12


def test_a_header_alone_is_no_record_and_is_not_a_dump(tmp_path):
    path = fatal_path(tmp_path, 3, 42)
    path.parent.mkdir(parents=True)
    path.write_text(FATAL_HEADER + json.dumps({"rank": 3, "pid": 42, "main": 1}) + "\n")
    assert read_fatal_record(path) is None
    assert find_dumps(tmp_path).dumps == {}


def _peer_lost_it(seq: int) -> FlightDump:
    entries = [
        FlightEntry(collective_seq_id=s, pg_id=0, process_group=["0", "default_pg"], profiling_name="gloo:all_reduce",
                    state="completed", retired=True, input_sizes=[[8]], input_dtypes=["Float"],
                    time_created_ns=int((time.time() - 2) * 1e9))
        for s in range(seq)
    ]  # fmt: skip
    entries.append(
        FlightEntry(collective_seq_id=seq, pg_id=0, process_group=["0", "default_pg"],
                    profiling_name="gloo:all_reduce", state="completed", retired=True, input_sizes=[[16]],
                    input_dtypes=["Float"], time_created_ns=int((time.time() - 1) * 1e9))
    )  # fmt: skip
    frames = [Frame(file="/src/train.py", line=14, name="main"), Frame(file="/src/train.py", line=12, name="sync_metric")]
    return FlightDump(
        rank=1, world_size=2, reason="exception", time=time.time(), step=5, phase="data",
        exception=DumpException(type="RuntimeError", message="Read error: Connection reset by peer", frames=frames),
        threads=[ThreadStack(name="MainThread", ident=threading.get_ident(), main=True, frames=frames)],
        flight_recorder=[FlightRecord(source="gloo", entries=entries,
                                      pg_status={"0": {"last_enqueued_collective": seq,
                                                       "last_completed_collective": seq}})],
    )  # fmt: skip


def test_gloo_abort_inside_a_collective_is_a_size_mismatch_with_both_sides(tmp_path):
    record = _fatal_record(tmp_path)
    dumps = {0: read_fatal_record(record), 1: _peer_lost_it(3)}
    status = {0: {"status": "failed", "exit_code": -6, "reason": "ended by SIGABRT"},
              1: {"status": "failed", "exit_code": 1, "reason": "RuntimeError: Connection reset by peer"}}  # fmt: skip
    v = analyze(dumps, world_size=2, rank_status=status)
    assert v.kind == "desync" and v.culprits == (0, 1), v.summary
    assert v.mismatches[0].kind == "size" and v.collective.op == "all_reduce" and v.collective.seq_id == 3
    assert "rank 0: all_reduce (aborted by gloo with SIGABRT" in v.summary, v.summary
    assert "rank 1: all_reduce [16] Float at sync_metric (train.py:12), then lost its peer" in v.summary, v.summary
    # a crash in the rank's own code (no collective on its stack) stays a crash
    own = read_fatal_record(record)
    own.threads[0].frames = [f for f in own.threads[0].frames if f.name != "all_reduce"]
    own.exception.frames = list(own.threads[0].frames)
    assert analyze({0: own, 1: _peer_lost_it(3)}, world_size=2, rank_status=status).kind == "crash"


def test_exit_dumps_of_a_job_that_ended_well_are_not_diagnosed(tmp_path):
    from ddpdoctor.pipeline import _verdict

    (tmp_path / "dumps").mkdir()
    for rank in (0, 1):
        dump = FlightDump(rank=rank, world_size=2, reason="exit", time=time.time(), step=12)
        (tmp_path / "dumps" / f"rank{rank}.exit-{rank + 1}.json").write_text(
            json.dumps({f: getattr(dump, f) for f in ("rank", "world_size", "reason", "time", "step")})
        )
    ok = {"ranks": [{"rank": r, "status": "ok", "exit_code": 0} for r in (0, 1)], "world_size": 2}
    assert _verdict(tmp_path, ok, 2) == (None, [])
    failed = {"ranks": [{"rank": 0, "status": "failed", "exit_code": 1}, {"rank": 1, "status": "ok"}]}
    assert _verdict(tmp_path, failed, 2)[0] is not None
