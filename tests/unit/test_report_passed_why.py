"""What a report says beyond the findings (issue 25 item 6, issue 26 item 9): a passed rule says the numbers that
decided it, the per-rank table has a wait column, a threshold changed by a config file is named where it matters,
the DDP comm hook is shown, and a run without a trace gets no table of dashes -- in every format (text, Markdown,
HTML, JSON and the TensorBoard dashboard's document).

The run is the recorded sample ``samples/recorded/ddp_straggler`` (rank 1 does extra work before every step; rank 0
waits 63.2 ms per step for it, so rank 0's 63 ms of "exposed" communication is waiting, not transfer)."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest

from ddpdoctor.pipeline import RuleOptions, analyze_run
from ddpdoctor.report import render
from ddpdoctor.report.document import build

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "recorded" / "ddp_straggler"
NO_OVERRIDES = RuleOptions(config=str(ROOT / "tests" / "golden" / "no-overrides.toml"))
FORMATS = ("text", "markdown", "html", "json")
pytestmark = pytest.mark.skipif(not SAMPLE.is_dir(), reason="the recorded sample is missing")


def _rendered(result) -> dict[str, str]:
    out = {}
    for fmt in FORMATS:
        stream = io.StringIO()
        render(result, fmt, stream)
        out[fmt] = stream.getvalue()
    return out


def _flat(text: str) -> str:
    """The report's words without line wrapping or markup (a sentence may be wrapped or escaped)."""
    if text.lstrip().startswith("<!"):  # HTML: its tags go
        text = re.sub(r"<[^>]+>", " ", text)
    for escaped, char in (("&lt;", "<"), ("&gt;", ">"), ("&#x27;", "'"), ("&#39;", "'"), ("&amp;", "&")):
        text = text.replace(escaped, char)  # HTML's and Markdown's escapes undone
    text = text.replace("\\", "")
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def straggler():
    return analyze_run(SAMPLE, rules=NO_OVERRIDES).diagnosis


@pytest.fixture(scope="module")
def dashboard():
    from ddpdoctor.tensorboard.report import build_report

    return build_report(SAMPLE, name="ddp_straggler", rules=NO_OVERRIDES)


def test_a_passed_rule_says_the_numbers_that_decided_it_in_every_format(straggler, dashboard):
    doc = build(straggler)
    why = {p["name"]: p["reason"] for p in doc["passed_reasons"]}
    assert list(why) == doc["passed"] and all(why.values()), why
    # a rule without a sentence of its own: the generic form, each tested value against its threshold
    assert re.search(r"dataloader_ms / step_ms_median = [0-9.]+ < 0\.1 \(min_share\)", why["dataloader-bound"])
    for fmt, text in _rendered(straggler).items():
        flat = _flat(text)
        for name, reason in why.items():
            assert reason in flat or json.dumps(reason)[1:-1] in flat, (fmt, name)
    assert [p["reason"] for p in dashboard["passed_reasons"]] == list(why.values())
    js = (ROOT / "ddpdoctor" / "tensorboard" / "static" / "sections.js").read_text()
    assert "passed_reasons" in js


def _metrics(ranks: list[dict], **run):
    from ddpdoctor.metrics.result import RunMetrics
    from ddpdoctor.table import Table

    base = {"mode": "ddp", "parallelism": "ddp", "world_size": len(ranks), "backend": "gloo", "steps_analyzed": 8}
    base |= {"ranks_loaded": len(ranks), "ranks_missing": 0, **run}
    return RunMetrics(run=base, ranks=ranks, per_step=Table(), collectives=Table(), devices=Table())


