"""Bad input to the analysis: one clear line naming the file and the problem, exit 2, no traceback; where the
rest of the input is usable it is analysed and the report lists what was skipped and what is missing.

Every input is the recorded 2-rank gloo DDP run (tests/fixtures/ddp_gloo_2rank) broken in one way. The CLI
runs in this process (``ddpdoctor.cli.main``), so an exception escaping it would fail the test with its
traceback.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tracemalloc
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import ddpdoctor.load.decode as decode
from ddpdoctor.cli import main
from ddpdoctor.errors import TraceError
from ddpdoctor.load import load

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
TRACES = sorted(FIXTURE.glob("rank*.pt.trace.json.gz"))  # rank0 x2 spans, rank1 x2 spans


@cache
def _doc_json(name: str) -> str:
    return gzip.decompress((FIXTURE / name).read_bytes()).decode()


def doc(path: Path) -> dict[str, Any]:
    """A fresh copy of one fixture trace document."""
    return json.loads(_doc_json(path.name))


def write(folder: Path, name: str, document: Any, *, gz: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = document if isinstance(document, bytes) else json.dumps(document).encode()
    path = folder / name
    path.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    return path


def copy_fixture(folder: Path, ranks: tuple[int, ...] = (0, 1)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for src in TRACES:
        if int(src.name[4]) in ranks:
            shutil.copy(src, folder / src.name)
    return folder


def diagnose(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["diagnose", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(capsys, target: Path, *args: str) -> str:
    """Run ``diagnose target``; it must fail with exit 2 and exactly one line on stderr naming ``name``."""
    code, out, err = diagnose(capsys, target, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: "), err
    assert out == "" and "Traceback" not in err
    return lines[0]


def report(capsys, target: Path) -> dict[str, Any]:
    code, out, err = diagnose(capsys, target, "--format", "json")
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------------------ unreadable files
def _cases() -> list[tuple[str, Any, bool, str]]:
    real = _doc_json(TRACES[0].name).encode()
    gz = gzip.compress(real, compresslevel=6)
    corrupt = bytearray(gz)
    corrupt[len(gz) // 2 : len(gz) // 2 + 64] = bytes(64)
    return [
        ("truncated JSON", real[: len(real) // 2], False, "not valid JSON"),
        ("truncated gzip", gz[: len(gz) // 2], None, "truncated or corrupt gzip"),
        ("corrupt gzip", bytes(corrupt), None, "truncated or corrupt gzip"),
        ("gzip magic only", b"\x1f\x8b", None, "truncated or corrupt gzip"),
        ("empty file", b"", False, "empty file"),
        ("plain text", b"hello, this is not a trace\n", False, "not valid JSON"),
        ("binary garbage", bytes(range(256)) * 4, False, "not valid JSON"),
        ("gzipped text", b"not json at all", True, "not valid JSON"),
        ("JSON object", {"loss": [2.3, 2.1]}, False, "not a Chrome/Kineto trace"),
        ("JSON list of numbers", [1, 2, 3], False, "not a Chrome/Kineto trace"),
        ("JSON string", "trace", False, "not a Chrome/Kineto trace"),
        ("traceEvents not a list", {"traceEvents": {"ph": "X"}}, False, "traceEvents is not a list"),
        ("traceEvents of numbers", {"traceEvents": [1, 2, 3]}, False, "cannot be read"),
        ("traceEvents empty", {"traceEvents": []}, False, "no events"),
        ("events without a phase", {"traceEvents": [{"foo": 1}, {"bar": 2}]}, False, "no timed events"),
        (
            "metadata only",
            {"traceEvents": [e for e in doc(TRACES[0])["traceEvents"] if e["ph"] == "M"]},
            False,
            "no timed events",
        ),
        ("number out of range", b'{"traceEvents": [{"ph": "X", "ts": 1e999}]}', False, "cannot be read"),
    ]


@pytest.mark.parametrize(("label", "content", "gz", "problem"), _cases(), ids=[c[0] for c in _cases()])
def test_an_unreadable_trace_is_one_clear_error_naming_it(tmp_path, capsys, label, content, gz, problem) -> None:
    name = "rank0.1.pt.trace.json" + (".gz" if gz is not False else "")
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if gz is True else data)
    line = one_error_line(capsys, path)
    assert str(path) in line and problem in line, line
    # the same file in a folder with nothing else: the folder fails with the file's own message
    assert problem in one_error_line(capsys, tmp_path)


def test_a_lying_gzip_size_trailer_does_not_allocate_gigabytes(tmp_path) -> None:
    # The loader sizes its buffer from the gzip trailer; one saying 4 GiB must not make it allocate 4 GiB.
    data = bytearray(TRACES[0].read_bytes())
    data[-4:] = b"\xff\xff\xff\xff"
    path = tmp_path / "rank0.1.pt.trace.json.gz"
    path.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="truncated or corrupt gzip"):  # the size check fails at the end
            load(path, workers=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20


def test_folders_without_traces(tmp_path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no trace files" in one_error_line(capsys, empty)
    other = tmp_path / "other"
    other.mkdir()
    (other / "README.md").write_text("notes")
    (other / "loss.csv").write_text("step,loss\n1,2.3\n")
    assert "no trace files" in one_error_line(capsys, other)
    parent = tmp_path / "runs"
    copy_fixture(parent / "exp1")
    line = one_error_line(capsys, parent)
    assert "no trace files" in line and "exp1" in line  # points at the folder that has them


def test_a_run_that_ended_before_its_window_says_so_not_no_trace_files(tmp_path, capsys) -> None:
    """A traced job of 6 steps whose window starts at step 8 (--wait 5 --warmup 2): the manifest's note and the
    steps it ran, not "no trace files in this folder"."""
    import json

    from ddpdoctor.capture import manifest
    from ddpdoctor.load import discover

    assert discover.BEFORE_WINDOW == manifest.BEFORE_WINDOW
    run = tmp_path / "run"
    run.mkdir()
    note = manifest.before_window_note([{"rank": 0, "status": "ok", "steps": 6}], {"wait": 5, "warmup": 2})
    ranks = [{"rank": r, "status": "ok", "steps": 6} for r in (0, 1)]
    (run / "manifest.json").write_text(json.dumps({"notes": [note], "ranks": ranks}))
    line = one_error_line(capsys, run)
    assert "the run ended before the profiled window (it starts at step 8): no trace was recorded" in line, line
    assert "the job ran 6 steps; lower --wait/--warmup or run more steps" in line, line
    (run / "manifest.json").write_text("{not json")  # an unreadable manifest: the plain error, no traceback
    assert "no trace files" in one_error_line(capsys, run)


def test_missing_path(tmp_path, capsys) -> None:
    assert "no such file" in one_error_line(capsys, tmp_path / "nope")


def test_control_characters_in_a_file_name_are_shown_escaped(tmp_path, capsys) -> None:
    path = tmp_path / "rank0.\x1b[31mred\x1b]0;title\x07.pt.trace.json"
    path.write_bytes(b"")
    line = one_error_line(capsys, path)
    assert "\x1b" not in line and "\x07" not in line
    assert "\\x1b[31mred\\x1b]0;title\\x07" in line and "empty file" in line


def test_a_file_name_that_is_not_utf8(tmp_path, capsys) -> None:
    folder = copy_fixture(tmp_path / "run", ranks=(0,))
    (folder / "rank1.\udcff.pt.trace.json").write_bytes(b"{")  # the bytes b"\xff" in the name
    out = report(capsys, folder)
    assert [s for s in out["run"]["skipped"] if "\\udcff" in s and "not valid JSON" in s]


# --------------------------------------------------------------------- the rest is used, the bad is listed
def test_bad_files_beside_good_ones_are_skipped_and_listed_in_every_format(tmp_path, capsys) -> None:
    folder = copy_fixture(tmp_path / "run")
    good = gzip.decompress(TRACES[0].read_bytes())
    write(folder, "rank2.1.pt.trace.json", good[:1000])
    write(folder, "rank3.1.pt.trace.json.gz", TRACES[0].read_bytes()[:3000])
    doc_ = report(capsys, folder)
    assert doc_["run"]["world_size"] == 2 and [r["rank"] for r in doc_["ranks"]] == [0, 1]
    skipped = doc_["run"]["skipped"]
    assert len(skipped) == 2
    assert any("rank2.1.pt.trace.json" in s and "not valid JSON" in s for s in skipped)
    assert any("rank3.1.pt.trace.json.gz" in s and "gzip" in s for s in skipped)
    for fmt, heading in (
        ("text", "Skipped (2)"),
        ("markdown", "## Skipped (2)"),
        ("html", "<h2>Skipped (2)</h2>"),
    ):
        code, out, _ = diagnose(capsys, folder, "--format", fmt)
        assert code == 0 and heading in out and "rank3.1.pt.trace.json.gz" in out


def test_when_no_file_can_be_read_the_error_counts_them(tmp_path, capsys) -> None:
    write(tmp_path, "rank0.1.pt.trace.json", b"")
    write(tmp_path, "rank1.1.pt.trace.json", b"[")
    line = one_error_line(capsys, tmp_path)
    assert "none of its 2 trace files could be read" in line and "rank0.1.pt.trace.json: empty file" in line


def test_no_profiler_step_the_whole_window_is_one_step(tmp_path, capsys) -> None:
    """No ProfilerStep#N range and no optimizer step to tell the steps by (test_optimizer_steps.py: with them)."""
    folder = tmp_path / "nostep"
    for src in TRACES:
        d = doc(src)
        d["traceEvents"] = [
            e for e in d["traceEvents"] if not str(e.get("name", "")).startswith(("ProfilerStep#", "Optimizer.step#"))
        ]
        write(folder, src.name, d, gz=True)
    out = report(capsys, folder)
    assert out["run"]["steps_analyzed"] == 2  # two profiled windows per rank, one step each
    assert any("ProfilerStep" in n and "one step" in n for n in out["run"]["notes"])
    assert all(r["step_ms"]["median"] and r["step_ms"]["median"] > 50 for r in out["ranks"])  # a window, not 0


