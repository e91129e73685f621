"""Every command sees the same run: diagnose, compare, baseline + gate and the TensorBoard event text written by
``view --rewrite-events`` report the same findings for one recorded run, with a pyproject.toml that changes a
rule's thresholds, and with ``--select`` / ``--ignore``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddpdoctor.cli import main

pytestmark = pytest.mark.integration

RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"
# Thresholds no real run passes: with them poor-comm-compute-overlap fires on any run with exposed communication
# (the built-in thresholds keep it silent on this run), so a command that ignores pyproject.toml reports less.
PYPROJECT = """\
[tool.ddpdoctor.rules.poor-comm-compute-overlap]
min_overlap = 1.01
min_exposed_ms = 0.0
min_exposed_share = 0.0
"""
CURRENT_FINDING = {"new finding", "new finding below fail-on", "already in baseline"}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with the recorded run and a pyproject.toml overriding a rule; the current folder."""
    shutil.copytree(RECORDED, tmp_path / "run")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _json_of(argv: list[str], capsys) -> dict:
    code = main(argv)
    out = capsys.readouterr().out
    assert code in (0, 1), (argv, code)
    return json.loads(out)


def _diagnose(options: list[str], capsys) -> set[str]:
    doc = _json_of(["diagnose", "run", "--format", "json", *options], capsys)
    return {f["name"] for f in doc["findings"]}


def _compare(options: list[str], capsys) -> set[str]:
    doc = _json_of(["compare", "run", "run", "--format", "json", *options], capsys)
    assert doc["findings"]["only_a"] == [] and doc["findings"]["only_b"] == []
    return set(doc["findings"]["both"])


def _baseline_and_gate(options: list[str], capsys) -> tuple[set[str], set[str]]:
    assert main(["baseline", "run", "--output", "base.json", *options]) == 0
    capsys.readouterr()
    baseline = {f["name"] for f in json.loads(Path("base.json").read_text())["findings"]}
    doc = _json_of(["gate", "run", "--baseline", "base.json", "--format", "json", *options], capsys)
    return baseline, {r["rule"] for r in doc["rules"] if r["verdict"] in CURRENT_FINDING}


def _view_event_text(options: list[str]) -> set[str]:
    """The finding names in the per-rank findings text that `ddpdoctor view --rewrite-events` writes."""
    shutil.rmtree("run/tensorboard", ignore_errors=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", "view", "run", "--rewrite-events", "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "wrote TensorBoard event files" in line or not line:
                break
        assert any("wrote TensorBoard event files" in line for line in lines), "".join(lines)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    names: set[str] = set()
    rules = {r: None for r in _all_rule_names()}
    for rank_dir in sorted(Path("run/tensorboard").glob("rank*")):
        acc = EventAccumulator(str(rank_dir), size_guidance={"tensors": 0})
        acc.Reload()
        (event,) = acc.Tensors("ddpdoctor/findings")
        text = event.tensor_proto.string_val[0].decode()
        findings_part = text.split("Not evaluated", 1)[0]
        names |= {name for name in rules if f" {name}**" in findings_part}
    return names


def _all_rule_names() -> list[str]:
    from ddpdoctor.diagnosis import load_rules

    return [rule.name for rule in load_rules()]


def _every_command(options: list[str], capsys) -> dict[str, set[str]]:
    baseline, gate = _baseline_and_gate(options, capsys)
    return {
        "diagnose": _diagnose(options, capsys),
        "compare": _compare(options, capsys),
        "baseline": baseline,
        "gate": gate,
        "view": _view_event_text(options),
    }


@pytest.mark.timeout(600)
def test_every_command_applies_the_pyprojects_rule_thresholds(project, capsys):
    seen = _every_command([], capsys)
    assert seen["diagnose"] >= {"poor-comm-compute-overlap"}, seen  # the override is in force
    assert all(found == seen["diagnose"] for found in seen.values()), seen
    # and without the override, the same rule stays silent in every command
    (project / "pyproject.toml").unlink()
    plain = _every_command([], capsys)
    assert "poor-comm-compute-overlap" not in plain["diagnose"]
    assert all(found == plain["diagnose"] for found in plain.values()), plain


@pytest.mark.timeout(600)
def test_every_command_applies_select_and_ignore(project, capsys):
    everything = _diagnose([], capsys)
    assert "poor-comm-compute-overlap" in everything
    ignored = _every_command(["--ignore", "poor-comm-compute-overlap"], capsys)
    assert all(found == everything - {"poor-comm-compute-overlap"} for found in ignored.values()), ignored
    selected = _every_command(["--select", "DDP002"], capsys)  # DDP002 is poor-comm-compute-overlap
    assert all(found == {"poor-comm-compute-overlap"} for found in selected.values()), selected
