"""The run directory: the one contract between ``ddpdoctor trace`` (writer) and everything that reads.

Layout of ``OUT/``::

    manifest.json                          the run: command, world size, exit code, per-rank status and files
    nodes/node<K>.json                     what the launcher on node K saw (merged into manifest.json)
    nodes/node<K>.log, exits<K>.json       torchrun's failure report in full, and each failed rank's exit status
    rank<R>.<ms>.pt.trace.json.gz          Kineto trace of rank R, one per profiled window ("span");
                                           TensorBoard's profiler plugin shows worker "rank<R>"
    ranks/rank<R>.json                     capture data of rank R (``RankCapture`` below)
    ranks/rank<R>.summary.json             metrics rank R computed from its own trace at the end of the run
    ranks/rank<R>.series.jsonl             rank R's always-on step series (``capture.series``)
    ranks/rank<R>.window<A>-<B>.summary.json  a window of steps A-B that ``--keep`` removed, summarised first
                                           (``capture.window_summary``; ``.rank<R>.window<A>-<B>.pending[.gz]``:
                                           the link to its trace its summariser reads meanwhile)
    groups/group<N>.json                   a job that created more than one process group (an evaluation spawned
    groups/group<N>/                       after the training, a world-size-1 group of a helper): each group but
                                           the training one has its own folder with this same layout (``ranks/``,
                                           traces; ``ddpdoctor diagnose`` reads it as a run), and a record
                                           {"name", "dir", "world_size", "backend", "hostname", "pid",
                                           "created_at"[, "moved_from"]}; the top level holds the training group
                                           (the one every command reads), and manifest.json's ``groups`` lists them
    tensorboard/                           event files (scalars, findings) for TensorBoard
    dumps/rank<R>.<id>.json                a rank's dump (``FlightDump``: step, phase, every thread's stack, the
                                           Flight Recorder's collectives, its exception), on a request, a signal
                                           or an exception (``ddpdoctor.capture.flight``)
    dumps/request.json                     a request for every rank to dump: {"id", "reason", "by", "time"}
    attempts/attempt<k>/                   a job torchrun may restart (--max-restarts N > 0): attempt k's files, a
                                           run's layout with its own manifest.json; the top-level manifest is the
                                           last attempt's, with ``attempts`` (k, dir, status, summary) and a note
    dumps/rank<R>.fatal-<pid>.txt          a rank's stacks at a fatal signal (SIGABRT, SIGSEGV: faulthandler's
                                           text below one header line); removed when the rank ends normally

Every file is written to a temporary name in the same folder and renamed into place, so a reader never sees a
half-written file and a crash leaves the last complete version.

The files read by more than one part have msgspec types (``Manifest``, ``RankCapture``, ``RankSummary``, defined in
``ddpdoctor.runfile_types`` and re-exported here):
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
     "threads": {"cpu_count", "omp_num_threads", "torch_intra_op_threads", "torch_inter_op_threads"},
     "trace_files": ["rank0.1732900000000.pt.trace.json.gz", ...],
     "process_groups": [{"name", "rank", "world_size", "backend"}, ...],  # the groups this process joined, in
                                                  # order; name "" is the top level; the file describes the first
     "torch_version", "cuda_available"}
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from stat import S_ISREG
from typing import Any

import msgspec

from ddpdoctor import liveness
from ddpdoctor.runfile_types import (
    DROPPABLE,
    SCHEMA_VERSION,
    DeviceMemory,
    Manifest,
    ManifestRank,
    RankCapture,
    RankSummary,
    RankSummaryLazy,
    RankSummaryWire,
    StepRecord,
)

__all__ = ["DeviceMemory", "Manifest", "ManifestRank", "RankCapture", "RankSummary", "SCHEMA_VERSION", "StepRecord"]

MANIFEST = "manifest.json"
RANKS_DIR = "ranks"
NODES_DIR = "nodes"
GROUPS_DIR = "groups"
DUMPS_DIR = "dumps"
ATTEMPTS_DIR = "attempts"  # attempts/attempt<k>/: the files of torchrun's attempt k (--max-restarts), a run's layout
ATTEMPT_RE = re.compile(r"attempt(\d{1,6})")


def attempt_dir(run: str | Path, attempt: int) -> Path:
    return Path(run) / ATTEMPTS_DIR / f"attempt{attempt}"


def attempt_dirs(run: str | Path) -> list[tuple[int, Path]]:
    """The attempts of a run whose ranks torchrun could restart, (k, folder) in order; [] for any other run."""
    folder = Path(run) / ATTEMPTS_DIR
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [(int(m.group(1)), folder / n) for n in names if (m := ATTEMPT_RE.fullmatch(n)) and (folder / n).is_dir()]
    return sorted(found)


DUMP_ID = r"[a-z0-9-]{1,64}"  # the <id> of dumps/rank<R>.<id>.json
TENSORBOARD_DIR = "tensorboard"

# The worker-name pattern TensorBoard's profiler plugin uses: "<worker>.<span>.pt.trace.json[.gz]".
TRACE_FILE_RE = re.compile(r"^rank(?P<rank>\d+)\.(?P<span>\d+)\.pt\.trace\.json(?:\.gz)?$")


def trace_file_name(rank: int, span: int) -> str:
    return f"rank{rank}.{span}.pt.trace.json.gz"


def rank_file(out: Path, rank: int) -> Path:
    return out / RANKS_DIR / f"rank{rank}.json"


def summary_file(out: Path, rank: int) -> Path:
    return out / RANKS_DIR / f"rank{rank}.summary.json"


WINDOW_SUMMARY_RE = re.compile(r"^rank(?P<rank>\d+)\.window(?P<first>\d+)-(?P<last>\d+)\.summary\.json$")


def window_summary_file(out: Path, rank: int, first: int, last: int) -> Path:
    """``ranks/rank<R>.window<first>-<last>.summary.json``: a window's summary, written as ``--keep`` removed its
    trace (capture/window_summary.py)."""
    return out / RANKS_DIR / f"rank{rank}.window{first}-{last}.summary.json"


def window_pending_file(out: Path, rank: int, first: int, last: int, trace_name: str) -> Path:
    """The link to a removed window's trace that its summariser reads (and removes): hidden, never a trace name."""
    gz = ".gz" if trace_name.endswith(".gz") else ""
    return out / RANKS_DIR / f".rank{rank}.window{first}-{last}.pending{gz}"


