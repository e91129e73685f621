"""``compare(a, b)``: ratios B/A, which run is better, findings in one only, what is not comparable; every
output format renders it. (Real runs compared: tests/integration/test_compare_cli.py.)"""

from __future__ import annotations

import dataclasses
import io
import json

from ddpdoctor.compare import compare
from ddpdoctor.compare.snapshot import Snapshot
from ddpdoctor.report import RENDERERS, Document, OutputFormat, renderer

DP_ENV = {
    "mode": "dp",
    "world_size": 1,
    "backend": None,
    "devices": ["NVIDIA A100"],
    "torch_version": "2.13.0",
    "batch_size_per_rank": None,
}
DDP_ENV = {
    "mode": "ddp",
    "world_size": 4,
    "backend": "nccl",
    "devices": ["NVIDIA A100"],
    "torch_version": "2.13.0",
    "batch_size_per_rank": 64,
}
GIB = 2**30


def _dp() -> Snapshot:
    return Snapshot(
        source="runs/<b>dp</b>",
        environment=DP_ENV,
        metrics={
            "step_ms.median": 200.0,
            "step_ms.p90": 230.0,
            "forward_ms": 90.0,
            "backward_ms": 100.0,
            "dp_gather_ms": 12.0,
            "gpu0_peak_reserved_bytes": 30 * GIB,
            "others_max_peak_reserved_bytes": 12 * GIB,
            "gpu0_vs_others_ratio": 2.5,
        },
        samples={"step_ms": [200.0, 201, 199, 230, 198]},
        devices=[
            {
                "rank": 0,
                "device": f"cuda:{i}",
                "name": "NVIDIA A100",
                "peak_allocated_bytes": 10 * GIB,
                "peak_reserved_bytes": (30 if i == 0 else 12) * GIB,
                "capacity_bytes": 80 * GIB,
            }
            for i in range(4)
        ],
        findings=[
            {
                "id": "DP001",
                "name": "use-ddp-instead-of-dp",
                "severity": "warning",
                "ranks": [0],
                "message": "use DDP",
            }
        ],
    )


def _ddp() -> Snapshot:
    return Snapshot(
        source="runs/ddp",
        environment=DDP_ENV,
        metrics={
            "step_ms.median": 80.0,
            "step_ms.p90": 90.0,
            "forward_ms": 30.0,
            "backward_ms": 40.0,
            "comm_ms": 20.0,
            "exposed_comm_ms": 4.0,
            "overlap_ratio": 0.8,
            "gpu0_peak_reserved_bytes": 11 * GIB,
            "others_max_peak_reserved_bytes": 11 * GIB,
            "gpu0_vs_others_ratio": 1.0,
        },
        samples={"step_ms": [80.0, 81, 79, 90, 78]},
        devices=[
            {
                "rank": i,
                "device": f"cuda:{i}",
                "name": "NVIDIA A100",
                "peak_allocated_bytes": 9 * GIB,
                "peak_reserved_bytes": 11 * GIB,
                "capacity_bytes": 80 * GIB,
            }
            for i in range(4)
        ],
        findings=[],
    )


def test_ratios_and_better():
    c = compare(_dp(), _ddp())
    step = c.row("step_ms.median")
    assert step.ratio == 0.4 and step.better == "B"
    assert c.row("gpu0_peak_reserved_bytes").ratio == 11 / 30
    assert c.row("overlap_ratio").a is None and c.row("overlap_ratio").ratio is None
    assert c.row("busbw_gbps") is None  # measured in neither: not shown


def test_headline_makes_speed_and_memory_balance_obvious():
    c = compare(_dp(), _ddp())
    assert any("B is 2.50x faster per step" in line for line in c.headline)
    assert any(line.startswith("Memory balance A: GPU 0 holds 2.50x") and "unbalanced" in line for line in c.headline)
    assert any(line.startswith("Memory balance B") and "(balanced)" in line for line in c.headline)


def test_says_what_is_not_comparable():
    text = "\n".join(compare(_dp(), _ddp()).not_comparable)
    assert "Different set-ups: A is DataParallel (one process), world size 1" in text
    assert "Global batch per step: A unknown, B 256" in text
    assert "communication: comm_ms, exposed_comm_ms, overlap_ratio measured only in B" in text
    assert "DataParallel: dp_gather_ms measured only in A" in text
    assert "DataParallel on CPU" not in text  # these are GPU runs


