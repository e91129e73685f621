"""The decoder's fast way (traceEvents located without a whole-document pass, chunks decoded in place) gives
what the plain way (the document validated first) gives, or hands over to it: same columns, same interned
tables, same error, and the file's bytes as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ddpdoctor.errors import TraceError
from ddpdoctor.load import columns, decode
from ddpdoctor.load.readfile import read_bytes

_FAST = decode._decode_fast


def _event(i: int, **extra: Any) -> dict[str, Any]:
    event = {
        "ph": "X",
        "cat": ["cpu_op", "kernel", "cuda_runtime"][i % 3],
        "name": f"op{i % 7}" if i % 11 else "nccl:all_reduce",
        "pid": 1,
        "tid": 2 + i % 2,
        "ts": 10.0 * i,
        "dur": 5.0,
        "args": {"External id": i, "correlation": i, "Input Dims": [[i, 2]], "Input type": ["float"]},
    }
    event.update(extra)
    return event


def _events(n: int = 300) -> list[dict[str, Any]]:
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}}]
    events += [_event(i) for i in range(n)]
    events += [
        {"ph": "s", "id": i, "pid": 1, "tid": 2, "ts": 10.0 * i, "cat": "ac2g", "name": "ac2g"} for i in range(5)
    ]
    events.append(
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 1.0, "args": {"Bytes": 4, "Total Allocated": 8}}
    )
    events.append(
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": 1, "ts": 0, "dur": 9e3}
    )
    return events


def _document(before: dict[str, Any], events: list[dict[str, Any]], after: dict[str, Any], indent: int | None = 1):
    """A trace with the keys of ``before``, traceEvents, then the keys of ``after``, in that order."""
    head = json.dumps(before, indent=indent)[:-1].rstrip()
    if before:
        head += ","
    text = head + '\n "traceEvents": ' + json.dumps(events, indent=indent)
    tail = json.dumps(after, indent=indent)[1:].lstrip()
    return text + ("," + tail if after else "}")


def _values(column: np.ndarray) -> tuple[str, list[Any]]:
    return str(column.dtype), [None if v != v else v for v in column.tolist()]  # NaN equal to NaN


def _state(out: columns.FileColumns, tables: columns.RankTables) -> dict[str, Any]:
    return {
        "x": {k: _values(out.column("x", k, None)) for k in out.x},
        "mem": {k: _values(out.column("mem", k, None)) for k in out.mem},
        "comm": out.comm_rows,
        "header": (out.distributed_info, out.device_properties, out.base_time_ns, out.window),
        "meta": (out.thread_names, out.process_labels, out.n_x, out.n_events, out.bad_times),
        "tables": (tables.names.names(), tables.names.flags, tables.cats.names(), dict(tables.strings)),
    }


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, bool]:
    """(fast result, plain result, whether the fast way decoded it): a state or the error's message."""
    taken = []

    def spy(*args: Any) -> Any:
        out = _FAST(*args)
        taken.append(out is not None)
        return out

    results = []
    for fast in (spy, lambda *args: None):
        monkeypatch.setattr(decode, "_decode_fast", fast)
        tables = columns.RankTables()
        tables.names.code("seen before")  # a rank's tables already hold another file's names
        try:
            results.append(_state(decode.decode_file(path, tables), tables))
        except TraceError as exc:
            results.append((str(exc), _state(columns.FileColumns(path=""), tables)["tables"]))
    return results[0], results[1], taken[0]


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "rank0.1.pt.trace.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


