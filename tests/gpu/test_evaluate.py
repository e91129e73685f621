"""The GPU checks' comparisons and thresholds, on recorded inputs shaped as ddpdoctor writes them (the
``diagnose --format json`` document, ``ranks/rank<R>.summary.json``) and as the workloads write theirs. The
numbers are what an H200 run looks like in size (141 GiB, ms-scale steps), made up by hand; each test also
shows the comparison failing when ddpdoctor's side is wrong."""

from __future__ import annotations

import copy

import gpu_evaluate as ev
import pytest

GIB = 2**30
TOTAL = 150_754_820_096  # an H200's total_memory (143,771 MiB)


def doc(*, mode="single", backend=None, world_size=1, findings=(), passed=(), not_evaluated=(), devices=None):
    """A diagnose --format json document (schema_version 1) with the fields the checks read."""
    return {
        "schema_version": 1,
        "run": {
            "path": "run",
            "mode": mode,
            "world_size": world_size,
            "backend": backend,
            "steps_analyzed": 4,
            "skipped": [],
            "notes": [],
        },
        "ranks": [
            {"rank": r, "step_ms": {"median": 10.0, "p90": 11.0}, "devices": devs}
            for r, devs in (devices or {0: []}).items()
        ],
        "findings": list(findings),
        "not_evaluated": [{"name": n, "reason": why} for n, why in not_evaluated],
        "passed": list(passed),
    }


def cuda0(allocated, reserved, capacity=TOTAL):
    return {
        "device": "cuda:0",
        "peak_allocated_bytes": allocated,
        "peak_reserved_bytes": reserved,
        "capacity_bytes": capacity,
    }


def summary(steps, *, analyzed=None, metrics=None, collectives=None, **columns):
    """A per-rank summary: ``per_step`` columns over ``steps`` (the last one not analysed, as with GPU work)."""
    analyzed = analyzed if analyzed is not None else [s != steps[-1] for s in steps]
    per_step = {"step": list(steps), "analyzed": analyzed, **{k: list(v) for k, v in columns.items()}}
    return {
        "schema_version": 1,
        "rank": 0,
        "metrics": metrics or {},
        "per_step": per_step,
        "collectives": collectives or {"step": [], "kind": [], "bytes": []},
        "devices": [],
    }


def statuses(items):
    return {i["what"]: i["status"] for i in items}


def failed(items):
    return [i["what"] for i in items if i["status"] == ev.FAIL]


# ---------------------------------------------------------------------------------------------- helpers
def test_ratio_item_bounds_and_missing_values():
    assert ev.ratio_item("x", 9.5, 10.0, (0.9, 1.05))["status"] == ev.PASS
    assert ev.ratio_item("x", 8.0, 10.0, (0.9, 1.05))["status"] == ev.FAIL
    assert ev.ratio_item("x", None, 10.0, (0.9, 1.05))["status"] == ev.FAIL
    assert ev.ratio_item("x", 1.0, 0, (0.0, 2.0))["status"] == ev.FAIL  # no ratio against zero
    assert ev.ratio_item("x", float("nan"), 1.0, (0.0, 2.0))["status"] == ev.FAIL


def test_close_item_relative_tolerance():
    assert ev.close_item("m", 100 * GIB, 100 * GIB + 2**20, 0.01)["status"] == ev.PASS
    assert ev.close_item("m", 98 * GIB, 100 * GIB, 0.01)["status"] == ev.FAIL


def test_status_of_needs_items_and_no_failure():
    assert ev.status_of([]) == ev.FAIL
    assert ev.status_of([ev.item("a", True), ev.item("b", None)]) == ev.PASS
    assert ev.status_of([ev.item("a", True), ev.item("b", False)]) == ev.FAIL


