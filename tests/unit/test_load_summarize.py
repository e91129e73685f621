"""``load(summarize=True)`` (what ``diagnose`` uses): each rank is summarised as soon as it is decoded and its
tables dropped. The metrics must be exactly those of loading every rank's tables and analysing them, also in
the cases where the loader only knows a rank's number or its other spans once every file is read."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"


def _same_metrics(path: Path, steps: tuple[int, int | None] | None = None, **kwargs) -> list:
    tables = analyze(load(path, **kwargs), steps=steps).to_json()
    streamed_run = load(path, summarize=True, steps=steps, **kwargs)
    streamed = analyze(streamed_run, steps=steps).to_json()
    assert json.dumps(streamed, sort_keys=True, default=str) == json.dumps(tables, sort_keys=True, default=str)
    return streamed_run.ranks


def _docs(rank: int | None = None) -> list[tuple[str, dict]]:
    files = sorted(FIXTURE.glob(f"rank{'' if rank is None else rank}*.pt.trace.json.gz"))
    return [(p.name, json.loads(gzip.decompress(p.read_bytes()))) for p in files]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("steps", [None, (3, 8)])
def test_run_directory_with_captures_in_process_and_in_workers(workers: int, steps) -> None:
    ranks = _same_metrics(FIXTURE, steps, workers=workers)
    assert [rt.rank for rt in ranks] == [0, 1]
    assert all(rt.tables is None and rt.summary is not None and rt.facts.has_steps for rt in ranks)


def test_a_recorded_sample_with_a_straggler() -> None:
    _same_metrics(SAMPLE)


def test_ranks_numbered_by_file_order(tmp_path: Path) -> None:
    for i, (name, doc) in enumerate(_docs()):
        del doc["distributedInfo"]
        worker = "hostA_11" if name.startswith("rank0") else "hostB_22"
        (tmp_path / f"{worker}.{1000 + i}.pt.trace.json").write_text(json.dumps(doc))
    ranks = _same_metrics(tmp_path)
    assert [rt.rank for rt in ranks] == [0, 1] and [rt.summary["rank"] for rt in ranks] == [0, 1]


def test_one_rank_split_over_two_worker_names_is_read_with_its_tables(tmp_path: Path) -> None:
    # rank 0's two profiled windows under two worker names: spans of one rank, put together after decoding
    for i, (_, doc) in enumerate(_docs(0)):
        (tmp_path / f"worker{i}.{100 + i}.pt.trace.json").write_text(json.dumps(doc))
    ranks = _same_metrics(tmp_path)
    assert len(ranks) == 1 and len(ranks[0].files) == 2 and ranks[0].tables is not None


def test_the_same_rank_twice_at_the_same_time_keeps_one(tmp_path: Path) -> None:
    for name, doc in _docs():
        (tmp_path / name.replace(".gz", "")).write_text(json.dumps(doc))
        if name.startswith("rank1"):
            (tmp_path / ("copy_" + name.replace(".gz", ""))).write_text(json.dumps(doc))
    streamed = load(tmp_path, summarize=True)
    assert [rt.rank for rt in streamed.ranks] == [0, 1] and len(streamed.skipped) == 2
    assert streamed.skipped == load(tmp_path).skipped
    _same_metrics(tmp_path)


def test_a_trace_without_steps_still_gets_its_note(tmp_path: Path) -> None:
    for name, doc in _docs():
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
        (tmp_path / name.replace(".gz", "")).write_text(json.dumps(doc))
    streamed = load(tmp_path, summarize=True)
    assert any("no ProfilerStep#N ranges" in n for n in streamed.notes)
    assert streamed.notes == load(tmp_path).notes
    _same_metrics(tmp_path)


def test_a_run_directory_whose_rank_numbers_differ_from_the_file_names(tmp_path: Path) -> None:
    # the capture is keyed by rank: a worker told the wrong one by the file name must not use it
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    for p in run.glob("rank*.pt.trace.json.gz"):
        p.rename(run / p.name.replace("rank0", "rankX").replace("rank1", "rank0").replace("rankX", "rank1"))
    _same_metrics(run, workers=2)
