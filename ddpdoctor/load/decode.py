"""Decode one Kineto trace file (plain or gzipped JSON) into compact columns.

Speed and memory: the file is decompressed into one preallocated buffer; msgspec checks the whole document and
keeps ``traceEvents`` as a raw slice; the slice is then cut at event boundaries into ~1 MB chunks that are
decoded with typed structs (only the fields in ``schema``), turned into numpy columns and dropped. Peak memory
is the JSON text plus the columns plus one chunk, instead of one Python dict per event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ddpdoctor.errors import TraceError
from ddpdoctor.load.categories import canonical
from ddpdoctor.load.discover import shown
from ddpdoctor.load.readfile import read_bytes
from ddpdoctor.load.schema import Args, Event, Header, LooseEvent, clean_distributed_info, loosen

CHUNK_BYTES = 1 << 20
_EVENT_GAP = re.compile(rb"\}\s*,\s*\{")
_ARRAY_START = re.compile(rb"\s*\[")
_STREAM_TID = re.compile(r"^\s*stream\s+([0-9]{1,18})\s*$", re.IGNORECASE)
_NUMERIC_ID = re.compile(r"^\s*(-?[0-9]{1,18})\s*$")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
COMM_NAME = re.compile(r"^(nccl:|gloo:|ucc:|mpi:|record_param_comms$|c10d::)")
_NO_ARGS = Args()

_EVENTS = msgspec.json.Decoder(list[Event])
_LOOSE_EVENTS = msgspec.json.Decoder(list[LooseEvent])
_HEADER = msgspec.json.Decoder(Header)
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def factorize(values: list[Any] | tuple[Any, ...]) -> tuple[np.ndarray, list[Any]]:
    """Codes (int32) of ``values`` into their distinct values in order of first appearance (C-level loops)."""
    uniques = list(dict.fromkeys(values))
    index = dict(zip(uniques, range(len(uniques)), strict=True))
    return np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values)), uniques


class NameTable:
    """Interns strings into int codes shared by all spans of a rank; ``flags[code]`` marks names matching
    ``flag``."""

    def __init__(self, flag: re.Pattern[str] | None = None) -> None:
        self.index: dict[str, int] = {}
        self.flag = flag
        self.flags: list[bool] = []

    def codes(self, values: list[str] | tuple[str, ...]) -> np.ndarray:
        """The code of each value; new values are added in the order they first appear."""
        local, uniques = factorize(values)
        table = np.fromiter((self._code(u) for u in uniques), dtype=np.int32, count=len(uniques))
        return table[local]

    def _code(self, value: str) -> int:
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.index)
            self.flags.append(bool(self.flag.match(value)) if self.flag is not None else False)
        return code

    def names(self) -> list[str]:
        out = [""] * len(self.index)
        for name, code in self.index.items():
            out[code] = name
        return out


@dataclass
class FileColumns:
    """The columns of one trace file. ``x_*`` are complete ("X") events, ``mem_*`` ``[memory]`` instants."""

    path: str
    distributed_info: dict[str, Any] | None = None
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    base_time_ns: int | None = None
    window: tuple[float, float] | None = None
    x: dict[str, list[np.ndarray]] = field(default_factory=dict)
    mem: dict[str, list[np.ndarray]] = field(default_factory=dict)
    comm_rows: list[dict[str, Any]] = field(default_factory=list)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    process_labels: dict[int, str] = field(default_factory=dict)
    n_x: int = 0
    n_events: int = 0
    # events left out because their time cannot be meant: reason -> count (said in a note)
    bad_times: dict[str, int] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """One line per kind of event left out, naming the file."""
        return [
            f"{shown(Path(self.path))}: {n} event{'s' if n != 1 else ''} skipped: {why}"
            for why, n in sorted(self.bad_times.items())
        ]

    def column(self, group: str, key: str, dtype: Any) -> np.ndarray:
        parts = getattr(self, group).get(key, [])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


@dataclass
class RankTables:
    """Interning tables shared by all files (spans) of one rank, so that their codes agree."""

    names: NameTable = field(default_factory=lambda: NameTable(COMM_NAME))
    cats: NameTable = field(default_factory=NameTable)
    # non-numeric pid/tid strings ("Spans") -> negative codes
    strings: dict[str, int] = field(default_factory=dict)


def decode_file(path: Path, tables: RankTables) -> FileColumns:
    """Decode ``path`` into columns, interning names/categories into the rank's ``tables``."""
    data = read_bytes(path)
    out = FileColumns(path=str(path))
    try:
        events_raw = _header(path, data, out)
        out = _decode_events(path, data, events_raw, out, tables)
    except RecursionError:
        raise TraceError(f"{shown(path)}: not valid JSON (nested too deeply)") from None
    except msgspec.ValidationError as exc:
        raise TraceError(f"{shown(path)}: an event in traceEvents cannot be read ({exc})") from None
    except msgspec.DecodeError as exc:
        raise TraceError(f"{shown(path)}: not valid JSON ({exc})") from None
    if out.n_events == 0:
        raise TraceError(f"{shown(path)}: the trace has no events")
    if out.n_x == 0 and not out.mem:
        raise TraceError(f'{shown(path)}: the trace has no timed events ("ph": "X") to analyse')
    return out


