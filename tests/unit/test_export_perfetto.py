"""``ddpdoctor export RUN --perfetto FILE``: a valid Chrome/Perfetto trace, a process per rank, clocks aligned on the
collectives, the findings marked on the ranks they name, bounded in size, and one-line errors."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from helpers import SAMPLES, run_cli

from ddpdoctor.load import load

STRAGGLER = SAMPLES / "recorded" / "ddp_straggler"
SHIFT_US = 5_000_000.0  # rank 1's clock set 5 s ahead: the export must undo it


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("perfetto") / "run.json"
    done = run_cli("export", str(STRAGGLER), "--perfetto", str(out))
    assert done.returncode == 0, done.stderr
    assert "ui.perfetto.dev" in done.stdout
    return json.loads(out.read_text())


def _check_schema(doc: dict) -> None:
    """The trace-event format Perfetto's and chrome://tracing's JSON importers read."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M", "i"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["s"] in ("p", "g", "t") and isinstance(e["ts"], (int, float)), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name") and "args" in e, e


def _ends(doc: dict, pid: int, prefix: str = "gloo:all_reduce") -> list[float]:
    return sorted(
        e["ts"] + e["dur"]
        for e in doc["traceEvents"]
        if e["pid"] == pid and e.get("name", "").startswith(prefix) and e["ph"] == "X"
    )


def test_every_rank_is_its_own_process_named_for_its_rank_and_host(exported):
    _check_schema(exported)
    names = {e["pid"]: e["args"]["name"] for e in exported["traceEvents"] if e["name"] == "process_name"}
    assert set(names) == {0, 1}
    assert all(names[r].startswith(f"rank {r} on ") for r in names), names
    pids = {e["pid"] for e in exported["traceEvents"] if e["ph"] == "X"}
    assert pids == {0, 1}


def _marks(doc: dict, rule: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "i" and e["name"] == rule]


def test_the_straggler_is_marked_where_it_arrives_late_and_the_others_where_they_wait(exported):
    straggler = _marks(exported, "DDP003 rank-straggler")
    late = [e for e in straggler if e["args"]["part"] == "late-arrival"]
    waits = [e for e in straggler if e["args"]["part"] == "wait-caused"]
    assert {e["pid"] for e in late} == {1} and {e["pid"] for e in waits} == {0}, straggler
    assert sorted(e["args"]["step"] for e in late) == exported["otherData"]["steps"]  # one per exported step
    assert all("rank 1 arrives" in e["args"]["where"] and "rank 1" in e["args"]["message"] for e in late)
    # at the moment rank 1 enters an all-reduce, not at the window's start
    starts = {
        round(e["ts"])
        for e in exported["traceEvents"]
        if e["ph"] == "X" and e["pid"] == 1 and e["name"].startswith("gloo:all_reduce")
    }
    assert all(round(e["ts"]) in starts for e in late), (late, sorted(starts))
    assert min(e["ts"] for e in late) > 1000


def test_it_loads_back_as_the_runs_ranks(exported, tmp_path):
    path = tmp_path / "again.json"
    path.write_text(json.dumps(exported))
    run, source = load(path), load(STRAGGLER)
    assert [rt.rank for rt in run.ranks] == [0, 1] and run.world_size == 2
    for rt, orig in zip(run.ranks, source.ranks, strict=True):
        own = sum(1 for e in exported["traceEvents"] if e["ph"] == "X" and e["pid"] == rt.rank)
        assert len(rt.tables.ops) + len(rt.tables.kernels) == own > 1000
        assert len(rt.tables.steps) == 8 and len(rt.tables.comm_ops) == len(orig.tables.comm_ops) > 0
        for col in ("name", "in_nelems", "group_size", "seq"):  # the collectives came back with their args
            assert rt.tables.comm_ops[col].tolist() == orig.tables.comm_ops[col].tolist()
    a, b = (set(rt.tables.ops["ts_us"].tolist()) for rt in run.ranks)
    assert a != b


def test_diagnose_of_the_export_finds_the_straggler_on_rank_1(exported, tmp_path):
    path = tmp_path / "again.json"
    path.write_text(json.dumps(exported))
    done = run_cli("diagnose", str(path))
    assert done.returncode == 0, done.stderr
    assert "world size 2" in done.stdout and "DDP003 rank-straggler  [rank 1]" in done.stdout


def test_a_trace_without_the_exports_marker_is_read_as_one_trace(exported, tmp_path):
    doc = json.loads(json.dumps(exported))
    del doc["otherData"]["producer"]
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(doc))
    run = load(path)
    assert [rt.rank for rt in run.ranks] == [0] and run.world_size == 1


