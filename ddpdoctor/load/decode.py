"""Decode one Kineto trace file (plain or gzipped JSON) into compact columns.

Speed and memory: the file is decompressed into one preallocated buffer. The ``traceEvents`` array is found
without parsing it (``_locate``: the text before it and after its last event are decoded on their own, and say
where it ends); it is then cut at event boundaries into ~1 MB chunks that are decoded in place (the cut's two
bytes become ``]``/``[`` for the decoder and are put back) with typed structs (only the fields in ``schema``,
by phase), turned into numpy columns and dropped. Peak memory is the JSON text plus the columns plus one
chunk's events, instead of one Python dict per event. The array's chunks, the text before it and the text after
it are each checked by msgspec, which together is the whole document; where any of this fails (a cut inside a
string, an odd layout, bad JSON) the file is read the plain way (``_decode_checked``: the whole document
validated first), which gives the same columns or the same error. Each decoded chunk becomes columns in
``ddpdoctor.load.columns``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ddpdoctor.errors import TraceError
from ddpdoctor.load.columns import FileColumns, RankTables, add_chunk, merge_part, tables_state
from ddpdoctor.load.discover import shown
from ddpdoctor.load.readfile import read_bytes
from ddpdoctor.load.schema import Event, Header, LooseEvent, clean_distributed_info, loosen

CHUNK_BYTES = 1 << 20
_EVENT_GAP = re.compile(rb"\}\s*,\s*\{")
_ARRAY_START = re.compile(rb"\s*\[")
_EVENTS_NAME = re.compile(rb'"traceEvents"')
_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\n\r]*:[ \t\n\r]*\[')
# the text before and after traceEvents is copied to be decoded on its own: beyond this the plain way is cheaper
_ENDS_MAX_BYTES = 16 << 20
_KEY_TRIES = 8  # "traceEvents" found inside a string or a nested object before the key itself
_LAST_TRIES = 8  # "}, {" found inside the last event's strings before the gap before it
_CUT_TRIES = 64  # "}, {" inside a string where a chunk would be cut: the cut moves to the next one
_SPACE = frozenset(b" \t\r\n")

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
    otherData: Any = msgspec.UNSET


_PART = msgspec.json.Decoder(_Part)


def decode_file(path: Path, tables: RankTables) -> FileColumns:
    """Decode ``path`` into columns, interning names/categories into the rank's ``tables``."""
    data = read_bytes(path)
    try:
        out = _decode_parts(path, data, tables)
        if out is None:
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
    if header is not None:
        _set_header(out, header)
    mark = tables.mark()
    try:
        _add_events(out, data, start, end, tables, strict_first=header is None)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, _Unchecked):
        tables.restore(mark)
        return None
    return out


def _add_events(
    out: FileColumns, data: np.ndarray, start: int, end: int, tables: RankTables, *, strict_first: bool
) -> None:
    """The events of ``data[start:end + 1]`` (as ``_decoded_chunks`` takes them) into ``out``, a chunk at a time."""
    view = memoryview(data)
    chunks = _decoded_chunks(data, view, start, end, strict_first=strict_first)
    try:
        for events in chunks:
            add_chunk(out, events, tables)
            del events  # freed before the next chunk is decoded
    finally:
        chunks.close()
        view.release()


class _Unchecked(Exception):
    """The events cannot be told to be a trace's this way (the plain way says what they are)."""


def _locate(data: np.ndarray) -> tuple[int, int, _Part | None] | None:
    """Where the top-level ``traceEvents`` array starts and ends (its ``[`` and ``]``) and the header keys
    around it, without parsing the events; None when it cannot be told this way. A document that is the array
    itself (Chrome's JSON array format) has no header (None).

    The text before the key is decoded as ``<text>"traceEvents":0}``: valid only where the key is one of the
    top-level object's (not inside a string or a nested value; then the next one is tried). The last event and
    everything after it are decoded as ``{"traceEvents":[<text>``, which gives the array's end (the last ``}, {``
    of the document may be inside a string of the last event: the ones before it are tried). The chunks
    between are decoded later; all three valid is the whole document valid."""
    if _ARRAY_START.match(data):  # [event, ...]: the array ends at the document's last "]"
        start, stop = _array_span(data)
        return (start, stop - 1, None) if stop - 1 > start and data[stop - 1] == 0x5D else None
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
    after = None
    for last in _last_events(data, start):
        if len(data) - last > _ENDS_MAX_BYTES:
            return None
        try:
            after = _PART.decode(b"".join((b'{"traceEvents":[', memoryview(data)[last:])))
            break
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
    if after is None:
        return None
    end = last + len(after.traceEvents) - 2
    if end < start or data[end] != 0x5D or _EVENTS_NAME.search(data, end):  # "]", no second key
        return None
    header = before
    for name in ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "otherData"):
        if getattr(after, name) is not msgspec.UNSET:  # a key given twice: the last one counts, as in msgspec
            setattr(header, name, getattr(after, name))
    return start, end, header