def test_rule_state_reads_findings_passed_and_not_evaluated():
    d = doc(
        findings=[{"name": "gpu0-oom-risk", "ranks": [0], "evidence": {}}],
        passed=["host-sync-stalls"],
        not_evaluated=[("rank-straggler", "applies to ddp runs")],
    )
    assert ev.rule_state(d, "gpu0-oom-risk") == "fired"
    assert ev.rule_state(d, "host-sync-stalls") == "passed"
    assert ev.rule_state(d, "rank-straggler") == "not evaluated: applies to ddp runs"
    assert ev.rule_state(d, "nope") == "absent"


def test_evidence_values_reads_run_and_per_rank_evidence():
    found = {
        "evidence": {
            "gpu0_headroom_ratio": 0.069,
            "max(foreign_cuda0_bytes)": 0,
            "gpu_shared_ranks": {"0": 2, "1": 2},  # a rank-scope rule: one value per rank
            "params.min_headroom": 0.1,
        }
    }
    assert ev.evidence_values(found, "gpu0_headroom_ratio") == [0.069]
    assert ev.evidence_values(found, "foreign_cuda0_bytes") == [0]
    assert ev.evidence_values(found, "gpu_shared_ranks") == [2, 2]
    assert ev.evidence_values(found, "headroom_ratio") == []
    assert ev.evidence_values(None, "x") == []


def test_count_trace_events_counts_device_work_and_dp_ranges():
    events = [
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn"},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        },
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)"},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy DtoH"},  # torch 1.9
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)"},
        {"ph": "X", "cat": "user_annotation", "name": "DataParallel.scatter"},
        {"ph": "X", "cat": "user_annotation", "name": "DataParallel.scatter"},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "DataParallel.scatter"},  # its device-side twin
        {"ph": "f", "cat": "ac2g", "name": "DataParallel.scatter"},  # a flow event, not a range
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel"},
    ]
    counts = ev.count_trace_events(events)
    assert (counts["kernel"], counts["nccl_kernel"], counts["gpu_memcpy"], counts["gpu_memset"]) == (2, 1, 2, 1)
    assert counts["ranges"] == {"DataParallel.scatter": 2}


def test_collective_bytes_per_step_counts_analysed_steps_only():
    s = summary(
        [8, 9, 10, 11, 12],
        collectives={
            "step": [7, 8, 8, 9, 10, 11, 12],
            "kind": ["all_reduce", "all_reduce", "all_reduce", "all_reduce", "all_reduce", "broadcast", "all_reduce"],
            "bytes": [1, 100, 50, 150, 150, 999, 777],
        },
    )
    # analysed: 8-11 (12 is the window's last step); step 7 is outside; broadcast is another kind
    assert ev.collective_bytes_per_step(s) == pytest.approx((100 + 50 + 150 + 150) / 4)
    assert ev.collective_bytes_per_step(summary([8], analyzed=[False])) is None


def test_outside_window_leaves_out_start_up_warmup_window_and_export_step():
    wall = [float(i) for i in range(20)]
    # defaults 5/2/5: iterations 8-12 recorded, 6-7 warm-up, 13 exports the trace; 0-1 start-up
    assert ev.outside_window(wall, 5, 2, 5) == [2.0, 3.0, 4.0, 5.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0]


# ------------------------------------------------------------------------------- check 1: one process
def single_inputs():
    # steps 8-12 profiled; the workload's --vary makes steps 8.2 / 11.0 / 13.8 ms of GPU work (step % 3)
    gpu = {s: 8.2 + 2.8 * (s % 3) for s in range(16)}
    events = [gpu[s] + 0.05 for s in range(16)]  # events also span the launch gap after each loss.item()
    steps = [8, 9, 10, 11, 12]
    s = summary(
        steps,
        gpu_busy_ms=[gpu[x] - 0.02 for x in steps],
        kernel_ms=[gpu[x] - 0.35 for x in steps],
        memcpy_ms=[0.33] * 5,
        metrics={"gpu_util_ratio": 0.97, "host_sync_ms": 0.4},
    )
    d = doc(devices={0: [cuda0(1_203_765_248, 1_441_792_000)]}, passed=["host-sync-stalls"])
    measure = {
        "event_ms": events,
        "max_memory_allocated": 1_203_765_248,
        "max_memory_reserved": 1_441_792_000,
        "total_memory": [TOTAL],
        "initialized_devices": [0],
        "device_count": 1,
        "nvml_context_devices": None,
    }
    counts = {"kernel": 1460, "gpu_memcpy": 10, "gpu_memset": 0, "nccl_kernel": 0, "ranges": {}}
    return d, s, measure, counts


