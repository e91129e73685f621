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
    # GIL-bound: together about one core at most, however many cores the host has
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