KINETO = ({"schemaVersion": 1, "deviceProperties": [{"id": 0}], "distributedInfo": {"rank": 0}}, {"traceName": "t"})
LAYOUTS = {
    "kineto": KINETO,
    "info array after (HTA)": (KINETO[0], {"INFO": ["a]", "b"], "traceName": "x", "baseTimeNanoseconds": 7}),
    "objects after": (
        {"schemaVersion": 1},
        {"deviceProperties": [{"id": 0}, {"id": 1}], "distributedInfo": {"rank": 1}},
    ),
    "keys before and after": (KINETO[0], {"distributedInfo": {"rank": 3}, "traceName": "t"}),
    "a key named traceEvents inside": ({"meta": {"traceEvents": 1}, "note": 'say "traceEvents": ['}, {"x": []}),
    "nothing around": ({}, {}),
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
@pytest.mark.parametrize("indent", [1, None], ids=["indented", "minified"])
@pytest.mark.parametrize("chunk", [1 << 20, 2000], ids=["one chunk", "many chunks"])
def test_the_fast_way_decodes_what_the_plain_way_decodes(tmp_path, monkeypatch, layout, indent, chunk) -> None:
    monkeypatch.setattr(decode, "CHUNK_BYTES", chunk)
    before, after = LAYOUTS[layout]
    fast, plain, taken = _both(_write(tmp_path, _document(before, _events(), after, indent)), monkeypatch)
    assert fast == plain
    assert fast["meta"][2] > 0 and fast["comm"] and fast["mem"]["ts"][1] and fast["header"][3] is not None
    assert taken or layout == "objects after"  # there the events' end is not told from the text after them


@pytest.mark.parametrize(
    "events",
    [
        [_event(1)],
        [_event(i, name="a }, { b" if i == 40 else "op") for i in range(400)],  # a cut inside a string
        [_event(i, args={"nested": [{"a": 1}, {"b": 2}]}) for i in range(200)],  # ... inside a nested value
        [_event(i, ph=["X", "Z", 5][i % 3]) for i in range(200)],  # phases the strict decoder refuses
        [_event(i, ts="12" if i % 50 else "x", pid=str(i % 3)) for i in range(200)],  # strings for numbers
    ],
    ids=["one event", "cut in a string", "cut in a nested value", "odd phases", "strings for numbers"],
)
def test_events_that_need_the_slower_ways_give_the_same(tmp_path, monkeypatch, events) -> None:
    monkeypatch.setattr(decode, "CHUNK_BYTES", 1500)
    fast, plain, _ = _both(_write(tmp_path, _document(*KINETO[:1], events, KINETO[1])), monkeypatch)
    assert fast == plain


@pytest.mark.parametrize(
    "text",
    [
        _document(*KINETO[:1], _events(), KINETO[1]).replace('"traceName": "t"', '"traceName": t'),  # after
        _document(*KINETO[:1], _events(), KINETO[1]).replace('"op3"', '"op3', 1),  # inside the events
        _document(*KINETO[:1], _events(), KINETO[1]).replace('"ts": 1000.0', '"ts": 1e999', 1),  # a number
        _document(*KINETO[:1], _events(), KINETO[1]).replace('"rank": 0', '"rank": [0', 1),  # before
        _document(*KINETO[:1], _events(), {"traceEvents": []}),  # the key twice
        '{"traceEvents": {"ph": "X"}}',
        '{"traceEvents": []}',
        "[" + json.dumps(_event(1)) + "]",  # the JSON array format
    ],
    ids=["bad after", "bad inside", "number out of range", "bad before", "key twice", "not a list", "empty", "array"],
)
def test_a_broken_document_is_told_as_the_plain_way_tells_it(tmp_path, monkeypatch, text) -> None:
    monkeypatch.setattr(decode, "CHUNK_BYTES", 2000)
    fast, plain, _ = _both(_write(tmp_path, text), monkeypatch)
    assert fast == plain


def test_the_file_text_is_as_it_was_after_the_fast_way(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(decode, "CHUNK_BYTES", 1500)
    good = _document(*KINETO[:1], _events(), KINETO[1], indent=None)
    bad = good.replace('"op5"', '"op5', 1)
    for text in (good, bad):
        data = read_bytes(_write(tmp_path, text))
        copy = bytes(data)
        decode._decode_fast(Path("x"), data, columns.RankTables())
        assert bytes(data) == copy


def test_the_fast_way_reads_real_traces(monkeypatch) -> None:
    """Every real trace here is decoded the fast way, to the same columns as the plain way."""
    root = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
    for path in sorted(root.glob("*.pt.trace.json*"))[:2]:
        fast, plain, taken = _both(path, monkeypatch)
        assert taken and fast == plain
        assert fast["x"]["ts"][0] == "float64" and None not in fast["x"]["ts"][1]


# issue 23, item 15: the shapes that fell to the plain way (a copy of the text, one object per event)
@pytest.mark.parametrize(
    "text",
    [
        json.dumps(_events()),  # Chrome's JSON array format
        " \n" + json.dumps(_events(), indent=1) + "\n",
        _document(*KINETO[:1], [_event(i, name=f"a }},{{ b{i % 3}") for i in range(400)], KINETO[1], indent=None),
        _document(*KINETO[:1], [_event(i, name="x},{y") for i in range(400)], KINETO[1], indent=None),
        _document(*KINETO[:1], [_event(i, args={"nested": [{"a": 1}, {"b": 2}]}) for i in range(400)], KINETO[1]),
    ],
    ids=["array", "array with spaces", "names with }, {", "every name with },{", "nested objects"],
)
def test_the_array_format_and_cuts_inside_strings_are_decoded_the_fast_way(tmp_path, monkeypatch, text) -> None:
    monkeypatch.setattr(decode, "CHUNK_BYTES", 1500)
    fast, plain, taken = _both(_write(tmp_path, text), monkeypatch)
    assert taken and fast == plain


@pytest.mark.parametrize(
    "text",
    ["[]", "[1, 2]", '[{"a": 1}]', '[{"ph": "Z"}]', "[" + json.dumps(_event(1)) + "] x", "[" + json.dumps(_event(1))],
    ids=["empty", "numbers", "no phase", "odd phase", "text after", "no end"],
)
def test_arrays_that_are_not_traces_are_told_as_the_plain_way_tells_them(tmp_path, monkeypatch, text) -> None:
    fast, plain, _ = _both(_write(tmp_path, text), monkeypatch)
    assert fast == plain
