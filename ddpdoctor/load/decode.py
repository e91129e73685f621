"""Decode one Kineto trace file (plain or gzipped JSON) into compact columns.

Speed and memory: the file is decompressed into one preallocated buffer. The ``traceEvents`` array is found
without parsing it (``_locate``: the text before it and after its last event are decoded on their own, and say
where it ends); it is then cut at event boundaries into ~1 MB chunks that are decoded in place (the cut's two
bytes become ``]``/``[`` for the decoder and are put back) with typed structs (only the fields in ``schema``,
by phase), turned into numpy columns and dropped. Peak memory is the JSON text plus the columns plus one
chunk's events, instead of one Python dict per event. The array's chunks, the text before it and the text after
it are each checked by msgspec, which together is the whole document; where any of this fails (a cut inside a
string, an odd layout, bad JSON) the file is read the plain way (``_decode_checked``: the whole document
validated first), which gives the same columns or the same error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import compress, islice
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ddpdoctor.errors import TraceError
from ddpdoctor.load.categories import canonical
from ddpdoctor.load.discover import shown
from ddpdoctor.load.readfile import read_bytes
from ddpdoctor.load.schema import (
    Complete,
    Event,
    Header,
    Instant,
    LooseEvent,
    Metadata,
    OldInstant,
    clean_distributed_info,
    loosen,
)

CHUNK_BYTES = 1 << 20
_EVENT_GAP = re.compile(rb"\}\s*,\s*\{")
_ARRAY_START = re.compile(rb"\s*\[")
_EVENTS_NAME = re.compile(rb'"traceEvents"')
_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\n\r]*:[ \t\n\r]*\[')
_STREAM_TID = re.compile(r"^\s*stream\s+([0-9]{1,18})\s*$", re.IGNORECASE)
_NUMERIC_ID = re.compile(r"^\s*(-?[0-9]{1,18})\s*$")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
COMM_NAME = re.compile(r"^(nccl:|gloo:|ucc:|mpi:|record_param_comms$|c10d::)")
COMM_COLUMNS = (
    "row",
    "in_nelems",
    "out_nelems",
    "group_size",
    "dtype",
    "collective_name",
    "pg_name",
    "seq",
    "input_dims",
    "input_type",
)
# the text before and after traceEvents is copied to be decoded on its own: beyond this the plain way is cheaper
_ENDS_MAX_BYTES = 16 << 20
_KEY_TRIES = 8  # "traceEvents" found inside a string or a nested object before the key itself
_KEPT = frozenset({Instant, OldInstant, Metadata})  # besides Complete; every other event is only counted
_TRACE_CAT = -1  # RankTables.cat_codes: a raw category whose canonical name is "trace" (never interned)

_EVENTS = msgspec.json.Decoder(list[Event])
_LOOSE_EVENTS = msgspec.json.Decoder(list[LooseEvent])
_HEADER = msgspec.json.Decoder(Header)
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ANY_JSON = msgspec.json.Decoder(msgspec.Raw)  # checks that a text is JSON, parsing nothing


class _Part(msgspec.Struct):
    """The header keys in the text before or after traceEvents; UNSET where absent."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"")
    deviceProperties: Any = msgspec.UNSET
    distributedInfo: Any = msgspec.UNSET
    baseTimeNanoseconds: Any = msgspec.UNSET


_PART = msgspec.json.Decoder(_Part)


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
        table = np.fromiter((self.code(u) for u in uniques), dtype=np.int32, count=len(uniques))
        return table[local]

    def code(self, value: str) -> int:
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

    def truncate(self, n: int) -> None:
        """Forget the values added after the first ``n``."""
        for value in list(islice(self.index, n, None)):
            del self.index[value]
        del self.flags[n:]


@dataclass
class FileColumns:
    """The columns of one trace file. ``x_*`` are complete ("X") events, ``mem_*`` ``[memory]`` instants,
    ``comm`` the collective calls among the complete events (``COMM_COLUMNS``, one list each; ``row`` is the
    call's row in ``x``)."""

    path: str
    distributed_info: dict[str, Any] | None = None
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    base_time_ns: int | None = None
    window: tuple[float, float] | None = None
    x: dict[str, list[np.ndarray]] = field(default_factory=dict)
    mem: dict[str, list[np.ndarray]] = field(default_factory=dict)
    comm: dict[str, list[Any]] = field(default_factory=dict)
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

    @property
    def comm_rows(self) -> list[dict[str, Any]]:
        """The collective calls, one dict per call (keys ``COMM_COLUMNS``)."""
        if not self.comm:
            return []
        return [dict(zip(COMM_COLUMNS, row, strict=True)) for row in zip(*self.comm.values(), strict=True)]


