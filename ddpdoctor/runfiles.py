"""Reading and writing the run files more than one part reads (``rundir`` has the layout).

The files read by more than one part have msgspec types (``Manifest``, ``RankCapture``, ``RankSummary``, defined in
``ddpdoctor.runfile_types``):
the capture writes through them and every reader reads through ``read_run_files`` / ``read_summaries``, with
one error policy: a file that cannot be read or does not fit its type is left out and named in a note with the
field (``ranks/rank3.json: skipped: Expected `int | null`, got `str` - at `$.memory.devices[0].index```); the
others are used. The types reach down to the nested values the readers use; only a rank capture's GIL, host load and
schedule records, optional to every reader, are left out alone when they do not fit (``runfile_types.DROPPABLE``).

``ranks/rank<R>.json`` (schema_version 1)::

    {"schema_version": 1, "rank", "local_rank", "world_size", "node_rank", "hostname", "pid",
     "status": "running" | "ok" | "failed" | "interrupted", "exit_code", "error",
     "backend", "device",                         # e.g. "gloo", "cuda:3" / "cpu"
     "steps": {"source": "optimizer" | "manual" | "none", "count", "first": 1,
               "wall_ms": [...],                  # wall time of every step from step `first` on
               "profiled": [[first_step, last_step], ...]},
     "memory": {"devices": [{"device", "index", "name", "capacity_bytes", "peak_allocated_bytes",
                             "peak_reserved_bytes", "per_step": {"step": [...], "peak_allocated_bytes": [...],
                             "peak_reserved_bytes": [...]}}]},
     "gil": {"probe", "available", "reason", "per_step": {"step": [...], "contention": [...], "threads": [...]}},
     "hostload": {"source", "reason", "windows": [{"first_step", "last_step", "wall_s", "cpu_s", "run_s",
                  "run_delay_s", "involuntary_switches", "host_busy_s", "host_steal_s", ...}]},  # capture/hostload.py
     "ddp": [{"module", "logging_data": {...}}],  # DistributedDataParallel._get_ddp_logging_data()
     "dp": [{"module", "device_ids", "output_device"}],
     "threads": {"cpu_count", "affinity_cpus", "affinity": [[first_cpu, last_cpu], ...], "omp_num_threads",
                 "torch_intra_op_threads", "torch_inter_op_threads"},
     "trace_files": ["rank0.1732900000000.pt.trace.json.gz", ...],
     "process_groups": [{"name", "rank", "world_size", "backend"}, ...],  # the groups this process joined, in
                                                  # order; name "" is the top level; the file describes the first
     "torch_version", "cuda_available"}
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ddpdoctor import liveness
from ddpdoctor.rundir import MANIFEST, RANKS_DIR, atomic_write_json, json_default, rank_file, read_json, read_regular
from ddpdoctor.runfile_types import (
    DROPPABLE,
    Manifest,
    RankCapture,
    RankSummary,
    RankSummaryLazy,
    RankSummaryWire,
)


def to_plain(data: Any) -> Any:
    """``data`` as it reads back from JSON (numpy scalars as numbers, tuples as lists)."""
    return json.loads(json.dumps(data, default=json_default))


def check(data: Any, kind: type[msgspec.Struct]) -> str | None:
    """None when ``data`` (decoded JSON) fits ``kind``, else why not, in one line."""
    try:
        msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        return str(exc).splitlines()[0]
    return None


def _read_object(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(data, None)`` or ``(None, why)``: the JSON object in ``path``, unchecked."""
    try:
        data = read_json(path)
    except OSError as exc:
        return None, f"cannot read it: {exc.strerror or exc}"
    except (ValueError, RecursionError) as exc:
        return None, f"not valid JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    return data, None


def _read_checked(path: Path, kind: type[msgspec.Struct]) -> tuple[dict[str, Any] | None, str | None]:
    """``(data, None)`` or ``(None, why)``: the JSON object in ``path`` checked against ``kind``."""
    data, why = _read_object(path)
    if data is None:
        return None, why
    why = check(data, kind)
    return (None, why) if why else (data, None)