def node_file(out: Path, node_rank: int) -> Path:
    return out / NODES_DIR / f"node{node_rank}.json"


def group_dir(out: Path, name: str) -> Path:
    """The folder of process group ``name`` (``group<N>``) that is not the run's top-level one: the same layout."""
    return out / GROUPS_DIR / name


def group_record(out: Path, name: str) -> Path:
    return out / GROUPS_DIR / f"{name}.json"


def trials_dir(run: Path) -> Path:
    """Where the trials of RUN go: ``<RUN>.trials/`` beside it (RUN itself is never written)."""
    named = run if run.name not in ("", ".", "..") else run.resolve()
    return named.parent / f"{named.name}.trials"


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file() or (path / RANKS_DIR).is_dir()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _tmp_path(path: Path) -> str:
    """A temporary file beside ``path`` with the permissions a plain ``open()`` would give (mkstemp's are 0600)."""
    import tempfile  # writers only: readers of a run do not pay for the import

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, _FILE_MODE)
    os.close(fd)
    return tmp


def temporary_path(path: Path) -> str:
    """A new empty temporary file beside ``path`` (hidden, ``.<name>.<random>.tmp``), for a writer to rename."""
    return _tmp_path(path)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename. ``durable``: sync the
    data to disk before the rename (a crash then never leaves a short file under ``path``); a report that the
    same command writes again can skip it (an fsync took a cold ``diagnose`` 5-45 ms on a busy disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, default=_json_default).encode() + b"\n")


