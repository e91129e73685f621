"""Which process group a rank's files belong to, so that no group's files replace another's.

A job may create more than one default process group over its life: ``mp.spawn`` of the training, then
``mp.spawn`` of an evaluation (a new group, new processes); a parent or a helper subprocess that creates a
world-size-1 group after (or during) training. Each of them would write ``ranks/rank0.json`` and ``rank0.<span>``
traces. The first group to claim rank 0's files of the run directory's top level keeps the top level (the layout of a
one-group run, read as before); every later group gets a folder of its own, ``groups/group<N>/``, with the same
layout (``ranks/``, traces), and a record ``groups/group<N>.json``. Once the job has ended, the launcher makes the
group with the most evidence of training the top-level one (:func:`settle`) and the manifest lists them all.

All ranks of a group agree on where it goes through the group's own store: rank 0 decides and puts the answer
under a key counted per group created on that store; the others wait for it (``_AGREE_S`` at most, then each
decides from what it sees on disk).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor import rundir

_AGREE_S = 30.0
_KEY = "ddpdoctor/group"
# rank file, summary, step series, a removed window's summary
_RANK_FILE = re.compile(r"^rank\d+(\.summary\.json|\.json|\.series\.jsonl|\.window\d+-\d+\.summary\.json)$")


@dataclass(frozen=True)
class Placement:
    """Where a process group's files go. ``name``: "" for the run directory's top level, else ``group<N>``."""

    name: str

    @property
    def top_level(self) -> bool:
        return not self.name

    def folder(self, out: Path) -> Path:
        return out if self.top_level else rundir.group_dir(out, self.name)


def join(out: Path, *, rank: int, world_size: int, backend: str | None) -> Placement:
    """Called in every rank right after ``init_process_group``: the placement of this group's files."""
    store = _store()
    if store is None:
        return _decide(out, rank=rank, world_size=world_size, backend=backend)
    from datetime import timedelta

    try:
        joined = int(store.add(f"{_KEY}/joined", 1))  # the n-th rank to join a group on this store
    except Exception:  # a store that cannot count: decide from the files
        return _decide(out, rank=rank, world_size=world_size, backend=backend)
    key = f"{_KEY}/{(joined - 1) // max(world_size, 1)}"  # the same for every rank of one group
    if rank == 0:
        place = _decide(out, rank=rank, world_size=world_size, backend=backend)
        with contextlib.suppress(Exception):  # the others then decide from the files
            store.set(key, json.dumps({"name": place.name}))
        return place
    try:
        store.wait([key], timedelta(seconds=_AGREE_S))
        return Placement(str(json.loads(store.get(key))["name"]))
    except Exception:  # rank 0 is not traced, or answered nothing: decide from the files
        return _decide(out, rank=rank, world_size=world_size, backend=backend)


def alone(out: Path, *, rank: int) -> Placement:
    """The placement of a process that became a rank without a process group (it steps on its own)."""
    return _decide(out, rank=rank, world_size=1, backend=None)


def _store() -> Any:
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:
        return None


def _decide(out: Path, *, rank: int, world_size: int, backend: str | None) -> Placement:
    """Rank 0 of a group (or a rank that cannot ask it): the top level when it can claim ``ranks/rank<R>.json``
    there (absent, or written by this very process), else a new ``groups/group<N>/``."""
    if _claim_rank_file(out, rank):
        return Placement("")
    return _new_group(out, world_size=world_size, backend=backend)


def _claim_rank_file(out: Path, rank: int) -> bool:
    """Create ``ranks/rank<R>.json`` if it does not exist (atomically: one claimant wins), holding only who claimed
    it; True when this process holds it (it claimed it now or wrote it before)."""
    path = rundir.rank_file(out, rank)
    mine = {"rank": rank, "pid": os.getpid(), "hostname": socket.gethostname(), "status": "running"}
    if _create(path, {"schema_version": rundir.SCHEMA_VERSION, **mine}):
        return True
    with contextlib.suppress(OSError, ValueError):
        data = rundir.read_json(path)
        return isinstance(data, dict) and data.get("pid") == mine["pid"] and data.get("hostname") == mine["hostname"]
    return False


def _new_group(out: Path, *, world_size: int, backend: str | None) -> Placement:
    """Number a new group (``groups/group<N>.json`` created atomically, the lowest N free) and make its folder."""
    for n in range(1, 1 << 16):
        name = f"group{n}"
        record = {
            "name": name,
            "dir": f"{rundir.GROUPS_DIR}/{name}",
            "world_size": world_size,
            "backend": backend,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "created_at": time.time(),
        }
        if _create(rundir.group_record(out, name), record):
            (rundir.group_dir(out, name) / rundir.RANKS_DIR).mkdir(parents=True, exist_ok=True)
            return Placement(name)
    raise OSError(f"no free group name under {out / rundir.GROUPS_DIR}")


def _create(path: Path, data: dict[str, Any]) -> bool:
    """Write ``path`` with ``data`` only if it does not exist (a link from a complete temporary file: a reader
    never sees it half-written, and of two writers one wins); False when it existed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(rundir.temporary_path(path))
    tmp.write_text(json.dumps(data) + "\n")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data) + "\n")
        return True
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def training_evidence(group: dict[str, Any]) -> tuple[int, ...]:
    """How much a group (an entry of the manifest's ``groups``) looks like the job's training, larger is more:
    optimizer steps seen, profiled steps, DDP, steps, ranks. An evaluation (forward passes and collectives, no
    optimizer) or a world-size-1 helper group ranks below a training."""
    return (int(group["steps"] > 0), group["profiled_steps"], int(group["ddp"]), group["steps"], len(group["ranks"]))


def settle(out: Path, groups: list[dict[str, Any]]) -> bool:
    """After the job: make the group with the most evidence of training (``training_evidence``; the top level's
    on a tie) the top-level one, the one every command reads. The top level's files move to a new
    ``groups/group<N>/`` first, then the training group's to the top level (renames: nothing is replaced or lost).
    ``groups``: the manifest's entries, the top level's first. True when files moved."""
    if len(groups) < 2 or groups[0]["dir"] != ".":
        return False
    top, best = groups[0], max(groups, key=training_evidence)
    if best is top:
        return False
    moved = _new_group(out, world_size=int(top["world_size"]), backend=top["backend"])
    if top["name"]:  # it was a group's before: say which
        _rewrite(rundir.group_record(out, moved.name), moved_from=top["name"])
    _move_files(out, moved.folder(out))
    source = out / best["dir"]
    _move_files(source, out)
    for folder in (source / rundir.RANKS_DIR, source):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when nothing else is left in it
    _rewrite(rundir.group_record(out, best["name"]), dir=".", moved_from=best["dir"])
    return True


def _move_files(source: Path, dest: Path) -> None:
    """Rename the rank files, summaries, step series and traces of the layout in ``source`` into ``dest`` (a name
    taken there stays)."""
    (dest / rundir.RANKS_DIR).mkdir(parents=True, exist_ok=True)
    names = [
        (rundir.RANKS_DIR, p.name) for p in (source / rundir.RANKS_DIR).glob("rank*") if _RANK_FILE.match(p.name)
    ]
    names += [("", p.name) for p in source.glob("rank*") if rundir.TRACE_FILE_RE.match(p.name)]
    for folder, name in names:
        target = dest / folder / name
        if not target.exists():
            os.rename(source / folder / name, target)


def _rewrite(path: Path, **fields: Any) -> None:
    with contextlib.suppress(OSError, ValueError):
        data = rundir.read_json(path)
        rundir.atomic_write_json(path, {**data, **fields})
