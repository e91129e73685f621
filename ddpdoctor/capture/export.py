"""Exporting one profiled window into the run directory: a complete trace, or none and the reason.

The profiler's exporter (Kineto's ``save``) writes ``<path>.tmp`` and renames it to ``<path>``; when a write fails
(a full disk, a quota) it logs "Failed to write to log file!" and returns as if it had succeeded, leaving
``<path>`` as it was and a short ``<path>.tmp`` that it keeps open, so the space that file took stays taken until
the process ends. So what was written is checked before it is renamed into place: the file is there and not empty,
the exporter's own temporary is gone (it renames it only after a complete write), and the document ends as the
profiler ends one (its last 64 KiB: the events array closed after an event, then plain members such as
``traceName``, then ``}``); an end of any other shape is read in full (msgspec over a memory map, no copy) and only
a document that ends early counts as incomplete. An incomplete file is never renamed into place:
:class:`TraceNotWritten` says why, with the disk's error when a test write finds one (the exporter gives none).
Every temporary is truncated before it is removed, which frees its space even while the exporter still holds it
open, so the rank file can still record what happened.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import tempfile
from pathlib import Path
from typing import Any

PROBE_BYTES = 64 << 10  # a test write after a failed export: any write fails on a disk that is still full
_TAIL_BYTES = 64 << 10  # read to check how the document ends
_STRING = rb'"(?:[^"\\]|\\.)*"'
_SCALAR = rb"(?:" + _STRING + rb"|-?[0-9][0-9.eE+-]*|true|false|null)"
# The last event's "}", the array's "]", then plain members only, among them the profiler's "traceName".
_END_OF_TRACE = re.compile(rb"\}\s*\]\s*(?:,\s*" + _STRING + rb"\s*:\s*" + _SCALAR + rb"\s*)*\}")


class TraceNotWritten(Exception):
    """The window's trace could not be written completely; ``str()`` says why, e.g. "the profiler's exporter
    stopped after 40960 bytes: [Errno 28] No space left on device"."""


def export_trace(prof: Any, out: Path, name: str, rank: int) -> None:
    """Export ``prof``'s window to ``out/name`` (complete, through a rename), or raise :class:`TraceNotWritten`
    and leave nothing behind."""
    fd, tmp = tempfile.mkstemp(prefix=f".rank{rank}.", suffix=".json", dir=out)
    os.close(fd)
    exporters_tmp = tmp + ".tmp"  # Kineto writes <tmp>.tmp and renames it to <tmp>
    try:
        try:
            prof.export_chrome_trace(tmp)
        except OSError as exc:
            raise TraceNotWritten(f"the profiler's exporter failed: {os_error(exc)}") from None
        why = incomplete(Path(tmp), Path(exporters_tmp))
        if why is not None:
            cause = disk_error(out)  # before the temporaries are removed: the space they hold is still taken
            raise TraceNotWritten(f"{why}: {cause}" if cause else why)
        os.replace(tmp, out / name)
    finally:
        for leftover in (exporters_tmp, tmp):
            remove_freeing_space(leftover)


def incomplete(path: Path, exporters_tmp: Path) -> str | None:
    """Why the exported ``path`` is not a complete trace, or None when it is one."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"the profiler's exporter left no file ({os_error(exc)})"
    if os.path.lexists(exporters_tmp):
        with contextlib.suppress(OSError):
            return f"the profiler's exporter stopped after {exporters_tmp.stat().st_size} bytes"
        return "the profiler's exporter did not finish its file"
    if size == 0:
        return "the profiler's exporter wrote nothing"
    try:
        return _cut_short(path, size)
    except OSError as exc:
        return f"the exported trace cannot be read back ({os_error(exc)})"


def _cut_short(path: Path, size: int) -> str | None:
    with open(path, "rb") as f:
        f.seek(max(0, size - _TAIL_BYTES))
        tail = f.read().rstrip()
        if not tail.endswith(b"}"):
            return f"the exported trace is cut short ({size} bytes, its document not closed)"
        if _closes_events(tail):
            return None
        # An end of another shape (a cut just after an event's "}", or another exporter's layout): read it all.
        import msgspec

        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as text:
            try:
                msgspec.json.decode(text, type=msgspec.Raw)  # checks the whole text is JSON, keeps nothing
            except msgspec.DecodeError as exc:
                # Only a document that ends early is incomplete; other bad JSON is the exporter's own output,
                # kept as it was written (a reader says what is wrong with it, as with any trace).
                if "truncated" in str(exc):
                    return f"the exported trace is cut short ({size} bytes, its document not closed)"
    return None


def _closes_events(tail: bytes) -> bool:
    """Whether ``tail`` ends as the profiler ends a complete trace: the ``traceEvents`` array closed after its last
    event, then only plain members (``"traceName": "...", "baseTimeNanoseconds": N``) and the document's ``}``.
    False for any other end, which is then read in full (the cost of a check, never a trace thrown away)."""
    end = len(tail)
    for _ in range(64):  # a "]" inside a string (the trace's name) does not start such an end: try the one before
        end = tail.rfind(b"]", 0, end)
        if end < 0:
            return False
        start = tail.rfind(b"}", 0, end)
        if start >= 0 and _END_OF_TRACE.fullmatch(tail, start) and b'"traceName"' in tail[end:]:
            return True
    return False


def disk_error(folder: Path, size: int = PROBE_BYTES) -> str | None:
    """The error a write of ``size`` bytes in ``folder`` meets now ("[Errno 28] No space left on device"), or
    None."""
    probe = folder / f".ddpdoctor-space-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(bytes(size))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return os_error(exc)
    finally:
        remove_freeing_space(str(probe))
    return None


def os_error(exc: OSError) -> str:
    """``[Errno 28] No space left on device`` (without the file name Python appends: the caller names it)."""
    if exc.errno is not None and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


def remove_freeing_space(path: str) -> None:
    """Remove ``path`` (if there), first truncating it: its blocks are freed even if another handle (the
    exporter's) still holds it open."""
    with contextlib.suppress(OSError):
        os.truncate(path, 0)
    with contextlib.suppress(OSError):
        os.unlink(path)
