"""`gil-contention` on a busy host (issue 25 item 3): samples/gil_small_ops.py's four GIL-bound threads and its
`--threads 1` twin (the same work on one worker thread), each traced quiet and with two CPU burners beside it.

On Linux gilwatch measures the job's threads from beside the rank: the share of their working time (their GIL wait
plus their time on a CPU) that they waited for the GIL (measured here on 2026-12-05 with the sample's default work:
0.27-0.39 for the four threads on a quiet host in 8 runs, and beside two burners in the job's session in 3; 0.00 for
one). So the threaded job fires on a quiet host, and beside burners fires or says the host rationed the CPUs; the
twin never fires: one of the job's threads has work, nothing contends with it (the threads with work are counted
from their own CPU time in ns, as a share of the busiest thread's, so a busy host cannot make the waiting main
thread look like a second worker). Where gilwatch cannot run, gilknocker's probe may say it cannot tell (a starved
probe under-reads), never pass; a low reading too close to the threshold to call (its upper bound above it) says
so, never passes. Each job is traced once per module (12 steps, 8 profiled).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import SAMPLES, cpu_burner, run_cli

from ddpdoctor.metrics.capture import WATCH_MIN_TICKS

pytestmark = [pytest.mark.integration]

WINDOW = ["--wait", "2", "--warmup", "1", "--active", "8"]  # 8 steps: a ratio known well enough to decide
# The sample's default work: 150 small torch ops a piece with a little Python between them (0.66-0.77x the speed of
# serial; its ops release the GIL and its threads run on 1.4-1.7 cores between them), as the held-out job of
# issue 25 was. Until 2026-12-05 it read 0.13-0.27 quiet (the threads' time blocked on the pool's queue was in the
# ratio's denominator), and the test used mostly-Python work (`--ops 30 --python 2000`) to stay clear of 0.2.
WORK: list[str] = []


# Burners in the job's own session (a preprocessing process started from the same shell): the kernel's autogroups
# share the CPUs between sessions, not processes, so these compete with the job's threads one for one.
BESIDE = """
import json, os, subprocess, sys, time
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(sys.argv[1]))]
start = time.monotonic()
try:
    code = subprocess.call([sys.executable, "-m", "ddpdoctor", *sys.argv[2:]])