def test_overlap_that_passed_because_its_exposed_time_is_waiting_says_so():
    # the flagship sample as the issue saw it: rank 0 shows 46% overlap and 25.5 ms exposed (19% of a step), all
    # of it waiting for rank 1 (no exposed data transfer): poor-comm-compute-overlap passes, and must say why
    from ddpdoctor.diagnosis import evaluate, load_rules, select_rules

    rank = {"step_ms_median": 133.0, "comm_ms": 47.2, "ddp_bucket_count": 2, "ddp_find_unused_parameters": False}
    ranks = [
        {
            **rank,
            "rank": 0,
            "overlap_ratio": 0.46,
            "exposed_comm_ms": 25.5,
            "exposed_transfer_ms": 0.0,
            "ddp_exposed_transfer_ms": 0.0,
            "collective_wait_ms": 25.4,
        },
        {
            **rank,
            "rank": 1,
            "overlap_ratio": 0.6,
            "exposed_comm_ms": 0.4,
            "exposed_transfer_ms": 0.0,
            "ddp_exposed_transfer_ms": 0.0,
            "collective_wait_ms": 0.0,
        },
    ]
    rules = select_rules(load_rules(), ["poor-comm-compute-overlap"])
    result = evaluate(rules, _metrics(ranks))
    assert result.passed == ("poor-comm-compute-overlap",)
    (why,) = build(result)["passed_reasons"]
    reason = why["reason"]
    assert reason.startswith("exposed data transfer of DDP's collectives 0.0 ms per step (0.0% of a 133.0 ms step)"), (
        reason
    )
    assert "up to 25.5 ms per step on a rank includes up to 25.4 ms of waiting for late ranks" in reason
    assert "which is not transfer" in reason
    assert re.search(r"exposed_transfer_ms.* = 0 < 1 \(min_exposed_ms\)", reason), reason  # what decided it
    for fmt, text in _rendered(result).items():
        assert "25.4 ms of waiting for late ranks" in _flat(text), fmt
    # without a transfer measurement (a rank missing) it does not claim any part is transfer
    for r in ranks:
        r["exposed_transfer_ms"] = r["ddp_exposed_transfer_ms"] = None
    result = evaluate(rules, _metrics(ranks[:1], world_size=2, ranks_loaded=1, ranks_missing=1))
    if result.passed:
        assert "transfer" not in result.passed_reasons[0].reason.split(";")[0]


def test_a_per_rank_rule_that_passed_gives_each_ranks_numbers():
    # rank-straggler is decided per rank: with a 100 ms threshold neither rank's 63.2 / 0 ms fires it
    result = analyze_run(SAMPLE, rules=_config_with("min_wait_ms = 100.0")).diagnosis
    why = {p["name"]: p["reason"] for p in build(result)["passed_reasons"]}
    assert "rank-straggler" in why, [f.name for f in result.findings]
    assert "r0=0, r1=63.2" in why["rank-straggler"] or "r1=63.2" in why["rank-straggler"], why["rank-straggler"]


def _config_with(line: str, rule: str = "rank-straggler") -> RuleOptions:
    import tempfile

    folder = Path(tempfile.mkdtemp())
    (folder / "pyproject.toml").write_text(f"[tool.ddpdoctor.rules.{rule}]\n{line}\n")
    return RuleOptions(config=str(folder / "pyproject.toml"))


def test_the_per_rank_table_has_a_wait_column_in_every_format(straggler, dashboard):
    doc = build(straggler)
    waits = {r["rank"]: r["collective_wait_ms"] for r in doc["ranks"]}
    assert round(waits[0], 1) == 63.2 and waits[1] == 0
    texts = _rendered(straggler)
    table = texts["text"].split("Per-rank step breakdown", 1)[1].splitlines()
    header = next(line for line in table if line.strip().startswith("rank"))
    row0 = next(line for line in table if line.split() and line.split()[0] == "0")
    assert "wait" in header.split()
    assert row0.split()[header.split().index("wait")] == "63.2"
    assert "| wait |" in texts["markdown"] and "<th>wait</th>" in texts["html"]
    assert "wait" in dashboard["rank_table"]["columns"] and "63.2" in dashboard["rank_table"]["rows"][0]