def _decode_events(
    path: Path, data: bytes | bytearray, events_raw: msgspec.Raw, out: FileColumns, tables: RankTables
) -> FileColumns:
    view = memoryview(events_raw)
    try:
        for chunk in _chunks(view):
            _add_chunk(out, _decode_chunk(chunk), tables)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError:
        # a cut fell inside a string or a nested object: fall back to one raw slice per event
        out = FileColumns(path=str(path))
        _header(path, data, out)
        raws = _RAW_LIST.decode(events_raw)
        for i in range(0, len(raws), 8192):
            _add_chunk(out, _decode_chunk(b"[" + b",".join(raws[i : i + 8192]) + b"]"), tables)
    finally:
        view.release()
    return out


def _header(path: Path, data: bytes | bytearray, out: FileColumns) -> msgspec.Raw:
    try:
        header = _HEADER.decode(data)
    except msgspec.ValidationError:
        # the Chrome "JSON array" format: the document is the list of events itself
        if _ARRAY_START.match(data):
            try:
                rows = _RAW_LIST.decode(data)
                first = msgspec.json.decode(rows[0]) if rows else None
            except msgspec.DecodeError as exc:
                raise TraceError(f"{shown(path)}: not valid JSON ({exc})") from None
            if isinstance(first, dict) and first.get("ph") is not None:
                return msgspec.Raw(bytes(data))
        raise TraceError(f"{shown(path)}: JSON, but not a Chrome/Kineto trace (no traceEvents)") from None
    except msgspec.DecodeError as exc:
        raise TraceError(f"{shown(path)}: not valid JSON ({exc})") from None
    if len(header.traceEvents) == 0:
        raise TraceError(f"{shown(path)}: JSON, but not a Chrome/Kineto trace (no traceEvents)")
    if isinstance(header.distributedInfo, dict):
        out.distributed_info = clean_distributed_info(header.distributedInfo)
    if isinstance(header.deviceProperties, list):
        out.device_properties = [d for d in header.deviceProperties if isinstance(d, dict)]
    base = header.baseTimeNanoseconds
    if isinstance(base, int) and not isinstance(base, bool) and 0 <= base < 2**63:
        out.base_time_ns = base
    raw = header.traceEvents
    if bytes(memoryview(raw)[:1]) != b"[":
        raise TraceError(f"{shown(path)}: traceEvents is not a list")
    return raw


def _chunks(view: memoryview):
    """Yield ``[...]`` byte strings of ~CHUNK_BYTES each, cut between two events of the array ``view``."""
    end = len(view) - 1  # the closing ']'
    pos = 1
    while pos < end:
        if end - pos <= CHUNK_BYTES:
            yield b"".join((b"[", view[pos:end], b"]"))
            return
        m = _EVENT_GAP.search(view, pos + CHUNK_BYTES, end)
        if m is None:
            yield b"".join((b"[", view[pos:end], b"]"))
            return
        yield b"".join((b"[", view[pos : m.start() + 1], b"]"))
        pos = m.end() - 1


def _decode_chunk(chunk: bytes) -> list[Event]:
    try:
        return _EVENTS.decode(chunk)
    except msgspec.ValidationError:
        return [loosen(e) for e in _LOOSE_EVENTS.decode(chunk)]