def _without_unfit_records(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` less its optional records (``runfile_types.DROPPABLE``: GIL probe, schedule) that do not fit their
    type, and a note for each (naming the field, ``$.gil.per_step.step[0]``)."""
    notes = []
    for key, kind in DROPPABLE.items():
        try:
            msgspec.convert(data.get(key), kind)
        except msgspec.ValidationError as exc:
            why = str(exc).splitlines()[0].replace("`$", f"`$.{key}")
            why = why if "- at `" in why else f"{why} - at `$.{key}`"
            notes.append(f"{key} left out ({why}); the rest of the file is used")
            data = {k: v for k, v in data.items() if k != key}
    return data, notes


def _rank_files(run_dir: Path, suffix: str) -> list[tuple[int, Path]]:
    return [(rank, Path(path)) for rank, _, path in _rank_paths(run_dir, suffix)]


def _rank_paths(run_dir: Path, suffix: str) -> list[tuple[int, str, str]]:
    """(rank, file name, path) of ``ranks/rank<R><suffix>``, by rank (paths as strings: a Path per file costs
    more than reading a small one)."""
    folder = os.path.join(run_dir, RANKS_DIR)
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    pattern = re.compile(rf"^rank(\d{{1,9}}){re.escape(suffix)}$")
    found = [(int(m.group(1)), name) for name in names if (m := pattern.match(name))]
    return [(rank, name, os.path.join(folder, name)) for rank, name in sorted(found)]


# Reading many ranks' files quickly: msgspec decodes a file that is valid in one pass; a file it refuses (or that
# fails a check) is read again the slow way, ``json`` then ``msgspec.convert``, which says why, in the words a note
# has always used. msgspec is stricter than ``json`` (NaN, 1e400, lone surrogates), never laxer.
_JSON = msgspec.json.Decoder()
_SUMMARY = msgspec.json.Decoder(RankSummaryWire)
_SUMMARY_LAZY = msgspec.json.Decoder(RankSummaryLazy)  # timeline and op_work as text (read_summaries' keep)
LAZY_TABLES = ("timeline", "op_work")  # RankSummaryLazy's undecoded tables, which load.kept leaves on disk


def _read_capture(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(data, None)``, ``(None, why)`` (the file left out), or ``(data, note)``: a rank capture whose optional
    records that do not fit were left out (``_without_unfit_records``), the note saying which and why."""
    try:
        data = _JSON.decode(read_regular(path))
        if isinstance(data, dict):
            msgspec.convert(data, RankCapture)
            return data, None
    except (OSError, msgspec.MsgspecError, ValueError, RecursionError):
        pass
    data, why = _read_object(Path(path))
    if data is None:
        return None, why
    data, dropped = _without_unfit_records(data)
    why = check(data, RankCapture)
    if why:
        return None, why
    return data, "; ".join(dropped) or None


_PG_KEY = b'"pg_config": '


class _SharedGroups:
    """The ``distributed_info.pg_config`` text of the last summary read, decoded once. Every rank of a job lists
    the same process groups with all their ranks: 100 kB of each rank's file at 16,384 ranks. Where a file holds
    the same text at its ``"pg_config": `` key, that text is compared (not parsed again): the file is decoded with
    ``null`` in its place and takes the decoded groups (one object shared by the ranks)."""

    def __init__(self, decoder: msgspec.json.Decoder = _SUMMARY) -> None:
        self.text = b""
        self.value: Any = None
        self.decoder = decoder

    def decode(self, data: bytes) -> tuple[RankSummaryWire, Any]:
        """The file's wire form, and its process groups decoded (``_MISSING`` when it has none to share)."""
        key = data.find(_PG_KEY) if self.text else -1
        if key > 0 and data[key - 1 : key] != b"\\":  # the key's own quote, not an escaped one in a string
            at = key + len(_PG_KEY)
            end = at + len(self.text)
            if data[at:end] == self.text:
                wire = self.decoder.decode(data[:at] + b"null" + data[end:])
                if bytes((wire.distributed_info or {}).get("pg_config") or b"") == b"null":
                    return wire, self.value
        wire = self.decoder.decode(data)
        raw = (wire.distributed_info or {}).get("pg_config")
        if raw is None or len(raw) < 256:
            return wire, _MISSING
        self.text, self.value = bytes(raw), _JSON.decode(raw)
        return wire, self.value


_MISSING = object()
_EMPTY_OBJECT = re.compile(rb"\{\s*\}")


def _read_summary(path: str, shared: _SharedGroups) -> tuple[dict[str, Any] | None, str | None]:
    """``(data, None)`` or ``(None, why)``: a summary file checked against ``RankSummary`` (the process groups'
    text decoded once for the ranks that share it, ``_SharedGroups``)."""
    try:
        wire, groups = shared.decode(read_regular(path))
    except (OSError, msgspec.MsgspecError, ValueError, RecursionError):
        return _read_checked(Path(path), RankSummary)
    data = msgspec.structs.asdict(wire)  # every field, in order, as it is (shallow)
    if isinstance(wire, RankSummaryLazy):  # timeline and op_work as text: None, {} or left as text (load.kept)
        for key in LAZY_TABLES:
            text = bytes(data[key]).strip()
            if not text:
                del data[key]
            elif text == b"null":
                data[key] = None
            elif not text.startswith(b"{"):  # not a table: the checked reader says why
                return _read_checked(Path(path), RankSummary)
            elif _EMPTY_OBJECT.fullmatch(text):
                data[key] = {}
    if data.get("op_work") is msgspec.UNSET:  # a summary from before it: absent, as the checked reader reads it
        del data["op_work"]
    data["devices"] = [msgspec.structs.asdict(d) for d in wire.devices]
    if wire.distributed_info is not None:
        info = wire.distributed_info
        rest = [key for key in info if not (key == "pg_config" and groups is not _MISSING)]
        values = _JSON.decode(b"[" + b",".join(bytes(info[key]) for key in rest) + b"]")  # one call for them all
        decoded = dict(zip(rest, values, strict=True))
        data["distributed_info"] = {key: decoded[key] if key in decoded else groups for key in info}
    return data, None


def read_rank_captures(run_dir: Path) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """rank -> the ``ranks/rank<R>.json`` data (checked against ``RankCapture``), and one note per file left
    out. The rank is the one the file states (a copied file keeps its own)."""
    out: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    for _, name, path in _rank_paths(run_dir, ".json"):
        data, why = _read_capture(path)
        if data is None:
            notes.append(f"{RANKS_DIR}/{name}: skipped: {why}")
            continue
        if why:  # optional records left out, the rest used
            notes.append(f"{RANKS_DIR}/{name}: {why}")
        if data["rank"] in out:
            notes.append(f"{RANKS_DIR}/{name}: skipped: rank {data['rank']} is already in another file")
            continue
        out[data["rank"]] = data
    return dict(sorted(out.items())), notes


# Set by the readers (read_run_files) on a rank capture that still says "running" whose process is known to be gone:
# why (``rank_process_gone``). Never written: the capture side reads the same files without it.
PROCESS_GONE = "process_gone"


def read_summaries(
    run_dir: Path, version: str, keep: Callable[[dict[str, Any], str], dict[str, Any]] | None = None
) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """rank -> ``ranks/rank<R>.summary.json`` written by ddpdoctor ``version`` (checked against
    ``RankSummary``; an older version's numbers are recomputed from the traces, silently), and notes on the
    files left out for another reason. ``keep(data, path)``: what is kept of each checked file, called as each
    is read (so that a run of 131,072 ranks never holds every file's lists at once). With ``keep``, each file's
    ``timeline`` and ``op_work`` reach it undecoded where they hold a table (``msgspec.Raw``: half of a file's
    decoding; ``None`` and ``{}`` as they are): ``keep`` leaves them on disk or decodes them."""
    out: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    shared = _SharedGroups(_SUMMARY if keep is None else _SUMMARY_LAZY)
    for _, name, path in _rank_paths(run_dir, ".summary.json"):
        data, why = _read_summary(path, shared)
        if data is None:
            notes.append(f"{RANKS_DIR}/{name}: skipped: {why}; the rank's trace is read instead")
        elif data["ddpdoctor_version"] == version and data["rank"] not in out:
            out[data["rank"]] = data if keep is None else keep(data, path)
    return dict(sorted(out.items())), notes


def read_summary_again(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """A summary file read as ``read_summaries`` reads it, ``(data, None)`` or ``(None, why)`` (what a kept
    summary left on disk: ``load.kept.OnDisk``)."""
    return _read_summary(path, _SharedGroups())


def read_manifest(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """``manifest.json`` checked against ``Manifest`` (``{}`` when absent), and a note when it is left out."""
    path = run_dir / MANIFEST
    if not path.exists():
        return {}, []
    data, why = _read_checked(path, Manifest)
    return (data, []) if data is not None else ({}, [f"{MANIFEST}: skipped: {why}"])


def read_run_files(run_dir: Path) -> tuple[dict[int, dict[str, Any]], dict[str, Any], list[str]]:
    """The capture files of a run directory: rank captures, the manifest, and notes on files left out."""
    captures, notes = read_rank_captures(run_dir)
    for rank, data in captures.items():
        if data.get("status") == "running":
            gone = liveness.rank_process_gone(data, rank_file(run_dir, rank))
            if gone:  # its process ended without finishing the file (kill -9, the OOM killer, a reboot)
                captures[rank] = {**data, PROCESS_GONE: gone}
    manifest, more = read_manifest(run_dir)
    return captures, manifest, notes + more


def _write_checked(path: Path, data: dict[str, Any], kind: type[msgspec.Struct]) -> str | None:
    """Write ``data`` atomically and return why it does not fit ``kind`` (None when it does). The data is written
    either way: what a rank measured is never thrown away for a bug of ddpdoctor's, which the tests catch here."""
    plain = to_plain(data)
    why = check(plain, kind)
    atomic_write_json(path, plain)
    return why


def write_rank_capture(path: Path, data: dict[str, Any]) -> str | None:
    """Write ``ranks/rank<R>.json``; returns why it does not fit ``RankCapture`` (None when it does)."""
    return _write_checked(path, data, RankCapture)


def write_summary(path: Path, data: dict[str, Any]) -> str | None:
    """Write ``ranks/rank<R>.summary.json``; returns why it does not fit ``RankSummary`` (None when it does)."""
    return _write_checked(path, data, RankSummary)


def write_manifest(path: Path, data: dict[str, Any]) -> str | None:
    """Write ``manifest.json``; returns why it does not fit ``Manifest`` (None when it does)."""
    return _write_checked(path, data, Manifest)
