"""On a busy host communication waits for a CPU too: gloo's transfer is CPU work on threads of its own (NCCL's network
progress runs on a proxy thread). A DDP job whose first half is frozen exposed 3 ms of transfer per step on a quiet
host and up to 35 ms beside a CPU burner, where poor-comm-compute-overlap fired on it (4 of 6 runs), hedged. There the
exposure must now pass the thresholds with the wait of the ranks' other threads (``other_threads_cpu_wait_ms``)
taken out too, else the rule is not evaluated and says why; a job that all-reduces after backward still fires
beside the burner (its other threads waited under 1 ms: gloo ran its synchronous all-reduce on the loop's thread).
Measured metrics of the recorded straggler sample, with the host and exposure of each case set (the values of the
runs named)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ddpdoctor.capture import hostload as capture
from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.diagnosis.rules import builtin_rules_dir, load_rule_file
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze, hostload

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"
RULES = ("poor-comm-compute-overlap", "ddp-bucket-size-mismatch")


@pytest.fixture(scope="module")
def metrics():
    return analyze(load(SAMPLE, workers=1))


def _case(
    metrics, *, contended: bool, others_ms: float, exposed_ms: float, loop_wait_ms: float = 40.0, buckets: int = 2
):
    m = copy.deepcopy(metrics)
    m.run["host_contended"] = contended
    for r in m.ranks:
        r["ddp_bucket_count"] = buckets
        r["cpu_wait_ms"] = loop_wait_ms
        r["other_threads_cpu_wait_ms"] = others_ms
        r["exposed_transfer_ms"] = r["ddp_exposed_transfer_ms"] = exposed_ms
        r["overlap_ratio"] = 0.41
    rules = [r for r in load_rules() if r.name in RULES]
    m.run["host_comm_cpu_wait_ms"] = hostload.comm_cpu_wait(m.ranks, contended)  # as hostload_metrics sets it
    result = evaluate(rules, m)
    found = {f.name: f.message for f in result.findings}
    undecided = {n.name: n.reason for n in result.not_evaluated}
    return found, undecided, set(result.passed)


def test_an_exposure_the_busy_host_s_wait_covers_is_not_evaluated_and_says_why(metrics) -> None:
    """The frozen job beside a burner: 12.8 ms exposed, its ranks' other threads waited up to 24.8 ms a step."""
    found, undecided, passed = _case(metrics, contended=True, others_ms=24.8, exposed_ms=12.8)
    assert not set(found) & set(RULES) and not set(passed) & set(RULES), (found, passed)
    why = undecided["poor-comm-compute-overlap"]
    assert why.startswith("the host was busy, and communication waited for a CPU too"), why
    assert "waited up to 24.8 ms per step" in why and "the 12.8 ms per step of exposed transfer" in why, why
    assert "41% of communication overlapped" in why and "only with that wait counted" in why, why
    assert "n/a" not in why
    bucket = undecided["ddp-bucket-size-mismatch"]
    assert "waited up to 24.8 ms per step" in bucket and "12.8 ms per step of exposed transfer" in bucket, bucket
    assert "(1 ms, 5% of a step)" in why and "(2 ms, 5% of a step)" in bucket and "%%" not in why + bucket


def test_an_exposure_beyond_the_host_s_wait_still_fires_on_a_busy_host(metrics) -> None:
    """The job that all-reduces after backward, beside the burner: 57 ms exposed, its other threads under 1 ms."""
    found, _, _ = _case(metrics, contended=True, others_ms=0.7, exposed_ms=57.0, loop_wait_ms=20.0)
    assert set(found) == set(RULES), found
    assert "The host was busy too" not in found["poor-comm-compute-overlap"]  # 20 ms of loop wait: under half of 57
    found, _, _ = _case(metrics, contended=True, others_ms=0.7, exposed_ms=57.0, loop_wait_ms=47.0)
    assert "The host was busy too" in found["poor-comm-compute-overlap"]  # the hedge where the loop waited as long


def test_one_bucket_s_exposure_is_not_the_host_s(metrics) -> None:
    """One DDP bucket: its one all-reduce is issued when the last gradient is ready, after backward, on any host. The
    try tests' fixture (an 8 MB model, bucket_cap_mb=500) beside three CPU burners: 12.9 ms exposed per step, its
    other threads waiting 12.8 ms (10-12 ms exposed on a quiet host). Taking that wait out left nothing, and CI,
    on a loaded machine, found no finding to try; with two buckets the same numbers stay undecided."""
    found, undecided, _ = _case(metrics, contended=True, others_ms=12.8, exposed_ms=12.9, loop_wait_ms=31.0, buckets=1)
    assert set(found) == set(RULES), (found, undecided)
    assert "The host was busy too" in found["poor-comm-compute-overlap"]  # hedged: the loop waited over half of it
    found, undecided, _ = _case(metrics, contended=True, others_ms=12.8, exposed_ms=12.9, loop_wait_ms=31.0)
    assert not set(found) & set(RULES) and set(RULES) <= set(undecided), (found, undecided)