def test_a_plain_dp_trace_is_called_single_process_only_where_its_stages_show_no_replication():
    """A plain trace states no devices: a DataParallel trace whose forward gathered (dp_gather_ms > 0) did run
    over several devices; one whose stages are all 0 (or unmeasured) did not, whatever its devices."""
    plain = {**DP_ENV, "devices": None}
    staged = dataclasses.replace(_dp(), environment=plain)
    text = "\n".join(compare(staged, _ddp()).not_comparable)
    assert "DataParallel on CPU" not in text and "shows none of its stages" not in text
    flat = dataclasses.replace(_dp(), environment=plain, metrics={**_dp().metrics, "dp_gather_ms": 0.0})
    text = "\n".join(compare(flat, _ddp()).not_comparable)
    assert "A is DataParallel whose trace shows none of its stages" in text
    on_cpu = dataclasses.replace(_dp(), environment={**DP_ENV, "devices": ["cpu"]})
    assert "A is DataParallel on CPU" in "\n".join(compare(on_cpu, _ddp()).not_comparable)


def test_findings_in_one_only():
    c = compare(_dp(), _ddp())
    assert [f["name"] for f in c.only_a] == ["use-ddp-instead-of-dp"] and c.only_b == () and c.both == ()


def test_every_format_renders_and_escapes():
    assert set(RENDERERS[Document.COMPARISON]) == set(OutputFormat)
    c = compare(_dp(), _ddp())
    outputs = {}
    for fmt in OutputFormat:
        out = io.StringIO()
        renderer(Document.COMPARISON, fmt)(c, out)
        outputs[fmt] = out.getvalue()
    assert "<b>dp</b>" not in outputs[OutputFormat.HTML] and "&lt;b&gt;dp&lt;/b&gt;" in outputs[OutputFormat.HTML]
    assert outputs[OutputFormat.HTML].count("<svg") >= 3  # step bars, step-by-step lines, memory per device
    assert "B is 2.50x faster per step" in outputs[OutputFormat.TEXT]
    assert "| step time | step time, median | 200.00 ms | 80.00 ms | 0.40x | B |" in outputs[OutputFormat.MARKDOWN]
    doc = json.loads(outputs[OutputFormat.JSON])
    step = next(m for m in doc["metrics"] if m["name"] == "step_ms.median")
    assert step == {
        "name": "step_ms.median",
        "label": "step time, median",
        "section": "step time",
        "unit": "ms",
        "a": 200.0,
        "b": 80.0,
        "ratio": 0.4,
        "better": "B",
    }
    assert doc["findings"]["only_a"][0]["name"] == "use-ddp-instead-of-dp"


def test_steps_of_different_work_make_no_faster_claim():
    """A plain trace whose profiler was stepped every second iteration has steps of two iterations: its step time
    against a run of one iteration a step is no speed."""
    one = dataclasses.replace(_ddp(), environment={**DDP_ENV, "optimizer_steps_per_step": 1.0})
    two = dataclasses.replace(
        _ddp(),
        environment={**DDP_ENV, "optimizer_steps_per_step": 2.0},
        metrics={**_ddp().metrics, "step_ms.median": 160.0},
        samples={"step_ms": [160.0, 162, 158, 180, 156]},
    )
    c = compare(one, two)
    (speed,) = [line for line in c.headline if line.startswith("Speed:")]
    assert "faster per step" not in speed
    assert "no faster claim: the steps are not the same work: A's hold about 1 optimizer step(s) each, B's about 2" in (
        speed
    )
    assert any(line.startswith("Steps: the steps are not the same work") for line in c.not_comparable)


def test_steps_of_the_same_or_unknown_work_keep_the_claim():
    faster = dataclasses.replace(
        _ddp(), metrics={**_ddp().metrics, "step_ms.median": 40.0}, samples={"step_ms": [40.0, 41, 39, 45, 38]}
    )
    for ra, rb in ((1.0, 1.1), (None, 2.0), (1.0, None)):
        a = dataclasses.replace(_ddp(), environment={**DDP_ENV, "optimizer_steps_per_step": ra})
        b = dataclasses.replace(faster, environment={**DDP_ENV, "optimizer_steps_per_step": rb})
        c = compare(a, b)
        assert any("B is 2.00x faster per step" in line for line in c.headline), (ra, rb, c.headline)
        assert not any(line.startswith("Steps:") for line in c.not_comparable)