@dataclass
class RankTables:
    """Interning tables shared by all files (spans) of one rank, so that their codes agree."""

    names: NameTable = field(default_factory=lambda: NameTable(COMM_NAME))
    cats: NameTable = field(default_factory=NameTable)
    # non-numeric pid/tid strings ("Spans") -> negative codes
    strings: dict[str, int] = field(default_factory=dict)
    # raw category -> the code of its canonical name in ``cats`` (_TRACE_CAT for "trace"): a cache
    cat_codes: dict[str | None, int] = field(default_factory=dict)

    def mark(self) -> tuple[int, int, int]:
        return len(self.names.index), len(self.cats.index), len(self.strings)

    def restore(self, mark: tuple[int, int, int]) -> None:
        """Forget what was interned after ``mark``."""
        n_names, n_cats, n_strings = mark
        self.names.truncate(n_names)
        self.cats.truncate(n_cats)
        for text in list(islice(self.strings, n_strings, None)):
            del self.strings[text]
        for raw, code in list(self.cat_codes.items()):
            if code >= n_cats:
                del self.cat_codes[raw]


def decode_file(path: Path, tables: RankTables) -> FileColumns:
    """Decode ``path`` into columns, interning names/categories into the rank's ``tables``."""
    data = read_bytes(path)
    try:
        out = _decode_fast(path, data, tables)
        if out is None:
            out = _decode_checked(path, data, tables)
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


# ------------------------------------------------------------------------------------------- the fast way
def _decode_fast(path: Path, data: bytes | np.ndarray, tables: RankTables) -> FileColumns | None:
    """``path``'s columns, its events decoded in place; None (and ``tables`` as they were) where the document
    is not the usual ``{..., "traceEvents": [...], ...}`` or any part of it fails to decode: the plain way
    then reads it again and gives the same columns, or says what is wrong."""
    if not isinstance(data, np.ndarray):  # bytes (several gzip members) cannot be written to
        return None
    located = _locate(data)
    if located is None:
        return None
    start, end, header = located
    out = FileColumns(path=str(path))
    _set_header(out, header)
    mark = tables.mark()
    view = memoryview(data)
    chunks = _chunks_in_place(data, view, start, end)
    try:
        for chunk in chunks:
            _add_chunk(out, _decode_chunk(chunk), tables)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, _Unchecked):
        tables.restore(mark)
        return None
    finally:
        chunks.close()  # the last chunk's two bytes put back before the plain way reads the text
        view.release()
    return out


class _Unchecked(Exception):
    """The last chunk is not JSON: the events do not end where ``_locate`` found."""


def _locate(data: np.ndarray) -> tuple[int, int, _Part] | None:
    """Where the top-level ``traceEvents`` array starts and ends (its ``[`` and ``]``) and the header keys
    around it, without parsing the events; None when it cannot be told this way.

    The text before the key is decoded as ``<text>"traceEvents":0}``: valid only where the key is one of the
    top-level object's (not inside a string or a nested value; then the next one is tried). The last event and
    everything after it are decoded as ``{"traceEvents":[<text>``, which gives the array's end. The chunks
    between are decoded later; all three valid is the whole document valid."""
    key, before = -1, None
    for _ in range(_KEY_TRIES):  # the first "traceEvents" that is a key of the top-level object
        found = _EVENTS_NAME.search(data, key + 1, _ENDS_MAX_BYTES)
        if found is None:
            return None
        key = found.start()
        try:
            before = _PART.decode(b"".join((memoryview(data)[:key], b'"traceEvents":0}')))
            break
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
    m = _EVENTS_KEY.match(data, key)
    if before is None or m is None:
        return None
    start = m.end() - 1
    last = _last_event(data, start)
    if len(data) - last > _ENDS_MAX_BYTES:
        return None
    try:
        after = _PART.decode(b"".join((b'{"traceEvents":[', memoryview(data)[last:])))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    end = last + len(after.traceEvents) - 2
    if end < start or data[end] != 0x5D or _EVENTS_NAME.search(data, end):  # "]", no second key
        return None
    header = before
    for name in ("deviceProperties", "distributedInfo", "baseTimeNanoseconds"):
        if getattr(after, name) is not msgspec.UNSET:  # a key given twice: the last one counts, as in msgspec
            setattr(header, name, getattr(after, name))
    return start, end, header


