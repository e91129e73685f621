"""What ddpdoctor writes in a run directory, by type and name: all that ``trace --force`` and ``view`` may delete
(``own_entries``, ``ddpdoctor_owned``); a file or folder of any other name is the user's, and is never touched."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ddpdoctor.rundir import (
    ATTEMPTS_DIR,
    DUMP_ID,
    DUMPS_DIR,
    GROUPS_DIR,
    MANIFEST,
    NODES_DIR,
    RANKS_DIR,
    TENSORBOARD_DIR,
    entry_kind,
)

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