def _int64(values: list[int], default: int = -1) -> np.ndarray:
    """``values`` as int64; numbers a trace cannot mean (beyond int64) become ``default``."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array([v if _I64_MIN <= v <= _I64_MAX else default for v in values], dtype=np.int64)


def _in_int64(value: int) -> int:
    return value if _I64_MIN <= value <= _I64_MAX else -1


def _ids(values: list[int | str] | tuple[int | str, ...], strings: dict[str, int]) -> np.ndarray:
    if set(map(type, values)) == {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass
    return np.array(
        [v if v.__class__ is int and _I64_MIN <= v <= _I64_MAX else _id_of(v, strings) for v in values],
        dtype=np.int64,
    )


def _id_of(value: Any, strings: dict[str, int]) -> int:
    text = str(value)
    m = _NUMERIC_ID.match(text) or _STREAM_TID.match(text)
    if m:
        return int(m.group(1))
    return strings.setdefault(text, -1 - len(strings))


def _append(group: dict[str, list[np.ndarray]], key: str, values: np.ndarray) -> None:
    group.setdefault(key, []).append(values)


def _add_chunk(out: FileColumns, events: list[Event], tables: RankTables) -> None:
    out.n_events += len(events)
    for e in [e for e in events if e.ph == "M"]:
        _add_meta(out, e, tables.strings)
    xs = [e for e in events if e.ph == "X"]
    if xs:
        _add_x(out, xs, tables)
    memory = [e for e in events if e.name == "[memory]" and (e.ph == "i" or e.ph == "I")]
    if memory:
        _add_memory(out, memory, tables)


def _columns(events: list[Event], mask: np.ndarray | None = None) -> tuple[list[Any], ...]:
    """name, cat, ts, dur, pid, tid and args of ``events`` (the rows where ``mask``), one list each. Plain list
    comprehensions: faster here than attrgetter/zip transposes, which make a tuple per event."""
    if mask is not None:
        events = list(compress(events, mask.tolist()))
    return (
        [e.name for e in events],
        [e.cat for e in events],
        [e.ts for e in events],
        [e.dur for e in events],
        [e.pid for e in events],
        [e.tid for e in events],
        [e.args or _NO_ARGS for e in events],
    )


def _add_x(out: FileColumns, xs: list[Event], tables: RankTables) -> None:
    """Complete events, less those without a usable time and the profiler's own "trace" ranges (the first
    "PyTorch Profiler" one gives the file's window)."""
    names, cats, ts, dur, pids, tids, args = _columns(xs)
    ts, dur = np.array(ts, dtype=np.float64), np.array(dur, dtype=np.float64)
    keep = _timed(ts, dur, out)
    raw_codes, raw_cats = factorize(cats)
    canon_of = [canonical(c) for c in raw_cats]
    if "trace" in canon_of:
        trace = np.array([c == "trace" for c in canon_of], dtype=bool)[raw_codes]
        for i in np.flatnonzero(trace & (keep if keep is not None else True)).tolist():
            if out.window is None and "PyTorch Profiler" in names[i]:
                out.window = (float(ts[i]), float(ts[i] + dur[i]))
        keep = ~trace if keep is None else keep & ~trace
    if keep is not None:
        if not keep.any():
            return
        names, cats, ts, dur, pids, tids, args = _columns(xs, keep)
        ts, dur = np.array(ts, dtype=np.float64), np.array(dur, dtype=np.float64)
        raw_codes, raw_cats = factorize(cats)
        canon_of = [canonical(c) for c in raw_cats]
    # canonical categories interned in the order they first appear
    canon_local, canon_uniques = factorize(canon_of)
    local = canon_local[raw_codes]
    cat_codes = tables.cats.codes(canon_uniques)[local] if len(canon_uniques) == 1 else None
    if cat_codes is None:
        order, seen = np.unique(local, return_index=True)
        firsts = order[np.argsort(seen, kind="stable")].tolist()
        interned = np.zeros(len(canon_uniques), dtype=np.int32)
        interned[firsts] = tables.cats.codes([canon_uniques[i] for i in firsts])
        cat_codes = interned[local]
    codes = tables.names.codes(names)
    x = out.x
    _append(x, "name", codes)
    _append(x, "cat", cat_codes)
    _append(x, "ts", ts)
    _append(x, "dur", dur)
    _append(x, "pid", _ids(pids, tables.strings))
    _append(x, "tid", _ids(tids, tables.strings))
    ext = _int64([a.external_id for a in args])
    _append(x, "external_id", np.where(ext >= 0, ext, _int64([a.external_id_v1 for a in args])))
    _append(x, "correlation", _int64([a.correlation for a in args]))
    _append(x, "device", _int64([a.device for a in args]))
    _append(x, "stream", _int64([a.stream for a in args]))
    _add_comm_rows(out, args, codes, tables.names)
    out.n_x += len(ts)