def atomic_gzip_file(src: str | os.PathLike[str], dest: Path, *, compresslevel: int = 3) -> None:
    """Compress ``src`` into ``dest`` atomically (level 3: near level 9's size at a fraction of its time). A write
    that fails (a full disk) raises and leaves ``dest`` as it was; the data is synced before the rename, so a crash
    never finds a short ``dest`` (the caller may remove ``src`` once ``dest`` is named)."""
    import gzip
    import shutil

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(dest)
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compresslevel) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, dest)
    except BaseException:
        _unlink_quietly(tmp)
        raise


# The most a run file (manifest, node, rank or summary file) may hold. A rank file grows by about 200 bytes per
# step (its step time and five memory and five GIL figures, indented): 1 GiB is five million steps. A larger one is
# not a file ddpdoctor wrote, and a device or a sparse file is not read into memory.
RUN_FILE_MAX_BYTES = 1 << 30


def open_regular(path: str | os.PathLike[str]) -> Any:
    """``path`` opened for reading (binary) when it is a regular file, else OSError saying what it is: a FIFO, a
    device or a folder is never read (or waited on: it is opened non-blocking, then looked at). A link is read
    as what it points to."""
    try:
        f = open(path, "rb", opener=_nonblocking)  # noqa: SIM115 - handed to the caller
    except OSError as exc:
        raise _cannot_open(exc, path) from None
    try:
        _check_regular(f.fileno(), path)
        os.set_blocking(f.fileno(), True)
    except BaseException:
        f.close()
        raise
    return f