def _array_span(data: bytes | np.ndarray) -> tuple[int, int]:
    """``(start, stop)`` of a document that is an array (``_ARRAY_START``), without the spaces around it."""
    start = _ARRAY_START.match(data).end() - 1  # type: ignore[union-attr]
    stop = len(data)
    while stop - 1 > start and data[stop - 1] in _SPACE:
        stop -= 1
    return start, stop


def _last_events(data: np.ndarray, start: int) -> list[int]:
    """Where the last event of the array whose ``[`` is at ``start`` may start, most likely first: the ``{`` of
    the last ``_LAST_TRIES`` ``}, {`` of the document, searched from its end (a name holding ``}, {`` makes one
    inside a string), then ``start + 1`` when the array may hold one event."""
    size = 1 << 16
    while True:
        lo = max(start + 1, len(data) - size)
        found = [m.end() - 1 for m in _EVENT_GAP.finditer(data, lo)][::-1][:_LAST_TRIES]
        if len(found) == _LAST_TRIES:
            return found
        if lo == start + 1:
            return [*found, start + 1]
        size *= 16


def _decoded_chunks(data: np.ndarray, view: memoryview, start: int, end: int, *, strict_first: bool):
    """Yield the events of the array at ``data[start:end + 1]``, ~CHUNK_BYTES of text at a time, each chunk
    decoded in place as ``[event, ..., event]`` (the byte before it set to ``[`` and the byte after it to ``]``
    meanwhile). A cut is made at a ``}, {`` between two events; where that one is inside a string or a nested
    value (the chunk then ends inside it: "truncated"), the cut moves to the next one, up to ``_CUT_TRIES``
    times. ``strict_first``: the first chunk must decode as typed events (an array of other things is not a
    trace; the plain way says so)."""
    pos = start + 1  # the first byte of the chunk's first event
    while True:
        m = _EVENT_GAP.search(data, pos + CHUNK_BYTES, end) if end - pos > CHUNK_BYTES else None
        for tries in range(_CUT_TRIES + 1):
            stop = m.start() + 2 if m is not None else end + 1
            try:
                with _bracketed(data, pos - 1, stop):
                    if strict_first:
                        try:
                            events = _EVENTS.decode(view[pos - 1 : stop])
                        except msgspec.ValidationError:
                            raise _Unchecked from None
                        if not events:
                            raise _Unchecked
                    else:
                        events = _decode_chunk(view[pos - 1 : stop])
                break
            except msgspec.DecodeError as exc:
                if m is None or tries == _CUT_TRIES or "truncated" not in str(exc):
                    raise
                m = _EVENT_GAP.search(data, m.end(), end)
        strict_first = False
        yield events
        del events  # one chunk's events alive at a time, not two while the next one is decoded
        if m is None:
            return
        pos = m.end() - 1


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


# ------------------------------------------------------------------------------- the fast way, in parts
# A file of this much JSON or more is cut into parts, one per core, decoded the fast way at once by processes
# forked from this one (which start with its bytes and the decoder), their columns merged in order. Measured on 2
# cores: df_index_resolver's one 54 MB file in 4 parts 0.29 s vs 0.47 s in one process (decoding alone), its whole
# `diagnose` after imports 0.48-0.50 s vs 0.63-0.64 s.
PARTS_MIN_BYTES = 16 << 20
_PARTS: tuple[np.ndarray, RankTables, list[tuple[int, int]]] | None = None  # what the forked processes inherit


