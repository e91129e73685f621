"""The loader on the recorded 2-rank gloo DDP run (tests/fixtures/ddp_gloo_2rank) and on broken input."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ddpdoctor.errors import TraceError
from ddpdoctor.load import load

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"


@pytest.fixture(scope="module")
def run():
    return load(FIXTURE, workers=1)


def test_run_directory_ranks_spans_and_capture(run) -> None:
    assert [r.rank for r in run.ranks] == [0, 1]
    assert run.rank_source == "distributedInfo"
    assert (run.world_size, run.mode, run.backend) == (2, "ddp", "gloo")
    assert set(run.capture) == {0, 1} and run.manifest["world_size"] == 2
    for rt in run.ranks:
        # repeat=2 profiled windows: two span files concatenated, three ProfilerSteps each
        assert len(rt.files) == 2 and len(rt.windows) == 2
        assert sorted(rt.ops["span"].unique()) == [0, 1]
        assert list(rt.steps["step"]) == [2, 3, 4, 7, 8, 9]
        assert rt.kernels.empty  # CPU-only training


def test_frames_have_contract_columns(run) -> None:
    rt = run.rank(0)
    base = {"name", "cat", "ts_us", "dur_us", "end_us", "pid", "tid"}
    assert base <= set(rt.ops.columns)
    assert base | {"device", "stream"} <= set(rt.kernels.columns)
    assert base | {"bytes", "total_allocated", "total_reserved", "device_type", "device_id"} <= set(
        rt.memory.columns
    )
    assert base | {"step"} <= set(rt.steps.columns)
    assert (rt.ops["end_us"] == rt.ops["ts_us"] + rt.ops["dur_us"]).all()
    assert set(rt.ops["cat"].unique()) <= {"cpu_op", "user_annotation", "python_function", "cuda_runtime"}


def test_gloo_calls_carry_sizes_and_run_on_gloo_threads(run) -> None:
    rt = run.rank(0)
    gloo = rt.comm_ops[rt.comm_ops["name"] == "gloo:all_reduce"]
    assert len(gloo) == 12  # 2 DDP buckets x 6 profiled steps
    assert {d[0][0] for d in gloo["input_dims"]} == {267786, 131584}  # the rebuilt bucket sizes in floats
    names = {rt.thread_names[(int(p), int(t))] for p, t in zip(gloo["pid"], gloo["tid"], strict=False)}
    assert all("pt_gloo_runloop" in n for n in names)


def test_parallel_and_in_process_loads_agree(run) -> None:
    parallel = load(FIXTURE, workers=2)
    for a, b in zip(run.ranks, parallel.ranks, strict=False):
        assert a.rank == b.rank and a.ops.equals(b.ops) and a.steps.equals(b.steps)


def test_progress_callback_counts_ranks() -> None:
    seen = []
    load(FIXTURE, workers=1, progress=lambda done, total, label: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]


def test_single_plain_json_file_and_rank_from_filename(tmp_path: Path) -> None:
    src = sorted(FIXTURE.glob("rank1.*.pt.trace.json.gz"))[0]
    doc = json.loads(gzip.decompress(src.read_bytes()))
    del doc["distributedInfo"]
    target = tmp_path / "trainer_rank-1.json"
    target.write_text(json.dumps(doc))
    run = load(target)
    assert [r.rank for r in run.ranks] == [1] and run.rank_source == "filename"
    assert len(run.ranks[0].steps) == 3


def test_workers_without_rank_are_ordered_and_spans_grouped(tmp_path: Path) -> None:
    for i, src in enumerate(sorted(FIXTURE.glob("rank*.pt.trace.json.gz"))):
        doc = json.loads(gzip.decompress(src.read_bytes()))
        del doc["distributedInfo"]
        worker = "hostA_11" if "rank0" in src.name else "hostB_22"
        (tmp_path / f"{worker}.{1000 + i}.pt.trace.json").write_text(json.dumps(doc))
    run = load(tmp_path)
    assert run.rank_source == "order"
    assert [len(r.files) for r in run.ranks] == [2, 2]


def test_bad_files_are_skipped_when_others_load(tmp_path: Path) -> None:
    for src in FIXTURE.glob("rank0.*.pt.trace.json.gz"):
        shutil.copy(src, tmp_path / src.name)
    good = sorted(tmp_path.glob("*.gz"))[0].read_bytes()
    (tmp_path / "rank5.1.pt.trace.json.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "rank6.1.pt.trace.json").write_text("")
    run = load(tmp_path)
    assert [r.rank for r in run.ranks] == [0]
    assert len(run.skipped) == 2
    assert any("rank5.1.pt.trace.json.gz" in s and "gzip" in s for s in run.skipped)
    assert any("rank6.1.pt.trace.json" in s and "empty" in s for s in run.skipped)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty file"),
        (b"{not json", "not valid JSON"),
        (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}', "not valid JSON"),
        (b'{"schemaVersion": 1, "foo": []}', "not a Chrome/Kineto trace"),
        (b"[1, 2, 3]", "not a Chrome/Kineto trace"),
        (b'{"traceEvents": []}', "no events"),
    ],
)
def test_bad_single_file_raises_trace_error_naming_it(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError) as err:
        load(path)
    assert str(path) in str(err.value) and problem in str(err.value)


def test_truncated_gzip_and_missing_path_and_empty_dir(tmp_path: Path) -> None:
    data = gzip.compress(b'{"traceEvents": []}' * 1000)
    (tmp_path / "t.json.gz").write_bytes(data[:-20])
    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        load(tmp_path / "t.json.gz")
    with pytest.raises(TraceError, match="no such file"):
        load(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match="no trace files"):
        load(empty)


def test_chunk_fallback_when_a_cut_lands_inside_a_string(tmp_path: Path, monkeypatch) -> None:
    # a name containing the event separator must not break decoding (the loader re-splits per event)
    import ddpdoctor.load.decode as decode

    monkeypatch.setattr(decode, "CHUNK_BYTES", 64)
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": 'x"}, {"ph": "X" ' + str(i),
            "ts": i,
            "dur": 1,
            "pid": 1,
            "tid": 1,
        }
        for i in range(50)
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))
    ops = load(path).ranks[0].ops
    assert len(ops) == 50 and ops["name"].iloc[7] == 'x"}, {"ph": "X" 7'