def _last_event(data: np.ndarray, start: int) -> int:
    """The ``{`` of the last event of the array whose ``[`` is at ``start`` (found as the last ``}, {`` of the
    document, searched from its end); ``start + 1`` when there is none (one event or none)."""
    size = 1 << 16
    while True:
        lo = max(start + 1, len(data) - size)
        last = None
        for last in _EVENT_GAP.finditer(data, lo):  # noqa: B007 (the last match is wanted)
            pass
        if last is not None:
            return last.end() - 1
        if lo == start + 1:
            return start + 1
        size *= 16


def _chunk_bounds(data: np.ndarray, start: int, end: int) -> list[tuple[int, int]]:
    """``(first, stop)`` of each ~CHUNK_BYTES chunk of the array at ``data[start:end + 1]``, cut between two
    events: ``data[first]`` is the byte before the chunk's first event (``[`` or a separator) and
    ``data[stop - 1]`` the byte after its last (``]`` or a separator)."""
    bounds = []
    pos = start + 1
    while end - pos > CHUNK_BYTES:
        m = _EVENT_GAP.search(data, pos + CHUNK_BYTES, end)
        if m is None:
            break
        bounds.append((pos - 1, m.start() + 2))
        pos = m.end() - 1
    bounds.append((pos - 1, end + 1))
    return bounds


def _chunks_in_place(data: np.ndarray, view: memoryview, start: int, end: int):
    """Yield each chunk as a view of ``data`` reading ``[event, ..., event]``: the byte before it is set to
    ``[`` and the byte after it to ``]`` while it is decoded, and put back after."""
    bounds = _chunk_bounds(data, start, end)
    if len(bounds) > 1:  # the events must end where _locate said: checked before any is decoded
        first, stop = bounds[-1]
        with _bracketed(data, first, stop):
            try:
                _ANY_JSON.decode(view[first:stop])
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                raise _Unchecked from None
    for first, stop in bounds:
        with _bracketed(data, first, stop):
            yield view[first:stop]


class _bracketed:
    """``data[first]`` = ``[`` and ``data[stop - 1]`` = ``]`` inside the block, as they were after it."""

    __slots__ = ("data", "first", "stop", "saved")

    def __init__(self, data: np.ndarray, first: int, stop: int) -> None:
        self.data, self.first, self.stop = data, first, stop

    def __enter__(self) -> None:
        data = self.data
        self.saved = data[self.first], data[self.stop - 1]
        data[self.first] = 0x5B  # [
        data[self.stop - 1] = 0x5D  # ]

    def __exit__(self, *exc: object) -> None:
        self.data[self.first], self.data[self.stop - 1] = self.saved


# ------------------------------------------------------------------------------------------ the plain way
def _decode_checked(path: Path, data: bytes | np.ndarray, tables: RankTables) -> FileColumns:
    """The whole document validated by msgspec first (``traceEvents`` kept raw), then its events decoded in
    chunks copied out of it; one raw slice per event where a cut falls inside a string."""
    out = FileColumns(path=str(path))
    events_raw = _header(path, data, out)
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


def _header(path: Path, data: bytes | np.ndarray, out: FileColumns) -> msgspec.Raw:
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
    _set_header(out, header)
    raw = header.traceEvents
    if bytes(memoryview(raw)[:1]) != b"[":
        raise TraceError(f"{shown(path)}: traceEvents is not a list")
    return raw


def _set_header(out: FileColumns, header: Header | _Part) -> None:
    if isinstance(header.distributedInfo, dict):
        out.distributed_info = clean_distributed_info(header.distributedInfo)
    if isinstance(header.deviceProperties, list):
        out.device_properties = [d for d in header.deviceProperties if isinstance(d, dict)]
    base = header.baseTimeNanoseconds
    if isinstance(base, int) and not isinstance(base, bool) and 0 <= base < 2**63:
        out.base_time_ns = base


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


# ---------------------------------------------------------------------------------------- events -> columns
def _decode_chunk(chunk: bytes | memoryview) -> list[Any]:
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


def _ints(values: Any, n: int, again: Any, default: int = -1) -> np.ndarray:
    """The ``n`` ints of the iterator ``values`` as int64; ``again()`` gives them again (as a list) when one is
    beyond int64 (it becomes ``default``)."""
    try:
        return np.fromiter(values, dtype=np.int64, count=n)
    except OverflowError:
        return _int64(again(), default)


def _in_int64(value: int) -> int:
    return value if _I64_MIN <= value <= _I64_MAX else -1


