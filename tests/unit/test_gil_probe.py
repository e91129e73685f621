"""The GIL probe counts only the job's own Python threads and how many of them make progress, not ddpdoctor's."""

from __future__ import annotations

import threading
import time

import pytest

from ddpdoctor.capture.gil import GilProbe
from ddpdoctor.metrics.capture import thread_metrics


def _spin_until(done: threading.Event) -> None:
    while not done.is_set():
        sum(range(200))  # pure Python: holds the GIL


def test_three_python_threads_take_turns_and_ddpdoctors_thread_is_not_counted() -> None:
    probe = GilProbe()
    if not probe.available:
        pytest.skip(probe.reason)
    # threads other tests of this process left alive (an executor's worker, a dask loop) are the job's too
    before = sum(1 for t in threading.enumerate() if not t.name.startswith("ddpdoctor"))
    stop = threading.Event()
    ours = threading.Thread(target=stop.wait, name="ddpdoctor-test-helper", daemon=True)
    ours.start()
    probe.start()
    # the workers spin until the sample is taken: on a loaded machine the main thread may get the GIL back long
    # after its sleep, and workers on a fixed timer would have ended by then
    done = threading.Event()
    workers = [threading.Thread(target=_spin_until, args=(done,)) for _ in range(3)]
    for w in workers:
        w.start()
    time.sleep(0.6)
    probe.sample(1)
    done.set()
    for w in workers:
        w.join()
    probe.stop()
    stop.set()
    series = probe.series
    # the threads alive before (the main thread at least) + 3 workers; the ddpdoctor-* helper and gilknocker's native
    # thread are not the job's
    assert series["job_threads"] == [before + 3]
    assert series["active_threads"][0] >= 2
    if probe.to_json()["probe"] == "gilwatch":  # Linux: they waited for the GIL most of the time they were ready
        assert series["contention"][0] > 0.4, series
    else:  # GIL-bound: together about one core at most, however many cores the host has (gilknocker holds it too)
        assert series["cpu_cores"][0] < 1.3


def test_thread_metrics_take_the_median_step_and_the_spread() -> None:
    capture = {
        "gil": {
            "per_step": {
                "contention": [0.1, 0.5, 0.6, 0.55, 0.9],
                "threads": [5] * 5,
                "active_threads": [4, 3, 0, 4, 2],
                "cpu_cores": [0.7, 1.2, 0.6, 1.0, 0.9],
            }
        }
    }
    m = thread_metrics(capture, None)
    assert m["active_python_threads"] == 3 and m["python_cpu_cores"] == pytest.approx(0.9)
    assert m["gil_contention"] == pytest.approx(0.53)
    assert m["gil_contention_spread"] == pytest.approx(0.78 - 0.26)
    # a capture from before these were recorded: unknown, not zero
    old = thread_metrics({"gil": {"per_step": {"contention": [0.4], "threads": [3]}}}, None)
    assert old["active_python_threads"] is None and old["python_cpu_cores"] is None


# ------------------------------------------------------------------------------------------ a busy host (issue 25)
def test_threads_with_work_are_counted_against_the_busiest_one_in_ns():
    from ddpdoctor.capture.gil import _step_values

    # (seconds on a CPU, seconds waiting for one, voluntary switches) at a step's start and end: the main thread
    # waits for its one worker and steps the optimizer (1.2 ms, 8% of the worker's 15 ms), on a host that kept
    # both waiting for a CPU for longer than they ran; a third thread ran 0.5 ms
    before = {1: (1.0, 1.0, 10), 2: (2.0, 2.0, 0), 3: (0.5, 0.0, 5)}
    after = {1: (1.0012, 1.03, 22), 2: (2.015, 2.09, 0), 3: (0.5005, 0.0, 6)}
    active, cores, runnable, share, blocked, switches = _step_values(after, before, 0.2)
    assert active == 1
    assert cores == pytest.approx((0.0012 + 0.015 + 0.0005) / 0.2, abs=1e-3)
    assert share == pytest.approx(0.0167 / (0.0167 + 0.12), abs=1e-3)
    assert runnable == pytest.approx((0.0167 + 0.12) / 0.2, abs=1e-3)
    assert blocked == pytest.approx((0.2 - 0.105) / 0.2, abs=1e-3) and switches == 0
    # four workers at 10-15 ms each: all four have work, the waiting main thread does not
    before4 = {t: (0.0, 0.0, 0) for t in range(5)}
    after4 = {0: (0.0012, 0.01, 12), 1: (0.015, 0.1, 40), 2: (0.010, 0.1, 40), 3: (0.012, 0.1, 40), 4: (0.004, 0.1, 9)}
    assert _step_values(after4, before4, 0.2)[0] == 4
    assert _step_values({}, before4, 0.2) == (None,) * 6 and _step_values(after4, before4, 0.0)[0] is None


