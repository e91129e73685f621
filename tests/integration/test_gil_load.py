"""`gil-contention` on a busy host (issue 25 item 3): samples/gil_small_ops.py's four GIL-bound threads and its
`--threads 1` twin (the same work on one worker thread), each traced quiet and with two CPU burners beside it.

On Linux gilwatch measures the job's threads from beside the rank: the share of the time they were ready to run
Python that they waited for the GIL (0.36-0.44 for the four threads, quiet or beside two burners; 0-0.08 for one or
two threads). So the threaded job fires with and without the burners, and the twin never does: one of the job's
threads has work, nothing contends with it (the threads with work are counted from their own CPU time in ns, as a
share of the busiest thread's, so a busy host cannot make the waiting main thread look like a second worker).
Where gilwatch cannot run, gilknocker's probe may say it cannot tell (a starved probe under-reads), never pass. Each
job is traced once per module (8 steps, 4 profiled, 150 small ops a piece: with 60, a piece is so short that under
load the pool often ran the four one after the other, and a step had no contention to see).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import SAMPLES, cpu_burner, run_cli

pytestmark = [pytest.mark.integration]

WINDOW = ["--wait", "2", "--warmup", "1", "--active", "4"]


# Burners in the job's own session (a preprocessing process started from the same shell): the kernel's autogroups
# share the CPUs between sessions, not processes, so these compete with the job's threads one for one.
BESIDE = """
import subprocess, sys
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(sys.argv[1]))]
try:
    sys.exit(subprocess.call([sys.executable, "-m", "ddpdoctor", *sys.argv[2:]]))
finally:
    for hog in hogs:
        hog.kill()
"""


def _traced(tmp_path_factory, threads: int, burners: int, session: str = "other") -> dict:
    out = tmp_path_factory.mktemp("gil_load") / f"t{threads}_b{burners}_{session}"
    args = [
        "trace", "-q", "--out", str(out), *WINDOW, str(SAMPLES / "gil_small_ops.py"),
        "--threads", str(threads), "--steps", "8", "--ops", "150",
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
    diagnosed = run_cli("diagnose", str(out), "--select", "gil-contention", "--format", "json", timeout=60)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    report = json.loads(diagnosed.stdout)
    # the GIL probe's per-rank metrics are in the rank's summary (the report's rank table shows gil_contention only)
    report["rank0_metrics"] = json.loads((out / "ranks" / "rank0.summary.json").read_text())["metrics"]
    return report


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
    """Where gilwatch measured the rank (Linux), the threaded job fires, quiet or beside burners in its session: the
    share of its threads' time (not waiting for a CPU) spent waiting for the GIL does not move with the load. With
    the host rationed (the burners in another session: the job gets half the CPUs, its threads take turns on them
    and hardly wait for the GIL) it may say so instead, never pass. gilknocker's fallback may say it cannot tell."""
    rank = _rank0(report)
    if rank.get("gil_samples") is None:
        _fired_or_undecided(report)
        return
    if rationed and rank["gil_contention"] is None:
        why = {n["name"]: n["reason"] for n in report["not_evaluated"]}["gil-contention"]
        assert why.startswith("the host rationed the CPUs on rank 0: other processes used "), why
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
    if _rank0(report).get("gil_samples") is not None:  # gilwatch: the one worker hardly waits (nothing contends)
        assert _rank0(report)["gil_contention"] < 0.1, _rank0(report)


@pytest.mark.timeout(400)
def test_threaded_job_fires(threaded):
    _fires(threaded)


@pytest.mark.timeout(400)
def test_single_thread_twin_passes(twin):
    _passes_with_one_thread(twin)


@pytest.mark.timeout(400)
def test_threaded_job_with_burners_in_another_session_fires_or_says_the_host_rationed_the_cpus(threaded_burned):
    _fires(threaded_burned, rationed=True)


@pytest.mark.timeout(400)
def test_threaded_job_with_burners_in_its_session_fires(threaded_beside):
    _fires(threaded_beside)


@pytest.mark.timeout(400)
def test_single_thread_twin_with_burners_in_its_session_passes(twin_beside):
    _passes_with_one_thread(twin_beside)


@pytest.mark.timeout(400)
def test_single_thread_twin_with_burners_passes(twin_burned):
    _passes_with_one_thread(twin_burned)
