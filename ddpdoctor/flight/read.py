"""Finding and reading Flight Recorder dumps: a run directory's ``dumps/rank<R>.<id>.json`` (``FlightDump``, written by
the capture), or the dumps torch itself writes (``TORCH_FR_DUMP_TEMP_FILE`` / ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
prefix + rank: pickle or JSON, NCCL or gloo) of a job that did not run under ddpdoctor.

ddpdoctor never runs code from an input file: torch's pickle dumps are read by ``ddpdoctor.flight.plain_pickle``,
which allows no globals at all (only the builtin containers and scalars that pickle encodes with its own opcodes),
after a size bound. One error policy, as the run directory's readers: a file that cannot be read or does not fit is
left out and named in ``DumpSet.skipped``; the others are used.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ddpdoctor import rundir
from ddpdoctor.errors import TraceError
from ddpdoctor.flight.plain_pickle import loads_plain
from ddpdoctor.runfile_types import MAX_STEP, FlightDump, FlightEntry, FlightRecord, Frame

__all__ = ["DUMP_MAX_BYTES", "DumpSet", "find_dumps", "read_torch_dump"]

DUMP_MAX_BYTES = 256 << 20  # a ring buffer of 2,000 entries with frames is a few MB; more is not a dump
_MAX_FILES = 100_000  # files looked at in one folder

# dumps/rank<R>.<id>.json
_OWN_NAME = re.compile(r"rank(\d{1,10})\.([a-z0-9-]{1,64})\.json")
# dumps/rank<R>.fatal-<pid>.txt: faulthandler's stacks at a fatal signal, below ddpdoctor's header line
_FATAL_NAME = re.compile(r"rank(\d{1,10})\.fatal-(\d{1,10})\.txt")
_FATAL_MAX_BYTES = 4 << 20
# torch's names: <prefix><rank>, e.g. nccl_trace_rank_3, fr_trace_rank_3.json, my_prefix12.pkl
_TORCH_NAME = re.compile(r"(.*?)(\d{1,10})(\.(?:json|pkl|pickle))?")
_OWN_REASONS_STALE = ("hang", "on_demand")  # answers to a request: stale once a newer request was made


@dataclass
class DumpSet:
    """The dumps found at one path: ``dumps`` rank -> FlightDump; ``source`` "ddpdoctor" (a run directory's dumps/)
    or "torch" (torch's own FR dump files); ``request``: the request id the set answers ("" when the ranks' own
    dumps were combined or for torch's files); ``skipped``: "path: why" of files left out; ``notes``: what a reader
    should know (ranks combined from different dumps, where the rank number came from, ...)."""

    dumps: dict[int, FlightDump] = field(default_factory=dict)
    source: str = "ddpdoctor"
    request: str = ""
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stems: dict[int, str] = field(default_factory=dict, repr=False)  # torch's files: each rank's name, less .json


def find_dumps(path: Path) -> DumpSet:
    """The dumps at ``path``: a run directory (its ``dumps/``), a ``dumps/`` folder itself, a folder of torch's own FR
    dumps, or one such file. A run directory without dumps gives an empty set (with a note); a path that does not
    exist raises TraceError."""
    path = Path(path)
    if not os.path.lexists(path):
        raise TraceError(f"{path}: no such file or directory")
    if path.is_dir():
        own = path / "dumps" if (path / "dumps").is_dir() else path
        names = _names(own)
        if any(_OWN_NAME.fullmatch(n) or _FATAL_NAME.fullmatch(n) for n in names):
            return _own_dumps(own, names)
        if own is not path:  # a run directory whose dumps/ holds none of ours: torch's files may be beside it
            names = _names(path)
            found = _torch_dumps(path, names)
            if not found.dumps and not found.skipped:
                found.source = "ddpdoctor"
                found.notes.append(f"{own}: no rank dumps")
            return found
        found = _torch_dumps(path, names)
        if not found.dumps and not found.skipped:
            found.notes.append(f"{path}: no Flight Recorder dumps (dumps/rank<R>.<id>.json, or torch's own files)")
        return found
    if _OWN_NAME.fullmatch(path.name):
        return _own_dumps(path.parent, [path.name])
    found = DumpSet(source="torch")
    _add_torch_file(found, path, path.name, single=True)
    return found


def _names(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as it:
            names = []
            for entry in it:
                names.append(entry.name)
                if len(names) >= _MAX_FILES:
                    break
    except OSError as exc:
        raise TraceError(f"{folder}: cannot list ({exc.strerror or exc})") from None
    return sorted(names)


# --- a run directory's dumps/ --------------------------------------------------------------------------------------


def read_own_dump(path: Path) -> FlightDump:
    """One ``dumps/rank<R>.<id>.json``, checked; OSError / ValueError saying why not."""
    data = rundir.read_regular(path, DUMP_MAX_BYTES)
    try:
        return msgspec.json.decode(data, type=FlightDump)
    except RecursionError:
        raise ValueError("nested too deeply to be a dump") from None
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"not JSON ({str(exc).splitlines()[0]})") from None


def _own_dumps(folder: Path, names: list[str]) -> DumpSet:
    found = DumpSet(source="ddpdoctor")
    by_rank: dict[int, list[tuple[str, FlightDump]]] = {}
    for name in names:
        m = _OWN_NAME.fullmatch(name)
        if not m:
            continue
        file = folder / name
        try:
            dump = read_own_dump(file)
        except (OSError, ValueError) as exc:
            found.skipped.append(f"{file}: {_why(exc)}")
            continue
        if dump.rank != int(m.group(1)):
            found.skipped.append(f"{file}: rank {dump.rank} inside, rank {m.group(1)} in the name")
            continue
        by_rank.setdefault(dump.rank, []).append((m.group(2), dump))
    for name in names:
        m = _FATAL_NAME.fullmatch(name)
        if not m:
            continue
        try:
            fatal = read_fatal_record(folder / name)
        except (OSError, ValueError) as exc:
            found.skipped.append(f"{folder / name}: {_why(exc)}")
            continue
        if fatal is not None and fatal.rank == int(m.group(1)):
            by_rank.setdefault(fatal.rank, []).append((f"fatal-{m.group(2)}", fatal))
    if not by_rank:
        return found
    # The newest request that was answered: a rank's answer to an older request is stale once a newer one was made.
    requests: dict[str, float] = {}
    for dumps in by_rank.values():
        for _id, d in dumps:
            if d.request and d.reason in _OWN_REASONS_STALE:
                requests[d.request] = max(requests.get(d.request, d.time), d.time)
    newest_request = max(requests, key=lambda r: requests[r]) if requests else ""
    newest_request_time = requests.get(newest_request, 0.0)
    # A hang request every rank answered is the picture of the hang: the dumps the ranks wrote after it (a signal
    # when the job was stopped, the exceptions that followed) show them unwinding, not where they were stuck.
    answers = {
        rank: next(((i, d) for i, d in dumps if d.request == newest_request and d.reason == "hang"), None)
        for rank, dumps in by_rank.items()
    }
    if newest_request and all(answers.values()):
        later = sorted({d.reason for dumps in by_rank.values() for _i, d in dumps if d.time > newest_request_time})
        for rank, answer in sorted(answers.items()):
            assert answer is not None
            found.dumps[rank] = answer[1]
        found.request = newest_request
        if later:
            found.notes.append(
                f"every rank's answer to the hang request {newest_request!r} is used; their later dumps "
                f"({', '.join(later)}: written as the job was stopped) are not"
            )
        return found
    ids = set()
    for rank, dumps in sorted(by_rank.items()):
        dumps.sort(key=lambda item: (item[1].time, item[0]))
        chosen = None
        for dump_id, d in reversed(dumps):
            stale = d.reason in _OWN_REASONS_STALE and d.request != newest_request and d.time < newest_request_time
            if not stale:
                chosen = (dump_id, d)
                break
        if chosen is None:
            found.notes.append(
                f"rank {rank}: its newest dump answers an older request than {newest_request!r}; left out"
            )
            continue
        if chosen[1].reason == "signal":
            # A stop signal that reached a process already unwinding from its own exception (the launcher stops
            # every rank once one has died): the exception, with the buffer as it failed, is this rank's story.
            stop = chosen[1]
            raised = [(i, d) for i, d in dumps if d.reason == "exception" and d.pid == stop.pid and d.time <= stop.time]
            if raised:
                chosen = raised[-1]
        ids.add(chosen[0])
        found.dumps[rank] = chosen[1]
    if len(ids) == 1 and newest_request and all(d.request == newest_request for d in found.dumps.values()):
        found.request = newest_request
    elif len(ids) > 1:
        found.notes.append(
            "the dump used of each rank: " + ", ".join(f"rank {r} {d.reason}" for r, d in found.dumps.items())
        )
    return found


_SIGNAL_OF = {
    "Aborted": "SIGABRT",
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_THREAD_LINE = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FILE_LINE = re.compile(r'  File "(.*)", line (\d+) in (.*)')


def read_fatal_record(path: Path) -> FlightDump | None:
    """``dumps/rank<R>.fatal-<pid>.txt`` as a FlightDump (reason "fatal": the signal as its exception, every thread's
    stack, no Flight Recorder buffer: the process ran no Python after the signal); None when the signal never came
    (the header alone). ValueError when it is not such a record."""
    from ddpdoctor.capture.flight import FATAL_HEADER, FATAL_WHERE

    text = rundir.read_regular(path, _FATAL_MAX_BYTES).decode("utf-8", "replace")
    first, _, body = text.partition("\n")
    if not first.startswith(FATAL_HEADER):
        raise ValueError("not a fatal-signal record (no ddpdoctor header line)")
    try:
        header = json.loads(first[len(FATAL_HEADER) :])
        rank, pid, main = int(header["rank"]), int(header.get("pid") or 0), int(header.get("main") or 0)
        world = max(1, int(header.get("world_size") or 1))
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ValueError("not a fatal-signal record (its header line is not ddpdoctor's)") from None
    where: dict[str, Any] = {"phase": "unknown"}  # a record of an older ddpdoctor: no "where" line
    if body.startswith(FATAL_WHERE):
        line, _, body = body.partition("\n")
        where = _where_line(line[len(FATAL_WHERE) :])
    if not body.strip():
        return None
    fatal = re.search(r"Fatal Python error: ([^\n]*)", body)
    what = fatal.group(1).strip() if fatal else "a fatal signal"
    signame = _SIGNAL_OF.get(what, what)
    threads: list[dict[str, Any]] = []
    current = None
    for line in body.splitlines():
        m = _THREAD_LINE.match(line)
        if m:
            ident = int(m.group(2), 16)
            current = {"name": "MainThread" if ident == main else f"thread {m.group(2)}", "ident": ident,
                       "main": ident == main, "frames": []}  # fmt: skip
            threads.append(current)
            continue
        m = _FILE_LINE.match(line)
        if m and current is not None:
            current["frames"].append({"file": m.group(1), "line": int(m.group(2)), "name": m.group(3).strip()})
        elif current is not None and not line.startswith("  "):
            current = None
    for t in threads:
        t["frames"].reverse()  # faulthandler lists the innermost first; a dump lists the outermost first
    main_frames = next((t["frames"] for t in threads if t["main"]), [])
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = 0.0
    data = {
        "rank": rank,
        "world_size": world,
        "pid": pid,
        "host": str(header.get("host") or ""),
        "reason": "fatal",
        "time": mtime,
        **where,
        "exception": {
            "type": signame,
            "message": f"Fatal Python error: {what} (the process was ended by the signal)",
            "frames": main_frames,
        },
        "threads": threads,
        "fr_error": "the process ended by a fatal signal: no Flight Recorder buffer could be dumped",
    }
    try:
        return msgspec.convert(data, FlightDump)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a fatal-signal record ({exc})") from None


def _where_line(text: str) -> dict[str, Any]:
    """A fatal record's "where" line: ``{"step", "phase"}`` as the phase tracker last stored them; ``{"phase":
    "unknown"}`` (the verdict then says the step is unknown) when it says "unknown" or cannot be read (a record of
    an older ddpdoctor has no such line: the same)."""
    from ddpdoctor.capture.phase import PHASES

    try:
        data = json.loads(text)
        step, phase = data["step"], str(data["phase"]).strip()
    except (ValueError, TypeError, KeyError):
        return {"phase": "unknown"}
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < MAX_STEP or phase not in PHASES:
        return {"phase": "unknown"}
    return {"step": step, "phase": phase}


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


# --- torch's own dump files ------------------------------------------------------------------------------------------


def _torch_dumps(folder: Path, names: list[str]) -> DumpSet:
    found = DumpSet(source="torch")
    for name in names:
        file = folder / name
        if name.startswith(".") or not _TORCH_NAME.fullmatch(name) or not file.is_file():
            continue
        _add_torch_file(found, file, name, single=False)
    return found


def _add_torch_file(found: DumpSet, file: Path, name: str, *, single: bool) -> None:
    m = _TORCH_NAME.fullmatch(name)
    try:
        data = rundir.read_regular(file, DUMP_MAX_BYTES)
    except OSError as exc:
        found.skipped.append(f"{file}: {_why(exc)}")
        return
    if data[:1] not in (b"{", b"\x80", b" ", b"\n", b"\t"):
        if single:
            found.skipped.append(f"{file}: not a Flight Recorder dump (neither JSON nor pickle)")
        return  # a folder may hold other files: only what looks like a dump is read
    try:
        mtime = file.stat().st_mtime
    except OSError:
        mtime = 0.0
    rank = int(m.group(2)) if m else None
    try:
        dump = read_torch_dump(data, rank=rank, time=mtime)
    except ValueError as exc:
        found.skipped.append(f"{file}: {exc}")
        return
    if dump.rank in found.dumps:
        stem = name.rsplit(".", 1)[0] if m and m.group(3) else name
        other = found.stems.get(dump.rank, "")
        if stem == other:  # the same dump as pickle and JSON: the one with the issuing frames is kept
            has_frames = any(e.frames for rec in dump.flight_recorder for e in rec.entries)
            if has_frames:
                found.dumps[dump.rank] = dump
            found.notes.append(f"rank {dump.rank}: {stem} read as pickle and as JSON; the one with frames is used")
            return
        found.skipped.append(f"{file}: a second dump of rank {dump.rank} (the first: {other})")
        return
    found.stems[dump.rank] = name.rsplit(".", 1)[0] if m and m.group(3) else name
    found.dumps[dump.rank] = dump
    if rank is None:
        found.notes.append(f"{file}: rank {dump.rank} taken from the dump's process group, not the file name")


def read_torch_dump(data: bytes, *, rank: int | None, time: float = 0.0) -> FlightDump:
    """torch's own FR dump (pickle or JSON bytes, NCCL or gloo) as a FlightDump with one FlightRecord per backend.
    ValueError saying why when it is not one."""
    raw: Any
    if data[:1] == b"\x80":
        try:
            raw = loads_plain(data)
        except Exception as exc:  # noqa: BLE001 - any malformed pickle is the input's problem
            raise ValueError(f"not a Flight Recorder dump (pickle: {exc})") from None
    else:
        try:
            raw = json.loads(data)
        except RecursionError:
            raise ValueError("not a Flight Recorder dump (JSON nested too deeply)") from None
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("entries", []), list):
        raise ValueError("not a Flight Recorder dump (no 'entries' list)")
    if "entries" not in raw and "pg_status" not in raw:
        raise ValueError("not a Flight Recorder dump (no 'entries' or 'pg_status')")
    skipped = 0
    by_source: dict[str, list[FlightEntry]] = {}
    for item in raw.get("entries") or []:
        entry = _entry(item)
        if entry is None:
            skipped += 1
            continue
        backend = entry.profiling_name.split(":", 1)[0] if ":" in entry.profiling_name else "nccl"
        by_source.setdefault(backend if backend in ("gloo", "nccl") else backend or "nccl", []).append(entry)
    pg_config = _plain_dict(raw.get("pg_config"))
    pg_status = _plain_dict(raw.get("pg_status"))
    version = str(raw.get("version", ""))
    if not by_source:
        by_source["nccl" if raw.get("nccl_comm_state") or raw.get("comm_lib_version") else "gloo"] = []
    records = [
        FlightRecord(source=src, version=version, pg_config=pg_config, pg_status=pg_status, entries=entries)
        for src, entries in sorted(by_source.items())
    ]
    world = _world_size(pg_config)
    if rank is None:
        raise ValueError("no rank in the file name (torch names its dumps <prefix><rank>)")
    fr_error = f"{skipped} entries that do not fit were left out" if skipped else None
    try:
        return FlightDump(
            rank=rank,
            world_size=max(world or 1, rank + 1),
            reason="torch",
            time=float(time),
            flight_recorder=records,
            fr_error=fr_error,
        )
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None


def _plain_dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        return {}
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return {}


def _entry(item: Any) -> FlightEntry | None:
    if not isinstance(item, dict):
        return None
    item = dict(item)
    frames = item.pop("frames", None)
    if isinstance(item.get("process_group"), tuple):
        item["process_group"] = list(item["process_group"])
    for key in ("time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms"):
        if item.get(key) == 0 and key != "timeout_ms":
            item[key] = None
    try:
        entry = msgspec.convert(item, FlightEntry, strict=False)
    except (msgspec.ValidationError, TypeError):
        return None
    if isinstance(frames, list):
        out = []
        for f in frames:
            if isinstance(f, dict):
                try:
                    out.append(
                        Frame(
                            file=str(f.get("filename", f.get("file", ""))),
                            line=int(f.get("line", 0) or 0),
                            name=str(f.get("name", "")),
                        )
                    )
                except (TypeError, ValueError, msgspec.ValidationError):
                    continue
        entry.frames = out[::-1]  # torch lists them innermost first; FlightEntry keeps them outermost first
    return entry


def _world_size(pg_config: dict[str, Any]) -> int | None:
    best = None
    for conf in pg_config.values():
        if not isinstance(conf, dict):
            continue
        ranks = conf.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                continue
        if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks) and ranks:
            best = max(best or 0, max(ranks) + 1)
    return best
