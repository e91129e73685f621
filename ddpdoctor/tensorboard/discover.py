"""Find ddpdoctor run directories under a TensorBoard logdir, and map the dashboard's run names back to them.

A run name is the run directory's path relative to the logdir, with ``/`` separators (``"."`` for the logdir
itself). The plugin only ever serves a run whose name is in ``find_runs(logdir)``: a request cannot name a
path of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddpdoctor import rundir

# Folders that never hold a run (and may be huge): skipped while walking.
_SKIP_DIRS = {rundir.RANKS_DIR, rundir.NODES_DIR, rundir.TENSORBOARD_DIR, "__pycache__", "node_modules"}


def find_runs(logdir: str | os.PathLike[str], *, max_depth: int = 6) -> dict[str, Path]:
    """Run name -> run directory, for every run directory at most ``max_depth`` levels under ``logdir``.

    Symbolic links are not followed, and hidden folders are skipped; a run directory is not searched further.
    """
    root = Path(logdir).resolve()
    runs: dict[str, Path] = {}
    if not root.is_dir():
        return runs
    for current, dirs, _files in os.walk(root, followlinks=False):
        here = Path(current)
        depth = len(here.relative_to(root).parts)
        if rundir.is_run_dir(here):
            runs[run_name(root, here)] = here
            dirs[:] = []
            continue
        if depth >= max_depth:
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
    return dict(sorted(runs.items()))


def run_name(logdir: Path, run_dir: Path) -> str:
    rel = run_dir.relative_to(logdir)
    return rel.as_posix() if rel.parts else "."


def resolve_run(logdir: str | os.PathLike[str], name: str | None) -> Path | None:
    """The run directory called ``name`` under ``logdir``, or None when there is no such run."""
    if not name:
        return None
    return find_runs(logdir).get(name)
