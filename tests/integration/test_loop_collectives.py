"""The training loop's own collectives (a loss all_reduce and an all_gather_object for logging, every step) are not
DDP's gradient all-reduce: three real traced 2-rank gloo jobs, two at a time beside a CPU burner.

- DDP + logging collectives: DDP's all-reduces are placed in the backward pass, the logging ones in the loop; the
  loop's exposed transfer is measured (``loop_exposed_transfer_ms``) and ``poor-comm-compute-overlap`` counts only
  the rest as DDP's (its message says how much it left out and why no DDP setting hides it).
- The same job without them: nothing is the loop's.
- Gradients all-reduced by hand after backward, without DDP: nothing can be told apart (no DDP forward range), so
  nothing is left out; that exposed all-reduce is exactly what the rule is about.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_overlap_finding_leaves_out, trace_jobs_beside_a_burner

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

pytestmark = [pytest.mark.integration]

COMMON = """
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    LOGGING = {logging}
    net = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)])
    model = DDP(net) if {ddp} else net
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(9):
        loss = model(torch.randn(32, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if not {ddp}:  # gradients averaged by hand, after the whole backward pass
            for p in net.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        opt.step()
        if LOGGING:  # the mean loss and a record of every rank, as a logger would gather them
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            records = [None] * dist.get_world_size()
            dist.all_gather_object(records, {{"step": step, "loss": float(mean)}})
    dist.barrier()
    dist.destroy_process_group()
"""
JOBS = {
    "logging": COMMON.format(logging=True, ddp=True),
    "plain": COMMON.format(logging=False, ddp=True),
    "by_hand": COMMON.format(logging=False, ddp=False),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return trace_jobs_beside_a_burner(tmp_path_factory.mktemp("loop"), JOBS)


def _diagnose(path: Path):  # noqa: ANN202
    metrics = analyze(load(path))  # from the ranks' summary files, as diagnose reads them
    result = evaluate(load_rules(), metrics)
    return metrics, {f.name: f for f in result.findings}


def _issued(path: Path, rank: int) -> set[tuple[str, str | None]]:
    data = json.loads((path / "ranks" / f"rank{rank}.summary.json").read_text())
    c = data["collectives"]
    return set(zip(c["kind"], c["issued_in"], strict=True))


@pytest.mark.timeout(360)
def test_logging_collectives_are_the_loops_and_left_out_of_ddps_exposed_time(runs: dict[str, Path]) -> None:
    for rank in (0, 1):
        issued = _issued(runs["logging"], rank)
        assert ("all_reduce", "backward") in issued and ("all_reduce", "loop") in issued, issued
        assert {w for k, w in issued if k == "all_gather"} == {"loop"}, issued
    metrics, findings = _diagnose(runs["logging"])
    for r in metrics.ranks:
        assert 0 < r["loop_exposed_transfer_ms"] <= r["exposed_transfer_ms"] <= r["exposed_comm_ms"] + 1e-9, r
        assert r["optimizer_exposed_transfer_ms"] == 0.0, r
    assert_overlap_finding_leaves_out(
        metrics, findings, "loop_exposed_transfer_ms", "collectives the training loop issues itself"
    )


@pytest.mark.timeout(360)
def test_without_logging_collectives_nothing_is_the_loops(runs: dict[str, Path]) -> None:
    for rank in (0, 1):
        assert _issued(runs["plain"], rank) == {("all_reduce", "backward")}
    metrics, findings = _diagnose(runs["plain"])
    assert all(r["loop_exposed_transfer_ms"] == 0.0 for r in metrics.ranks), metrics.ranks
    finding = findings.get("poor-comm-compute-overlap")
    assert finding is None or "the training loop issues itself" not in finding.message


@pytest.mark.timeout(360)
def test_gradients_all_reduced_by_hand_are_not_taken_for_the_loops(runs: dict[str, Path]) -> None:
    for rank in (0, 1):
        assert {w for _, w in _issued(runs["by_hand"], rank)} == {None}
    metrics, findings = _diagnose(runs["by_hand"])
    assert all(r["loop_exposed_transfer_ms"] is None for r in metrics.ranks), metrics.ranks
    if "poor-comm-compute-overlap" in findings:  # the whole exposed transfer is the rule's
        finding = findings["poor-comm-compute-overlap"]
        exposed = [r["exposed_transfer_ms"] for r in metrics.ranks]
        assert finding.estimated_gain_ms == pytest.approx(sum(exposed) / len(exposed), abs=5e-4)