def test_clocks_that_differ_by_seconds_are_aligned_on_the_collectives(tmp_path):
    run = tmp_path / "shifted"
    shutil.copytree(STRAGGLER, run)
    (trace,) = sorted(run.glob("rank1.*.pt.trace.json.gz"))
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = e["ts"] + SHIFT_US
    trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for summary in (run / "ranks").glob("*.summary.json"):  # the summaries hold the old clock: read the traces
        summary.unlink()
    out = tmp_path / "aligned.json"
    done = run_cli("export", str(run), "--perfetto", str(out))
    assert done.returncode == 0, done.stderr
    aligned = json.loads(out.read_text())
    assert abs(aligned["otherData"]["clock_offsets_us"]["1"] - SHIFT_US) < 1000
    r0, r1 = _ends(aligned, 0), _ends(aligned, 1)
    assert len(r0) == len(r1) >= 8
    assert max(abs(a - b) for a, b in zip(r0, r1, strict=True)) < 2000  # µs: the same all-reduces end together


def test_a_cap_keeps_whole_steps_and_says_so(tmp_path):
    out = tmp_path / "capped.json"
    done = run_cli("export", str(STRAGGLER), "--perfetto", str(out), "--max-events", "1200")
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    kept = doc["otherData"]["steps"]
    assert 1 <= len(kept) < 8 and "over the cap of 1,200" in doc["otherData"]["note"]
    assert "note:" in done.stdout and doc["otherData"]["cut"] is None
    steps = {e["name"] for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#")}
    assert steps == {f"ProfilerStep#{s}" for s in kept}
    assert sum(e["ph"] != "M" for e in doc["traceEvents"]) <= 1200


def _timed(doc: dict) -> int:
    return sum(e["ph"] != "M" for e in doc["traceEvents"])


def test_a_step_over_the_cap_alone_is_cut_and_says_where(tmp_path):
    out = tmp_path / "one.json"
    done = run_cli("export", str(STRAGGLER), "--perfetto", str(out), "--steps", "6..6", "--max-events", "300")
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert _timed(doc) <= 300
    cut = doc["otherData"]["cut"]
    assert cut["steps_in_part"] == [6] and cut["steps_whole"] == [] and cut["events_in_span"] > 300
    assert 0 < cut["kept_until_us"] < cut["span_end_us"]
    assert max(e["ts"] for e in doc["traceEvents"] if e["ph"] == "X") < cut["kept_until_us"]
    assert "warning: the cap of 300 events (--max-events) cut step 6" in done.stderr
    assert "cut by the cap" in done.stdout and "cut step 6" in doc["otherData"]["note"]
    assert [rt.rank for rt in load(out).ranks] == [0, 1]


def test_the_whole_window_is_capped_too_when_no_step_is_common_to_every_rank(tmp_path):
    run = tmp_path / "disjoint"
    shutil.copytree(STRAGGLER, run)
    (trace,) = sorted(run.glob("rank1.*.pt.trace.json.gz"))
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    for e in doc["traceEvents"]:  # rank 1 counts its steps from 104: no step is common to both ranks
        if e.get("name", "").startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + 100}"
    trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for summary in (run / "ranks").glob("*.summary.json"):
        summary.unlink()
    whole, capped = tmp_path / "whole.json", tmp_path / "capped.json"
    assert run_cli("export", str(run), "--perfetto", str(whole)).returncode == 0
    done = run_cli("export", str(run), "--perfetto", str(capped), "--max-events", "700")
    assert done.returncode == 0, done.stderr
    all_of_it, doc = json.loads(whole.read_text()), json.loads(capped.read_text())
    assert all_of_it["otherData"]["steps"] == [] and _timed(all_of_it) > 3000
    assert _timed(doc) <= 700 and doc["otherData"]["cut"]["events_in_span"] > 3000
    assert "cut the profiled window" in done.stderr and "no step common to every rank" in done.stdout
    marks = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert marks and all("applies to the exported window as a whole" in e["args"]["where"] for e in marks)


def test_steps_the_run_does_not_have_are_listed(tmp_path):
    done = run_cli("export", str(STRAGGLER), "--perfetto", str(tmp_path / "x.json"), "--steps", "40..50")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "the run has steps 4-11" in done.stderr and not (tmp_path / "x.json").exists()


def test_an_existing_file_is_not_replaced_without_force(tmp_path):
    out = tmp_path / "mine.json"
    out.write_text("my notes")
    done = run_cli("export", str(STRAGGLER), "--perfetto", str(out))
    assert done.returncode == 2 and "--force" in done.stderr and done.stderr.count("\n") == 1
    assert out.read_text() == "my notes"
    assert run_cli("export", str(STRAGGLER), "--perfetto", str(out), "--force").returncode == 0
    assert out.read_text().startswith("{")
