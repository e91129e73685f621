"""The ranks' dumps (issue 24, capture/flight.py): real 2-rank gloo jobs under ``ddpdoctor trace``, each bounded.

A dump is ``dumps/rank<R>.<id>.json`` (``FlightDump``): step, phase, every thread's stack, the Flight Recorder's
collectives, the exception. Made on a request file while the main thread is blocked in a collective, on SIGUSR1
without stopping the job, on SIGTERM, and on an exception escaping the script. ~15-30 s each on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from helpers import REPO, read_json, run_cli

from ddpdoctor.runfile_types import FlightDump

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

JOB = REPO / "tests" / "integration" / "dump_job.py"
FAST = ["--wait", "1", "--warmup", "1", "--active", "1"]


def _start(out: Path, env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ddpdoctor", "trace", "--out", str(out), *FAST]
    if env.get("SPAWN") != "1":
        cmd += ["--standalone", "--nproc-per-node", "2"]
    cmd += [str(JOB)]
    full = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    return subprocess.Popen(
        cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def _wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.2)
    return predicate()


def _dumps(out: Path, pattern: str = "*") -> dict[int, list[Path]]:
    found: dict[int, list[Path]] = {}
    for path in sorted((out / "dumps").glob(f"rank*.{pattern}.json")):
        found.setdefault(int(path.name.split(".")[0][4:]), []).append(path)
    return found


def _load(path: Path) -> FlightDump:
    return msgspec.convert(json.loads(path.read_text()), FlightDump)


def _main(dump: FlightDump):
    return next(t for t in dump.threads if t.main)


def _rank_pids(out: Path) -> dict[int, int]:
    pids = {}
    for r in (0, 1):
        try:
            pids[r] = read_json(out / "ranks" / f"rank{r}.json")["pid"]
        except (OSError, ValueError, KeyError):
            pass
    return pids if len(pids) == 2 else {}


def test_a_request_is_answered_by_every_rank_while_rank_0_is_blocked_in_a_collective(tmp_path):
    out, release = tmp_path / "run", tmp_path / "release"
    stalled = tmp_path / "stalled"
    proc = _start(out, {"MODE": "wait", "STEPS": "5", "RELEASE": str(release), "STALLED": str(stalled)})
    try:
        # rank 0 is inside the all_reduce of step 3 once rank 1 has completed 2 steps and sits in read_batch
        assert _wait_for(stalled.exists, 90, proc), "rank 1 never reached its stall"
        time.sleep(1.5)  # rank 0 reaches its all_reduce
        request = out / "dumps" / "request.json"
        request.parent.mkdir(exist_ok=True)
        tmp = request.with_name(".request.tmp")
        tmp.write_text(json.dumps({"id": "t-1", "reason": "on_demand", "by": "the test", "time": time.time()}))
        os.replace(tmp, request)
        answered = _wait_for(lambda: len(_dumps(out, "t-1")) == 2, 30, proc)
        assert answered, sorted(p.name for p in (out / "dumps").iterdir())
    finally:
        release.touch()
    _, stderr = _finish(proc)
    assert proc.returncode == 0, stderr[-3000:]
    r0, r1 = _load(out / "dumps" / "rank0.t-1.json"), _load(out / "dumps" / "rank1.t-1.json")
    assert (r0.request, r0.reason, r0.rank, r0.world_size) == ("t-1", "on_demand", 0, 2)
    # rank 0: in the all_reduce of step 3 (2 steps completed, backward phase), its FR entry not completed
    assert (r0.step, r0.phase) == (2, "backward")
    assert any(f.name == "all_reduce" for f in _main(r0).frames), _main(r0).frames
    entries = [e for rec in r0.flight_recorder for e in rec.entries]
    assert entries and entries[-1].profiling_name.endswith("all_reduce")
    assert not entries[-1].retired and entries[-1].state != "completed"
    assert all(e.retired for e in entries[:-1])
    # rank 1: its main thread sleeps in read_batch (data phase), its collectives all completed
    assert (r1.step, r1.phase) == (2, "data")
    names = [f.name for f in _main(r1).frames]
    assert names[-2:] == ["main", "read_batch"] or "read_batch" in names[-3:], names
    assert _main(r1).frames[-1].file.endswith("dump_job.py")
    entries1 = [e for rec in r1.flight_recorder for e in rec.entries]
    assert entries1 and all(e.retired for e in entries1)
    assert entries1[-1].collective_seq_id < entries[-1].collective_seq_id
    # the ddpdoctor thread made them, not the main thread; it is not among the threads listed
    assert not any(t.name == "ddpdoctor-flight" for t in r0.threads)
    manifest = read_json(out / "manifest.json")
    assert all(entry["status"] == "ok" for entry in manifest["ranks"]), manifest["ranks"]


def test_sigusr1_dumps_a_running_job_which_then_finishes_normally(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, {"MODE": "long", "STEPS": "40", "SLEEP_S": "0.1"})
    pids = _wait_for(lambda: _rank_pids(out), 90, proc)
    assert pids, "the ranks never wrote their files"
    time.sleep(1.0)
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    assert _wait_for(lambda: len(_dumps(out, "sigusr1-*")) == 2, 30, proc), list((out / "dumps").glob("*"))
    _, stderr = _finish(proc)
    assert proc.returncode == 0, stderr[-3000:]  # the job was not stopped, its exit code unchanged
    for rank, paths in _dumps(out, "sigusr1-*").items():
        assert len(paths) == 1, paths  # one signal, one dump
        dump = _load(paths[0])
        assert (dump.rank, dump.reason, dump.request) == (rank, "on_demand", "")
        assert dump.phase in ("data", "forward", "backward", "optimizer")
    manifest = read_json(out / "manifest.json")
    assert [e["status"] for e in manifest["ranks"]] == ["ok", "ok"]
    for r in (0, 1):  # nothing lost: every step counted, the profiled window written
        capture = read_json(out / "ranks" / f"rank{r}.json")
        assert capture["steps"]["count"] == 40 and capture["trace_files"], capture["steps"]
    # diagnose finds no failure in it: no culprit, no error finding made of the dumps
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    assert diagnosed.returncode == 0 and "Traceback" not in diagnosed.stderr, diagnosed.stderr
    report = json.loads(diagnosed.stdout)
    assert not [f["name"] for f in report["findings"] if f["severity"] == "error"], report["findings"]
    health = report["run"].get("health")
    assert health is None or (health["kind"] == "ok" and health["culprits"] == []), health


def test_sigterm_dumps_every_rank_before_it_ends(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, {"MODE": "long", "STEPS": "3000", "SLEEP_S": "0.05"})
    assert _wait_for(lambda: _rank_pids(out), 90, proc), "the ranks never wrote their files"
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, stderr = _finish(proc)
    assert proc.returncode == -signal.SIGTERM, stderr[-3000:]
    dumps = _dumps(out, "signal-*")
    assert sorted(dumps) == [0, 1], sorted(p.name for p in (out / "dumps").iterdir())
    for rank, paths in dumps.items():
        dump = _load(paths[0])
        assert (dump.rank, dump.reason) == (rank, "signal")
        assert dump.step >= 1 and _main(dump).frames
        assert [e for rec in dump.flight_recorder for e in rec.entries]


def test_an_exception_in_rank_1_is_dumped_with_its_traceback_and_rank_0_dumps_too(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, {"MODE": "crash", "STEPS": "8"})
    _, stderr = _finish(proc)
    assert proc.returncode != 0, stderr[-3000:]
    dumps = _dumps(out)
    assert 1 in dumps, sorted(p.name for p in (out / "dumps").iterdir()) if (out / "dumps").exists() else stderr
    crash = _load(next(p for p in dumps[1] if ".exception-" in p.name))
    assert (crash.reason, crash.step) == ("exception", 3)
    assert crash.exception is not None and crash.exception.type == "RuntimeError"
    assert crash.exception.message == "bad shard at step 4"
    last = crash.exception.frames[-1]
    assert last.file.endswith("dump_job.py") and last.name == "main", crash.exception.frames
    assert not any("ddpdoctor" in f.file for f in crash.exception.frames)
    # rank 0, waiting for its dead peer, dumps too: its own exception ("Connection closed by peer") or the signal
    # that stopped it
    assert 0 in dumps, sorted(p.name for p in (out / "dumps").iterdir())
    other = _load(dumps[0][-1])
    assert other.reason in ("exception", "signal")
    assert [e for rec in other.flight_recorder for e in rec.entries]


def test_sigusr1_dumps_an_mp_spawn_rank_blocked_in_a_collective(tmp_path):
    """Ranks ddpdoctor did not start (mp.spawn's): the signal is seen by a ddpdoctor thread, so rank 0 dumps while
    its main thread is inside the all_reduce (a Python signal handler would only run once it returns)."""
    out, release, stalled = tmp_path / "run", tmp_path / "release", tmp_path / "stalled"
    proc = _start(out, {"MODE": "wait", "STEPS": "5", "SPAWN": "1", "RELEASE": str(release), "STALLED": str(stalled)})
    try:
        assert _wait_for(stalled.exists, 90, proc), "rank 1 never reached its stall"
        pids = _wait_for(lambda: _rank_pids(out), 30, proc)
        time.sleep(1.5)  # rank 0 reaches its all_reduce
        os.kill(pids[0], signal.SIGUSR1)
        assert _wait_for(lambda: _dumps(out, "sigusr1-*").get(0), 30, proc), list(out.glob("dumps/*"))
    finally:
        release.touch()
    _, stderr = _finish(proc)
    assert proc.returncode == 0, stderr[-3000:]
    dump = _load(_dumps(out, "sigusr1-*")[0][0])
    assert (dump.rank, dump.reason, dump.step, dump.phase) == (0, "on_demand", 2, "backward")
    assert any(f.name == "all_reduce" for f in _main(dump).frames)
    entries = [e for rec in dump.flight_recorder for e in rec.entries]
    assert entries and not entries[-1].retired
    assert [e["status"] for e in read_json(out / "manifest.json")["ranks"]] == ["ok", "ok"]
