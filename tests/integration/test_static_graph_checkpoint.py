"""DDP with ``static_graph=True`` and activation checkpointing (issue 26's "static graph + checkpointing" job), and
its twin without ``static_graph``: two real traced 2-rank gloo jobs, run at once.

Both pass ``find_unused_parameters=True`` and recompute their blocks in backward (``torch.utils.checkpoint``).
- static graph: the set of used parameters is declared fixed, so DDP skips the per-step graph traversal and rebuilds
  its buckets: ``find-unused-parameters-cost`` must not fire, the overlap rule's find_unused clause must not be said,
  and the recomputation is backward's, not a second forward.
- the twin (no ``static_graph``): the same job pays for the traversal, and the rule fires.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import run_cli, write_script

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

pytestmark = [pytest.mark.integration]

JOB = """
    import sys
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.checkpoint import checkpoint

    STATIC = sys.argv[1] == "static"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(192, 192), nn.GELU(), nn.Linear(192, 192)) for _ in range(4)
            )
            self.head = nn.Linear(192, 8)

        def forward(self, x):
            for block in self.blocks:
                x = x + checkpoint(block, x, use_reentrant=False)
            return self.head(x)


    model = DDP(Net(), find_unused_parameters=True, static_graph=STATIC)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(9):
        loss = model(torch.randn(64, 192)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("static")
    script = write_script(base / "train.py", JOB)

    def trace(kind: str) -> Path:
        out = base / kind
        window = ["--wait", "2", "--warmup", "1", "--active", "4"]
        done = run_cli(
            "trace", "-q", "--out", str(out), *window, "--standalone", "--nproc-per-node", "2", str(script), kind,
            timeout=200,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return out

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(("static", "dynamic"), pool.map(trace, ("static", "dynamic")), strict=True))


def _diagnose(path: Path):  # noqa: ANN202
    metrics = analyze(load(path, workers=1))
    result = evaluate(load_rules(), metrics)
    return metrics, {f.name: f for f in result.findings}, set(result.passed), result


@pytest.mark.timeout(300)
def test_static_graph_with_checkpointing_is_not_charged_for_find_unused_parameters(runs: dict[str, Path]) -> None:
    metrics, findings, passed, _ = _diagnose(runs["static"])
    assert metrics.run["parallelism"] == "ddp", metrics.run.get("parallelism_evidence")
    assert all(r["ddp_static_graph"] == 1 for r in metrics.ranks), [r["ddp_static_graph"] for r in metrics.ranks]
    assert all(r["ddp_find_unused_parameters"] == 1 for r in metrics.ranks)
    assert "find-unused-parameters-cost" not in findings and "find-unused-parameters-cost" in passed
    for finding in findings.values():
        assert "find_unused_parameters=True without static_graph" not in finding.message, finding.message
        assert finding.severity != "error", (finding.name, finding.message)
    # the checkpointed blocks run again in backward: the phases are measured, backward holds the recomputation.
    # Compared in each rank's fastest analysed step of each phase: the two jobs run at once on 2 cores, and a rank
    # kept off its CPU (CI, 2026-12-05: rank 1 got 60% of the CPU time it wanted) had its forward at 9-15 ms in 3 of
    # 4 steps against 2.6 ms in the fourth, the median over backward's 6.2 ms
    table = metrics.per_step
    assert {int(r) for r in table["rank"]} == {0, 1}
    for rank in (0, 1):
        mine = [i for i, r in enumerate(table["rank"]) if int(r) == rank and table["analyzed"][i]]
        forward = min(float(table["forward_ms"][i]) for i in mine)
        backward = min(float(table["backward_ms"][i]) for i in mine)
        assert 0 < forward < backward, (
            rank,
            [table["forward_ms"][i] for i in mine],
            [table["backward_ms"][i] for i in mine],
        )


@pytest.mark.timeout(300)
def test_the_same_job_without_static_graph_pays_for_the_traversal(runs: dict[str, Path]) -> None:
    metrics, findings, _passed, _ = _diagnose(runs["dynamic"])
    assert not any(r["ddp_static_graph"] for r in metrics.ranks)  # DDP logs static_graph only when it is set
    finding = findings["find-unused-parameters-cost"]
    assert "static_graph=True" in finding.recommendation, finding.recommendation
