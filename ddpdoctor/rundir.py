"""The run directory: the one contract between ``ddpdoctor trace`` (writer) and everything that reads.

Layout of ``OUT/``::

    manifest.json                          the run: command, world size, exit code, per-rank status and files
    nodes/node<K>.json                     what the launcher on node K saw (merged into manifest.json)
    rank<R>.<ms>.pt.trace.json.gz          Kineto trace of rank R, one per profiled window ("span");
                                           TensorBoard's profiler plugin shows worker "rank<R>"
    ranks/rank<R>.json                     capture data of rank R (see RANK_SCHEMA below)
    ranks/rank<R>.summary.json             metrics rank R computed from its own trace at the end of the run
    tensorboard/                           event files (scalars, findings) for TensorBoard

Every file is written to a temporary name in the same folder and renamed into place, so a reader never sees a
half-written file and a crash leaves the last complete version.

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
     "ddp": [{"module", "logging_data": {...}}],  # DistributedDataParallel._get_ddp_logging_data()
     "dp": [{"module", "device_ids", "output_device"}],
     "threads": {"cpu_count", "omp_num_threads", "torch_intra_op_threads", "torch_inter_op_threads"},
     "trace_files": ["rank0.1732900000000.pt.trace.json.gz", ...],
     "torch_version", "cuda_available"}
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
RANKS_DIR = "ranks"
NODES_DIR = "nodes"
TENSORBOARD_DIR = "tensorboard"
SCHEMA_VERSION = 1

# The worker-name pattern TensorBoard's profiler plugin uses: "<worker>.<span>.pt.trace.json[.gz]".
TRACE_FILE_RE = re.compile(r"^rank(?P<rank>\d+)\.(?P<span>\d+)\.pt\.trace\.json(?:\.gz)?$")


def trace_file_name(rank: int, span: int) -> str:
    return f"rank{rank}.{span}.pt.trace.json.gz"


def rank_file(out: Path, rank: int) -> Path:
    return out / RANKS_DIR / f"rank{rank}.json"


def summary_file(out: Path, rank: int) -> Path:
    return out / RANKS_DIR / f"rank{rank}.summary.json"


def node_file(out: Path, node_rank: int) -> Path:
    return out / NODES_DIR / f"node{node_rank}.json"


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file() or (path / RANKS_DIR).is_dir()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _tmp_path(path: Path) -> str:
    """A temporary file beside ``path`` with the permissions a plain ``open()`` would give (mkstemp's are 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, _FILE_MODE)
    os.close(fd)
    return tmp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, default=_json_default).encode() + b"\n")


def atomic_gzip_file(src: str | os.PathLike[str], dest: Path, *, compresslevel: int = 3) -> None:
    """Compress ``src`` into ``dest`` atomically (level 3: near level 9's size at a fraction of its time)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(dest)
    try:
        with open(src, "rb") as fin, gzip.open(tmp, "wb", compresslevel=compresslevel) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        os.replace(tmp, dest)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


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


def ddpdoctor_owned(path: Path) -> list[Path]:
    """The entries of a run directory that ddpdoctor wrote (what ``--force`` may replace); nothing else."""
    owned = []
    for entry in path.iterdir():
        if entry.name in (MANIFEST, RANKS_DIR, NODES_DIR, TENSORBOARD_DIR) or TRACE_FILE_RE.match(entry.name):
            owned.append(entry)
    return owned