def _capture(
    contention: list[float], active: list[int], other_cores: float | None, cores: float = 0.3, share: float = 0.95
) -> dict:
    hostload = None
    if other_cores is not None:  # this process used 0.3 CPUs of 2 for 1 s; the host was busy for the rest
        busy = (0.3 + other_cores) / 2 * 2.0
        window = {"wall_s": 1.0, "host_total_s": 2.0, "host_busy_s": busy, "cpu_s": 0.3, "host_cpus": 2}
        hostload = {"windows": [window]}
    n = len(contention)
    gil = {"contention": contention, "threads": [6] * n, "active_threads": active, "cpu_cores": [cores] * n}
    return {"gil": {"per_step": {**gil, "cpu_share": [share] * n}}, "hostload": hostload}


def test_a_low_reading_on_a_busy_host_with_threads_at_work_cannot_decide():
    from ddpdoctor.metrics.capture import gil_reasons

    starved = thread_metrics(_capture([0.05, 0.1, 0.02], [4, 4, 4], 1.4, share=0.2), None)
    assert starved["gil_contention"] is None and starved["gil_host_other_cores"] == pytest.approx(1.4)
    assert starved["active_python_threads"] == 4 and starved["python_cpu_share"] == pytest.approx(0.2)
    why = gil_reasons([{"rank": 0, **starved}])["gil_contention"]
    assert why.startswith("the CPUs were too busy to tell on rank 0: other processes used 1.4 CPUs and the job's 4")
    assert "got 20% of the CPU time" in why and "its reading of 6% (20% or less) is no evidence" in why
    # the same reading on a quiet host, a high reading on a busy one, one thread at work: each is evidence
    assert thread_metrics(_capture([0.05, 0.1, 0.02], [4, 4, 4], 0.1), None)["gil_contention"] == pytest.approx(
        0.17 / 3
    )
    assert thread_metrics(_capture([0.5, 0.4, 0.3], [4, 4, 4], 1.4), None)["gil_contention"] == pytest.approx(0.4)
    one = thread_metrics(_capture([0.05, 0.1, 0.02], [1, 1, 1], 1.4), None)
    assert one["gil_contention"] == pytest.approx(0.17 / 3) and gil_reasons([{"rank": 0, **one}]) == {}
    # a quiet host whose CPUs the job's own threads oversubscribe (4 runnable threads on 2 cores): starved as well
    own = thread_metrics(_capture([0.09, 0.13, 0.12], [4, 4, 4], 0.0, cores=1.15, share=0.5), None)
    assert own["gil_contention"] is None and own["gil_probe_reading"] == pytest.approx(0.34 / 3)
    why = gil_reasons([{"rank": 0, **own}])["gil_contention"]
    assert why.startswith("the CPUs were too busy to tell on rank 0: the job's 4 Python threads at work got 50% of")
    assert "other processes" not in why
    # a rank without a reading for another reason (--no-gil) gets no host reason
    assert gil_reasons([{"rank": 0, **starved}, {"rank": 1, "gil_contention": None}]) == {}


def test_a_high_reading_from_threads_that_ran_in_parallel_cannot_decide():
    """The probe read contention, but the threads used 1.63 cores of a quiet host (CI's run of the 4-thread small-op
    sample): they took turns on the GIL and ran native code in parallel; the data does not say which cost more."""
    from ddpdoctor.metrics.capture import gil_reasons

    mixed = thread_metrics(_capture([0.2, 0.25, 0.2], [4, 4, 4], 0.0, cores=1.63), None)
    assert mixed["gil_contention"] is None and mixed["python_cpu_cores"] == pytest.approx(1.63)
    why = gil_reasons([{"rank": 0, **mixed}])["gil_contention"]
    assert why.startswith("the evidence conflicts on rank 0: the GIL probe read 22% contention, but the job's 4")
    assert "used 1.63 CPU cores between them" in why and "too busy" not in why
    # the same reading from threads that took turns (about one core), or a low one from parallel threads: evidence
    turns = thread_metrics(_capture([0.2, 0.25, 0.2], [4, 4, 4], 0.0, cores=1.0), None)
    assert turns["gil_contention"] == pytest.approx(0.65 / 3)
    assert thread_metrics(_capture([0.05, 0.1, 0.02], [4, 4, 4], 0.0, cores=1.6), None)["gil_contention"] < 0.1
    # one thread at work: nothing contends, whatever the cores
    one = thread_metrics(_capture([0.4, 0.4, 0.4], [1, 1, 1], 0.0, cores=1.6), None)
    assert one["gil_contention"] == pytest.approx(0.4) and gil_reasons([{"rank": 0, **one}]) == {}
    # one rank busy-host, one rank parallel: both reasons, each with its rank
    starved = thread_metrics(_capture([0.05, 0.1, 0.02], [4, 4, 4], 1.4, share=0.2), None)
    both = gil_reasons([{"rank": 0, **starved}, {"rank": 1, **mixed}])["gil_contention"]
    assert "too busy to tell on rank 0" in both and "conflicts on rank 1" in both