def test_a_threshold_from_a_config_file_is_named_in_the_header_and_in_its_rules_line():
    options = _config_with("min_wait_ms = 100.0")
    result = analyze_run(SAMPLE, rules=options).diagnosis
    doc = build(result)
    assert doc["overrides"] == [
        {"rule": "rank-straggler", "param": "min_wait_ms", "value": 100.0, "default": 2.0, "source": options.config}
    ]
    why = {p["name"]: p["reason"] for p in doc["passed_reasons"]}
    assert "rank-straggler.min_wait_ms = 100 (default 2) from " in why["rank-straggler"]
    for fmt, text in _rendered(result).items():
        assert "rank-straggler.min_wait_ms = 100 (default 2) from" in _flat(text), fmt
    # a finding decided with an overridden threshold says so too
    result = analyze_run(SAMPLE, rules=_config_with("min_wait_ms = 10.0")).diagnosis
    (finding,) = [f for f in result.findings if f.name == "rank-straggler"]
    assert "rank-straggler.min_wait_ms = 10 (default 2) from" in finding.message
    # without an override the reports say nothing of overrides
    plain = analyze_run(SAMPLE, rules=NO_OVERRIDES).diagnosis
    assert build(plain)["overrides"] == [] and "default 2) from" not in _rendered(plain)["text"]


def _with_comm_hook(tmp_path: Path, hook: str) -> Path:
    run = Path(shutil.copytree(SAMPLE, tmp_path / "run"))
    for rank in (0, 1):
        for name in (f"rank{rank}.json", f"rank{rank}.summary.json"):
            path = run / "ranks" / name
            text = path.read_text()
            data = json.loads(text)
            if name.endswith(".summary.json"):
                assert "ddp_comm_hook" in text
                data["metrics"]["ddp_comm_hook"] = hook
            else:
                data["ddp"][0]["logging_data"]["comm_hook"] = hook
            path.write_text(json.dumps(data))
    return run


def test_the_ddp_comm_hook_is_shown_in_every_format(tmp_path):
    from ddpdoctor.tensorboard.report import build_report

    run = _with_comm_hook(tmp_path, "fp16_compress_hook")
    result = analyze_run(run, rules=NO_OVERRIDES).diagnosis
    assert build(result)["run"]["ddp_comm_hook"] == "fp16_compress_hook"
    for fmt, text in _rendered(result).items():
        shown = '"ddp_comm_hook": "fp16_compress_hook"' if fmt == "json" else "comm hook fp16_compress_hook"
        assert shown in _flat(text).replace("comm hook:", "comm hook"), fmt
    assert build_report(run, name="r", rules=NO_OVERRIDES)["run"]["ddp_comm_hook"] == "fp16_compress_hook"
    js = (ROOT / "ddpdoctor" / "tensorboard" / "static" / "sections.js").read_text()
    assert "ddp_comm_hook" in js
    # DDP without a hook: its default all-reduce is named as such
    plain = analyze_run(SAMPLE, rules=NO_OVERRIDES).diagnosis
    assert build(plain)["run"]["ddp_comm_hook"] == "none (DDP's default all-reduce)"
    assert "comm hook: none (DDP's default all-reduce)" in _flat(_rendered(plain)["text"])


