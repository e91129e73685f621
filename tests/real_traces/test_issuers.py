"""Where each collective of the recorded GPU DDP traces was issued (``metrics.issuers.issuers``): DDP's gradient
all-reduces inside the backward pass (its reducer's hooks, on autograd's device thread), its buffer broadcasts in
its forward, and none taken for the training loop's own collectives, which ``poor-comm-compute-overlap`` leaves out
of DDP's exposed time."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ddpdoctor.load import load
from ddpdoctor.metrics import analyze
from ddpdoctor.metrics.summary import summarize_rank

# the DDP jobs of ../shared/traces with DDP's forward range and NCCL kernels (ns_resolution_trace has no kernel to
# time a collective by; df_index_resolver and megatron no forward range of DDP's: below)
DDP_SETS = ("hta/nccl_parser_config", "tracelens/mi300_resnet_act_checkpoint")


@pytest.mark.parametrize("name", DDP_SETS)
def test_ddp_gradient_all_reduces_are_issued_in_backward_and_none_by_the_loop(traces_dir: Path, name: str) -> None:
    run = load(traces_dir / name, workers=1)
    for rt in run.ranks:
        c = summarize_rank(rt, None)["collectives"]
        issued = Counter(zip(c["kind"], c["issued_in"], strict=True))
        assert issued[("all_reduce", "backward")] > 0, issued
        assert {w for k, w in issued if k == "all_reduce"} == {"backward"}, issued
        assert {w for k, w in issued if k == "broadcast"} <= {"ddp_forward"}, issued
        assert not any(w == "loop" for _, w in issued), issued
    for r in analyze(run).ranks:  # nothing of the loop's to leave out of DDP's exposed time
        assert r["loop_exposed_transfer_ms"] in (None, 0.0), r


@pytest.mark.parametrize("name", ["astra-sim/megatron_tp8_a100_8ranks", "hta/df_index_resolver"])
def test_without_a_ddp_forward_range_no_collective_is_placed(traces_dir: Path, name: str) -> None:
    """Without a forward range of DDP's (tensor parallelism; a trace recorded without it), the loop's collectives
    cannot be told from the job's: none is placed, and none is left out of the exposed time."""
    run = load(traces_dir / name, workers=1)
    c = summarize_rank(run.ranks[0], None)["collectives"]
    assert len(c["issued_in"]) > 0
    assert set(c["issued_in"]) == {None}
    assert all(r["loop_exposed_transfer_ms"] is None for r in analyze(run).ranks)
