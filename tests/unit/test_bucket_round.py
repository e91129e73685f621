"""ddp-bucket-size-mismatch weighs one round of DDP's gradient all-reduces (``ddp_round_bytes``), not every
all-reduce of a step: two DDP models in one loop (a GAN's generator and discriminator), or gradient accumulation
that all-reduces each micro-batch, send several rounds a step, and no bucket size splits a round smaller than the
model's gradients."""

from __future__ import annotations

from test_engine import fake_metrics

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.metrics.derived import derived_rank_metrics

RULE = "ddp-bucket-size-mismatch"


def _found(metrics) -> dict:
    return {f.name: f for f in evaluate(load_rules(), metrics).findings}


def test_the_round_is_the_models_gradients_where_ddp_gave_them() -> None:
    metrics = fake_metrics("ddp_4ranks")  # one 20 MiB all-reduce a step in one 25 MB bucket: fires
    assert RULE in _found(metrics)
    assert {v["ddp_round_bytes"] for v in derived_rank_metrics(metrics).values()} == {20 * 2**20}
    # the same all-reduces from models of 1.04 MiB of gradients (a real two-model job: 1.01 MiB messages, 2 a
    # step, one 2 MB bucket each): a round under twice min_split_mb, latency-bound whatever the cap
    for row in metrics.ranks:
        row.update(ddp_largest_grad_bytes=0.26 * 2**20, ddp_largest_grad_share=0.25)
    assert {round(v["ddp_round_bytes"]) for v in derived_rank_metrics(metrics).values()} == {round(1.04 * 2**20)}
    assert RULE not in _found(metrics)
    why = {p.name: p.reason for p in evaluate(load_rules(), metrics).passed_reasons}[RULE]
    assert "max(ddp_round_bytes) >= 2 * params.min_split_mb * 2 ** 20 = false" in why, why


def test_without_the_models_gradients_a_step_of_several_rounds_is_divided_among_them() -> None:
    metrics = fake_metrics("ddp_4ranks")
    for row in metrics.ranks:
        row.update(ddp_sync_rounds_per_step=20)  # 20 forwards outside no_sync() per optimizer step
    assert {v["ddp_round_bytes"] for v in derived_rank_metrics(metrics).values()} == {2**20}
    assert RULE not in _found(metrics)
    for row in metrics.ranks:
        row.update(ddp_sync_rounds_per_step=1)
    assert RULE in _found(metrics)


def test_collectives_without_sizes_are_no_small_messages() -> None:
    """A trace that states no collective sizes (a CPU trace recorded without record_shapes, NCCL calls without
    their arguments) has no message size: not messages of 0 bytes, which called dozens of buckets "small"."""
    metrics = fake_metrics("ddp_4ranks")
    for row in metrics.ranks:
        row.update(ddp_bucket_count=100, ddp_bucket_cap_mb=0.5)
    metrics.collectives["bytes"] = metrics.collectives["bytes"] / 1000  # 20 KiB messages: too small, it fires
    assert RULE in _found(metrics)
    metrics.collectives["bytes"] = None
    derived = derived_rank_metrics(metrics)
    assert {v["allreduce_message_bytes"] for v in derived.values()} == {None}
    assert {v["ddp_round_bytes"] for v in derived.values()} == {None}
    assert {v["allreduce_count"] for v in derived.values()} == {1.0}  # what the trace does state stays
    assert RULE not in _found(metrics)