def test_the_rule_says_not_evaluated_on_a_busy_host_and_passes_one_thread_at_work():
    from types import SimpleNamespace

    from ddpdoctor.diagnosis.engine import evaluate
    from ddpdoctor.diagnosis.rules import load_rules
    from ddpdoctor.metrics.capture import gil_reasons

    rule = [r for r in load_rules() if r.name == "gil-contention"]

    def verdict(capture: dict):
        ranks = [{"rank": 0, **thread_metrics(capture, None)}]
        run = {"mode": "single", "world_size": 1, "not_measured": gil_reasons(ranks)}
        return evaluate(rule, SimpleNamespace(run=run, ranks=ranks))

    busy = verdict(_capture([0.05, 0.1, 0.02], [4, 4, 4], 1.4))
    assert not busy.findings and not busy.passed
    assert "the CPUs were too busy to tell on rank 0" in busy.not_evaluated[0].reason
    # the wait share is left out with the reading: the same reason once, never "no GIL probe data" (CI clone,
    # 2026-12-07, said both of a traced run that had gilwatch's samples)
    assert "no GIL probe data" not in busy.not_evaluated[0].reason
    assert busy.not_evaluated[0].reason.count("too busy to tell") == 1
    mixed = verdict(_capture([0.25, 0.2, 0.25], [4, 4, 4], 0.0, cores=1.63))  # took turns and ran in parallel
    assert not mixed.findings and not mixed.passed
    assert "the evidence conflicts on rank 0: the GIL probe read 23%" in mixed.not_evaluated[0].reason
    one = verdict(_capture([0.6, 0.5, 0.7], [1, 1, 1], 1.4))  # a busy host inflates the reading: one thread
    assert not one.findings and one.passed == ("gil-contention",)
    assert "active_python_threads = 1 < 2" in one.passed_reasons[0].reason
    fired = verdict(_capture([0.5, 0.4, 0.3], [4, 4, 4], 1.4))
    assert [f.name for f in fired.findings] == ["gil-contention"]


def test_a_gilwatch_reading_the_host_rationed_names_that_cause_once_for_both_of_the_rules_metrics():
    """CI clone, 2026-12-07: the 4-thread job beside burners in another session, gilwatch 7% of their time in the
    GIL's wait, the threads got 28% of their runnable CPU time, other processes 1.2 CPUs. Both of the rule's GIL
    metrics are left out for that reason; the report said it for one and "no GIL probe data" for the other."""
    from types import SimpleNamespace

    from ddpdoctor.diagnosis.engine import evaluate
    from ddpdoctor.diagnosis.rules import load_rules
    from ddpdoctor.metrics.capture import gil_reasons

    capture = _capture([0.07] * 4, [4] * 4, 1.2, share=0.28)
    capture["gil"]["per_step"].update(
        gil_wait_s=[0.007] * 4, gil_run_s=[0.093] * 4, gil_ready_s=[0.1] * 4, gil_ticks=[60] * 4
    )
    ranks = [{"rank": 0, **thread_metrics(capture, None)}]
    assert ranks[0]["gil_samples"] == 240 and ranks[0]["gil_contention"] is None, ranks[0]
    assert ranks[0]["gil_wait_share"] is None
    run = {"mode": "ddp", "world_size": 1, "not_measured": gil_reasons(ranks)}
    rule = [r for r in load_rules() if r.name == "gil-contention"]
    verdict = evaluate(rule, SimpleNamespace(run=run, ranks=ranks))
    assert not verdict.findings and not verdict.passed
    why = verdict.not_evaluated[0].reason
    assert why.startswith("not measured in this run: gil_contention, gil_wait_share; the host rationed the CPUs on")
    assert "got 28% of the CPU time" in why and why.count("rationed") == 1 and "no GIL probe data" not in why, why