def _ids(values: list[int | str] | tuple[int | str, ...], strings: dict[str, int]) -> np.ndarray:
    """pids/tids as int64: numbers as they are, strings by ``_id_of`` (each distinct value once, in the order
    they first appear, so ``strings`` grows as it would value by value)."""
    ints = np.array(values)  # int64 only when every value is an int within int64 (a string makes it "<U")
    if ints.dtype == np.int64:
        return ints
    codes, uniques = factorize(values)
    table = [v if v.__class__ is int and _I64_MIN <= v <= _I64_MAX else _id_of(v, strings) for v in uniques]
    return np.array(table, dtype=np.int64)[codes]


def _id_of(value: Any, strings: dict[str, int]) -> int:
    text = str(value)
    m = _NUMERIC_ID.match(text) or _STREAM_TID.match(text)
    if m:
        return int(m.group(1))
    return strings.setdefault(text, -1 - len(strings))


def _append(group: dict[str, list[np.ndarray]], key: str, values: np.ndarray) -> None:
    group.setdefault(key, []).append(values)


def _add_chunk(out: FileColumns, events: list[Any], tables: RankTables) -> None:
    n = len(events)
    out.n_events += n
    xs = [e for e in events if e.__class__ is Complete]
    memory = None
    if len(xs) < n:
        rest = [e for e in events if e.__class__ in _KEPT]
        if rest:
            for e in rest:
                if e.__class__ is Metadata:
                    _add_meta(out, e, tables.strings)
            memory = [e for e in rest if e.__class__ is not Metadata and e.name == "[memory]"]
    if xs:
        _add_x(out, xs, tables)
    if memory:
        _add_memory(out, memory, tables)


def _add_x(out: FileColumns, xs: list[Complete], tables: RankTables) -> None:
    """Complete events, less those without a usable time and the profiler's own "trace" ranges (the first
    "PyTorch Profiler" one gives the file's window)."""
    n = len(xs)
    ts = np.fromiter((e.ts for e in xs), dtype=np.float64, count=n)
    dur = np.fromiter((e.dur for e in xs), dtype=np.float64, count=n)
    keep = _timed(ts, dur, out)
    cat = _cat_codes(xs, keep, tables)
    trace = cat == _TRACE_CAT
    if trace.any():
        for i in np.flatnonzero(trace & (keep if keep is not None else True)).tolist():
            if out.window is None and "PyTorch Profiler" in xs[i].name:
                out.window = (float(ts[i]), float(ts[i] + dur[i]))
        keep = ~trace if keep is None else keep & ~trace
    rows = None  # the kept rows of xs (None: all)
    if keep is not None:
        if not keep.any():
            return
        rows = np.flatnonzero(keep)
        ts, dur, cat = ts[rows], dur[rows], cat[rows]
    kept = xs if rows is None else [xs[i] for i in rows.tolist()]
    index = tables.names.index
    try:  # every name seen before: no interning
        codes = np.fromiter((index[e.name] for e in xs), dtype=np.int32, count=n)
        if rows is not None:
            codes = codes[rows]
    except KeyError:
        codes = tables.names.codes([e.name for e in kept])
    m = len(kept)
    x = out.x
    _append(x, "name", codes)
    _append(x, "cat", cat)
    _append(x, "ts", ts)
    _append(x, "dur", dur)
    _append(x, "pid", _ids([e.pid for e in kept], tables.strings))
    _append(x, "tid", _ids([e.tid for e in kept], tables.strings))
    ext = _ints((e.args.external_id for e in kept), m, lambda: [e.args.external_id for e in kept])
    missing = np.flatnonzero(ext < 0)
    if len(missing):  # torch 1.9's device events: "external id"
        ext[missing] = _int64([kept[i].args.external_id_v1 for i in missing.tolist()])
    _append(x, "external_id", ext)
    _append(x, "correlation", _ints((e.args.correlation for e in kept), m, lambda: [e.args.correlation for e in kept]))
    _append(x, "device", _ints((e.args.device for e in kept), m, lambda: [e.args.device for e in kept]))
    _append(x, "stream", _ints((e.args.stream for e in kept), m, lambda: [e.args.stream for e in kept]))
    _add_comm(out, kept, codes, tables.names)
    out.n_x += m


def _cat_codes(xs: list[Complete], keep: np.ndarray | None, tables: RankTables) -> np.ndarray:
    """The code in ``tables.cats`` of each event's canonical category (``_TRACE_CAT`` for "trace"; -2 for a
    category that only rows not in ``keep`` have). New canonical categories of the rows kept (not "trace")
    are interned in the order they first appear."""
    cache = tables.cat_codes
    try:  # every category seen before
        return np.fromiter((cache[e.cat] for e in xs), dtype=np.int32, count=len(xs))
    except KeyError:
        pass
    raw_codes, raw_cats = factorize([e.cat for e in xs])
    canon_of = [canonical(c) for c in raw_cats]
    is_trace = np.array([c == "trace" for c in canon_of], dtype=bool)[raw_codes]
    kept = ~is_trace if keep is None else keep & ~is_trace
    for i in dict.fromkeys(raw_codes[kept].tolist()):
        tables.cats.code(canon_of[i])
    index = tables.cats.index
    for raw, canon in zip(raw_cats, canon_of, strict=True):
        if canon == "trace":
            cache[raw] = _TRACE_CAT
        elif canon in index:
            cache[raw] = index[canon]
    return np.array([cache.get(raw, -2) for raw in raw_cats], dtype=np.int32)[raw_codes]


