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

The files read by more than one part are read and written by ``ddpdoctor.runfiles`` (types in
``ddpdoctor.runfile_types``; a rank capture's schema is in ``runfiles``' docstring); what ddpdoctor owns in a
run directory, all that ``--force`` and ``view`` may delete, is ``ddpdoctor.owned``.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from stat import S_ISREG
from typing import Any

from ddpdoctor.runfile_types import (
    SCHEMA_VERSION,
    DeviceMemory,
    Manifest,
    ManifestRank,
    RankCapture,
    RankSummary,
    StepRecord,
)

__all__ = ["DeviceMemory", "Manifest", "ManifestRank", "RankCapture", "RankSummary", "SCHEMA_VERSION", "StepRecord"]

MANIFEST = "manifest.json"
# the manifest's notes on a profiled window the job's end cut short, or never reached (``capture/manifest.py``);
# here, so that reading a run directory does not import the capture package
BEFORE_WINDOW = "the run ended before the profiled window"
WINDOW_CUT = "the job ended inside the profiled window"
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
    atomic_write_bytes(path, json.dumps(obj, indent=1, default=json_default).encode() + b"\n")


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


def _not_regular(mode: int, path: str | os.PathLike[str]) -> OSError:
    return OSError(errno.EINVAL, f"{entry_kind(mode)}, not a regular file", str(path))


def read_json(path: Path) -> Any:
    return json.loads(read_regular(path))


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def json_default(obj: Any) -> Any:
    # numpy scalars and the like
    for attr in ("item", "tolist"):
        if hasattr(obj, attr):
            return getattr(obj, attr)()
    return str(obj)