def _decode_parts(path: Path, data: bytes | np.ndarray, tables: RankTables) -> FileColumns | None:
    """``path``'s columns, the same as ``_decode_fast`` gives, its events decoded in parts by forked processes;
    None where this cannot be done (a small file, one core, no safe fork: ``load.forked``; an odd layout) or any
    part fails (the other ways then read the file again and give the same columns, or the error)."""
    global _PARTS
    if not isinstance(data, np.ndarray) or len(data) < PARTS_MIN_BYTES:
        return None
    from ddpdoctor.load import forked

    cores = forked.cores()
    # two parts a core where they are at least 8 MB: the first part costs more (it meets most names first)
    n = min(2 * cores, len(data) // (PARTS_MIN_BYTES // 2))
    if cores < 2 or n < 2:
        return None
    context = forked.fork_context()
    located = _locate(data) if context is not None else None
    if located is None or located[2] is None:
        return None
    start, end, header = located
    bounds = _part_bounds(data, start, end, n)
    if len(bounds) < 2:
        return None
    from concurrent.futures import ProcessPoolExecutor

    mark = tables.mark()
    _PARTS = (data, tables, bounds)
    try:
        with ProcessPoolExecutor(max_workers=min(cores, len(bounds)), mp_context=context) as pool:
            futures = [pool.submit(_decode_part, k) for k in range(len(bounds))]
            results = [f.result() for f in futures]
    except Exception:  # noqa: BLE001 - a part that fails (bad JSON, a cut inside a string, a lost process)
        return None
    finally:
        _PARTS = None
    out = FileColumns(path=str(path))
    _set_header(out, header)
    for part, state in results:
        if not merge_part(out, part, state, tables, mark):
            tables.restore(mark)
            return None
    return out


def _part_bounds(data: np.ndarray, start: int, end: int, n: int) -> list[tuple[int, int]]:
    """``n`` parts (fewer where events are few) of the array at ``data[start:end + 1]``, as ``_decoded_chunks``
    takes them: the byte before each part's first event and the byte after its last, cut at ``}, {``."""
    bounds, first, at = [], start, start
    for k in range(1, n):
        m = _EVENT_GAP.search(data, max(at, start + (end - start) * k // n), end)
        if m is None:
            break
        bounds.append((first, m.start() + 1))
        first, at = m.end() - 2, m.end()
    bounds.append((first, end))
    return bounds


def _decode_part(k: int) -> tuple[FileColumns, tuple[Any, ...]]:
    """In a forked process: the columns of part ``k`` of the file ``_PARTS`` holds, and its tables' state."""
    assert _PARTS is not None
    data, tables, bounds = _PARTS
    first, last = bounds[k]
    out = FileColumns(path="")
    _add_events(out, data, first, last, tables, strict_first=False)
    return out, tables_state(tables)


# ------------------------------------------------------------------------------------------ the plain way
def _decode_checked(path: Path, data: bytes | np.ndarray, tables: RankTables) -> FileColumns:
    """The whole document validated by msgspec first (``traceEvents`` kept raw), then its events decoded in
    chunks copied out of it; one raw slice per event where a cut falls inside a string."""
    out = FileColumns(path=str(path))
    events_raw = _header(path, data, out)
    view = memoryview(events_raw)
    try:
        for chunk in _chunks(view):
            add_chunk(out, _decode_chunk(chunk), tables)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError:
        # a cut fell inside a string or a nested object: fall back to one raw slice per event
        out = FileColumns(path=str(path))
        _header(path, data, out)
        raws = _RAW_LIST.decode(events_raw)
        for i in range(0, len(raws), 8192):
            add_chunk(out, _decode_chunk(b"[" + b",".join(raws[i : i + 8192]) + b"]"), tables)
    finally:
        view.release()
    return out


def _header(path: Path, data: bytes | np.ndarray, out: FileColumns) -> msgspec.Raw | memoryview:
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
                return memoryview(data)[slice(*_array_span(data))]  # the array alone, never a copy
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
    if isinstance(header.otherData, dict):
        out.other_data = header.otherData


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


def _decode_chunk(chunk: bytes | memoryview) -> list[Any]:
    try:
        return _EVENTS.decode(chunk)
    except msgspec.ValidationError:
        return [loosen(e) for e in _LOOSE_EVENTS.decode(chunk)]
