"""Decoded events -> the compact columns of one trace file (``FileColumns``), names and categories interned into
tables shared by all files of a rank (``RankTables``): one pass of list comprehensions per chunk of events, then
numpy; Python loops only over distinct names, categories and ids, metadata events and collective calls.
``ddpdoctor.load.decode`` reads the file and hands each decoded chunk to ``add_chunk``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import compress, islice
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ddpdoctor.load.categories import canonical
from ddpdoctor.load.discover import shown
from ddpdoctor.load.schema import Complete, Instant, Metadata, OldInstant

_STREAM_TID = re.compile(r"^\s*stream\s+([0-9]{1,18})\s*$", re.IGNORECASE)
_NUMERIC_ID = re.compile(r"^\s*(-?[0-9]{1,18})\s*$")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
# the ops whose arguments are kept (``comm_ops``): the collective calls, and FSDP2's all-gather copy-in, whose
# Input Dims list the parameter tensors of the unit it gathers (metrics.fsdp)
COMM_NAME = re.compile(r"^(nccl:|gloo:|ucc:|mpi:|record_param_comms$|c10d::|fsdp::all_gather_copy_in$)")
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
_KEPT = frozenset({Instant, OldInstant, Metadata})  # besides Complete; every other event is only counted
_TRACE_CAT = -1  # RankTables.cat_codes: a raw category whose canonical name is "trace" (never interned)


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
    other_data: dict[str, Any] | None = None  # the trace's ``otherData`` (ddpdoctor's export: ``load.exported``)
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
    if str not in set(map(type, values)):  # (one string among ints would make np.array convert them all)
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass
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


def add_chunk(out: FileColumns, events: list[Any], tables: RankTables) -> None:
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


# ----------------------------------------------------------------------- one file decoded in parts, merged
def tables_state(tables: RankTables) -> tuple[list[str], list[str], list[str], dict[str | None, int]]:
    """What a process that decoded a part of a file with a copy of ``tables`` sends back: its names, categories and
    pid/tid strings in the order they were interned, and its category cache."""
    return tables.names.names(), tables.cats.names(), list(tables.strings), dict(tables.cat_codes)


def merge_part(
    out: FileColumns,
    part: FileColumns,
    state: tuple[list[str], list[str], list[str], dict[str | None, int]],
    tables: RankTables,
    forked_at: tuple[int, int, int],
) -> bool:
    """Append ``part`` (the next part of ``out``'s file, decoded by a process forked when ``tables`` were as at
    ``forked_at``, which may have decoded other parts of the file since) to ``out``, and the names and categories
    new to ``tables`` in the order that process interned them: the order a decoding of the whole file in this
    process would have interned them, so the codes are the same (each of the part's codes is mapped to its name's
    code here). False (``tables`` then as the earlier parts left them) where that cannot be made so: the part's
    pid/tid strings got other codes there than one process would give them, and those codes, negative like a
    negative pid, cannot be told apart to be mapped."""
    names, cats, strings, cat_cache = state
    n_names, n_cats, n_strings = forked_at
    merged = dict(tables.strings)
    for i, text in enumerate(strings[n_strings:]):  # a string's code is -1 - its position: the same, or no merge
        if merged.setdefault(text, -1 - len(merged)) != -1 - n_strings - i:
            return False
    tables.strings.update(merged)
    name_map = np.arange(len(names), dtype=np.int32)
    name_map[n_names:] = [tables.names.code(n) for n in names[n_names:]]
    cat_map = np.arange(len(cats), dtype=np.int32)
    cat_map[n_cats:] = [tables.cats.code(c) for c in cats[n_cats:]]
    for raw, code in cat_cache.items():
        if raw not in tables.cat_codes:
            tables.cat_codes[raw] = int(cat_map[code]) if code >= 0 else code
    for key, parts in part.x.items():
        if key == "name":
            parts = [name_map[p] for p in parts]
        elif key == "cat":
            parts = [cat_map[p] for p in parts]
        out.x.setdefault(key, []).extend(parts)
    for key, parts in part.mem.items():
        out.mem.setdefault(key, []).extend(parts)
    if part.comm:
        comm = out.comm or {key: [] for key in COMM_COLUMNS}
        out.comm = comm
        comm["row"] += [out.n_x + r for r in part.comm["row"]]
        for key in COMM_COLUMNS[1:]:
            comm[key] += part.comm[key]
    for key, name in part.thread_names.items():  # as _add_meta would have met them after out's
        if not (name.endswith("(python)") and key in out.thread_names):
            out.thread_names[key] = name
    out.process_labels.update(part.process_labels)
    if out.window is None:
        out.window = part.window
    out.n_x += part.n_x
    out.n_events += part.n_events
    for why, n in part.bad_times.items():
        out.bad_times[why] = out.bad_times.get(why, 0) + n
    return True
