"""Find the trace files under a path and group them by the worker (rank) that wrote them.

Handles a ddpdoctor run directory (``rank<R>.<span>.pt.trace.json.gz``), ``tensorboard_trace_handler`` folders
(``<worker>.<ms>.pt.trace.json[.gz]``, several spans per worker), HTA-style ``rank-N.json.gz`` and single
files.
"""

from __future__ import annotations

import re
from pathlib import Path

from ddpdoctor.errors import TraceError
from ddpdoctor.rundir import BEFORE_WINDOW, DUMPS_DIR, MANIFEST, NODES_DIR, RANKS_DIR, entry_kind

_PT_TRACE = re.compile(r"\.pt\.trace\.json(\.gz)?$", re.IGNORECASE)
_JSON = re.compile(r"\.json(\.gz)?$", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d{1,9})(?!\d)", re.IGNORECASE)
_SPAN_SUFFIX = re.compile(r"\.\d+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(path: object) -> str:
    """A path (or any text) for a one-line message: control characters (terminal escapes, newlines) in file
    names are shown as ``\\xNN``, never sent to the terminal; bytes that are not UTF-8 as ``\\udcNN``."""
    text = str(path).encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def trace_files(path: Path) -> list[Path]:
    """The trace files a path stands for: the file itself, or the trace files directly inside a folder."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        try:  # there, but a FIFO, a device, a socket: say what it is
            what = f"{entry_kind(path.stat().st_mode)}, not a trace file or a folder"
        except OSError:
            what = "no such file or directory"
        raise TraceError(f"{shown(path)}: {what}")
    entries = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    pt = [p for p in entries if _PT_TRACE.search(p.name)]
    files = pt or [p for p in entries if _JSON.search(p.name) and p.name != MANIFEST]
    if not files:
        below = sorted(
            {
                p.parent.name
                for p in path.glob("*/*")
                if p.is_file() and _JSON.search(p.name) and not (p.parent.name in _RECORDS and _plain_json(p))
            }
        )
        hint = f"; folders below it with traces: {shown(', '.join(below))}" if below else ""
        ended = _ended_before_window(path)
        if ended:
            raise TraceError(f"{shown(path)}: {ended}; lower --wait/--warmup or run more steps")
        raise TraceError(f"{shown(path)}: no trace files (*.pt.trace.json[.gz], *.json[.gz]) in this folder{hint}")
    return files


def _ended_before_window(path: Path) -> str | None:
    """The manifest's note on a traced job that ended before its profiled window, with the steps it ran (a run
    directory with no trace for that reason); None otherwise, or when the manifest cannot be read."""
    import json

    try:
        manifest = json.loads((path / MANIFEST).read_bytes()[: 1 << 24])
        note = next(n for n in manifest.get("notes") or [] if str(n).startswith(BEFORE_WINDOW))
        steps = sorted({int(r.get("steps") or 0) for r in manifest.get("ranks") or [] if r.get("status") == "ok"})
    except (OSError, ValueError, TypeError, AttributeError, StopIteration):
        return None
    ran = f"; the job ran {'/'.join(map(str, steps))} steps" if steps else ""
    return f"{note}{ran}"


_RECORDS = (RANKS_DIR, NODES_DIR, DUMPS_DIR)  # a run directory's own record folders: their JSON files are not traces


def _plain_json(path: Path) -> bool:
    """A JSON file that is not a trace file's name (``rank0.json``, ``node0.json``: ddpdoctor's records)."""
    return not _PT_TRACE.search(path.name) and not path.name.endswith(".gz")


def worker_name(path: Path) -> str:
    """The worker part of a trace file name: ``rank0.1732900000000.pt.trace.json.gz`` -> ``rank0``."""
    name = path.name
    stem = _PT_TRACE.sub("", name) if _PT_TRACE.search(name) else _JSON.sub("", name)
    return _SPAN_SUFFIX.sub("", stem) or stem


def rank_from_name(path: Path) -> int | None:
    """The rank written in a file name (``rank3``, ``rank-3``, ``rank_3``), if any."""
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def group_by_worker(files: list[Path]) -> dict[str, list[Path]]:
    """Files grouped by the worker that wrote them (its spans), in a stable order."""
    groups: dict[str, list[Path]] = {}
    for f in files:
        rank = rank_from_name(f)
        key = f"rank{rank}" if rank is not None else worker_name(f)
        groups.setdefault(key, []).append(f)
    return dict(sorted(groups.items(), key=lambda kv: _natural(kv[0])))


def _natural(text: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]