def test_single_passes_on_a_consistent_run():
    items = ev.evaluate_single(*single_inputs())
    assert failed(items) == []
    assert statuses(items)["no CUDA context on another device"] == ev.NA  # one GPU
    assert ev.status_of(items) == ev.PASS


def test_single_catches_steps_matched_to_the_wrong_profiler_step():
    d, s, measure, counts = single_inputs()
    s["per_step"]["step"] = [x + 1 for x in s["per_step"]["step"]]  # ddpdoctor's step numbers off by one
    assert "each step's GPU busy time vs its own CUDA events" in failed(ev.evaluate_single(d, s, measure, counts))


def test_single_catches_kernel_time_far_from_the_events():
    d, s, measure, counts = single_inputs()
    s["per_step"]["gpu_busy_ms"] = [x * 0.7 for x in s["per_step"]["gpu_busy_ms"]]
    s["per_step"]["kernel_ms"] = [x * 0.7 for x in s["per_step"]["kernel_ms"]]
    bad = failed(ev.evaluate_single(d, s, measure, counts))
    assert "GPU busy time per step vs CUDA events" in bad and "kernel time per step vs CUDA events" in bad


def test_single_catches_memory_peaks_and_devices():
    d, s, measure, counts = single_inputs()
    d["ranks"][0]["devices"] = [
        cuda0(1_203_765_248, 1_300_000_000),
        {"device": "cuda:1", "peak_allocated_bytes": 0, "peak_reserved_bytes": 2**21, "capacity_bytes": TOTAL},
    ]
    bad = failed(ev.evaluate_single(d, s, measure, counts))
    assert "peak reserved on cuda:0" in bad and "devices with memory recorded" in bad
    assert "peak allocated on cuda:0" not in bad


def test_single_needs_device_work_in_the_trace():
    d, s, measure, counts = single_inputs()
    bad = failed(ev.evaluate_single(d, s, measure, {**counts, "kernel": 0, "gpu_memcpy": 0}))
    assert bad == ["kernels in the trace", "memcpy in the trace"]


def test_single_uses_nvml_on_several_gpus():
    d, s, measure, counts = single_inputs()
    many = {**measure, "device_count": 2, "nvml_context_devices": [0, 1]}
    assert "no CUDA context on another device" in failed(ev.evaluate_single(d, s, many, counts))
    ok = {**measure, "device_count": 2, "nvml_context_devices": [0]}
    assert statuses(ev.evaluate_single(d, s, ok, counts))["no CUDA context on another device"] == ev.PASS


# ------------------------------------------------------------------------------------------ check 2: DDP
GRAD_BYTES = 4 * (6 * (2048 * 2048 + 2048) + 2048 * 10 + 10)


def nccl_inputs(nccl_kernels=0):
    steps = [8, 9, 10, 11, 12]
    # two buckets per step (25 MB cap), 5 steps recorded
    coll_steps = [s for s in steps for _ in range(2)]
    first = 26_222_632
    s = summary(
        steps,
        metrics={"comm_ms": 0.41 if nccl_kernels else 0.0, "overlap_ratio": 0.62 if nccl_kernels else None},
        collectives={"step": coll_steps, "kind": ["all_reduce"] * 10, "bytes": [first, GRAD_BYTES - first] * 5},
    )
    d = doc(mode="ddp", backend="nccl", world_size=1, passed=["ranks-share-cuda0", "rank-straggler"])
    measure = {
        "backend": "nccl",
        "world_size": 1,
        "gradient_bytes_per_step": GRAD_BYTES,
        "current_device": 0,
        "model_device_index": 0,
    }
    return d, s, measure, {"kernel": 900, "gpu_memcpy": 10, "nccl_kernel": nccl_kernels, "ranges": {}}