def _failed_run_without_trace(path: Path, steps: int = 5) -> Path:
    """A run directory as `ddpdoctor trace` leaves a job that failed before its profiled window: no trace."""
    (path / "ranks").mkdir(parents=True)
    peer = "RuntimeError: Connection closed by peer [127.0.0.1]:43136"
    ranks = [(0, "failed", peer, 1), (1, "failed", "RuntimeError: bad batch", 1)]
    for rank, status, why, code in ranks:
        recorded = {"source": "optimizer", "count": steps, "wall_ms": [10.0] * steps, "profiled": []}
        capture = {
            "rank": rank,
            "world_size": 2,
            "status": status,
            "error": why,
            "exit_code": code,
            "backend": "gloo",
            "steps": recorded,
        }
        (path / "ranks" / f"rank{rank}.json").write_text(json.dumps(capture))
    manifest = {
        "schema_version": 1,
        "world_size": 2,
        "exit_code": 1,
        "notes": ["the run ended before the profiled window (it starts at step 12): no trace was recorded"],
        "ranks": [
            {"rank": r, "status": s, "reason": w, "steps": steps, "exit_code": c, "trace_files": []}
            for r, s, w, c in ranks
        ],
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_a_run_without_a_trace_gets_what_is_known_per_rank_never_a_table_of_dashes(tmp_path):
    from ddpdoctor.tensorboard.report import build_report

    run = _failed_run_without_trace(tmp_path / "run")
    result = analyze_run(run, rules=NO_OVERRIDES).diagnosis
    texts = _rendered(result)
    for fmt in ("text", "markdown", "html"):
        text = texts[fmt]
        assert "Per-rank step breakdown" not in text and "Step breakdown per rank" not in text, fmt
        assert not re.search(r"(—\s*\|?\s*){6,}", re.sub(r"<[^>]+>", " ", text)), fmt  # no row of dashes
        flat = _flat(text)
        assert "Per rank (no trace" in flat, fmt
        assert re.search(r"\b1\b.*crashed.*\b5\b", flat), fmt  # rank 1: crashed after 5 steps, exit 1
    table = build_report(run, name="failed", rules=NO_OVERRIDES)["rank_table"]
    assert table["columns"][:3] == ["rank", "state", "steps"] and table["rows"][1][:3] == ["1", "crashed", "5"]


def test_a_passed_line_never_shows_a_coalesce_default_as_if_it_were_measured():
    # ranks-never-synchronize reads training_collectives through coalesce(..., 1): on ranks that did not record it
    # (a foreign trace, an older run) the passed line once said "coalesce(max(training_collectives), 1) = 1 != 0",
    # a count nobody measured; and a part that two branches of its `or` test was said twice
    from ddpdoctor.diagnosis import evaluate, load_rules, select_rules

    rules = select_rules(load_rules(), ["ranks-never-synchronize"])
    ranks = [
        {"rank": r, "collectives_per_step": 2.0, "ddp_bucket_count": 2, "steps_run": 20, "step_ms_median": 30.0}
        for r in (0, 1)
    ]
    result = evaluate(rules, _metrics(ranks, optimizer_steps_per_step=1.0))
    assert result.passed == ("ranks-never-synchronize",)
    reason = result.passed_reasons[0].reason
    parts = reason.split("; ")
    assert "coalesce(" not in reason and "= 1 != 0" not in reason, reason
    assert "count(ddp_bucket_count) = 2 != 0" in parts, reason  # measured: said without its default
    assert parts[-1] == "not measured: max(training_collectives), max(training_collective_bytes), min(ddp_round_bytes)"
    assert len(parts) == len(set(parts)), reason
    # measured, the same part says the count
    for row in ranks:
        row.update(training_collectives=4, training_collective_bytes=8 * 2**20)
    reason = evaluate(rules, _metrics(ranks, optimizer_steps_per_step=1.0)).passed_reasons[0].reason
    assert "max(training_collectives) = 4 != 0" in reason, reason
    # the bytes were measured, the gradients' round was not: the comparison failed on its default, said so
    assert reason.endswith("; not measured: min(ddp_round_bytes)") and "max(training_collective_bytes) =" not in reason


def test_a_coalesce_that_fell_back_on_another_metric_shows_that_metric():
    # poor-comm-compute-overlap reads coalesce(mean(ddp_exposed_transfer_ms), mean(exposed_comm_ms)): where the
    # first was not measured the second was compared, and the passed line says so (neither "not measured" nor the
    # coalesce() call)
    from ddpdoctor.diagnosis import evaluate, load_rules, select_rules

    rules = select_rules(load_rules(), ["poor-comm-compute-overlap"])
    rank = {"step_ms_median": 100.0, "comm_ms": 10.0, "overlap_ratio": 0.9, "exposed_comm_ms": 1.0}
    result = evaluate(rules, _metrics([{**rank, "rank": 0}, {**rank, "rank": 1}]))
    assert result.passed == ("poor-comm-compute-overlap",)
    reason = result.passed_reasons[0].reason
    assert "mean(exposed_comm_ms) / mean(step_ms_median) = 0.01 < 0.05 (min_exposed_share)" in reason, reason
    assert "coalesce(" not in reason and "not measured" not in reason, reason