def _add_memory(out: FileColumns, memory: list[Instant], tables: RankTables) -> None:
    ts = np.fromiter((e.ts for e in memory), dtype=np.float64, count=len(memory))
    keep = _timed(ts, None, out)
    if keep is not None:
        if not keep.any():
            return
        memory = list(compress(memory, keep.tolist()))
        ts = ts[keep]
    n = len(memory)
    args = [e.args for e in memory]
    m = out.mem
    _append(m, "ts", ts)
    _append(m, "pid", _ids([e.pid for e in memory], tables.strings))
    _append(m, "tid", _ids([e.tid for e in memory], tables.strings))
    _append(m, "bytes", _ints((a.bytes for a in args), n, lambda: [a.bytes for a in args], 0))
    _append(m, "total_allocated", _optional_floats([a.total_allocated for a in args]))
    _append(m, "total_reserved", _optional_floats([a.total_reserved for a in args]))
    _append(m, "device_type", _ints((a.device_type for a in args), n, lambda: [a.device_type for a in args]))
    _append(m, "device_id", _ints((a.device_id for a in args), n, lambda: [a.device_id for a in args]))


def _optional_floats(values: list[int | None]) -> np.ndarray:
    """Ints (or None) as float64, NaN for None and for a number beyond int64 (as the loose decoder reads it)."""
    out = np.array(values, dtype=np.float64)
    if (np.abs(out) >= 2.0**63).any():
        out = np.array([v if v is None or _I64_MIN <= v <= _I64_MAX else None for v in values], dtype=np.float64)
    return out


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


def _add_meta(out: FileColumns, e: Metadata, strings: dict[str, int]) -> None:
    args = e.args
    pid = e.pid if e.pid.__class__ is int else _id_of(e.pid, strings)
    tid = e.tid if e.tid.__class__ is int else _id_of(e.tid, strings)
    if e.name == "thread_name" and args.name:
        # later entries win: Kineto writes "thread 6023 (python)" and then the real "(pt_gloo_runloop)" name
        if not (args.name.endswith("(python)") and (pid, tid) in out.thread_names):
            out.thread_names[(pid, tid)] = args.name
    elif e.name == "process_labels" and args.labels:
        out.process_labels[pid] = args.labels


def _add_comm(out: FileColumns, kept: list[Complete], codes: np.ndarray, names: NameTable) -> None:
    """The collective calls among ``kept`` (their names' codes ``codes``) with their arguments."""
    at = np.flatnonzero(np.array(names.flags, dtype=bool)[codes]).tolist()
    if not at:
        return
    args = [kept[i].args for i in at]
    comm = out.comm or {key: [] for key in COMM_COLUMNS}
    out.comm = comm
    comm["row"] += [out.n_x + i for i in at]
    comm["in_nelems"] += [_in_int64(a.in_nelems) for a in args]
    comm["out_nelems"] += [_in_int64(a.out_nelems) for a in args]
    comm["group_size"] += [_in_int64(a.group_size) for a in args]
    comm["dtype"] += [a.dtype for a in args]
    comm["collective_name"] += [a.collective_name for a in args]
    comm["pg_name"] += [a.pg_name for a in args]
    comm["seq"] += [_in_int64(a.seq) for a in args]
    comm["input_dims"] += _raw_values([a.input_dims for a in args])
    comm["input_type"] += _raw_values([a.input_type for a in args])


def _raw_values(raws: list[msgspec.Raw]) -> list[Any]:
    """The JSON values of ``raws`` (None for an empty one), decoded as one array."""
    present = [r for r in raws if len(r)]
    if not present:
        return [None] * len(raws)
    try:
        values = iter(msgspec.json.decode(b"".join((b"[", b",".join(present), b"]"))))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return [_raw_value(r) for r in raws]  # each alone, as the error (or None) is the one it gives alone
    return [next(values) if len(r) else None for r in raws]


def _raw_value(raw: msgspec.Raw) -> Any:
    if len(raw) == 0:
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
