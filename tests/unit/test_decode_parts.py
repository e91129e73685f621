"""One large trace file decoded in parts by forked processes (``decode._decode_parts``) gives what decoding it in
this process gives: the same columns, the same interned tables (codes in the same order), the same header and
notes; and where a part cannot be decoded or merged exactly, the file is read the other way, with the same result.

pytest has torch imported, where ``load.forked`` does not fork; these tests allow it (the forked processes only
decode JSON) and make every file "large" and the machine two cores."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from test_decode_fast import KINETO, _document, _event, _events, _state, _write

from ddpdoctor.errors import TraceError
from ddpdoctor.load import columns, decode, forked


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Files from 2 kB up are decoded in parts; how many parts each decoding used is appended to the list."""
    monkeypatch.setattr(forked, "fork_context", lambda: multiprocessing.get_context("fork"))
    monkeypatch.setattr(decode, "PARTS_MIN_BYTES", 2000)
    monkeypatch.setattr(decode, "CHUNK_BYTES", 1500)  # and several chunks in each part
    monkeypatch.setattr(forked, "cores", lambda: 2)
    used: list[int] = []
    split = decode._part_bounds

    def spy(*args: Any) -> list[tuple[int, int]]:
        bounds = split(*args)
        used.append(len(bounds))
        return bounds

    monkeypatch.setattr(decode, "_part_bounds", spy)
    return used


def _decoded(path: Path) -> Any:
    tables = columns.RankTables()
    tables.names.code("seen before")  # a rank's tables already hold another file's names
    tables.strings["Spans"] = -1  # ... and a pid string
    try:
        return _state(decode.decode_file(path, tables), tables)
    except TraceError as exc:
        return str(exc)


def _in_one_process(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(decode, "_decode_parts", lambda *args: None)
        return _decoded(path)


def _strings_in_every_part(n: int = 400) -> list[dict[str, Any]]:
    # each quarter meets its own pid strings, in another order than the one before: whether a part's numbering
    # agrees with one process's depends on which parts its process decoded before (exact merge, or the other way)
    names = ["A", "B", "C", "D"]
    return [_event(i, pid=names[(i // 100 + i % 7) % 4] if i % 10 == 3 else 1) for i in range(n)]


CASES = {
    "kineto": (_events(400), True),
    # metadata in both halves: a thread's real name after its "(python)" one, and the other way round
    "thread names": (
        [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "thread 2 (python)"}}]
        + _events(400)
        + [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "pt_main_thread"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 3, "args": {"name": "thread 3 (python)"}},
            {"ph": "M", "name": "process_labels", "pid": 1, "tid": 0, "args": {"labels": "GPU 0"}},
        ],
        True,
    ),
    # new names and categories only in the second half, a window only there, bad durations in both halves
    "late names": (
        [_event(i, dur=-2.0 if i == 7 else 5.0) for i in range(200)]
        + [_event(i, name=f"late{i % 13}", cat="gpu_memcpy", dur=-1.0 if i == 333 else 5.0) for i in range(200, 400)]
        + [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": 1, "tid": 1, "ts": 0, "dur": 9e3}],
        True,
    ),
    "a pid string met in the second half": (
        [_event(i, pid="Spans3" if i == 390 else 1) for i in range(400)],
        True,
    ),
    "pid strings in every part": (_strings_in_every_part(), None),
    # the cut at the middle falls inside this name: that part fails and the file is read in one process
    "a cut inside a string": (
        [_event(i, name="x }, { y" * 400 if i == 200 else "op") for i in range(400)],
        False,
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_parts_give_what_one_process_gives(tmp_path, monkeypatch, parts, case) -> None:
    events, merged = CASES[case]  # merged: None where either may happen
    path = _write(tmp_path, _document(KINETO[0], events, KINETO[1]))
    merge = columns.merge_part
    merges: list[bool] = []
    monkeypatch.setattr(decode, "merge_part", lambda *args: merges.append(merge(*args)) or merges[-1])
    got = _decoded(path)
    assert parts and parts[0] >= 2  # it was cut
    if merged is not None:
        assert (bool(merges) and all(merges)) is merged  # exact merge, or the other way
    assert got == _in_one_process(path, monkeypatch)
    assert isinstance(got, dict) and got["meta"][2] > 0


def test_a_part_with_bad_json_gives_the_error_one_process_gives(tmp_path, monkeypatch, parts) -> None:
    text = _document(KINETO[0], _events(400), KINETO[1])
    middle = text.index('"name"', len(text) * 3 // 4)
    path = _write(tmp_path, text[:middle] + '"name" "op"' + text[middle + len('"name": "op0"') :])
    got = _decoded(path)
    assert parts and parts[0] >= 2
    assert isinstance(got, str) and "not valid JSON" in got
    assert got == _in_one_process(path, monkeypatch)


def test_small_files_and_one_core_are_decoded_in_this_process(tmp_path, monkeypatch, parts) -> None:
    path = _write(tmp_path, _document(KINETO[0], _events(400), KINETO[1]))
    monkeypatch.setattr(decode, "PARTS_MIN_BYTES", path.stat().st_size + 1)
    assert _decoded(path) == _in_one_process(path, monkeypatch)
    monkeypatch.setattr(decode, "PARTS_MIN_BYTES", 2000)
    monkeypatch.setattr(forked, "cores", lambda: 1)
    assert _decoded(path) == _in_one_process(path, monkeypatch)
    assert parts == []
