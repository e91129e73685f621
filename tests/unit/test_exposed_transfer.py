"""Exposed transfer and bandwidth against traces whose intervals are known exactly (issue 26 items 2 and 3).

Two ranks of three 1000 µs steps, on gloo (the CPU: gloo's ranges on its own two threads, compute on the training
thread) and on NCCL (comm kernels on stream 20, compute kernels on stream 7). In every step rank 1 arrives late:

    rank 0: compute [0, C0)   all-reduce A [100, 500) on thread/stream 1   all-reduce B [150, 520) on thread/stream 2
    rank 1: compute [0, 400)  all-reduce A [400, 500)                      all-reduce B [410, 520)

Each collective moves 1e6 bytes. Its transfer is from the last arrival to the end: A [400, 500), B [410, 520), the
same on both ranks; together [400, 520) = 120 µs. So, by hand:

- rank 0 waits [100, 410); with C0 = 300 the wait is hidden under compute until 300: exposed communication
  [300, 520) = 220 µs, of which the transfer [400, 520) = 120 µs; with C0 = 450 (all of the wait hidden) exposed
  communication [450, 520) = 70 µs, all of it transfer. The old estimate, exposed less all waiting (220 - 310 or
  70 - 310), read 0 in both.
- rank 1 waits for no one: exposed = transfer = [400, 520) = 120 µs.
- algbw = 2e6 bytes / 120 µs = 16.67 GB/s on both ranks (summing each rank's own durations gave 2.6 and 9.5 GB/s;
  summing the two transfers, 210 µs, 9.5 GB/s). busbw = algbw for an all-reduce over 2 ranks.

Tolerance: 1e-6 ms and 1e-6 relative (the intervals are exact). One rank's trace alone gives no exposed transfer and
no bandwidth: which part of its collectives is waiting cannot be told.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

STEP_US = 1000.0
BYTES = 1e6
MAIN, GLOO_A, GLOO_B = 100, 201, 202


def _x(name: str, cat: str, ts: float, dur: float, tid: int = MAIN, pid: int = 1, **args: object) -> dict:
    e: dict = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _trace(rank: int, backend: str, compute_until: float, steps: int = 3) -> dict:
    arrive = {"A": 100.0, "B": 150.0} if rank == 0 else {"A": 400.0, "B": 410.0}
    ends = {"A": 500.0, "B": 520.0}
    compute_end = compute_until if rank == 0 else 400.0
    sized = {"Input Dims": [[int(BYTES / 4)]], "Input type": ["float"]}
    events: list[dict] = []
    corr = iter(range(1, 1_000_000))
    for s in range(steps):
        t0 = 10_000.0 + s * STEP_US
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", t0, STEP_US))
        for key in ("A", "B"):  # the training thread issues both at its arrival
            events.append(_x("c10d::allreduce_", "cpu_op", t0 + arrive[key], 3.0, **sized))
        if backend == "gloo":
            events.append(_x("aten::mm", "cpu_op", t0, compute_end))
            for key, tid in (("A", GLOO_A), ("B", GLOO_B)):
                events.append(
                    _x(
                        "gloo:all_reduce",
                        "user_annotation",
                        t0 + arrive[key],
                        ends[key] - arrive[key],
                        tid=tid,
                        **sized,
                    )
                )
        else:
            c = next(corr)
            events.append(_x("cudaLaunchKernel", "cuda_runtime", t0, 2.0, correlation=c))
            events.append(_x("sm90_gemm", "kernel", t0, compute_end, tid=7, pid=0, correlation=c, device=0, stream=7))
            for key, stream in (("A", 20), ("B", 21)):
                c = next(corr)
                host = t0 + arrive[key]
                events.append(_x("nccl:all_reduce", "cpu_op", host, 2.5, **sized))
                events.append(_x("cudaLaunchKernel", "cuda_runtime", host + 0.5, 1.0, correlation=c))
                events.append(
                    _x(
                        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                        "kernel",
                        t0 + arrive[key],
                        ends[key] - arrive[key],
                        tid=stream,
                        pid=0,
                        correlation=c,
                        device=0,
                        stream=stream,
                    )
                )
    out = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": backend, "rank": rank, "world_size": 2},
        "traceEvents": events,
    }
    if backend == "nccl":
        out["deviceProperties"] = [{"id": 0, "name": "H100", "totalGlobalMem": 80 * 2**30}]
    return out


def _run(folder: Path, backend: str, compute_until: float, ranks: tuple[int, ...] = (0, 1)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(_trace(rank, backend, compute_until)))
    return folder


CASES = {  # compute_until of rank 0 -> (exposed comm, exposed transfer) of rank 0, in µs per step
    300.0: (220.0, 120.0),  # wait partly hidden under compute
    450.0: (70.0, 70.0),  # wait all hidden: what is exposed is transfer
}


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("compute_until", sorted(CASES))
def test_exposed_transfer_subtracts_only_the_exposed_wait(tmp_path: Path, backend: str, compute_until: float) -> None:
    metrics = analyze(load(_run(tmp_path, backend, compute_until), workers=1))
    r0, r1 = metrics.ranks
    exposed, transfer = CASES[compute_until]
    assert r0["exposed_comm_ms"] == pytest.approx(exposed / 1e3, abs=1e-6)
    assert r0["exposed_transfer_ms"] == pytest.approx(transfer / 1e3, abs=1e-6)
    assert r0["collective_wait_ms"] == pytest.approx(0.310, abs=1e-6)  # [100, 410): all of it, hidden or not
    assert r1["exposed_comm_ms"] == pytest.approx(0.120, abs=1e-6)
    assert r1["exposed_transfer_ms"] == pytest.approx(0.120, abs=1e-6)


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_bandwidth_is_bytes_over_the_transfer_time_the_same_on_every_rank(tmp_path: Path, backend: str) -> None:
    metrics = analyze(load(_run(tmp_path, backend, 300.0), workers=1))
    expected = 2 * BYTES / 120e-6 / 1e9  # 16.67 GB/s: concurrent transfers [400, 500) and [410, 520) once
    for r in metrics.ranks:
        assert r["algbw_gbps"] == pytest.approx(expected, rel=1e-6), r["rank"]
        assert r["busbw_gbps"] == pytest.approx(expected, rel=1e-6), r["rank"]
    table = metrics.collectives.to_pandas()
    assert table["algbw_gbps"].tolist() == pytest.approx([expected, expected], rel=1e-6)
    # each rank's own wall time in all-reduces, concurrent ones counted once: [100, 520) and [400, 520) per step
    n = metrics.ranks[0]["steps_analyzed"]
    assert n >= 2 and table["ms"].tolist() == pytest.approx([n * 0.420, n * 0.120], abs=1e-6)


def test_one_rank_alone_has_no_transfer_verdict(tmp_path: Path) -> None:
    metrics = analyze(load(_run(tmp_path, "gloo", 300.0, ranks=(0,)), workers=1))
    (r0,) = metrics.ranks
    assert r0["exposed_comm_ms"] == pytest.approx(0.220, abs=1e-6)
    assert r0["exposed_transfer_ms"] is None and r0["algbw_gbps"] is None and r0["busbw_gbps"] is None


def test_summaries_without_exposed_intervals_say_why_ddps_share_is_missing() -> None:
    """Summary files from before the exposed-transfer measurement (no ``exposed_comm``): the total and DDP's share
    of it are not measured, each with the reason (and the way to get them), so that a rule that needs DDP's share
    says so instead of "no collective communication was found"."""
    from ddpdoctor.diagnosis import evaluate, load_rules
    from ddpdoctor.load import load
    from ddpdoctor.metrics import analyze

    run = load(Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler", use_summaries=True)
    for rt in run.ranks:
        assert rt.summary is not None and "exposed_comm" in rt.summary
        del rt.summary["exposed_comm"]
    metrics = analyze(run)
    assert all(r["ddp_exposed_transfer_ms"] is None for r in metrics.ranks)
    for name in ("exposed_transfer_ms", "ddp_exposed_transfer_ms"):
        assert "predate the exposed-transfer measurement" in metrics.run["not_measured"][name]
    reasons = {n.name: n.reason for n in evaluate(load_rules(), metrics).not_evaluated}
    assert "predate the exposed-transfer measurement" in reasons["ddp-giant-gradient"], reasons
    assert "no collective communication was found" not in reasons["ddp-giant-gradient"]


def test_a_rank_without_collectives_in_its_steps_charges_its_exposed_time_to_ddp() -> None:
    """Exposed communication but no collective in the analysed steps (nobody was waited for, nothing issued by an
    optimizer or the loop): DDP's share is all of it, as the total is, never left out of the ranks' mean."""
    from ddpdoctor.metrics.cross_rank import all_collectives
    from ddpdoctor.metrics.transfer import transfer_metrics

    steps = {"step": [1, 2], "analyzed": [True, True], "step_ms": [1.0, 1.0], "start_us": [0.0, 1000.0]}
    steps["end_us"] = [1000.0, 2000.0]
    exposed = {"start_us": [100.0, 1100.0], "end_us": [300.0, 1300.0]}  # 200 µs a step
    summaries = [
        {"rank": r, "world_size": 2, "per_step": steps, "collectives": {}, "exposed_comm": exposed} for r in (0, 1)
    ]
    for values in transfer_metrics(summaries, all_collectives(summaries)).values():
        assert values["exposed_transfer_ms"] == values["ddp_exposed_transfer_ms"] == pytest.approx(0.2, abs=1e-9)
        assert values["loop_exposed_transfer_ms"] is None