def test_no_profiler_step_the_optimizers_tell_the_steps(tmp_path, capsys) -> None:
    """The recorded 2-rank run without its ProfilerStep#N ranges: steps from one optimizer step's end to the next
    (2 spans x 3 optimizer steps a rank: 2 x 2 steps), timed about as the profiler's own steps time them."""
    folder = tmp_path / "optimizer"
    for src in TRACES:
        d = doc(src)
        assert sum(e.get("name") == "Optimizer.step#SGD.step" for e in d["traceEvents"]) == 3
        d["traceEvents"] = [e for e in d["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
        write(folder, src.name, d, gz=True)
    out, stepped = report(capsys, folder), report(capsys, FIXTURE)
    assert out["run"]["steps_analyzed"] == 4
    assert any("from the end of one optimizer step" in n for n in out["run"]["notes"])
    for mine, theirs in zip(out["ranks"], stepped["ranks"], strict=True):
        assert mine["step_ms"]["median"] == pytest.approx(theirs["step_ms"]["median"], rel=0.2)
        assert mine["comm_ms"] == pytest.approx(theirs["comm_ms"], rel=0.2)


def test_no_rank_information_ranks_are_numbered_in_file_order(tmp_path, capsys) -> None:
    folder = tmp_path / "norank"
    for src in TRACES:
        d = doc(src)
        del d["distributedInfo"]
        write(folder, src.name.replace("rank0", "hostA_11").replace("rank1", "hostB_22"), d, gz=True)
    run = load(folder, workers=1)
    assert run.rank_source == "order" and [r.rank for r in run.ranks] == [0, 1]
    assert [len(r.files) for r in run.ranks] == [2, 2] and "hostA_11" in run.ranks[0].files[0]
    out = report(capsys, folder)
    assert any("file-name order" in n for n in out["run"]["notes"])
    # rank in the file name but not in the trace: taken from the name, nothing to note
    named = tmp_path / "named"
    for src in TRACES:
        d = doc(src)
        del d["distributedInfo"]
        write(named, src.name, d, gz=True)
    assert load(named, workers=1).rank_source == "filename"
    assert report(capsys, named)["run"]["notes"] == []


def test_ranks_missing_from_the_world_size_are_named(tmp_path, capsys) -> None:
    folder = tmp_path / "world4"
    for src in TRACES:
        d = doc(src)
        d["distributedInfo"]["world_size"] = 4
        write(folder, src.name, d, gz=True)
    out = report(capsys, folder)
    assert out["run"]["world_size"] == 4 and len(out["ranks"]) == 2
    assert any("no traces of rank(s) 2-3" in n for n in out["run"]["notes"])
    code, text, _ = diagnose(capsys, folder)
    assert code == 0 and "no traces of rank(s) 2-3" in text


def test_ranks_of_different_runs_are_refused(tmp_path, capsys) -> None:
    sizes = tmp_path / "sizes"
    for src in TRACES:
        d = doc(src)
        if src.name.startswith("rank1"):
            d["distributedInfo"]["world_size"] = 8
        write(sizes, src.name, d, gz=True)
    line = one_error_line(capsys, sizes)
    assert "different runs" in line and "world size 2 in rank0." in line and "world size 8 in rank1." in line

    later = tmp_path / "later"  # the same job, run again a day later: rank 1's traces come from the rerun
    for src in TRACES:
        d = doc(src)
        if src.name.startswith("rank1"):
            d["baseTimeNanoseconds"] += 86_400 * 10**9
        write(later, src.name, d, gz=True)
    line = one_error_line(capsys, later)
    assert "different runs" in line and "minutes apart" in line and "rank1." in line


def test_clock_skew_between_hosts_is_not_a_different_run(tmp_path, capsys) -> None:
    folder = tmp_path / "skew"
    for src in TRACES:
        d = doc(src)
        if src.name.startswith("rank1"):
            d["baseTimeNanoseconds"] += 90 * 10**9  # rank 1's host clock 90 s ahead
        write(folder, src.name, d, gz=True)
    out = report(capsys, folder)
    assert [r["rank"] for r in out["ranks"]] == [0, 1] and out["run"]["skipped"] == []


def test_duplicate_ranks_keep_one_and_list_the_other(tmp_path, capsys) -> None:
    folder = copy_fixture(tmp_path / "dup")
    for src in TRACES[:2]:  # rank 0's traces again, under another worker name
        shutil.copy(src, folder / src.name.replace("rank0", "copy_of_rank_zero"))
    clean = report(capsys, copy_fixture(tmp_path / "clean"))
    out = report(capsys, folder)
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["run"]["steps_analyzed"] == clean["run"]["steps_analyzed"]  # not counted twice
    assert out["ranks"] == clean["ranks"]
    (skip,) = out["run"]["skipped"]
    assert "copy_of_rank_zero" in skip and "rank 0 again" in skip


def test_a_trace_beside_its_gzipped_copy_is_read_once(tmp_path, capsys) -> None:
    folder = copy_fixture(tmp_path / "both")
    write(folder, TRACES[0].name.removesuffix(".gz"), gzip.decompress(TRACES[0].read_bytes()))
    run = load(folder, workers=1)
    assert [len(r.files) for r in run.ranks] == [2, 2]
    (skip,) = run.skipped
    assert "same time as" in skip and TRACES[0].name in skip


def test_one_worker_name_for_every_rank(tmp_path) -> None:
    # tensorboard_trace_handler(dir, worker_name="trainer") on every rank: the ranks come from distributedInfo
    folder = tmp_path / "same_name"
    for src in TRACES:
        write(folder, f"trainer.{src.name.split('.')[1]}.pt.trace.json", doc(src))
    run = load(folder, workers=1)
    assert [r.rank for r in run.ranks] == [0, 1] and [len(r.files) for r in run.ranks] == [2, 2]
    assert run.skipped == [] and run.rank_source == "distributedInfo"


def test_a_restarted_rank_is_one_rank_with_more_spans(tmp_path) -> None:
    # two processes reporting rank 0 at different times (a restart): spans of one rank, nothing skipped
    folder = tmp_path / "restart"
    rank0 = [src for src in TRACES if src.name.startswith("rank0")]
    for i, src in enumerate(rank0):
        d = doc(src)
        write(folder, f"host_{100 + i}.{i}.pt.trace.json", d)
    run = load(folder, workers=1)
    assert [r.rank for r in run.ranks] == [0] and len(run.ranks[0].files) == 2 and run.skipped == []


# ----------------------------------------------------------------------------------------- old and new torch
def _as_torch_1_9(d: dict[str, Any]) -> dict[str, Any]:
    """The trace as torch 1.9's Kineto wrote it: capitalised categories, epoch-µs timestamps, string tids, no
    baseTimeNanoseconds or distributedInfo."""
    base_us = d.pop("baseTimeNanoseconds") // 1000
    for key in ("distributedInfo", "trace_id", "displayTimeUnit", "record_shapes", "profile_memory"):
        d.pop(key, None)
    rename = {"cpu_op": "Operator", "user_annotation": "Operator", "fwdbwd": "async", "Trace": "Trace"}
    for e in d["traceEvents"]:
        if "cat" in e:
            e["cat"] = rename.get(e["cat"], e["cat"])
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + base_us
        if e.get("ph") == "X" and isinstance(e.get("tid"), int):
            e["tid"] = str(e["tid"])
    return d


def _as_future_torch(d: dict[str, Any]) -> dict[str, Any]:
    """The trace with what a newer torch might add: unknown top-level keys, event fields, phases and
    categories, numbers written as strings."""
    d["schemaVersion"] = 99
    d["new_top_level_field"] = {"nested": [1, 2, {"x": None}]}
    events = d["traceEvents"]
    pid = next(e["pid"] for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    for i, e in enumerate(events):
        e["future_field"] = [i, "x"]
        if e.get("ph") == "X" and i % 7 == 0:
            e["ts"] = repr(e["ts"])  # a number as a string
            e["dur"] = repr(e["dur"])
    ts = events[-1]["ts"] if isinstance(events[-1]["ts"], float) else 0.0
    events += [
        {"ph": "b", "cat": "future_async", "name": "a", "id2": {"local": 1}, "pid": pid, "tid": 1, "ts": ts},
        {"ph": "e", "cat": "future_async", "name": "a", "id2": {"local": 1}, "pid": pid, "tid": 1, "ts": ts},
        {"ph": "C", "name": "counter", "pid": pid, "ts": ts, "args": {"value": 3}},
        {"ph": "P", "name": "sample", "pid": pid, "tid": 1, "ts": ts},
        {"ph": "O", "name": "snapshot", "id": "0x1", "pid": pid, "ts": ts, "args": {"snapshot": {}}},
        {"ph": "R", "name": "mark", "pid": pid, "tid": 1, "ts": ts},
        {"ph": "i", "s": "g", "name": "instant", "pid": pid, "tid": 1, "ts": ts, "args": {"new": True}},
    ]
    return d


def _converted(tmp_path: Path, convert) -> Path:
    folder = tmp_path / "converted"
    for src in TRACES:
        write(folder, src.name, convert(doc(src)), gz=True)
    return folder


@pytest.mark.parametrize("era", ["torch 1.9", "future torch"])
def test_traces_of_old_and_new_torch_load_to_the_same_frames(tmp_path, capsys, era) -> None:
    folder = _converted(tmp_path, _as_torch_1_9 if era == "torch 1.9" else _as_future_torch)
    now, then = load(FIXTURE, workers=1), load(folder, workers=1)
    assert [r.rank for r in then.ranks] == [0, 1] and then.skipped == [] and then.notes == []
    for a, b in zip(now.ranks, then.ranks, strict=True):
        assert len(a.ops) == len(b.ops) and list(a.steps["step"]) == list(b.steps["step"])
        assert list(a.comm_ops["name"]) == list(b.comm_ops["name"])
        assert (a.steps["dur_us"].to_numpy() == b.steps["dur_us"].to_numpy()).all()
        assert set(b.ops["cat"].unique()) <= {"cpu_op", "user_annotation", "python_function", "cuda_runtime"}
    expected = report(capsys, copy_fixture(tmp_path / "modern"))
    got = report(capsys, folder)
    keys = ("comm_ms", "dataloader_ms", "forward_ms")
    for r_now, r_then in zip(expected["ranks"], got["ranks"], strict=True):
        assert r_then["step_ms"]["median"] == pytest.approx(r_now["step_ms"]["median"], abs=1e-3)
        assert [r_then[k] for k in keys] == pytest.approx([r_now[k] for k in keys], abs=1e-3)
    if era == "future torch":  # nothing a newer torch adds changes a number
        for r_now, r_then in zip(expected["ranks"], got["ranks"], strict=True):
            for key, value in r_now.items():
                if isinstance(value, float):
                    assert r_then[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
        assert [f["name"] for f in got["findings"]] == [f["name"] for f in expected["findings"]]


def test_torch_1_9_cpu_ddp_overlap_matches_the_modern_trace(tmp_path, capsys) -> None:
    expected = report(capsys, copy_fixture(tmp_path / "modern"))
    got = report(capsys, _converted(tmp_path, _as_torch_1_9))
    # torch 1.9 wrote record_function ranges with category "Operator". ProfilerStep#N and DataLoader ranges are
    # kept out of CPU compute by name; DistributedDataParallel.forward and Optimizer.step# still count as compute
    # and also cover the Python gaps between their ops, so overlap may differ by up to 1 percentage point.
    assert [r["overlap_ratio"] for r in got["ranks"]] == pytest.approx(
        [r["overlap_ratio"] for r in expected["ranks"]], abs=0.01
    )
    assert {f["name"] for f in got["findings"]} == {f["name"] for f in expected["findings"]}


# ---------------------------------------------------------------------------------------------- huge files
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_large_trace_is_decoded_in_chunks_within_twice_its_size(tmp_path, monkeypatch, gz) -> None:
    """A trace is decoded in ~1 MB chunks of typed events, never as one Python dict per event: peak memory
    stays near the file's JSON text (``json.loads`` needs ~6x)."""
    chunks = []
    real_decode = decode._decode_chunk
    monkeypatch.setattr(decode, "_decode_chunk", lambda chunk: chunks.append(len(chunk)) or real_decode(chunk))
    n = 60_000
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i % 40}",
            "pid": 7,
            "tid": 7 + i % 3,
            "ts": 1e3 + 10 * i,
            "dur": 5.0,
            "args": {"External id": i, "Input Dims": [[32, 256]], "Input type": ["float"]},
        }
        for i in range(n)
    ]
    events += [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{s}",
            "pid": 7,
            "tid": 7,
            "ts": 1e3 + s * n,
            "dur": n - 1.0,
        }
        for s in range(10)
    ]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()
    del events
    path = write(tmp_path, "rank0.1.pt.trace.json" + (".gz" if gz else ""), text, gz=gz)
    tracemalloc.start()
    try:
        run = load(path, workers=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(run.ranks[0].ops) == n + 10 and list(run.ranks[0].steps["step"]) == list(range(10))
    assert len(chunks) >= len(text) // decode.CHUNK_BYTES and max(chunks) < 2 * decode.CHUNK_BYTES
    assert peak < 2 * len(text), (peak, len(text))


def _renumbered(folder: Path, shift: int) -> Path:
    """The recorded run with rank 1's ProfilerStep#N ranges numbered N + ``shift`` (as if its profiler's schedule
    had waited ``shift`` steps longer than rank 0's)."""
    for src in TRACES:
        d = doc(src)
        if src.name.startswith("rank1"):
            for e in d["traceEvents"]:
                name = str(e.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + shift}"
        write(folder, src.name, d, gz=True)
    return folder


def test_ranks_profiled_at_different_steps_are_not_matched(tmp_path, capsys) -> None:
    """Windows that share no step: nothing across ranks is measured, the report says why (not "no collective
    communication was found"), and an exposed time that includes waiting says it is an upper bound."""
    from ddpdoctor.metrics import analyze

    folder = _renumbered(tmp_path / "apart", 100)
    m = analyze(load(folder, workers=1))
    assert m.run["ranks_unmatched"] == 2
    assert all(r["collective_wait_ms"] is None and r["exposed_transfer_ms"] is None for r in m.ranks)
    assert all(r["comm_ms"] for r in m.ranks)  # each rank's own communication is still timed
    out = report(capsys, folder)
    (note,) = [n for n in out["run"]["notes"] if "profiled at different steps" in n]
    assert note.startswith("ranks 0-1: no collective of their analysed steps was recorded by another rank")
    reasons = {e["name"]: e["reason"] for e in out["not_evaluated"]}
    assert "the ranks were profiled at different steps" in reasons["rank-straggler"]
    assert "no collective communication was found" not in reasons["rank-straggler"]
    for finding in out["findings"]:
        if finding["name"] == "poor-comm-compute-overlap":
            assert "matched no other rank's" in finding["message"]


@pytest.mark.parametrize("shift", [0, 1])
def test_ranks_whose_windows_overlap_are_matched(tmp_path, capsys, shift) -> None:
    """The recorded run as it is, and with rank 1's steps one behind: the steps both analysed match."""
    from ddpdoctor.metrics import analyze

    m = analyze(load(_renumbered(tmp_path / "near", shift), workers=1))
    assert m.run["ranks_unmatched"] == 0
    assert all(r["collective_wait_ms"] is not None for r in m.ranks)
    assert not any("profiled at different steps" in n for n in m.run.get("notes", []))