def read_regular(path: str | os.PathLike[str], limit: int = RUN_FILE_MAX_BYTES) -> bytes:
    """The bytes of ``path`` when it is a regular file (as ``open_regular``) of at most ``limit`` bytes, else
    OSError saying why. (Plain ``os.read`` calls: reading many small rank files, half the time of ``open()``.)"""
    try:
        fd = _nonblocking(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _cannot_open(exc, path) from None
    try:
        size = _check_regular(fd, path).st_size
        parts, total = [], 0
        while size <= limit and total <= limit:  # a file that grows meanwhile is read up to the bound
            want = min(max(size + 1 - total, READ_CHUNK), limit + 1 - total)
            chunk = os.read(fd, want)
            parts.append(chunk)
            total += len(chunk)
            if len(chunk) < want:  # a regular file's read is short only at its end
                break
    finally:
        os.close(fd)
    if size > limit or total > limit:
        raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB, more than a run file holds", str(path))
    return parts[0] if len(parts) == 1 else b"".join(parts)


READ_CHUNK = 1 << 16


def _nonblocking(path: str | os.PathLike[str], flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)


def _cannot_open(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """``exc`` of opening ``path``, or for a socket (ENXIO) an OSError saying that it is one."""
    if exc.errno == errno.ENXIO:
        try:
            return _not_regular(os.stat(path).st_mode, path)
        except OSError:
            pass
    return exc


def _check_regular(fd: int, path: str | os.PathLike[str]) -> os.stat_result:
    st = os.fstat(fd)
    if not S_ISREG(st.st_mode):
        raise _not_regular(st.st_mode, path)
    return st


def _not_regular(mode: int, path: str | os.PathLike[str]) -> OSError:
    return OSError(errno.EINVAL, f"{entry_kind(mode)}, not a regular file", str(path))


def read_json(path: Path) -> Any:
    return json.loads(read_regular(path))


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _json_default(obj: Any) -> Any:
    # numpy scalars and the like
    for attr in ("item", "tolist"):
        if hasattr(obj, attr):
            return getattr(obj, attr)()
    return str(obj)


# --- what ddpdoctor writes in a run directory, by type and name (all that ``--force`` and ``view`` may delete) ------
_RANDOM = r"[a-z0-9_]{8}"  # the random part of tempfile's names
_TRACE = r"rank\d+\.\d+\.pt\.trace\.json"


class _Folder:
    """A folder ddpdoctor makes: the names of the regular files it writes there (with its unfinished writes'
    temporary names), and the names of the folders it makes there with their kind."""

    def __init__(self, files: str | None, folders: dict[str, str] | None = None) -> None:
        self.files = re.compile(rf"^({files})$") if files else None
        self.folders = [(re.compile(rf"^({name})$"), kind) for name, kind in (folders or {}).items()]

    def folder_kind(self, name: str) -> str | None:
        return next((kind for pattern, kind in self.folders if pattern.match(name)), None)


EVENT_FILE_RE = re.compile(r"^events\.out\.tfevents\..+$")
_LAYOUT = {
    "run": _Folder(
        rf"{re.escape(MANIFEST)}|{_TRACE}(\.gz)?"
        rf"|\.{re.escape(MANIFEST)}\.{_RANDOM}\.tmp"  # atomic_write_bytes
        rf"|\.{_TRACE}\.gz\.{_RANDOM}\.tmp"  # atomic_gzip_file
        rf"|\.rank\d+\.{_RANDOM}\.json(\.tmp)?"  # the profiler's export and Kineto's own temporary
        r"|\.ddpdoctor-(write-test|space-probe)-\d+",  # trace's and the launcher's probes
        {
            RANKS_DIR: "ranks",
            NODES_DIR: "nodes",
            TENSORBOARD_DIR: "tensorboard",
            GROUPS_DIR: "groups",
            DUMPS_DIR: "dumps",
            ATTEMPTS_DIR: "attempts",
        },
    ),
    # attempts/attempt<k>/: torchrun's attempt k of a job it may restart, a run's layout (its own manifest.json)
    "attempts": _Folder(None, {r"attempt\d+": "run"}),
    # dumps/rank<R>.<id>.json (a rank's dump, capture/flight.py) and dumps/request.json (a request for every rank's)
    "dumps": _Folder(
        rf"(rank\d+\.{DUMP_ID}\.json|request\.json)|\.(rank\d+\.{DUMP_ID}\.json|request\.json)\.{_RANDOM}\.tmp"
        r"|rank\d+\.fatal-\d+\.txt"  # a rank's stacks at a fatal signal (faulthandler's, capture/flight.py)
    ),
    # groups/group<N>.json, and groups/group<N>/: the files of another process group of the job, a run's layout
    "groups": _Folder(rf"group\d+\.json|\.group\d+\.json\.{_RANDOM}\.tmp", {r"group\d+": "run"}),
    # rank<R>.series.jsonl: the rank's always-on step series (capture/series.py)
    # rank<R>.window<A>-<B>.summary.json: a window --keep removed, summarised (capture/window_summary.py), and the
    # hidden link to its trace that the summariser reads meanwhile
    "ranks": _Folder(
        rf"rank\d+(\.window\d+-\d+)?(\.summary)?\.json|\.rank\d+(\.window\d+-\d+)?(\.summary)?\.json\.{_RANDOM}\.tmp"
        r"|rank\d+\.series\.jsonl|\.rank\d+\.window\d+-\d+\.pending(\.gz)?"
    ),
    # node<K>.log: torchrun's report; exits<K>.json: the exit status torchrun saw of each rank that failed
    "nodes": _Folder(rf"node\d+\.(json|log)|exits\d+\.json|\.(node|exits)\d+\.json\.{_RANDOM}\.tmp"),
    # tensorboard/rank<R>/, and the folders `view` writes it in and moves it aside to
    "tensorboard": _Folder(None, {r"rank\d+|\.rank\d+\.old|\.rank\d+\.[a-z0-9_]+\.tmp": "events"}),
    "events": _Folder(EVENT_FILE_RE.pattern[1:-1]),
}


def entry_kind(mode: int) -> str:
    """What a file of ``mode`` (``os.lstat``) is, in words: "a file", "a directory", "a symbolic link", ..."""
    import stat

    for test, what in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "not a regular file"


class OwnEntries:
    """What ddpdoctor wrote under a folder of a run directory: ``files`` (regular files, by name and type) and
    ``folders`` (folders it makes, deepest first, each holding nothing but those), or ``foreign``: the first
    entry that is not ddpdoctor's (``(path, why)``), in which case nothing may be deleted."""

    def __init__(self) -> None:
        self.files: list[Path] = []
        self.folders: list[Path] = []
        self.foreign: tuple[Path, str] | None = None

    def message(self, root: Path) -> str:
        """The foreign entry in one line (its path relative to ``root``)."""
        from ddpdoctor import escape

        assert self.foreign is not None
        path, why = self.foreign
        try:
            shown = path.relative_to(root)
        except ValueError:
            shown = path
        return f"{escape.terminal(shown)} is {why}"

    def remove(self) -> None:
        """Delete the files, then the folders (``os.rmdir``: a folder that gained an entry since is kept and the
        OSError raised). Links are never followed: ``unlink`` removes a name, never what it points to."""
        assert self.foreign is None
        for path in self.files:
            try:
                os.unlink(path)
            except FileNotFoundError:  # another rank of the job replaced its own file meanwhile
                pass
        for folder in self.folders:
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                pass


def own_entries(folder: Path, kind: str = "run", *, include_folder: bool = False) -> OwnEntries:
    """Walk ``folder`` (a folder of ``kind`` in ``_LAYOUT``) without following links and collect what ddpdoctor
    wrote there; stop at the first entry that is not ddpdoctor's by type and name (a symbolic link anywhere, a
    directory with a file's name, a name ddpdoctor never writes). ``include_folder``: ``folder`` itself is one of
    ddpdoctor's folders, removed after its contents."""
    found = OwnEntries()
    _walk(folder, _LAYOUT[kind], found)
    if include_folder and found.foreign is None:
        found.folders.append(folder)
    return found


def _walk(folder: Path, layout: _Folder, found: OwnEntries) -> None:
    import stat

    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        found.foreign = (folder, f"a folder ddpdoctor cannot read ({exc.strerror or exc})")
        return
    for name in names:
        path = folder / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:  # gone meanwhile (another rank's temporary file, renamed)
            continue
        except OSError as exc:
            found.foreign = (path, f"an entry ddpdoctor cannot look at ({exc.strerror or exc})")
            return
        if stat.S_ISLNK(mode):
            found.foreign = (path, "a symbolic link, which ddpdoctor never follows or deletes")
            return
        sub = layout.folder_kind(name) if stat.S_ISDIR(mode) else None
        if sub is not None:
            _walk(path, _LAYOUT[sub], found)
            if found.foreign is not None:
                return
            found.folders.append(path)
        elif stat.S_ISREG(mode) and layout.files is not None and layout.files.match(name):
            found.files.append(path)
        else:
            found.foreign = (path, f"{entry_kind(mode)} that is not ddpdoctor's")
            return


def ddpdoctor_owned(path: Path) -> list[Path]:
    """The entries of run directory ``path`` that are wholly ddpdoctor's: its own regular files, and its
    folders holding nothing else (a file of the user's inside ``ranks/`` makes the folder not ddpdoctor's)."""
    import stat

    owned = []
    layout = _LAYOUT["run"]
    for entry in sorted(path.iterdir()):
        try:
            mode = os.lstat(entry).st_mode
        except OSError:
            continue
        sub = layout.folder_kind(entry.name) if stat.S_ISDIR(mode) else None
        if sub is not None:
            if own_entries(entry, sub).foreign is None:
                owned.append(entry)
        elif stat.S_ISREG(mode) and layout.files is not None and layout.files.match(entry.name):
            owned.append(entry)
    return owned


# --- reading and writing the files more than one part reads (types in ddpdoctor.runfile_types) ---------------
def to_plain(data: Any) -> Any:
    """``data`` as it reads back from JSON (numpy scalars as numbers, tuples as lists)."""
    return json.loads(json.dumps(data, default=_json_default))


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
    data = {name: getattr(wire, name) for name in wire.__struct_fields__}
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
