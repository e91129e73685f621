"""dataloader-bound on a busy host: a loader without workers loads in the training loop, so its time stretches with
the host's load. A balanced job's loader (4 ms a step on a quiet host) measured 58.4 ms of a 465 ms step beside
other processes, its loop waiting 229.6 ms a step for a CPU, and the rule told it to add workers. Where the loop
waited 10% of the window or more for a CPU, the wait must pass the thresholds with that whole wait taken out;
else the rank is undecided. Loaders with workers, quiet hosts and runs without the record are judged as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddpdoctor.diagnosis import evaluate, load_rules, select_rules
from ddpdoctor.metrics import hostload


def _evaluate(**rank0):
    base = {"rank": 0, "dataloader_ms": 58.4, "step_ms_median": 465.4, "dataloader_workers": 0}
    other = {"rank": 1, "dataloader_ms": 16.9, "step_ms_median": 480.1, "dataloader_workers": 0}
    rows = [{**base, **rank0}, other]
    for row in rows:
        row["dataloader_own_ms"] = hostload.dataloader_own(row, row)
    metrics = SimpleNamespace(run={"mode": "ddp", "parallelism": "ddp"}, ranks=rows)
    return evaluate(select_rules(load_rules(), ["dataloader-bound"]), metrics)


def test_a_loader_the_busy_host_may_explain_is_undecided_not_named() -> None:
    result = _evaluate(cpu_wait_ms=229.6, cpu_wait_share=0.45)
    assert result.findings == () and result.passed == ("dataloader-bound",)
    reason = result.passed_reasons[0].reason
    assert "undecided on rank 0" in reason


@pytest.mark.parametrize(
    "rank0",
    [
        {},  # the host's load not recorded (foreign traces): as before
        {"cpu_wait_ms": 10.0, "cpu_wait_share": 0.02},  # a quiet host
        {"cpu_wait_ms": 229.6, "cpu_wait_share": 0.45, "dataloader_workers": 2},  # workers: as before
        # a loader slow of its own on a busy host: 200 ms a step, 46.5 ms of the loop's CPU wait cannot explain it
        {"dataloader_ms": 200.0, "cpu_wait_ms": 46.5, "cpu_wait_share": 0.1},
    ],
)
def test_other_loaders_are_judged_as_before(rank0) -> None:
    result = _evaluate(**rank0)
    assert [f.ranks for f in result.findings] == [(0,)]


def test_the_finding_on_a_busy_host_says_the_wait_beyond_the_hosts() -> None:
    (finding,) = _evaluate(dataloader_ms=200.0, cpu_wait_ms=46.5, cpu_wait_share=0.1).findings
    assert "exceeds that by 153.5 ms per step" in finding.message


def test_the_own_wait_is_the_wait_less_the_loops_cpu_wait_only_on_a_busy_host_without_workers() -> None:
    row = {"dataloader_ms": 58.4, "dataloader_workers": 0}
    assert hostload.dataloader_own(row, {"cpu_wait_ms": 229.6, "cpu_wait_share": 0.45}) == 0.0
    assert hostload.dataloader_own(row, {"cpu_wait_ms": 20.0, "cpu_wait_share": 0.1}) == pytest.approx(38.4)
    assert hostload.dataloader_own(row, {"cpu_wait_ms": 9.0, "cpu_wait_share": 0.09}) == 58.4  # not busy
    assert hostload.dataloader_own(row, {"cpu_wait_ms": None, "cpu_wait_share": None}) == 58.4  # not recorded
    workers = {**row, "dataloader_workers": 4}
    assert hostload.dataloader_own(workers, {"cpu_wait_ms": 229.6, "cpu_wait_share": 0.45}) == 58.4
    assert hostload.dataloader_own({"dataloader_ms": None}, {"cpu_wait_ms": 1.0, "cpu_wait_share": 0.5}) is None