def test_nccl_one_rank_without_nccl_kernels_passes_with_a_note():
    items = ev.evaluate_ddp_nccl(*nccl_inputs())
    assert failed(items) == [] and statuses(items)["NCCL kernels"] == ev.NA


def test_nccl_with_kernels_needs_comm_time_and_overlap():
    d, s, measure, counts = nccl_inputs(nccl_kernels=10)
    assert failed(ev.evaluate_ddp_nccl(d, s, measure, counts)) == []
    s["metrics"] = {"comm_ms": 0.0, "overlap_ratio": None}
    assert len(failed(ev.evaluate_ddp_nccl(d, s, measure, counts))) == 2


def test_nccl_catches_wrong_bytes_and_a_false_ranks_share_cuda0():
    d, s, measure, counts = nccl_inputs()
    s["collectives"]["bytes"] = [b // 2 for b in s["collectives"]["bytes"]]  # e.g. bf16 assumed for fp32
    d["passed"] = []
    d["findings"] = [{"name": "ranks-share-cuda0", "ranks": [0], "evidence": {}}]
    assert failed(ev.evaluate_ddp_nccl(d, s, measure, counts)) == [
        "all-reduce bytes per step",
        "ranks-share-cuda0 stays silent",
    ]


def shared_measures(uuids=("GPU-5b1c", "GPU-5b1c")):
    return [
        {"rank": r, "model_device_uuid": u, "model_device_index": 0, "current_device": 0} for r, u in enumerate(uuids)
    ]


def shared_finding(ranks=(0, 1), shared=2):
    return {
        "name": "ranks-share-cuda0",
        "ranks": list(ranks),
        "evidence": {
            "set_device_calls": {str(r): 0 for r in ranks},
            "gpu_shared_ranks": {str(r): shared for r in ranks},
        },
    }


def test_shared_gpu_fires_for_both_ranks():
    d = doc(mode="ddp", backend="gloo", world_size=2, findings=[shared_finding()])
    items = ev.evaluate_ddp_shared(d, shared_measures())
    assert failed(items) == [] and "ranks sharing the GPU, in the finding" in statuses(items)


def test_shared_gpu_catches_a_wrong_count_in_the_finding():
    d = doc(mode="ddp", backend="gloo", world_size=2, findings=[shared_finding(shared=1)])
    assert failed(ev.evaluate_ddp_shared(d, shared_measures())) == ["ranks sharing the GPU, in the finding"]


def test_shared_gpu_fails_when_the_rule_misses_a_rank_or_stays_silent():
    one = doc(
        mode="ddp",
        backend="gloo",
        world_size=2,
        findings=[shared_finding(ranks=(1,))],
    )
    assert failed(ev.evaluate_ddp_shared(one, shared_measures())) == ["ranks-share-cuda0 fires for both ranks"]
    silent = doc(mode="ddp", backend="gloo", world_size=2, passed=["ranks-share-cuda0"])
    item = next(i for i in ev.evaluate_ddp_shared(silent, shared_measures()) if "fires" in i["what"])
    assert item["status"] == ev.FAIL and item["ddpdoctor"] == "passed"


def test_shared_gpu_precondition_two_gpus():
    d = doc(
        mode="ddp",
        backend="gloo",
        world_size=2,
        findings=[{"name": "ranks-share-cuda0", "ranks": [0, 1], "evidence": {}}],
    )
    bad = failed(ev.evaluate_ddp_shared(d, shared_measures(("GPU-a", "GPU-b"))))
    assert bad == ["both ranks compute on the same GPU (the workload's own view)"]


# ------------------------------------------------------------------------------- check 3: gpu0-oom-risk
def oom_run(fraction, state):
    reserved = int(fraction * TOTAL) + 88 * 2**20  # the ballast plus the training's own blocks
    headroom = 1 - reserved / TOTAL
    findings = (
        [
            {
                "name": "gpu0-oom-risk",
                "ranks": [0],
                "evidence": {"gpu0_headroom_ratio": headroom, "params.min_headroom": 0.1},
            }
        ]
        if state == "fired"
        else []
    )
    d = doc(
        devices={0: [cuda0(reserved - 40 * 2**20, reserved)]},
        findings=findings,
        passed=["gpu0-oom-risk"] if state == "passed" else [],
    )
    measure = {"args": {"reserve": fraction}, "max_memory_reserved": reserved, "total_memory": [TOTAL]}
    return d, measure


def test_oom_fires_at_93_percent_and_not_at_40():
    items = ev.evaluate_oom([oom_run(0.93, "fired"), oom_run(0.40, "passed")], 0.10)
    assert failed(items) == [] and ev.status_of(items) == ev.PASS


def test_oom_catches_a_missed_and_a_false_finding():
    bad = failed(ev.evaluate_oom([oom_run(0.93, "passed"), oom_run(0.40, "fired")], 0.10))
    assert bad == ["reserve 0.93: gpu0-oom-risk", "reserve 0.4: gpu0-oom-risk"]


def test_oom_catches_a_wrong_headroom_in_the_finding():
    hi = oom_run(0.93, "fired")
    hi[0]["findings"][0]["evidence"]["gpu0_headroom_ratio"] = 0.12
    assert failed(ev.evaluate_oom([hi, oom_run(0.40, "passed")], 0.10)) == ["reserve 0.93: headroom in the finding"]


def test_oom_precondition_the_runs_straddle_the_threshold():
    bad = failed(ev.evaluate_oom([oom_run(0.40, "passed"), oom_run(0.50, "passed")], 0.10))
    assert bad == ["the runs straddle the threshold"]


# --------------------------------------------------------------------------- check 4: host-sync-stalls
def sync_run(*, fired, host_sync, item_ms, calls, util):
    steps = [8, 9, 10, 11, 12]
    s = summary(steps, host_sync_ms=[host_sync] * 5, metrics={"host_sync_ms": host_sync, "gpu_util_ratio": util})
    d = doc(
        findings=[{"name": "host-sync-stalls", "ranks": [0], "evidence": {"host_sync_ms": host_sync}}] if fired else [],
        passed=[] if fired else ["host-sync-stalls"],
    )
    return d, s, {"item_ms": [item_ms] * 16, "item_calls_per_step": calls}


def test_host_sync_fires_with_item_and_not_without():
    items = ev.evaluate_host_sync(
        sync_run(fired=True, host_sync=3.1, item_ms=4.4, calls=64, util=0.71),
        sync_run(fired=False, host_sync=0.0, item_ms=0.0, calls=0, util=0.83),
        1.0,
    )
    assert failed(items) == []


def test_host_sync_catches_missing_blocked_time_and_a_false_finding():
    items = ev.evaluate_host_sync(
        sync_run(fired=False, host_sync=0.2, item_ms=4.4, calls=64, util=0.95),
        sync_run(fired=True, host_sync=1.8, item_ms=0.0, calls=0, util=0.5),
        1.0,
    )
    assert failed(items) == [
        "with .item(): host sync time vs the workload's time inside .item()",
        "with .item(): host-sync-stalls fires",
        "without: host sync time per step",
        "without: host-sync-stalls stays silent",
    ]


def test_thresholds_come_from_the_rule_files():
    import gpu_checks

    headroom = gpu_checks.rule_param("gpu0-oom-risk", "min_headroom")
    assert 0 < headroom < 1
    # the workloads' 93 % and 40 % must straddle the rule's threshold, whatever it is set to
    assert 1 - 0.93 < headroom < (1 - 0.40) / 2
    assert gpu_checks.rule_param("host-sync-stalls", "min_ms") > 0


# ------------------------------------------------------------------------------ check 5: DataParallel
def dp_inputs(ranges=None, replicas=None, rule="not_evaluated", device_ids=(0,)):
    steps = [8, 9, 10, 11, 12]
    s = summary(
        steps,
        metrics={
            "dp_scatter_ms": 0.21,
            "dp_replicas": replicas,  # counted from replica ranges: None on one GPU
            "dp_replicate_ms": None,
            "dp_parallel_apply_ms": None,
            "dp_gather_ms": None,
        },
    )
    d = doc(
        mode="dp",
        passed=["use-ddp-instead-of-dp"] if rule == "passed" else [],
        not_evaluated=[("use-ddp-instead-of-dp", "not measured in this run: dp_replicas")]
        if rule == "not_evaluated"
        else [],
        findings=[{"name": "use-ddp-instead-of-dp", "ranks": [0], "evidence": {}}] if rule == "fired" else [],
    )
    capture = {"dp": [{"module": "Sequential", "device_ids": list(device_ids), "output_device": 0}]}
    counts = {"kernel": 700, "ranges": ranges if ranges is not None else {"DataParallel.scatter": 6}}
    return d, s, capture, {"device_ids": [0], "output_device": 0}, counts


def test_dp_one_gpu_shows_scatter_and_says_what_it_cannot_show():
    for rule in ("not_evaluated", "passed"):
        items = ev.evaluate_dp(*dp_inputs(rule=rule))
        assert failed(items) == []
        assert [i["what"] for i in items if i["status"] == ev.NA] == ["replicas", *ev.DP_STAGES_ONE_GPU_SKIPS]


def test_dp_catches_missing_scatter_wrong_devices_and_a_false_finding():
    bad = failed(ev.evaluate_dp(*dp_inputs(ranges={}, rule="fired", device_ids=(0, 1))))
    assert bad == [
        "DataParallel's devices in the capture",
        "DataParallel.scatter ranges in the trace",
        "use-ddp-instead-of-dp does not fire for one device",
    ]


def test_dp_replicas_are_compared_where_replica_ranges_exist():
    ranges = {"DataParallel.scatter": 6, "DataParallel.replica[0]": 6}
    assert failed(ev.evaluate_dp(*dp_inputs(ranges=ranges, replicas=1))) == []
    assert failed(ev.evaluate_dp(*dp_inputs(ranges=ranges, replicas=None))) == ["replicas"]
    # no replica ranges but a replica count: where would it come from?
    assert failed(ev.evaluate_dp(*dp_inputs(replicas=2))) == ["replicas"]


def test_dp_stage_in_the_trace_must_be_measured():
    d, s, capture, measure, counts = dp_inputs(ranges={"DataParallel.scatter": 6, "DataParallel.gather": 6})
    assert failed(ev.evaluate_dp(d, s, capture, measure, counts)) == ["DataParallel.gather time"]


# ------------------------------------------------------------------------------ check 6: capture overhead
def steps_ms(outside, window=40.0, n=100):
    """100 step times: start-up and the profiled window slow, the rest ``outside`` ms."""
    return [300.0, 25.0] + [window if 6 <= i <= 13 else outside for i in range(2, n)]


def test_overhead_within_two_percent_passes():
    items = ev.evaluate_overhead(
        [steps_ms(5.00), steps_ms(5.02), steps_ms(4.98)], [steps_ms(5.05), steps_ms(5.04), steps_ms(5.07)], (5, 2, 5)
    )
    assert items[0]["status"] == ev.PASS and items[0]["ratio"] == pytest.approx(1.01)


def test_overhead_above_two_percent_fails_and_the_window_does_not_count():
    slow = ev.evaluate_overhead([steps_ms(5.0)] * 3, [steps_ms(5.2)] * 3, (5, 2, 5))
    assert slow[0]["status"] == ev.FAIL
    # a slow profiled window alone is not overhead outside it
    window_only = ev.evaluate_overhead([steps_ms(5.0, window=5.0)] * 3, [steps_ms(5.0, window=90.0)] * 3, (5, 2, 5))
    assert window_only[0]["status"] == ev.PASS


def test_items_are_json_ready():
    import json

    d, s, measure, counts = single_inputs()
    items = ev.evaluate_single(d, s, copy.deepcopy(measure), counts)
    json.dumps(items, allow_nan=False)
