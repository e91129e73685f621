"""Advice that can apply and not-evaluated reasons that are true (issue 26 item 9, the rule side; the real traced
jobs are in tests/integration/test_loop_kinds.py): thread advice on more ranks than CPUs, DataLoader advice for a
loader that already has workers and on a CPU run, the parallelism named for FSDP and pipeline jobs, the set-up
rules on FSDP, a run without steps; and the capture's view of samplers inside batch samplers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, TensorDataset

from ddpdoctor.capture.setup import _sampling
from ddpdoctor.diagnosis import evaluate, load_rules, select_rules
from ddpdoctor.metrics.setup import setup_metrics

TRACE = {"step_ms_median": 100.0, "steps_analyzed": 5, "comm_ms": 20.0, "exposed_comm_ms": 8.0}


def _metrics(rows: list[dict], **run) -> SimpleNamespace:
    ranks = [{"rank": i, **TRACE, **row} for i, row in enumerate(rows)]
    run_level = {"mode": "ddp", "world_size": len(ranks), "backend": "gloo", "steps_analyzed": 5, **run}
    collectives = pd.DataFrame([], columns=["rank", "kind", "count", "bytes", "ms"])
    return SimpleNamespace(run=run_level, ranks=ranks, collectives=collectives)


def _diagnose(m: SimpleNamespace, *names: str):
    result = evaluate(select_rules(load_rules(), names), m)
    return result, {f.name: f for f in result.findings}, {n.name: n.reason for n in result.not_evaluated}


def test_more_ranks_than_cpus_gets_one_thread_per_rank_and_is_called_oversubscribed():
    rows = [{"intra_op_threads": 1, "local_world_size": 4, "cpu_count": 2} for _ in range(4)]
    _, found, _ = _diagnose(_metrics(rows), "cpu-thread-oversubscription")
    finding = found["cpu-thread-oversubscription"]
    assert "(0 here)" not in finding.recommendation and "0 rank" not in finding.recommendation
    assert "more ranks (4) than it has CPUs (2)" in finding.message
    assert "Run at most 2 rank(s) per node" in finding.recommendation and "1 intra-op thread" in finding.recommendation


def test_threads_advice_without_rank_oversubscription_keeps_its_number():
    rows = [{"intra_op_threads": 8, "local_world_size": 2, "cpu_count": 8} for _ in range(2)]
    _, found, _ = _diagnose(_metrics(rows), "cpu-thread-oversubscription")
    finding = found["cpu-thread-oversubscription"]
    assert "(4 here)" in finding.recommendation and "more ranks" not in finding.message
    assert "per node" not in finding.recommendation


def test_one_cpu_per_rank_is_advised_one_thread_not_zero():
    rows = [{"intra_op_threads": 2, "local_world_size": 3, "cpu_count": 2} for _ in range(2)]  # 3 ranks, 2 CPUs
    finding = _diagnose(_metrics(rows), "cpu-thread-oversubscription")[1]["cpu-thread-oversubscription"]
    assert "0 here" not in finding.recommendation and "0 rank" not in finding.recommendation
    rows = [{"intra_op_threads": 4, "local_world_size": 2, "cpu_count": 3} for _ in range(2)]  # 2 ranks, 3 CPUs
    finding = _diagnose(_metrics(rows), "cpu-thread-oversubscription")[1]["cpu-thread-oversubscription"]
    assert "and at least 1 (1 here)" in finding.recommendation


def test_dataloader_bound_with_workers_on_a_cpu_run():
    rows = [{"dataloader_ms": 40.0, "dataloader_workers": 2, "gpu_util_ratio": None} for _ in range(2)]
    _, found, _ = _diagnose(_metrics(rows), "dataloader-bound")
    finding = found["dataloader-bound"]
    assert "GPU" not in finding.message  # a CPU run has no GPU to idle
    assert "already loads with 2 worker process(es)" in finding.message
    assert "Load batches in background worker processes" not in finding.recommendation
    assert "persistent_workers=True" in finding.recommendation


def test_dataloader_workers_on_a_node_without_spare_cpus_are_not_told_to_add_workers():
    """2 ranks with 2 workers each on 2 CPUs (6 processes): more workers cannot help; on 16 CPUs they can."""
    rows = [
        {"dataloader_ms": 40.0, "dataloader_workers": 2, "local_world_size": 2, "cpu_count": 2, "gpu_util_ratio": None}
        for _ in range(2)
    ]
    finding = _diagnose(_metrics(rows), "dataloader-bound")[1]["dataloader-bound"]
    assert "2 CPU(s) for 2 rank(s) with 2 worker(s) each: 6 processes" in finding.message, finding.message
    assert finding.recommendation.startswith("Do not add workers"), finding.recommendation
    assert "raise num_workers" not in finding.recommendation and "num_workers=0" in finding.recommendation
    for row in rows:
        row["cpu_count"] = 16
    finding = _diagnose(_metrics(rows), "dataloader-bound")[1]["dataloader-bound"]
    assert "processes, more than the CPUs" not in finding.message
    assert "raise num_workers only while the rank has idle CPU cores" in finding.recommendation


def test_dataloader_workers_started_every_epoch_are_told_to_persist():
    """Workers without persistent_workers, in a run of several short epochs: each epoch starts them again (a job
    of 3-batch epochs here waited 30 ms a step, its epochs' first steps 200 ms); the advice is persistent_workers.
    One epoch, persistent workers, or unknown: the clause stays out."""
    base = {"dataloader_ms": 40.0, "dataloader_workers": 2, "gpu_util_ratio": None, "batches_per_epoch": 3}
    rows = [{**base, "dataloader_persistent_workers": False, "dataloader_epochs": 6} for _ in range(2)]
    finding = _diagnose(_metrics(rows), "dataloader-bound")[1]["dataloader-bound"]
    assert "started 2 new worker process(es) for each of its 6 epochs of 3 batch(es)" in finding.message
    assert finding.recommendation.startswith(
        "Keep the workers between epochs: DataLoader(..., persistent_workers=True)"
    )
    assert "--set loader.persistent_workers=true" in finding.recommendation
    for change in (
        {"dataloader_persistent_workers": True},
        {"dataloader_epochs": 1},
        {"dataloader_persistent_workers": None},
    ):
        rows = [{**base, "dataloader_persistent_workers": False, "dataloader_epochs": 6, **change} for _ in range(2)]
        finding = _diagnose(_metrics(rows), "dataloader-bound")[1]["dataloader-bound"]
        assert "not persistent" not in finding.message and "Keep the workers" not in finding.recommendation, change


def test_dataloader_bound_without_workers_on_a_gpu_run():
    rows = [{"dataloader_ms": 40.0, "dataloader_workers": 0, "gpu_util_ratio": 0.4} for _ in range(2)]
    _, found, _ = _diagnose(_metrics(rows), "dataloader-bound")
    finding = found["dataloader-bound"]
    assert "Its GPU has nothing to do meanwhile." in finding.message and "already loads" not in finding.message
    assert finding.recommendation.startswith("Load batches in background worker processes")


@pytest.mark.parametrize(
    ("parallelism", "words"), [("fsdp", "fully sharded data parallel"), ("pipeline", "pipeline parallel")]
)
def test_not_applicable_names_the_jobs_parallelism_not_its_mode(parallelism, words):
    _, _, reasons = _diagnose(_metrics([{}, {}], parallelism=parallelism), "use-ddp-instead-of-dp")
    reason = reasons["use-ddp-instead-of-dp"]
    assert words in reason and "this run is ddp" not in reason, reason


def test_sampler_and_uneven_batch_rules_apply_to_fsdp():
    rows = [
        {
            "batches_per_epoch": 5,
            "distributed_sampler": True,
            "sampler_shuffle": True,
            "dataloader_epochs": 2,
            "epochs_repeating_order": 1,
            "set_epoch_calls": 0,
            "join_used": False,
        },
        {
            "batches_per_epoch": 6,
            "distributed_sampler": True,
            "sampler_shuffle": True,
            "dataloader_epochs": 2,
            "epochs_repeating_order": 1,
            "set_epoch_calls": 0,
            "join_used": False,
        },
    ]
    m = _metrics(rows, parallelism="fsdp")
    _, found, reasons = _diagnose(m, "sampler-epoch-not-set", "uneven-batches-across-ranks")
    assert set(found) == {"sampler-epoch-not-set", "uneven-batches-across-ranks"}, reasons
    assert "the job hangs" in found["uneven-batches-across-ranks"].message  # no Join: it does hang


def test_uneven_batches_under_join_names_the_idle_rank():
    captures = {
        r: {
            "setup": {
                "join_contexts": 2,
                "data_loaders": [
                    {"loader": 1, "batches_yielded": n, "exhausted": True, "batch_size": 16, "dataset_len": 16 * n}
                ],
            }
        }
        for r, n in ((0, 5), (1, 6))
    }
    per_rank, run = setup_metrics(captures)
    m = _metrics([per_rank[0], per_rank[1]], **run)
    _, found, _ = _diagnose(m, "uneven-batches-across-ranks")
    message = found["uneven-batches-across-ranks"].message
    assert "the job hangs" not in message and "Join" in message
    assert "rank 0, for about 17% of each epoch (1 of 6 steps)" in message


def test_no_step_detected_leaves_timing_rules_unevaluated_and_says_why():
    captures = {
        r: {"steps": {"source": "none", "count": 0}, "setup": {"ddp_models": [{"module": "M"}]}} for r in (0, 1)
    }
    per_rank, run = setup_metrics(captures)
    assert run["steps_detected"] is False and "ddpdoctor.step()" in run["notes"][0]
    rows = [{**per_rank[r], "dataloader_ms": 40.0, "ddp_bucket_count": 1, "allreduce_count": 8} for r in (0, 1)]
    _, found, reasons = _diagnose(_metrics(rows, **run), "dataloader-bound", "allreduce-every-microstep")
    assert found == {}
    assert "no training step was detected" in reasons["dataloader-bound"]
    assert "DDP not used" not in reasons["allreduce-every-microstep"]
    assert "ddpdoctor.step()" in reasons["allreduce-every-microstep"]


def test_steps_detected_keeps_timing_rules():
    captures = {r: {"steps": {"source": "optimizer", "count": 9}} for r in (0, 1)}
    per_rank, run = setup_metrics(captures)
    assert run["steps_detected"] is True and "notes" not in run
    _, found, _ = _diagnose(_metrics([{"dataloader_ms": 40.0}] * 2, **run), "dataloader-bound")
    assert "dataloader-bound" in found


def test_the_capture_finds_the_sampler_inside_a_batch_sampler():
    data = TensorDataset(torch.zeros(64, 2))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True)
    loader = DataLoader(data, batch_sampler=BatchSampler(sampler, batch_size=16, drop_last=False))
    seen = _sampling(loader, iterable=False)
    assert seen["distributed_sampler"] is True and seen["batch_size"] == 16 and seen["shuffle"] is True
    assert seen["sampler"] == "DistributedSampler" and seen["sampler_num_replicas"] == 2
    # a plain shuffling loader: not sharded, shuffles; a sequential one: does not
    assert _sampling(DataLoader(data, batch_size=8, shuffle=True), iterable=False) == {
        **seen,
        "sampler": "RandomSampler",
        "distributed_sampler": False,
        "sampler_epoch": None,
        "sampler_num_replicas": None,
        "batch_size": 8,
    }
    assert _sampling(DataLoader(data, batch_size=8), iterable=False)["shuffle"] is False
    assert _sampling(DataLoader(data, sampler=RandomSampler(data), batch_size=4), iterable=False)["shuffle"] is True


def test_find_unused_parameters_that_the_model_needs_is_not_advised_away():
    """Parameters went unused (DDP's logging data): the flag is needed, so the advice never says to drop it; with
    none unused it is pure overhead and the advice starts with dropping it."""
    rows = [{"ddp_find_unused_parameters": 1, "ddp_unused_parameter_size_ratio": 0.005} for _ in range(2)]
    finding = _diagnose(_metrics(rows), "find-unused-parameters-cost")[1]["find-unused-parameters-cost"]
    assert "0.5% of the parameter bytes got no gradient, so the model needs the flag" in finding.message
    assert "drop find_unused_parameters" not in finding.recommendation, finding.recommendation
    assert finding.recommendation.startswith("Keep find_unused_parameters=True")
    for row in rows:
        row["ddp_unused_parameter_size_ratio"] = 0.0
    finding = _diagnose(_metrics(rows), "find-unused-parameters-cost")[1]["find-unused-parameters-cost"]
    assert "pure overhead" in finding.message and "needs the flag" not in finding.message
    assert finding.recommendation.startswith("If every parameter gets a gradient in every step, drop")


def test_a_wait_for_data_in_one_step_alone_is_not_a_wait_every_step():
    """A job with long epochs whose profiled window holds one epoch's first batch: 37 ms in one step of five (its
    workers starting), nothing in the others. The mean, 7.4 ms of a 36 ms step, passed both thresholds; without
    that step the wait is 0.1 ms: no finding, and the passed line says why. A wait in every step still fires, and
    a rank without the trimmed mean (an older summary) is decided on the mean as before."""
    from ddpdoctor.metrics.summary import _step_metrics
    from ddpdoctor.table import Table

    waits = [0.1, 37.0, 0.1, 0.1, 0.1]
    analysed = Table({"step_ms": np.array([36.0, 73.0, 36.0, 36.0, 36.0]), "dataloader_ms": np.array(waits)})
    step = _step_metrics(analysed)
    assert step["dataloader_ms"] == pytest.approx(7.48) and step["dataloader_ms_trimmed"] == pytest.approx(0.1)
    assert _step_metrics(analysed[np.array([0, 1])])["dataloader_ms_trimmed"] is None  # 2 steps: not measured
    row = {"step_ms_median": 36.0, "dataloader_workers": 2, "gpu_util_ratio": None}
    rows = [{**row, "dataloader_ms": step["dataloader_ms"], "dataloader_ms_trimmed": step["dataloader_ms_trimmed"]}] * 2
    result, found, _ = _diagnose(_metrics(rows), "dataloader-bound")
    assert "dataloader-bound" not in found
    (why,) = result.passed_reasons
    assert why.reason.startswith(
        "the wait for data, 7.5 ms per step on average, is 0.1 ms per step without the one analysed step that waited"
    ), why.reason
    for trimmed in (7.0, None):  # a wait in every step; the trimmed mean not measured
        rows = [{**row, "dataloader_ms": 7.48, "dataloader_ms_trimmed": trimmed}] * 2
        assert "dataloader-bound" in _diagnose(_metrics(rows), "dataloader-bound")[1], trimmed


def test_a_wait_one_step_holds_most_of_counts_the_other_steps_as_the_gain():
    # 12 ms a step on average, 3.6 ms without the longest step (a real job: an epoch's first batch, 46 ms, in a
    # 5-step window of 10-batch epochs): the finding stands on the other steps, and claims their wait, not the mean
    row = {"step_ms_median": 34.3, "dataloader_workers": 1, "gpu_util_ratio": None}
    rows = [{**row, "dataloader_ms": 12.0, "dataloader_ms_trimmed": 3.6}] * 2
    finding = _diagnose(_metrics(rows), "dataloader-bound")[1]["dataloader-bound"]
    assert finding.estimated_gain_ms == pytest.approx(3.6)
    assert "without that step the others wait 3.6 ms per step, the time counted as the gain" in finding.message
    rows = [{**row, "dataloader_ms": 12.0, "dataloader_ms_trimmed": 11.0}] * 2  # every step waits: no such clause
    finding = _diagnose(_metrics(rows), "dataloader-bound")[1]["dataloader-bound"]
    assert finding.estimated_gain_ms == pytest.approx(11.0) and "One analysed step" not in finding.message
