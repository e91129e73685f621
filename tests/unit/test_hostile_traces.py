"""Trace files built to break the loader (issue 13, items 13-15): a step number of 400 digits, JSON nested
10,000 deep, timestamps that are not numbers and negative durations, a gzip bomb. Each is one clear line
(exit 2) when it is the only file, and is skipped (or its bad events are) with a note when good files are
beside it: one bad file never aborts the others."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib

import pytest
from test_bad_traces import TRACES, copy_fixture, doc, one_error_line, report, write

from ddpdoctor.cli import main
from ddpdoctor.errors import TraceError
from ddpdoctor.load import load, readfile

DEEP = b'{"traceEvents": [' + b"[" * 10_000 + b"]" * 10_000 + b"]}"
RANK1 = [p for p in TRACES if p.name.startswith("rank1")][0]


def _with_rank1(tmp_path, edit) -> tuple:
    folder = copy_fixture(tmp_path / "run")
    d = doc(RANK1)
    edit(d)
    write(folder, RANK1.name, json.dumps(d).encode(), gz=True)
    return folder


# ---------------------------------------------------------------------------------------------- item 13
def test_a_400_digit_step_number_is_not_a_step(tmp_path, capsys) -> None:
    def edit(d):
        for e in d["traceEvents"]:
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                e["name"] = "ProfilerStep#" + "9" * 400
                break

    out = report(capsys, _with_rank1(tmp_path, edit))
    assert [r["rank"] for r in out["ranks"]] == [0, 1]


def test_json_nested_10000_deep_is_one_line_alone(tmp_path, capsys) -> None:
    path = write(tmp_path, "rank0.1.pt.trace.json", DEEP)
    line = one_error_line(capsys, path)
    assert "nested too deeply" in line and str(path) in line


def test_json_nested_10000_deep_beside_good_files_is_skipped(tmp_path, capsys) -> None:
    folder = copy_fixture(tmp_path / "run")
    write(folder, "rank2.1.pt.trace.json.gz", DEEP, gz=True)
    out = report(capsys, folder)
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert any("rank2.1.pt.trace.json.gz" in s and "nested too deeply" in s for s in out["run"]["skipped"])


def test_a_deeply_nested_baseline_is_one_line(tmp_path, capsys) -> None:
    base = tmp_path / "b.json"
    nested = b"[" * 10_000 + b"]" * 10_000
    base.write_bytes(b'{"kind": "ddpdoctor-baseline", "schema_version": 1, "x": ' + nested + b"}")
    capsys.readouterr()
    code = main(["gate", str(copy_fixture(tmp_path / "run")), "--baseline", str(base)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1 and "b.json" in err


# ---------------------------------------------------------------------------------------------- item 14
@pytest.mark.parametrize(
    "field,value,why",
    [
        ("ts", "not a time", "timestamp"),
        ("ts", None, "timestamp"),
        ("dur", "soon", "duration"),
        ("dur", -66_900.0, "negative duration"),
    ],
)
def test_events_with_unreadable_times_are_skipped_and_noted(tmp_path, capsys, recwarn, field, value, why) -> None:
    def edit(d):
        steps = [e for e in d["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
        steps[1][field] = value

    out = report(capsys, _with_rank1(tmp_path, edit))
    said = out["run"]["skipped"] + out["run"]["notes"]
    assert any(RANK1.name in s and "1 event" in s and why in s for s in said), said
    step_ms = [r["step_ms"]["median"] for r in out["ranks"]]
    assert all(v is not None and v > 0 for v in step_ms), step_ms  # no 0 ms or negative steps
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


# ---------------------------------------------------------------------------------------------- item 15
def _bomb(size: int, head: bytes = b"") -> bytes:
    """A gzip member of ``head`` + ``size`` zero bytes, built without holding them."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [comp.compress(head)]
    block = bytes(1 << 20)
    for _ in range(size // len(block)):
        parts.append(comp.compress(block))
    parts.append(comp.flush())
    return b"".join(parts)


def test_a_gzip_bomb_of_zeros_fails_at_the_first_bytes(tmp_path) -> None:
    path = tmp_path / "rank0.1.pt.trace.json.gz"
    path.write_bytes(_bomb(1 << 30))  # 1 GiB of zeros in ~1 MB
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="not valid JSON"):
            load(path, workers=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20


def test_a_gzip_bomb_that_starts_like_json_is_bounded(tmp_path) -> None:
    path = tmp_path / "rank0.1.pt.trace.json.gz"
    path.write_bytes(_bomb(1 << 30, head=b'{"traceEvents": [' + b" " * 100))
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="more than 128 times"):
            load(path, workers=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * max(128 * path.stat().st_size, readfile.GZIP_MIN_LIMIT) + 64 * 2**20


def test_real_traces_are_well_under_the_bound() -> None:
    for p in TRACES:
        assert len(gzip.decompress(p.read_bytes())) < readfile.GZIP_MAX_RATIO * p.stat().st_size / 4
