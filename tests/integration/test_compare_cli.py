"""``ddpdoctor compare`` on real runs: a DataParallel-style single process against 2-rank DDP (CPU, gloo),
in every format, and a committed baseline against a run. The runs come from test_gate_cli.py's ``traced``
(traced once per session, whichever module asks first)."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli
from test_gate_cli import Runs

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory)


@pytest.mark.timeout(300)
def test_compare_dp_and_ddp_in_every_format(runs, tmp_path):
    for fmt in ("text", "json", "markdown", "html"):
        out = tmp_path / f"compare.{fmt}"
        result = run_cli(
            "compare", str(runs["dp"]), str(runs["healthy_a"]), "--format", fmt, "--output", str(out)
        )
        assert result.returncode == 0, result.stderr
        text = out.read_text()
        if fmt == "json":
            doc = json.loads(text)
            step = next(m for m in doc["metrics"] if m["name"] == "step_ms.median")
            assert step["a"] > 0 and step["b"] > 0 and step["ratio"] == pytest.approx(step["b"] / step["a"])
            assert doc["a"]["environment"]["mode"] == "dp" and doc["b"]["environment"]["mode"] == "ddp"
            text = " ".join(doc["not_comparable"] + doc["headline"])
        assert "DataParallel on CPU" in text  # what is not comparable is said
        # a "faster" claim only beyond the runs' step-to-step noise (issue 25), "no faster claim" otherwise
        assert "faster per step" in text or "no faster claim" in text
        if fmt == "html":
            assert text.count("<svg") >= 2 and "<script" not in text


@pytest.mark.timeout(300)
def test_compare_baseline_with_a_run(runs):
    # a committed baseline compares like a run
    result = run_cli("compare", str(runs["baseline"]), str(runs["slowed"]), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["a"]["source"] == str(runs["baseline"]) and doc["a"]["origin"] == str(runs["healthy_a"])
    step = next(m for m in doc["metrics"] if m["name"] == "step_ms.median")
    assert step["ratio"] > 1.5 and step["better"] == "A"  # +40 ms on a ~33 ms step
