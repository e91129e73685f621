"""A rank ended by a fatal signal (gloo's SIGABRT on a size mismatch) cannot dump; its faulthandler record
(``dumps/rank<R>.fatal-<pid>.txt``) still says where its main thread was, and the verdict names the mismatch with
both sides. Real faulthandler output of a process that aborts inside a function named as torch's collective."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

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
    frames = [
        Frame(file="/src/train.py", line=14, name="main"),
        Frame(file="/src/train.py", line=12, name="sync_metric"),
    ]
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


IN_STEP = """
import os, sys, types
import torch
from ddpdoctor.capture import flight
from ddpdoctor.capture.phase import PhaseTracker

tracker = PhaseTracker()
tracker.install()
session = types.SimpleNamespace(claimed=True, out=sys.argv[1], rank=1, identity=types.SimpleNamespace(world_size=2),
                                phase=tracker)
print(flight.arm_fatal(session), flush=True)

class Aborts(torch.nn.Module):
    def forward(self, x):
        if STEP == 3:
            os.abort()  # a fatal signal inside the 4th step's forward (3 steps completed)
        return x

model = torch.nn.Sequential(torch.nn.Linear(4, 1), Aborts())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for STEP in range(5):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    tracker.step_ended(STEP + 1)
"""


def test_a_fatal_record_says_the_step_and_phase_the_signal_came_in(tmp_path):
    """The phase tracker keeps the record's "where" line (mapped memory) up to the signal: the step is the one the
    rank was in, not the count its rank file last recorded (the false "after 0 steps" of a gloo abort at step 5)."""
    script = tmp_path / "job.py"
    script.write_text(IN_STEP)
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], timeout=120, capture_output=True, text=True)
    assert run.returncode == -6, run.stderr
    record = Path(run.stdout.strip())
    assert record.parent == tmp_path / "dumps" and record.name.startswith("rank1.fatal-"), run.stdout
    dump = read_fatal_record(record)
    assert dump is not None and dump.exception.type == "SIGABRT"
    assert (dump.step, dump.phase) == (3, "forward")
    main = next(t for t in dump.threads if t.main)
    abort_line = next(i for i, line in enumerate(IN_STEP.splitlines(), 1) if "os.abort()" in line)
    assert main.frames[-1].name == "forward" and main.frames[-1].line == abort_line, main.frames
    state = analyze({1: dump}, world_size=2, rank_status={1: {"status": "failed", "exit_code": -6}}).ranks[1]
    assert (state.state, state.step, state.phase) == ("crashed", 3, "forward")


def test_a_fatal_record_without_a_where_line_has_an_unknown_step_never_the_rank_files_count(tmp_path):
    from ddpdoctor.metrics.health import health_metrics
    from ddpdoctor.report.document import health_lines

    dump = read_fatal_record(_fatal_record(tmp_path))  # a record as an older ddpdoctor wrote it: no "where" line
    assert dump.phase == "unknown"
    peer = _peer_lost_it(3)
    status = {0: {"status": "failed", "exit_code": -6, "reason": "ended by SIGABRT"},
              1: {"status": "failed", "exit_code": 1, "reason": "RuntimeError: Connection reset by peer"}}  # fmt: skip
    own = read_fatal_record(_fatal_record(tmp_path / "own"))
    own.threads[0].frames = [f for f in own.threads[0].frames if f.name != "all_reduce"]  # a crash, no collective
    own.exception.frames = list(own.threads[0].frames)
    verdict = analyze({0: own, 1: peer}, world_size=2, rank_status=status)
    assert verdict.kind == "crash" and verdict.ranks[0].step is None and verdict.ranks[0].phase is None
    # rank 0's rank file was last written before its first step (still "running": the signal ended the process)
    captures = {
        0: {"rank": 0, "status": "running", "steps": {"source": "none", "count": 0}},
        1: {"rank": 1, "status": "failed", "steps": {"source": "optimizer", "count": 5}},
    }
    manifest = {"world_size": 2, "ranks": [{"rank": r, "steps": captures[r]["steps"]["count"], **status[r]}
                                           for r in (0, 1)]}  # fmt: skip
    health, doc = health_metrics(manifest, captures, verdict)
    assert health["rank_crashed"] and not health["startup_failed"], health
    assert "rank 0 crashed at a step not recorded:" in health["health_summary"], health["health_summary"]
    assert "before its first step" not in health["health_summary"] and "0 steps" not in health["health_summary"]
    entry = next(e for e in doc["ranks"] if e["rank"] == 0)
    assert entry["steps"] is None and entry["steps_at_least"] == 0, entry
    lines = health_lines({"run": {"health": doc}})
    rank0 = next(line for line in lines if line.startswith("rank 0:"))
    assert "step unknown" in rank0 and "after 0 steps" not in rank0, rank0
    assert any(line.startswith("rank 1:") and "after 5 steps, in data" in line for line in lines), lines


CHILD_ABORTS = """
import os, sys, types
from ddpdoctor.capture import flight
from ddpdoctor.capture.phase import PhaseTracker

tracker = PhaseTracker()
tracker.install()
session = types.SimpleNamespace(claimed=True, out=sys.argv[1], rank=0, identity=types.SimpleNamespace(world_size=2),
                                phase=tracker)
path = flight.arm_fatal(session)
pid = os.fork()
if pid == 0:
    os.abort()  # a forked worker (DataLoader, multiprocessing) dies of a fatal signal of its own
_, status = os.waitpid(pid, 0)
print(path, os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, flush=True)
flight.remove_fatal()  # the rank ends well
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_workers_fatal_signal_is_not_written_into_the_ranks_record(tmp_path):
    """The rank's fatal record is the rank's: a child forked from it (faulthandler off there, as in a bare run)
    writes nothing into it, so a rank that ends well leaves no record that would say it died by SIGABRT."""
    script = tmp_path / "job.py"
    script.write_text(CHILD_ABORTS)
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], timeout=120, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    path, signum = run.stdout.split()
    assert signum == str(int(signal.SIGABRT)), run.stdout
    assert not Path(path).exists(), Path(path).read_text()[:2000]