def test_on_a_quiet_host_the_other_threads_wait_is_the_job_s_own_and_not_taken_out(metrics) -> None:
    """Two ranks' helper threads on 2 CPUs wait ~6 ms a step on a quiet host (the recorded sample): that is no
    busy host, and the verdict is the one without it."""
    found, undecided, _ = _case(metrics, contended=False, others_ms=24.8, exposed_ms=12.8, loop_wait_ms=0.3)
    assert set(found) == set(RULES), (found, undecided)


def test_a_quiet_pass_stays_a_pass(metrics) -> None:
    found, undecided, passed = _case(metrics, contended=True, others_ms=24.8, exposed_ms=0.5)
    assert not set(found) & set(RULES) and set(RULES) <= passed, (found, undecided)


def test_without_the_other_threads_wait_the_verdict_is_the_one_before(metrics) -> None:
    """A run recorded before the measure (or without /proc): nothing is taken out, the finding stands (hedged by the
    loop's wait where that is at least half)."""
    m = copy.deepcopy(metrics)
    m.run["host_contended"] = True
    for r in m.ranks:
        r["cpu_wait_ms"], r["other_threads_cpu_wait_ms"], r["overlap_ratio"] = 20.0, None, 0.41
        r["exposed_transfer_ms"] = r["ddp_exposed_transfer_ms"] = 12.8
    m.run["host_comm_cpu_wait_ms"] = hostload.comm_cpu_wait(m.ranks, True)  # as hostload_metrics sets it
    found = {f.name: f.message for f in evaluate([r for r in load_rules() if r.name in RULES], m).findings}
    assert set(found) == set(RULES) and "The host was busy too" in found["poor-comm-compute-overlap"], found


def test_the_other_threads_wait_is_every_thread_s_less_the_loop_s_per_step() -> None:
    window = {
        "first_step": 8, "last_step": 12, "complete": True, "wall_s": 0.7, "cpu_s": 1.0,
        "run_s": 1.2, "run_delay_s": 0.3, "main_run_s": 0.5, "main_run_delay_s": 0.1,
    }  # fmt: skip
    out, why = hostload.rank_hostload({"hostload": {"source": "procfs", "windows": [window]}})
    assert why is None
    assert out["cpu_wait_ms"] == pytest.approx(20.0) and out["other_threads_cpu_wait_ms"] == pytest.approx(40.0)
    older = {k: v for k, v in window.items() if k != "run_delay_s"}
    out, _ = hostload.rank_hostload({"hostload": {"source": "procfs", "windows": [older]}})
    assert out["cpu_wait_ms"] == pytest.approx(20.0) and out["other_threads_cpu_wait_ms"] is None


@pytest.mark.skipif(not capture.os.path.exists("/proc/self/task"), reason="Linux /proc only")
def test_a_live_window_records_every_thread_s_wait_and_the_loop_s() -> None:
    probe = capture.HostLoad()
    probe.step(1, True)
    sum(i * i for i in range(200_000))
    probe.step(2, False)
    (window,) = probe.windows
    assert window["run_delay_s"] >= window["main_run_delay_s"] >= 0.0
    out, _ = hostload.rank_hostload({"hostload": probe.to_json()})
    assert out["other_threads_cpu_wait_ms"] is not None and out["other_threads_cpu_wait_ms"] >= 0.0


def test_undecided_is_a_key_of_any_scope() -> None:
    """A run rule's sentence is its reason when `when` is unknown; a per-rank rule's is rendered with the values of
    each rank it leaves undecided (rank-straggler's: tests/unit/test_hostload.py)."""
    assert load_rule_file(builtin_rules_dir() / "poor-comm-compute-overlap.toml").undecided is not None
    assert load_rule_file(builtin_rules_dir() / "rank-straggler.toml").undecided is not None


def _loop_case(metrics, *, contended: bool, others_ms: float, loop_ms: float = 4.61, step_ms: float = 66.6):
    m = copy.deepcopy(metrics)
    m.run["host_contended"] = contended
    for r in m.ranks:
        r["other_threads_cpu_wait_ms"], r["loop_exposed_transfer_ms"], r["step_ms_median"] = others_ms, loop_ms, step_ms
    m.run["host_comm_cpu_wait_ms"] = hostload.comm_cpu_wait(m.ranks, contended)  # as hostload_metrics sets it
    result = evaluate([r for r in load_rules() if r.name == "loop-collectives-exposed"], m)
    return [f.message for f in result.findings], [n.reason for n in result.not_evaluated], result.passed


