"""The set-up rules (missing-distributed-sampler ... batchnorm-not-synced) over set-up metrics.

The set-up metrics come from the recorded captures of real runs (tests/fixtures/setup_captures.json, see
test_setup_metrics.py) or, for CUDA, from hand-made captures labelled as such. The trace-derived numbers a
message quotes (step time, communication time, all-reduces per step) are set by hand here; the real runs in
tests/integration/test_setup_checks.py measure them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from ddpdoctor.diagnosis import evaluate, load_rules, select_rules
from ddpdoctor.metrics.setup import setup_metrics

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "setup_captures.json"
RECORDED = json.loads(FIXTURE.read_text())
SETUP_RULES = {
    "DDP013": "missing-distributed-sampler",
    "DDP014": "sampler-epoch-not-set",
    "DDP015": "uneven-batches-across-ranks",
    "DDP016": "allreduce-every-microstep",
    "DDP017": "ranks-share-cuda0",
    "DDP018": "dp-gathers-large-outputs",
    "DDP019": "batchnorm-not-synced",
}
# the trace-derived numbers of a rank (hand-set): a 100 ms step with 20 ms of collectives, 8 of them exposed
TRACE = {"step_ms_median": 100.0, "comm_ms": 20.0, "exposed_comm_ms": 8.0, "ddp_bucket_count": 2}


def metrics(captures: dict, *, mode: str = "ddp", allreduces_per_step: float | None = None, **trace) -> SimpleNamespace:
    """A RunMetrics-like object: set-up metrics from ``captures`` plus the hand-set trace numbers."""
    per_rank, run = setup_metrics({int(r): c for r, c in captures.items()})
    ranks = [{"rank": r, **TRACE, **trace, **m} for r, m in sorted(per_rank.items())]
    collectives = pd.DataFrame(
        [
            {
                "rank": r["rank"],
                "kind": "all_reduce",
                "count": allreduces_per_step * 5,
                "bytes": 1e6,
                "ms": 100.0,
            }
            for r in ranks
        ]
        if allreduces_per_step is not None
        else [],
        columns=["rank", "kind", "count", "bytes", "ms"],
    )
    for r in ranks:
        r["steps_analyzed"] = 5
    run_level = {"mode": mode, "world_size": len(ranks), "backend": "gloo", "steps_analyzed": 5, **run}
    return SimpleNamespace(run=run_level, ranks=ranks, collectives=collectives)


def diagnose(m: SimpleNamespace, *names: str):
    result = evaluate(select_rules(load_rules(), names or tuple(SETUP_RULES.values())), m)
    return result, {f.name: f for f in result.findings}


def test_the_rule_names_and_ids_are_the_interface():
    rules = {r.id: r.name for r in load_rules()}
    assert {k: rules.get(k) for k in SETUP_RULES} == SETUP_RULES
    assert rules["DDP011"] == "cpu-thread-oversubscription"


def test_the_healthy_run_passes_every_set_up_check():
    result, found = diagnose(metrics(RECORDED["ddp_train"]))
    assert found == {}
    assert set(result.passed) == set(SETUP_RULES.values()) - {"ranks-share-cuda0", "dp-gathers-large-outputs"}
    reasons = {n.name: n.reason for n in result.not_evaluated}
    assert "no rank used CUDA" in reasons["ranks-share-cuda0"]
    assert reasons["dp-gathers-large-outputs"].startswith("applies to DataParallel")


@pytest.mark.parametrize(
    ("recording", "rule"),
    [
        ("no_distributed_sampler", "missing-distributed-sampler"),
        ("set_epoch_missing", "sampler-epoch-not-set"),
        ("uneven_batches", "uneven-batches-across-ranks"),
        ("batchnorm_small_batch", "batchnorm-not-synced"),
    ],
)
def test_each_recorded_mistake_fires_its_rule_and_no_other_set_up_rule(recording, rule):
    _, found = diagnose(metrics(RECORDED[recording], allreduces_per_step=2.0))
    assert set(found) == {rule}


def test_missing_sampler_says_the_factor_and_what_an_epoch_would_take():
    _, found = diagnose(metrics(RECORDED["no_distributed_sampler"]), "missing-distributed-sampler")
    finding = found["missing-distributed-sampler"]
    assert finding.evidence["data_duplication_factor"] == 2.0
    assert "read by 2 of the 2 ranks" in finding.message and "50% of the compute" in finding.message
    assert "No rank's training DataLoader uses a DistributedSampler" in finding.message
    assert "about 3 batches per rank instead of 6" in finding.message
    assert finding.estimated_gain_ms == pytest.approx(50.0)  # half of every 100 ms step repeats another rank
    assert "DistributedSampler(dataset, shuffle=True)" in finding.recommendation


def test_set_epoch_rule_says_it_is_never_called():
    _, found = diagnose(metrics(RECORDED["set_epoch_missing"]), "sampler-epoch-not-set")
    finding = found["sampler-epoch-not-set"]
    assert "2 of 3 epochs" in finding.message and "never called" in finding.message
    assert finding.ranks == (0, 1)


def test_uneven_batches_names_the_ranks_with_more_batches():
    _, found = diagnose(metrics(RECORDED["uneven_batches"]), "uneven-batches-across-ranks")
    finding = found["uneven-batches-across-ranks"]
    assert finding.ranks == (0,)
    assert "from 6 to 7" in finding.message and "join()" in finding.message


def test_allreduce_every_microstep_costs_the_extra_rounds():
    m = metrics(RECORDED["grad_accum_no_sync"], allreduces_per_step=8.0)  # 4 rounds x 2 buckets
    _, found = diagnose(m)
    assert set(found) == {"allreduce-every-microstep"}
    finding = found["allreduce-every-microstep"]
    # 20 ms of collectives per step for 4 rounds: 3 of them (15 ms) wasted, 6 ms of the 8 exposed
    assert "4 times per optimizer step" in finding.message and "15.0 ms of communication" in finding.message
    assert "6.0 ms of it not hidden" in finding.message and "8 all-reduce calls per step" in finding.message
    assert finding.estimated_gain_ms == pytest.approx(6.0)
    assert "no_sync()" in finding.recommendation


def test_allreduce_rule_trusts_the_trace_when_it_shows_one_round_per_step():
    # e.g. two forwards (two views) before one backward: two synced forwards, but one all-reduce round
    result, found = diagnose(metrics(RECORDED["grad_accum_no_sync"], allreduces_per_step=2.0))
    assert "allreduce-every-microstep" not in found and "allreduce-every-microstep" in result.passed


def test_allreduce_rule_without_recorded_collectives_relies_on_the_capture():
    _, found = diagnose(metrics(RECORDED["grad_accum_no_sync"]), "allreduce-every-microstep")
    assert "The trace agrees" not in found["allreduce-every-microstep"].message


def test_dataparallel_gathering_large_outputs():
    m = metrics(RECORDED["dp_gather_outputs"], mode="dp", dp_gather_ms=30.0, dp_replicas=2)
    _, found = diagnose(m)
    assert set(found) == {"dp-gathers-large-outputs"}
    finding = found["dp-gathers-large-outputs"]
    assert "32 MiB of outputs per step from 2 replicas" in finding.message and "30.0 ms" in finding.message
    assert finding.estimated_gain_ms == 30.0
    rule = load_rules()
    bigger = [r.with_params({"min_gathered_mb": 64.0}, "test") for r in rule if r.name == "dp-gathers-large-outputs"]
    assert evaluate(bigger, m).passed == ("dp-gathers-large-outputs",)


# ------------------------------------------------------------------- CUDA (hand-made captures, no GPU here)
def cuda_capture(current: str, model: str, set_device: list[str] | None = None, visible: str | None = None) -> dict:
    """A CUDA rank's capture (hand-made): current device at the end, DDP model's device, set_device calls."""
    return {
        "hostname": "host0",
        "device": current,
        "setup": {
            "data_loaders": [],
            "set_device_calls": set_device or [],
            "cuda_visible_devices": visible,
            "ddp_models": [{"device": model, "batchnorm_layers": 0}],
            "ddp_sync_rounds_per_step": {"1": 10},
        },
    }


def test_ranks_that_never_set_their_device_and_share_gpu0():
    m = metrics({r: cuda_capture("cuda:0", "cuda:0") for r in range(2)})
    _, found = diagnose(m, "ranks-share-cuda0")
    finding = found["ranks-share-cuda0"]
    assert finding.severity == "error" and finding.ranks == (0, 1)
    assert "torch.cuda.set_device() is never called" in finding.message
    assert "2 ranks compute on the same GPU" in finding.message
    assert "set_device(local_rank)" in finding.recommendation


def test_a_rank_on_its_own_gpu_without_set_device_lands_on_gpu0():
    m = metrics({0: cuda_capture("cuda:0", "cuda:0"), 1: cuda_capture("cuda:0", "cuda:1")}, foreign_cuda0_bytes=0)
    m.ranks[1]["foreign_cuda0_bytes"] = 600 * 2**20
    _, found = diagnose(m, "ranks-share-cuda0")
    finding = found["ranks-share-cuda0"]
    assert finding.ranks == (1,)  # rank 0's device is cuda:0 anyway
    assert "lands on GPU 0" in finding.message and "600 MiB of tensors on cuda:0" in finding.message


def test_ranks_that_set_their_device_or_are_isolated_pass():
    own = metrics({r: cuda_capture(f"cuda:{r}", f"cuda:{r}", set_device=[str(r)]) for r in range(2)})
    isolated = metrics({r: cuda_capture("cuda:0", "cuda:0", visible=str(r)) for r in range(2)})
    for m in (own, isolated):
        result, found = diagnose(m, "ranks-share-cuda0")
        assert found == {} and result.passed == ("ranks-share-cuda0",)


def test_every_set_up_rule_fix_is_a_code_snippet():
    for rule in load_rules():
        if rule.name in SETUP_RULES.values():
            assert "```python" in rule.docs.fix, rule.name


def _uneven(steps: tuple[int, int] | None, join: bool, job_failed: bool | None):
    captures = copy.deepcopy(RECORDED["uneven_batches"])  # rank 0: 7 batches an epoch, rank 1: 6
    for rank, cap in captures.items():
        if steps is not None:
            cap["steps"] = {"source": "optimizer", "count": steps[int(rank)], "first": 1}
        cap["setup"]["join_contexts"] = int(join)
    m = metrics(captures)
    if job_failed is not None:
        m.run["job_failed"] = job_failed
    return diagnose(m, "uneven-batches-across-ranks")


def test_uneven_epochs_of_a_loop_that_stops_at_a_step_count_pass():
    """Per-rank shards of different lengths under a loop bounded by a step count (a traced 2-rank job, 2026-12-07:
    40 and 50 batches an epoch, 16 steps on each rank, the run ended well): no rank was left alone in an
    all-reduce, so "the job hangs" would be false. Join, a failed run or different step counts still fire."""
    result, found = _uneven((16, 16), join=False, job_failed=False)
    assert found == {} and result.passed == ("uneven-batches-across-ranks",)
    assert "max(steps_run) > min(steps_run) = false" in result.passed_reasons[0].reason
    for steps, join, failed in (((7, 6), True, False), ((6, 6), False, True), ((7, 6), False, False)):
        _, found = _uneven(steps, join=join, job_failed=failed)
        assert set(found) == {"uneven-batches-across-ranks"}, (steps, join, failed)
    # without the step counts (a capture before 2026-12-07) or how the job ended: as before
    assert set(_uneven(None, join=False, job_failed=False)[1]) == {"uneven-batches-across-ranks"}
    assert set(_uneven((16, 16), join=False, job_failed=None)[1]) == {"uneven-batches-across-ranks"}


def test_ranks_pinned_each_to_its_own_cpus_are_not_oversubscribed():
    """2 ranks on a 2-CPU host, each pinned to one CPU with one thread (a traced job, 2026-12-07: "2 compute
    threads for 1 CPUs... more ranks than CPUs"): the CPUs of the host's ranks together are the union of their
    affinities. Ranks that share their CPUs, or a rank without its CPU list, count as before."""
    from ddpdoctor.metrics.analysis import _node_cpus

    def caps(*affinities):
        return {r: {"hostname": "h", "threads": {"affinity": a}} for r, a in enumerate(affinities)}

    assert _node_cpus(caps([[0, 0]], [[1, 1]])) == {"h": 2}
    assert _node_cpus(caps([[0, 3]], [[0, 3]], [[2, 5]])) == {"h": 6}
    assert _node_cpus(caps([[0, 0]], None)) == {}  # one rank's CPUs unknown: the host's union is too
    assert _node_cpus(caps([[0, 1 << 20]])) == {}  # no CPU set a host has
    pinned = {"intra_op_threads": 1, "local_world_size": 2, "cpu_count": 2}
    rule = [r for r in load_rules() if r.name == "cpu-thread-oversubscription"]
    ranks = [{"rank": r, **pinned} for r in range(2)]
    result = evaluate(rule, SimpleNamespace(run={"mode": "ddp", "world_size": 2}, ranks=ranks))
    assert result.passed == ("cpu-thread-oversubscription",)
    ranks = [{"rank": r, **pinned, "cpu_count": 1} for r in range(2)]  # both on the one CPU: oversubscribed
    result = evaluate(rule, SimpleNamespace(run={"mode": "ddp", "world_size": 2}, ranks=ranks))
    assert [f.name for f in result.findings] == ["cpu-thread-oversubscription"]


def test_ranks_that_meet_outside_the_profiled_steps_synchronise():
    """A job without DDP that averages its models every 20 steps (local SGD): no collective in the profiled steps,
    but the Flight Recorder held its all-reduces where the run ended (run_collectives). Barriers are not counted
    (capture/flight.py), so ranks that train apart and meet only at a barrier still fire, and so does a run whose
    count is unknown."""
    rule = [r for r in load_rules() if r.name == "ranks-never-synchronize"]

    def verdict(run_collectives):
        ranks = [{"rank": r, "collectives_per_step": 0.0, "run_collectives": run_collectives} for r in range(2)]
        run = {"mode": "ddp", "world_size": 2, "steps_analyzed": 5, "ranks_loaded": 2}
        return evaluate(rule, SimpleNamespace(run=run, ranks=ranks))

    assert verdict(8).passed == ("ranks-never-synchronize",)
    assert [f.name for f in verdict(0).findings] == ["ranks-never-synchronize"]
    assert [f.name for f in verdict(None).findings] == ["ranks-never-synchronize"]


def test_a_ddp_model_that_issued_nothing_after_its_first_step_never_synchronised():
    """A DDP model and no collective in the profiled steps: a window inside no_sync() accumulation, unless the Flight
    Recorder shows that no collective ran after the first step in the whole run (training_collectives; DDP's start-up
    broadcasts are before it). Only where the job trains (an optimizer steps) for 2 steps or more, and not with torch's
    noop_hook (a rule of its own)."""
    rule = [r for r in load_rules() if r.name == "ranks-never-synchronize"]

    def verdict(**row):
        base = {
            "collectives_per_step": 0.0,
            "ddp_bucket_count": 1,
            "run_collectives": 3,
            "training_collectives": 0,
            "steps_run": 20,
            "ddp_noop_hook": False,
        }
        run = {"mode": "ddp", "world_size": 2, "steps_analyzed": 5, "ranks_loaded": 2, "optimizer_steps_per_step": 1}
        run |= {k: row.pop(k) for k in [k for k in row if k in run]}  # a run metric
        ranks = [{"rank": r, **{**base, **row}} for r in range(2)]
        return evaluate(rule, SimpleNamespace(run=run, ranks=ranks))

    # a loss all-reduced every step (4 bytes each) and nothing else, DDP's own all-reduce, 9 KiB of gradients
    logged = {"collectives_per_step": 1.0, "training_collectives": 19, "training_collective_bytes": 76}
    logged |= {"ddp_round_bytes": 9216.0, "ddp_comm_hook": None}
    (finding,) = verdict(**logged).findings
    assert "sent 76 bytes in 19 collective(s), under 25% of one round of the model's 9 KiB" in finding.message
    assert "Not one collective runs in those steps." not in finding.message
    for row in (
        {"training_collective_bytes": 9216},  # a round's worth: a gradient all-reduce, or the replicas averaged
        {"training_collective_bytes": None},  # a size not stated, or the buffer full: unknown
        {"ddp_round_bytes": None},  # the model's gradient bytes unknown
        {"ddp_comm_hook": "powerSGD_hook"},  # a hook that compresses: few bytes may be a real sync
    ):
        assert verdict(**{**logged, **row}).passed == ("ranks-never-synchronize",), row

    (finding,) = verdict().findings
    assert "They do build a DDP model, but not one collective ran after their first step" in finding.message
    assert "(20 steps;" in finding.message
    for row in (
        {"training_collectives": 2},  # the ranks met after their first step (averaging, a loss logged)
        {"training_collectives": None},  # unknown: the recorder off, another clock
        {"steps_run": 1},  # no step after the first
        {"optimizer_steps_per_step": None},  # no optimizer steps: nothing trains (a DDP model used for inference)
        {"ddp_noop_hook": True},  # ddp-noop-comm-hook says it
        {"ddp_forwards_per_step": 0},  # ddp-forward-bypassed says it
        {"collectives_per_step": 1.0},  # a collective in the profiled steps
    ):
        assert verdict(**row).passed == ("ranks-never-synchronize",), row

    # no DDP: ranks that met only before their first step (the initial weights broadcast), never after
    no_ddp = {"ddp_bucket_count": None, "run_collectives": 4, "ddp_noop_hook": None}
    (finding,) = verdict(**no_ddp).findings
    assert "They met only before their first step (4 collective(s), such as a broadcast" in finding.message
    assert "They do build a DDP model" not in finding.message
    assert verdict(**{**no_ddp, "training_collectives": 2}).passed == ("ranks-never-synchronize",)
