"""Rule engine logic and the `diagnose` command's contract (exit codes, --select/--ignore, --output).

The inputs are RunMetrics-like objects built from small hand-written dicts in tests/golden/inputs/ (they test
the engine's logic: which rule fires on which numbers; they are not findings measured from real traces)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from ddpdoctor.cli import diagnose_cmd, main
from ddpdoctor.diagnosis import apply_config, evaluate, load_config, load_rules, select_rules
from ddpdoctor.diagnosis.findings import Diagnosis, Finding, format_ranks, sort_findings
from ddpdoctor.pipeline import Analysis

INPUTS = Path(__file__).resolve().parents[1] / "golden" / "inputs"


def fake_metrics(name: str) -> SimpleNamespace:
    """A RunMetrics-like object from tests/golden/inputs/<name>.json (hand-made engine-logic input)."""
    data = json.loads((INPUTS / f"{name}.json").read_text())
    frames = {k: pd.DataFrame(data[k]) for k in ("per_step", "collectives", "devices")}
    return SimpleNamespace(run=data["run"], ranks=data["ranks"], **frames)


def by_name(result: Diagnosis) -> dict[str, Finding]:
    return {f.name: f for f in result.findings}


# ------------------------------------------------------------------------------------------- engine
def test_sick_ddp_run_fires_the_expected_rules_on_the_expected_ranks():
    result = evaluate(load_rules(), fake_metrics("ddp_4ranks"))
    found = by_name(result)
    assert set(found) == {
        "dataloader-bound",
        "poor-comm-compute-overlap",
        "rank-straggler",
        "low-collective-bandwidth",
        "host-sync-stalls",
        "broadcast-buffers-cost",
        "gpu0-oom-risk",
        "find-unused-parameters-cost",
        "cpu-thread-oversubscription",
        "ddp-bucket-size-mismatch",
    }
    assert found["dataloader-bound"].ranks == (2,)  # per-rank rule: only the rank where it holds
    assert found["rank-straggler"].ranks == (2,)  # the one rank last at far more collectives than chance
    assert found["host-sync-stalls"].ranks == (0,)
    assert found["gpu0-oom-risk"].ranks == (0, 1, 2, 3)  # rank 0 + the ranks holding memory on cuda:0
    # allreduce-every-microstep: the trace's all-reduces per step equal the bucket count, one round per step
    assert result.passed == ("gil-contention", "allreduce-every-microstep", "ranks-never-synchronize")
    assert [(n.name, n.reason) for n in result.not_evaluated][:1] == [
        ("use-ddp-instead-of-dp", "applies to DataParallel (dp) runs; this run is ddp")
    ]
    # the set-up checks need what `ddpdoctor trace` observes (DataLoaders, set_device): absent from this input
    rest = {n.name: n.reason for n in result.not_evaluated[1:]}
    assert rest.pop("dp-gathers-large-outputs") == "applies to DataParallel (dp) runs; this run is ddp"
    for name in ("fsdp-one-large-unit", "fsdp-exposed-all-gather", "fsdp-exposed-reduce-scatter"):
        assert rest.pop(name).startswith("applies to fsdp jobs; this run is data parallel"), name
    assert set(rest) == {
        "missing-distributed-sampler",
        "sampler-epoch-not-set",
        "uneven-batches-across-ranks",
        "ranks-share-cuda0",
        "batchnorm-not-synced",
        # how the job ended: a hand-made input has no manifest, rank files or dumps (issue 24)
        "rank-crashed",
        "job-failed-at-startup",
        "collective-hang",
        "collective-mismatch",
        "rank-died",
        # the host's load: only `ddpdoctor trace` runs on Linux record it (issue 25 item 4)
        "rank-starved-of-cpu",
        # DDP's gradient sizes and torch.compile's regions: recorded by `ddpdoctor trace` (issue 26 items 4, 5)
        "ddp-giant-gradient",
        "compile-recompiles",
        # which code issued each collective: the hand-made input has no issuers (what an analysis of traces gives)
        "loop-collectives-exposed",
        # DDP forwards per optimizer step: counted by `ddpdoctor trace` as the job runs
        "ddp-forward-bypassed",
        # DDP's communication hook: named in DDP's logging data, which `ddpdoctor trace` records
        "ddp-noop-comm-hook",
    }
    assert all(reason.startswith("not measured in this run: ") for reason in rest.values())
    assert "the host's load was not recorded" in rest["rank-starved-of-cpu"]
    assert "no record of how the job ended" in rest["rank-crashed"]
    assert "no DataLoader was observed" in rest["missing-distributed-sampler"]


def test_findings_carry_the_numbers_that_made_them_fire():
    found = by_name(evaluate(load_rules(), fake_metrics("ddp_4ranks")))
    loader = found["dataloader-bound"]
    assert loader.message.startswith("Waiting for the next batch takes 30.0 ms per step on rank 2: 25% of a 120.0")
    assert loader.evidence["dataloader_ms"] == {"2": 30.0} and loader.evidence["params.min_share"] == 0.10
    assert loader.estimated_gain_ms == 30.0
    overlap = found["poor-comm-compute-overlap"]
    assert overlap.evidence["mean(overlap_ratio)"] == pytest.approx(0.37)
    # 4 ranks expose 22 ms each, of which 17/17/1/17 ms is waiting for the straggler: mean transfer 9.0 ms
    assert (
        "9.0 ms per step of communication is exposed" in overlap.message
        and "35.0 ms of collectives" in overlap.message
        and "That is data transfer only" in overlap.message  # every rank is in the data: waits are known
    )
    assert "only 1 gradient bucket" in overlap.message
    assert overlap.estimated_gain_ms == pytest.approx(9.0)
    oom = found["gpu0-oom-risk"]
    assert oom.severity == "error" and oom.estimated_gain_ms is None
    assert "never call torch.cuda.set_device(local_rank)" in oom.message and "4% headroom" in oom.message
    assert found["low-collective-bandwidth"].estimated_gain_ms == pytest.approx(22.0 * (1 - 3.2 / 5.0), abs=1e-3)
    assert found["host-sync-stalls"].estimated_gain_ms == pytest.approx(9.0 * 0.4)


def test_findings_are_sorted_errors_first_then_most_costly_first():
    result = evaluate(load_rules(), fake_metrics("ddp_4ranks"))
    assert result.findings[0].name == "gpu0-oom-risk" and result.findings[0].severity == "error"
    rest = [f for f in result.findings if f.severity != "error"]
    gains = [f.estimated_gain_ms for f in rest]
    known = [g for g in gains if g is not None]
    assert known == sorted(known, reverse=True) and gains[: len(known)] == known  # unknown gains last
    assert rest[0].name == "dataloader-bound"


def test_rules_whose_metrics_are_all_missing_are_not_evaluated_with_the_reason():
    result = evaluate(load_rules(), fake_metrics("cpu_single"))
    reasons = {n.name: n.reason for n in result.not_evaluated}
    assert "gpu0_headroom_ratio" in reasons["gpu0-oom-risk"] and "no CUDA device" in reasons["gpu0-oom-risk"]
    assert "host_sync_ms" in reasons["host-sync-stalls"]
    assert reasons["rank-straggler"] == "applies to DistributedDataParallel (ddp) runs; this run is single"
    assert set(result.passed) == {"dataloader-bound", "cpu-thread-oversubscription"}
    assert set(by_name(result)) == {"gil-contention"}
    # nothing is silently passed: every selected rule is in exactly one of the three lists
    names = [f.name for f in result.findings] + list(result.passed) + [n.name for n in result.not_evaluated]
    assert sorted(names) == sorted(r.name for r in load_rules())


def test_ddp_rule_without_communication_is_not_evaluated_not_passed():
    metrics = fake_metrics("ddp_4ranks")
    for row in metrics.ranks:
        for key in (
            "comm_ms",
            "exposed_comm_ms",
            "exposed_transfer_ms",
            "ddp_exposed_transfer_ms",
            "overlap_ratio",
            "busbw_gbps",
            "algbw_gbps",
        ):
            row[key] = None
    result = evaluate(select_rules(load_rules(), ["poor-comm-compute-overlap"]), metrics)
    assert result.findings == () and result.passed == ()
    (item,) = result.not_evaluated
    assert "exposed_comm_ms" in item.reason and "overlap_ratio" in item.reason
    assert "no collective communication was found" in item.reason


def test_dp_run_gets_the_dataparallel_rule():
    found = by_name(evaluate(load_rules(), fake_metrics("dp_2gpu")))
    dp = found["use-ddp-instead-of-dp"]
    assert dp.estimated_gain_ms == 25.0  # replicate + scatter + gather
    assert "--nproc-per-node=2" in dp.recommendation and "share one GIL" in dp.message
    assert "1.57x" in found["gpu0-oom-risk"].message


def test_a_param_override_changes_the_decision(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ddpdoctor.rules.dataloader-bound]\nmin_share = 0.3\n")
    rules = apply_config(load_rules(), load_config(cwd=tmp_path))
    result = evaluate(select_rules(rules, ["dataloader-bound"]), fake_metrics("ddp_4ranks"))
    assert result.findings == () and result.passed == ("dataloader-bound",)


def test_nan_and_numpy_values_are_treated_as_missing_and_plain_numbers():
    import numpy as np

    metrics = fake_metrics("ddp_4ranks")
    for row in metrics.ranks:
        row["dataloader_ms"] = np.float32(row["dataloader_ms"])
    metrics.ranks[2]["dataloader_ms"] = float("nan")
    metrics.ranks[1]["step_ms_median"] = float("inf")
    result = evaluate(select_rules(load_rules(), ["dataloader-bound"]), metrics)
    assert result.passed == ("dataloader-bound",)
    json.loads(_render_json(result))  # strict JSON: no NaN or Infinity


def _render_json(result: Diagnosis) -> str:
    import io

    from ddpdoctor.report import render

    buf = io.StringIO()
    render(result, "json", buf)
    return buf.getvalue()


def test_format_ranks_and_sort_helpers():
    assert format_ranks([3]) == "rank 3"
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"
    every_other = format_ranks(range(0, 16384, 2))  # a line at any world size; the count says how many
    assert every_other == "ranks 0, 2, 4, 6, 8, 10, 12, 14, ..., 16380, 16382 (8,192 ranks)"
    assert format_ranks(range(0, 24, 2)).endswith("20, 22")  # 12 spans: all of them
    a = Finding("X001", "a", "info", (0,), "m", "r", {}, None)
    b = Finding("X002", "b", "warning", (0,), "m", "r", {}, 1.0)
    c = Finding("X003", "c", "error", (0,), "m", "r", {}, None)
    assert [f.id for f in sort_findings([a, b, c])] == ["X003", "X002", "X001"]  # errors lead


def test_evidence_of_many_ranks_is_their_values_not_a_list_of_every_rank():
    from ddpdoctor.report.fmt import evidence_value

    assert evidence_value({0: 1.5, 1: 2}) == "r0=1.5, r1=2"  # a few ranks: each one
    assert evidence_value({r: 1 for r in range(16384)}) == "1 on ranks 0-16383"
    assert evidence_value({str(r): 1 for r in range(16384)}) == "1 on ranks 0-16383"  # as the engine keys it
    two = {r: 4 if r in (7, 900) else 1 for r in range(16384)}
    assert evidence_value(two) == "1 on ranks 0-6, 8-899, 901-16383; 4 on ranks 7, 900"
    spread = {r: 10 + (r * 7919) % 4096 / 100 for r in range(4096)}
    assert evidence_value(spread) == "10 (r0) to 50.95 (r4081) over 4,096 ranks"
    with_gaps = {r: None if r == 3 else float(r) for r in range(20)}  # not measured on one rank: said, not dropped
    assert evidence_value(with_gaps) == "0 (r0) to 19 (r19) over 19 ranks; n/a on rank 3"
    names = {r: f"host{r % 5}" for r in range(100)}
    assert evidence_value(names).endswith("; 2 more values") and len(evidence_value(names)) < 400


@pytest.mark.parametrize(("fail_on", "fails"), [(None, False), ("info", True), ("warning", True), ("error", False)])
def test_fails_at_or_above_threshold(fail_on, fails):
    result = evaluate(
        select_rules(load_rules(), ["dataloader-bound", "ddp-bucket-size-mismatch"]),
        fake_metrics("ddp_4ranks"),
    )
    assert {f.severity for f in result.findings} == {"warning", "info"}
    assert result.fails(fail_on) is fails


# ------------------------------------------------------------------------------------------- the command
@pytest.fixture
def fake_analyze(monkeypatch):
    calls = []

    def analyze_run(path, *, steps=None, rules=None, progress=None, traces_optional=False, over_time=False):
        calls.append((path, steps))
        if not Path(path).exists():
            raise diagnose_cmd.UsageError(f"{path}: no such file or directory")
        metrics = fake_metrics("ddp_4ranks")
        return Analysis(Path(path), metrics, evaluate(rules, metrics))

    monkeypatch.setattr(diagnose_cmd, "analyze_run", analyze_run)
    return calls


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ([], 0),
        (["--fail-on", "info"], 1),
        (["--fail-on", "warning"], 1),
        (["--fail-on", "error"], 1),
        (["--fail-on", "error", "--ignore", "gpu0-oom-risk"], 0),
        (["--select", "DDP001,gil-contention", "--fail-on", "warning"], 1),
        (["--select", "gil-contention", "--fail-on", "info"], 0),
        (["--select", "gil-contention", "--select", "rank-straggler", "--fail-on", "warning"], 1),
    ],
)
def test_diagnose_exit_codes(fake_analyze, tmp_path, capsys, args, code):
    assert main(["diagnose", str(tmp_path), "--format", "json", *args]) == code
    assert json.loads(capsys.readouterr().out)["schema_version"] == 1


def test_select_and_ignore_reach_the_report(fake_analyze, tmp_path, capsys):
    main(
        [
            "diagnose",
            str(tmp_path),
            "--format",
            "json",
            "--select",
            "DDP001,DDP003,gil-contention",
            "--ignore",
            "rank-straggler",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert [f["name"] for f in doc["findings"]] == ["dataloader-bound"]
    assert doc["passed"] == ["gil-contention"] and doc["not_evaluated"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--select", "nope"], "unknown rule 'nope'"),
        (["--ignore", "dataloader-bond"], "did you mean dataloader-bound"),
        (["--steps", "5-3"], "--steps must look like N..M"),
        (["--steps", "9..3"], "the last step comes before the first"),
        (["--rules-dir", "/nonexistent-dir"], "rules directory does not exist"),
        (["--config", "/nonexistent.toml"], "config file does not exist"),
        (["--format", "pdf"], "invalid choice"),
        (["--fail-on", "fatal"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(fake_analyze, tmp_path, capsys, args, message):
    assert main(["diagnose", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and err.startswith("ddpdoctor: error: ")


def test_missing_run_exits_2(fake_analyze, tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_steps_are_parsed_and_passed_on(fake_analyze, tmp_path, capsys):
    assert main(["diagnose", str(tmp_path), "--steps", "5..", "--format", "json"]) == 0
    assert main(["diagnose", str(tmp_path), "--steps", "5..20", "--format", "json"]) == 0
    assert [s for _, s in fake_analyze] == [(5, None), (5, 20)]


def test_output_is_written_atomically_and_only_on_success(fake_analyze, tmp_path, capsys, monkeypatch):
    out = tmp_path / "reports" / "report.html"
    assert main(["diagnose", str(tmp_path), "--format", "html", "--output", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>") and capsys.readouterr().out == ""
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # no temporary file left behind

    failed = tmp_path / "failed.json"
    assert main(["diagnose", str(tmp_path), "--select", "nope", "--output", str(failed)]) == 2
    assert not failed.exists()

    def broken(result, fmt, stream):
        stream.write("partial")
        raise RuntimeError("renderer bug")

    monkeypatch.setattr(diagnose_cmd, "render", broken)
    with pytest.raises(RuntimeError):
        main(["diagnose", str(tmp_path), "--output", str(failed)])
    assert not failed.exists()
    with pytest.raises(RuntimeError):
        main(["diagnose", str(tmp_path), "--output", str(out)])
    assert out.read_text().startswith("<!DOCTYPE html>")  # the previous report is untouched
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]


@pytest.mark.parametrize("command", ["diagnose", "compare", "baseline", "gate"])
@pytest.mark.parametrize("where", ["a folder", "under a file", "a read-only folder", "empty"])
def test_an_output_that_cannot_be_written_is_refused_before_any_run_is_read(
    fake_analyze, tmp_path, capsys, command, where
):
    (tmp_path / "a-file").write_text("kept")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    target, said = {
        "a folder": (tmp_path, "is a folder; name the file to write in it"),
        "under a file": (tmp_path / "a-file" / "sub" / "r.json", "a-file is a file, not a folder"),
        "a read-only folder": (locked / "new" / "r.json", f"no permission to write in {locked}"),
        "empty": ("", "must name a file"),
    }[where]
    if where == "a read-only folder" and os.access(locked, os.W_OK):
        pytest.skip("running as a user that can write anywhere")
    runs = {"diagnose": ["r"], "compare": ["a", "b"], "baseline": ["r"], "gate": ["base", "r"]}[command]
    argv = [command, *(str(tmp_path / r) for r in runs), "--output", str(target)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpdoctor: error: argument --output") and said in err and err.count("\n") == 1
    assert fake_analyze == []  # nothing read: the path was checked with the options
    assert (tmp_path / "a-file").read_text() == "kept" and not (locked / "new").exists()


def test_rules_and_explain_commands(capsys):
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    for rule in load_rules():
        assert rule.id in out and rule.name in out
    assert main(["rules", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"id", "name", "severity", "applies_to", "summary"} <= set(rows[0])
    assert main(["explain", "DDP004"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# gpu0-oom-risk (DDP004)") and "## Why is this bad?" in text
    assert main(["explain", "no-such-rule"]) == 2
    assert "unknown rule" in capsys.readouterr().err
