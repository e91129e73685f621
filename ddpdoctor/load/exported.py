"""ddpdoctor's own Perfetto export read back as the ranks it holds (``ddpdoctor export RUN --perfetto FILE``).

The export is one Chrome trace of every rank, a process per rank. Read as any other single trace it would be one
rank; the exporter therefore writes ``otherData.producer = PRODUCER`` and ``otherData.ranks``: per rank the
process id it has in the file, its rank, its host, its ``distributedInfo`` and the window exported. ``split``
turns the columns of such a file into one ``FileColumns`` per rank carrying that ``distributedInfo``, so that the
loader numbers the ranks as the run did. A file without the marker (every foreign trace) is left as it is.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from ddpdoctor.load.columns import COMM_COLUMNS, FileColumns
from ddpdoctor.load.schema import clean_distributed_info, valid_rank, valid_world_size

PRODUCER = "ddpdoctor export --perfetto"
_OTHER_PIDS = "events of a process the export's otherData.ranks does not list"


def rank_entries(other_data: Any) -> list[dict[str, Any]] | None:
    """The export's ``otherData.ranks`` (each with an int ``pid`` and a valid ``rank``), None when ``other_data``
    is not a ddpdoctor export's or its rank list is unusable (then the file is read as any trace)."""
    if not isinstance(other_data, dict) or other_data.get("producer") != PRODUCER:
        return None
    entries = other_data.get("ranks")
    if not isinstance(entries, list) or not entries:
        return None
    out = []
    for e in entries:
        if not isinstance(e, dict) or valid_rank(e.get("rank")) is None:
            return None
        pid = e.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            return None
        out.append(e)
    if len({e["pid"] for e in out}) != len(out) or len({e["rank"] for e in out}) != len(out):
        return None
    return out


def split(f: FileColumns) -> list[FileColumns] | None:
    """One ``FileColumns`` per rank of a ddpdoctor export (``f``'s rows of that rank's process), None for any other
    file. Events of a process that is no listed rank are left out, and the first part's notes say how many."""
    entries = rank_entries(f.other_data)
    if entries is None:
        return None
    world_size = valid_world_size((f.other_data or {}).get("world_size"))
    x = {key: np.concatenate(chunks) for key, chunks in f.x.items() if chunks}
    pid = x.get("pid", np.zeros(0, dtype=np.int64))
    mem = {key: np.concatenate(chunks) for key, chunks in f.mem.items() if chunks}
    mem_pid = mem.get("pid", np.zeros(0, dtype=np.int64))
    comm_rows = np.asarray(f.comm.get("row", []), dtype=np.int64)
    parts = []
    for i, e in enumerate(entries):
        rows = pid == e["pid"]
        new_row = np.cumsum(rows) - 1
        in_rank = rows[comm_rows] if len(comm_rows) else np.zeros(0, dtype=bool)
        comm = (
            {key: [v for v, keep in zip(f.comm[key], in_rank.tolist(), strict=True) if keep] for key in COMM_COLUMNS}
            if f.comm
            else {}
        )
        if comm:
            comm["row"] = new_row[comm_rows[in_rank]].tolist()
        info = clean_distributed_info(e["distributed_info"]) if isinstance(e.get("distributed_info"), dict) else {}
        info["rank"] = e["rank"]
        if world_size is not None:
            info.setdefault("world_size", world_size)
        mem_rows = mem_pid == e["pid"]
        part = replace(
            f,
            distributed_info=info,
            window=_window(e.get("window_us")),
            x={key: [col[rows]] for key, col in x.items()},
            mem={key: [col[mem_rows]] for key, col in mem.items()},
            comm=comm,
            thread_names={k: v for k, v in f.thread_names.items() if k[0] == e["pid"]},
            process_labels={k: v for k, v in f.process_labels.items() if k == e["pid"]},
            n_x=int(rows.sum()),
            n_events=int(rows.sum() + mem_rows.sum()),
            bad_times=dict(f.bad_times) if i == 0 else {},
        )
        parts.append(part)
    other = int(len(pid) - np.isin(pid, [e["pid"] for e in entries]).sum())
    if other:
        parts[0].bad_times[_OTHER_PIDS] = other
    return parts


def _window(value: Any) -> tuple[float, float] | None:
    if not isinstance(value, list) or len(value) != 2:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        return None
    lo, hi = float(value[0]), float(value[1])
    return (lo, hi) if hi >= lo else None