finally:
    cpu = 0.0
    for hog in hogs:
        with open(f"/proc/{hog.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        hog.kill()
    print(json.dumps({"burners_cores": cpu / (time.monotonic() - start)}), file=sys.stderr)
sys.exit(code)
"""


def _traced(tmp_path_factory, threads: int, burners: int, session: str = "other", work: list[str] = WORK) -> dict:
    out = tmp_path_factory.mktemp("gil_load") / f"t{threads}_b{burners}_{session}"
    args = [
        "trace", "-q", "--out", str(out), *WINDOW, str(SAMPLES / "gil_small_ops.py"),
        "--threads", str(threads), "--steps", "12", *work,
    ]  # fmt: skip
    if session == "job":
        run = subprocess.run(
            [sys.executable, "-c", BESIDE, str(burners), *args],
            capture_output=True, text=True, timeout=280, start_new_session=True,
        )  # fmt: skip
    else:  # burners in this session, the job in its own: it gets half the host at most
        with cpu_burner(burners):
            run = run_cli(*args, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    burners_cores = json.loads(run.stderr.strip().splitlines()[-1])["burners_cores"] if session == "job" else None
    diagnosed = run_cli("diagnose", str(out), "--select", "gil-contention", "--format", "json", timeout=60)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    report = json.loads(diagnosed.stdout)
    # the GIL probe's per-rank metrics are in the rank's summary (the report's rank table shows gil_contention only)
    report["rank0_metrics"] = json.loads((out / "ranks" / "rank0.summary.json").read_text())["metrics"]
    report["burners_cores"] = burners_cores  # what the job-session burners used, CPUs (None: not measured)
    return report


@pytest.fixture(scope="module")
def sleepy(tmp_path_factory):
    return _traced(tmp_path_factory, 4, 0, work=["--sleepy"])


@pytest.fixture(scope="module")
def threaded(tmp_path_factory):
    return _traced(tmp_path_factory, 4, 0)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    return _traced(tmp_path_factory, 1, 0)


@pytest.fixture(scope="module")
def threaded_burned(tmp_path_factory):
    return _traced(tmp_path_factory, 4, 2)


@pytest.fixture(scope="module")
def twin_burned(tmp_path_factory):
    return _traced(tmp_path_factory, 1, 2)


@pytest.fixture(scope="module")
def threaded_beside(tmp_path_factory):
    return _traced(tmp_path_factory, 4, 2, session="job")


@pytest.fixture(scope="module")
def twin_beside(tmp_path_factory):
    return _traced(tmp_path_factory, 1, 2, session="job")


def _rank0(report: dict) -> dict:
    return report["rank0_metrics"]


def _fired_or_undecided(report: dict) -> None:
    rank = _rank0(report)
    assert rank["active_python_threads"] >= 2  # four worker threads with work, whatever the load
    assert "gil-contention" not in report["passed"], json.dumps(report, indent=1)[-3000:]
    found = {f["name"]: f for f in report["findings"]}
    if "gil-contention" in found:
        f = found["gil-contention"]
        assert f["ranks"] == [0] and f["evidence"]["active_python_threads"]["0"] >= 2
        assert 0.2 < f["evidence"]["gil_contention"]["0"] <= 1.0
        return
    why = {n["name"]: n["reason"] for n in report["not_evaluated"]}["gil-contention"]
    assert rank["gil_contention"] is None, rank
    reading = rank["gil_probe_reading"]
    if "the evidence conflicts on rank 0: " in why:  # a reading above 20% from threads that also ran in parallel
        assert reading > 0.2 and rank["python_cpu_cores"] >= 1.3, rank
        assert f"used {rank['python_cpu_cores']:.2f} CPU cores" in why, why
    else:  # a low reading while the CPUs were oversubscribed, by other processes or by the job's own threads
        assert "the CPUs were too busy to tell on rank 0: " in why, why
        assert reading <= 0.2 and (rank["gil_host_other_cores"] >= 0.5 or rank["python_cpu_share"] < 0.8), rank
        assert f"its reading of {100 * reading:.0f}%" in why, why


def _fires(report: dict, rationed: bool = False) -> None:
    """Where gilwatch measured the rank (Linux), the threaded job fires on a quiet host. Beside burners (``rationed``)
    it may instead say that the host rationed the CPUs (the threads got too little of the CPU time they were
    runnable for, so they took turns on it and hardly waited for the GIL), with the numbers; never pass.
    gilknocker's fallback may say it cannot tell."""
    rank = _rank0(report)
    if rank.get("gil_samples") is None:
        _fired_or_undecided(report)
        return
    if rationed and rank["gil_contention"] is None and rank["gil_samples"] < WATCH_MIN_TICKS:
        # beside burners the threads may run so little that gilwatch saw them under its floor (CI, 2026-12-04:
        # 74 samples in the profiled steps): it says so, never passes
        why = {n["name"]: n["reason"] for n in report["not_evaluated"]}["gil-contention"]
        assert "too few samples on rank 0" in why, why
        return
    if rank["gil_contention"] is None and rank["gil_probe_reading"] <= 0.2 < (rank["gil_contention_upper"] or 0):
        # a low reading whose upper bound is over the threshold (CI clone, quiet, 2026-12-04: 0.144 of 4 steps of
        # 0.05-0.26) is too close to call, said with its numbers; never a pass
        why = {n["name"]: n["reason"] for n in report["not_evaluated"]}["gil-contention"]
        assert "too close to call on rank 0: " in why or "the host rationed the CPUs on rank 0" in why, why
        return
    if rationed and rank["gil_contention"] is None:
        why = {n["name"]: n["reason"] for n in report["not_evaluated"]}["gil-contention"]
        # both of the rule's GIL metrics are left out for that one reason (CI clone, 2026-12-07: the wait share
        # was said to have "no GIL probe data")
        assert "gil_contention, gil_wait_share; the host rationed the CPUs on rank 0: other processes used " in why
        assert why.count("the host rationed") == 1 and "no GIL probe data" not in why, why
        assert rank["gil_host_other_cores"] >= 0.5 and rank["python_cpu_share"] < 0.8, rank
        assert f"got {100 * rank['python_cpu_share']:.0f}% of the CPU time" in why, why
        return
    found = {f["name"]: f for f in report["findings"]}
    assert "gil-contention" in found, json.dumps({"rank": rank, "report": report}, indent=1)[-3000:]
    f = found["gil-contention"]
    assert f["ranks"] == [0] and f["evidence"]["active_python_threads"]["0"] >= 2
    assert 0.2 < f["evidence"]["gil_contention"]["0"] <= 1.0 and rank["gil_samples"] >= 50, rank


def _passes_with_one_thread(report: dict) -> None:
    assert report["findings"] == [], json.dumps(report["findings"], indent=1)
    assert report["passed"] == ["gil-contention"], report["not_evaluated"]
    assert _rank0(report)["active_python_threads"] == 1
    reason = next(p["reason"] for p in report["passed_reasons"] if p["name"] == "gil-contention")
    assert "active_python_threads = 1 < 2" in reason
    rank = _rank0(report)
    if rank.get("gil_samples") is not None:  # gilwatch: the one worker hardly waits (nothing contends)
        if rank["gil_contention"] is None:  # one thread gives fewer samples: under the floor, no ratio is kept
            assert rank["gil_samples"] < WATCH_MIN_TICKS, rank
        # under the rule's 20% (it passes here on the thread count alone): 0.00-0.05 quiet; 0.10 once beside burners
        # in another session (clean-clone suite, 2026-12-05), the main thread, off its CPU while it held the GIL,
        # keeping the worker waiting
        assert rank["gil_probe_reading"] <= 0.2, rank


@pytest.mark.timeout(400)
def test_threaded_job_fires(threaded):
    # No burner of the test's own; where other processes still kept the host busy (a shared CI machine: at least
    # half a CPU, by the host's load record) the rule may say so instead, with those numbers, never pass
    _fires(threaded, rationed=True)


@pytest.mark.timeout(400)
def test_single_thread_twin_passes(twin):
    _passes_with_one_thread(twin)


@pytest.mark.timeout(400)
def test_threaded_job_with_burners_in_another_session_fires_or_says_the_host_rationed_the_cpus(threaded_burned):
    _fires(threaded_burned, rationed=True)


@pytest.mark.timeout(400)
def test_threaded_job_with_burners_in_its_session_fires_or_says_the_host_rationed_the_cpus(threaded_beside):
    # Burners in the job's session compete with its threads one for one, and the job usually fires; on 2026-12-04
    # here the burners took 1.7 of the 2 CPUs in one run of three (the threads got 22% of their runnable time) and
    # the rule said so instead of passing
    _fires(threaded_beside, rationed=True)


@pytest.mark.timeout(400)
def test_single_thread_twin_with_burners_in_its_session_passes(twin_beside):
    _passes_with_one_thread(twin_beside)


@pytest.mark.timeout(400)
def test_single_thread_twin_with_burners_passes(twin_burned):
    _passes_with_one_thread(twin_burned)


@pytest.mark.timeout(400)
def test_threads_that_mostly_sleep_do_not_fire(sleepy):
    """Four threads that each sleep 1 ms between small ops (4-5% of a CPU each) meet the GIL now and then when they
    wake together: a few samples of GIL wait against a few ms of CPU time read up to 0.35 of their working time
    (2026-12-05, quiet), which alone would fire; the wait took 0.002-0.043 of their time in all (``gil_wait_share``),
    and the rule passes on that. On a busy host it may say it cannot tell; never a finding."""
    assert "gil-contention" not in {f["name"] for f in sleepy["findings"]}, json.dumps(sleepy["findings"])[-3000:]
    rank = _rank0(sleepy)
    if "gil-contention" in sleepy["passed"] and rank.get("gil_contention") is not None:
        reason = next(p["reason"] for p in sleepy["passed_reasons"] if p["name"] == "gil-contention")
        if rank["gil_contention"] > 0.2 and rank["active_python_threads"] >= 2:
            assert rank["gil_wait_share"] <= 0.1 and "gil_wait_share = " in reason, (rank, reason)
    else:
        assert "gil-contention" in {n["name"] for n in sleepy["not_evaluated"]}, sleepy