def _add_memory(out: FileColumns, memory: list[Event], tables: RankTables) -> None:
    _, _, ts, _, pids, tids, args = _columns(memory)
    ts = np.array(ts, dtype=np.float64)
    keep = _timed(ts, None, out)
    if keep is not None:
        if not keep.any():
            return
        _, _, ts, _, pids, tids, args = _columns(memory, keep)
        ts = np.array(ts, dtype=np.float64)
    m = out.mem
    _append(m, "ts", ts)
    _append(m, "pid", _ids(pids, tables.strings))
    _append(m, "tid", _ids(tids, tables.strings))
    _append(m, "bytes", _int64([a.bytes for a in args], 0))
    _append(m, "total_allocated", np.array([a.total_allocated for a in args], dtype=np.float64))
    _append(m, "total_reserved", np.array([a.total_reserved for a in args], dtype=np.float64))
    _append(m, "device_type", _int64([a.device_type for a in args]))
    _append(m, "device_id", _int64([a.device_id for a in args]))


def _timed(ts: np.ndarray, dur: np.ndarray | None, out: FileColumns) -> np.ndarray | None:
    """Which events to keep (None: all): not those whose timestamp (or duration) is not a finite number or is
    negative; a step of 0 or -66.9 ms is no measurement. The count of each kind goes into ``out.bad_times``."""
    bad_ts = np.isnan(ts)
    reasons = [("timestamp (ts) not a number", bad_ts)]
    if dur is not None:
        reasons += [
            ("duration (dur) not a number", ~bad_ts & np.isnan(dur)),
            ("negative duration (dur)", ~bad_ts & (dur < 0)),
        ]
    bad = None
    for why, rows in reasons:
        n = int(rows.sum())
        if n:
            out.bad_times[why] = out.bad_times.get(why, 0) + n
            bad = rows if bad is None else bad | rows
    return None if bad is None else ~bad


def _add_meta(out: FileColumns, e: Event, strings: dict[str, int]) -> None:
    args = e.args or _NO_ARGS
    pid = e.pid if e.pid.__class__ is int else _id_of(e.pid, strings)
    tid = e.tid if e.tid.__class__ is int else _id_of(e.tid, strings)
    if e.name == "thread_name" and args.name:
        # later entries win: Kineto writes "thread 6023 (python)" and then the real "(pt_gloo_runloop)" name
        if not (args.name.endswith("(python)") and (pid, tid) in out.thread_names):
            out.thread_names[(pid, tid)] = args.name
    elif e.name == "process_labels" and args.labels:
        out.process_labels[pid] = args.labels


def _add_comm_rows(out: FileColumns, args: list[Args], codes: np.ndarray, names: NameTable) -> None:
    for i in np.flatnonzero(np.array(names.flags, dtype=bool)[codes]):
        a = args[i]
        out.comm_rows.append(
            {
                "row": out.n_x + int(i),
                "in_nelems": _in_int64(a.in_nelems),
                "out_nelems": _in_int64(a.out_nelems),
                "group_size": _in_int64(a.group_size),
                "dtype": a.dtype,
                "collective_name": a.collective_name,
                "pg_name": a.pg_name,
                "seq": _in_int64(a.seq),
                "input_dims": _raw_value(a.input_dims),
                "input_type": _raw_value(a.input_type),
            }
        )


def _raw_value(raw: msgspec.Raw) -> Any:
    if len(raw) == 0:
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
