"""A run that did not complete cannot pass the gate (issue 13, item 6): a rank that failed, died, hung or was
interrupted, a rank missing, no profiled step, or too few steps for the statistics. The gate fails, naming
the reason, in every output (text, JSON, Markdown, JUnit, GitHub annotations)."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import pytest

from ddpdoctor.compare.baseline_file import dumps, from_json
from ddpdoctor.compare.gate import gate
from ddpdoctor.compare.snapshot import build
from ddpdoctor.compare.thresholds import load_config
from ddpdoctor.report import Document, OutputFormat, github, junit, renderer


def _capture(rank: int, *, status: str = "ok", steps: int = 30, world: int = 2, ms: float = 30.0, **extra) -> dict:
    return {
        "schema_version": 1,
        "rank": rank,
        "world_size": world,
        "status": status,
        "exit_code": 0 if status == "ok" else 1,
        "error": None if status == "ok" else "RuntimeError: injected",
        "backend": "gloo",
        "device": "cpu",
        "torch_version": "2.13.0",
        "steps": {
            "source": "optimizer",
            "count": steps,
            "first": 1,
            "wall_ms": [ms + (i % 3) * 0.5 for i in range(steps)],
            "profiled": [[3, 7]] if steps >= 7 else [],
        },
        **extra,
    }


def _run(*captures: dict, name: str = "runs/x"):
    return build(name, list(captures))


BASE = _run(_capture(0), _capture(1), name="runs/base")


def test_a_complete_run_passes():
    result = gate(_run(_capture(0), _capture(1)), BASE, load_config(cwd="/"))
    assert not result.failed and result.incomplete == ()


@pytest.mark.parametrize(
    "captures,reason",
    [
        ((_capture(0, status="failed", steps=3, ms=1.0), _capture(1, status="failed", steps=3)), "rank 0 failed"),
        ((_capture(0), _capture(1, status="running", steps=12)), "rank 1 has not finished"),
        ((_capture(0), _capture(1, status="hung")), "rank 1 hung"),
        ((_capture(0, status="interrupted"), _capture(1, status="interrupted")), "rank 0 was interrupted"),
        ((_capture(0),), "rank 1 is missing"),
        ((_capture(0, steps=3), _capture(1, steps=3)), "3 steps"),
        ((_capture(0, steps=0), _capture(1, steps=0)), "no training step"),
    ],
)
def test_an_incomplete_run_fails_the_gate_with_the_reason(captures, reason):
    # the crashed run's few steps are much faster than the baseline's: it would otherwise "improve" by -96 %
    current = _run(*captures)
    result = gate(current, BASE, load_config(cwd="/"))
    assert result.failed and result.exit_code == 1
    assert any(reason in r for r in result.incomplete), result.incomplete
    for fmt in OutputFormat:
        out = io.StringIO()
        renderer(Document.GATE, fmt)(result, out)
        text = out.getvalue()
        assert reason in text, fmt
        if fmt is OutputFormat.JSON:
            doc = json.loads(text)
            assert doc["result"] == "fail" and any(reason in r for r in doc["incomplete"])
    root = ET.fromstring(junit.to_bytes(result))
    run_case = next(c for c in root.iter("testcase") if c.get("classname") == "ddpdoctor.gate.run")
    assert run_case.find("failure") is not None and reason in run_case.find("failure").get("message")
    assert any(line.startswith("::error") and reason in line for line in github.annotations(result))


def test_an_incomplete_baseline_fails_too_and_survives_the_file_round_trip():
    crashed = _run(_capture(0), _capture(1, status="failed", steps=12), name="runs/crashed")
    assert crashed.incomplete
    again = from_json(json.loads(dumps(crashed)), "baseline.json")
    assert again.incomplete == crashed.incomplete
    result = gate(_run(_capture(0), _capture(1)), again, load_config(cwd="/"))
    assert result.failed and any(r.startswith("baseline: rank 1 failed") for r in result.incomplete)
