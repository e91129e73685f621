"""Which parallelism a job uses, from the evidence one rank's trace gives (ddpdoctor.metrics.parallelism)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddpdoctor.metrics.parallelism import detect_parallelism


def _rank(**evidence: float | bool | None) -> dict:
    row = {
        "collectives_per_step": 0.0,
        "tp_collectives_per_step": 0.0,
        "forward_allreduce_per_step": 0.0,
        "backward_allreduce_per_step": 0.0,
        "allgather_per_step": 0.0,
        "reduce_scatter_per_step": 0.0,
        "p2p_per_step": 0.0,
        "ddp_ranges": False,
        "fsdp_ranges": False,
        "ddp_bucket_count": None,
    }
    row.update(evidence)
    return row


@pytest.mark.parametrize(
    ("ranks", "mode", "world", "expected"),
    [
        # DDP: its ranges, or its configuration from the capture
        ([_rank(collectives_per_step=7, backward_allreduce_per_step=5, ddp_ranges=True)], "ddp", 2, "ddp"),
        ([_rank(collectives_per_step=3, ddp_bucket_count=3)], "ddp", 2, "ddp"),
        # gradient all-reduces in backward only, no DDP ranges (a hand-written or Horovod-style data parallel)
        ([_rank(collectives_per_step=404, backward_allreduce_per_step=404)], "ddp", 2, "ddp"),
        # Megatron-LM: all-reduces inside _ReduceFromModelParallelRegion (TP), no DDP
        ([_rank(collectives_per_step=85, tp_collectives_per_step=84)], "ddp", 8, "tp"),
        # TP without named ranges: several all-reduces per step during forward
        (
            [_rank(collectives_per_step=48, forward_allreduce_per_step=24, backward_allreduce_per_step=24)],
            "ddp",
            4,
            "tp",
        ),
        # FSDP / ZeRO-3: all_gather of parameter shards and reduce_scatter of gradient shards every step
        ([_rank(collectives_per_step=20, allgather_per_step=12, reduce_scatter_per_step=6)], "ddp", 4, "fsdp"),
        ([_rank(collectives_per_step=2, fsdp_ranges=True)], "ddp", 4, "fsdp"),
        # pipeline stages: send/recv
        ([_rank(collectives_per_step=16, p2p_per_step=16)], "ddp", 4, "pipeline"),
        # mixes: TP inside, DDP across
        ([_rank(collectives_per_step=90, tp_collectives_per_step=84, ddp_ranges=True)], "ddp", 16, "tp+ddp"),
        # several ranks and no collective at all
        ([_rank(), _rank()], "ddp", 2, "none"),
        # one process
        ([_rank()], "single", 1, "single"),
        ([_rank()], "dp", 1, "dp"),
        # collectives that fit no signature: said so, not guessed
        ([_rank(collectives_per_step=1)], "ddp", 2, "unknown"),
    ],
)
def test_signatures(ranks: list[dict], mode: str, world: int, expected: str) -> None:
    parallelism, why = detect_parallelism(ranks, mode, world)
    assert parallelism == expected and why


def test_a_loss_all_reduce_in_forward_does_not_make_ddp_tensor_parallel() -> None:
    # DDP plus dist.all_reduce(loss) for logging: one all-reduce in forward per step is not tensor parallelism
    rank = _rank(collectives_per_step=6, forward_allreduce_per_step=1, backward_allreduce_per_step=5, ddp_ranges=True)
    assert detect_parallelism([rank], "ddp", 2)[0] == "ddp"


def test_syncbatchnorm_all_gathers_do_not_make_ddp_fsdp() -> None:
    # SyncBatchNorm gathers statistics in forward (all_gather) but reduces nothing by scatter
    rank = _rank(collectives_per_step=26, allgather_per_step=20, backward_allreduce_per_step=6, ddp_ranges=True)
    assert detect_parallelism([rank], "ddp", 2)[0] == "ddp"


def test_kernels_without_calls_still_count_as_communication() -> None:
    # an old trace: NCCL kernels on the device, no nccl:* calls recorded on the host -- not "no collective"
    from ddpdoctor.metrics.parallelism import parallelism_evidence
    from ddpdoctor.table import Codes, Table

    ops = Table(
        {
            "name": Codes.from_values(["ProfilerStep#1", "ProfilerStep#2"]),
            "ts_us": [0.0, 100.0],
            "end_us": [100.0, 200.0],
            "tid": [1, 1],
        }
    )
    steps = Table({"host_start_us": [0.0, 100.0], "host_end_us": [100.0, 200.0], "analyzed": [True, True]})
    rt = SimpleNamespace(tables=SimpleNamespace(ops=ops))
    calls = Table.empty(["name", "tid", "ts_us", "end_us", "kind"])
    assert parallelism_evidence(rt, steps, calls, timed=6)["collectives_per_step"] == 3.0
    assert parallelism_evidence(rt, steps, calls, timed=0)["collectives_per_step"] == 0.0
