"""``ddpdoctor export RUN --perfetto FILE``: a valid Chrome/Perfetto trace, a process per rank, clocks aligned on the
collectives, the findings marked on the ranks they name, bounded in size, and one-line errors."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

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
    return sorted(e["ts"] + e["dur"] for e in doc["traceEvents"] if e["pid"] == pid and e.get("name", "").startswith(prefix) and e["ph"] == "X")  # fmt: skip


def test_every_rank_is_its_own_process_named_for_its_rank_and_host(exported):
    _check_schema(exported)
    names = {e["pid"]: e["args"]["name"] for e in exported["traceEvents"] if e["name"] == "process_name"}
    assert set(names) == {0, 1}
    assert all(names[r].startswith(f"rank {r} on ") for r in names), names
    pids = {e["pid"] for e in exported["traceEvents"] if e["ph"] == "X"}
    assert pids == {0, 1}


def test_the_straggler_finding_is_marked_on_the_straggler_only(exported):
    marks = [e for e in exported["traceEvents"] if e["ph"] == "i"]
    straggler = [e for e in marks if e["name"] == "DDP003 rank-straggler"]
    assert [e["pid"] for e in straggler] == [1], marks
    assert "rank 1" in straggler[0]["args"]["message"]


def test_it_loads_back_with_ddpdoctors_own_loader(exported, tmp_path):
    path = tmp_path / "again.json"
    path.write_text(json.dumps(exported))
    run = load(path)
    assert run.ranks and len(run.ranks[0].tables.ops) > 1000


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
    assert "note:" in done.stdout
    steps = {e["name"] for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#")}
    assert steps == {f"ProfilerStep#{s}" for s in kept}


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