def test_the_loop_s_own_collectives_on_a_busy_host_pass_only_beyond_its_wait(metrics) -> None:
    """A job that all-reduces its loss every step: 0.34 ms exposed a step on its own, 4.6 ms (6.9% of a 66.6 ms step)
    beside three CPU burners, its ranks' other threads waiting up to 31.7 ms a step: it fired there."""
    found, undecided, _ = _loop_case(metrics, contended=True, others_ms=31.7)
    assert not found and len(undecided) == 1, (found, undecided)
    assert undecided[0].startswith("the host was busy, and communication waited for a CPU too"), undecided
    assert "waited up to 31.7 ms per step" in undecided[0] and "for 4.6 ms per step" in undecided[0], undecided
    assert "(1 ms, 5% of a step)" in undecided[0] and "n/a" not in undecided[0], undecided
    found, _, _ = _loop_case(metrics, contended=False, others_ms=31.7)  # a quiet host: the verdict without it
    assert len(found) == 1 and "4.6 ms per step" in found[0], found
    found, _, _ = _loop_case(metrics, contended=True, others_ms=0.5)  # beyond the wait: still found
    assert len(found) == 1, found
    _, _, passed = _loop_case(metrics, contended=True, others_ms=31.7, loop_ms=0.34)
    assert passed == ("loop-collectives-exposed",)


def _bcast_case(metrics, *, contended: bool, others_ms: float, transfer_ms: float, wall_ms: float | None = None):
    m = copy.deepcopy(metrics)
    m.run["host_contended"] = contended
    for r in m.ranks:
        r["ddp_broadcast_buffers"], r["step_ms_median"], r["other_threads_cpu_wait_ms"] = True, 9.1, others_ms
        r["buffer_broadcast_transfer_ms"] = transfer_ms
        r["buffer_broadcast_ms"] = transfer_ms if wall_ms is None else wall_ms
    m.run["host_comm_cpu_wait_ms"] = hostload.comm_cpu_wait(m.ranks, contended)  # as hostload_metrics sets it
    result = evaluate([r for r in load_rules() if r.name == "broadcast-buffers-cost"], m)
    return [f.message for f in result.findings], [n.reason for n in result.not_evaluated], result.passed


def test_buffer_broadcasts_on_a_busy_host_pass_only_beyond_its_wait(metrics) -> None:
    """A BatchNorm job's buffer broadcasts, traced while the machine ran a test suite: 1.38 ms of transfer a step
    (0.1-0.5 ms in its first steps, 4.8 ms in one), its ranks' other threads waiting up to 5.8 ms a step. It fired
    there (1.6 ms in the broadcasts)."""
    found, undecided, _ = _bcast_case(metrics, contended=True, others_ms=5.8, transfer_ms=1.38)
    assert not found and len(undecided) == 1, (found, undecided)
    assert undecided[0].startswith("the host was busy, and communication waited for a CPU too"), undecided
    assert "waited up to 5.8 ms per step" in undecided[0] and "moved data for 1.38 ms per step" in undecided[0]
    assert "(0.5 ms, 2% of a step)" in undecided[0] and "n/a" not in undecided[0], undecided
    found, _, _ = _bcast_case(metrics, contended=False, others_ms=5.8, transfer_ms=1.38)  # quiet: no discount
    assert len(found) == 1 and "move data for 1.38 ms per step (15.2% of a 9.1 ms step)" in found[0], found
    found, _, _ = _bcast_case(metrics, contended=True, others_ms=0.4, transfer_ms=1.38)  # beyond the wait
    assert len(found) == 1, found
    _, _, passed = _bcast_case(metrics, contended=True, others_ms=5.8, transfer_ms=0.2)
    assert passed == ("broadcast-buffers-cost",)


def test_waiting_in_the_buffer_broadcasts_for_a_late_rank_is_not_their_cost(metrics) -> None:
    """Rank 0 waits 1.6 ms a step in the broadcasts for a rank that reaches its forward late; they move data for
    0.2 ms: without broadcast_buffers the wait moves to the next collective, so the rule passes on the transfer."""
    found, undecided, passed = _bcast_case(metrics, contended=False, others_ms=0.0, transfer_ms=0.2, wall_ms=1.6)
    assert not found and not undecided and passed == ("broadcast-buffers-cost",), (found, undecided)
    found, _, _ = _bcast_case(metrics, contended=False, others_ms=0.0, transfer_ms=0.9, wall_ms=2.4)
    assert len(found) == 1 and "The ranks spend 2.40 ms per step in them on average" in found[0], found
