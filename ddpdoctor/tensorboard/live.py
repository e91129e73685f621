"""The always-on step series as TensorBoard scalars, written while the job runs (``ddpdoctor view RUN``).

``view`` starts :class:`SeriesEvents` after the run's own event files are written: it reads every rank's
``ranks/rank<R>.series.jsonl`` (``capture/series.py``) and appends its rows to an event file of its own in
``tensorboard/rank<R>/`` (name ending ``.series``), then reads what the ranks appended every ``interval`` seconds
until ``view`` stops; TensorBoard reloads the files itself, so the Scalars and Time Series tabs follow the job.
Tags, per step (wall time of the step's end as the event's time):

- ``series/step_ms``, ``series/data_wait_ms``, ``series/forward_ms``, ``series/backward_ms``,
  ``series/optimizer_ms``: the step's wall time and its phases;
- ``series/ddp_comm_ms``: DDP's backward communication time (the steps DDP's timing was read for);
- ``series/memory_bytes`` (CUDA allocated on the rank's device; the process RSS on CPU),
  ``series/memory_reserved_bytes`` (CUDA).

A line not yet complete is read when it is; a rank whose file appears later is picked up. Each start replaces the
``.series`` event files an earlier ``view`` wrote (the same steps again, not twice).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

from ddpdoctor import owned, rundir

SUFFIX = ".series"
_SERIES = re.compile(r"rank(\d+)\.series\.jsonl")
# row field -> (tag, scale)
TAGS = (
    ("wall_s", "series/step_ms", 1e3),
    ("data_s", "series/data_wait_ms", 1e3),
    ("forward_s", "series/forward_ms", 1e3),
    ("backward_s", "series/backward_ms", 1e3),
    ("optimizer_s", "series/optimizer_ms", 1e3),
    ("mem_bytes", "series/memory_bytes", 1),
    ("mem_reserved_bytes", "series/memory_reserved_bytes", 1),
)


class _Rank:
    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.offset = 0
        self.rest = b""


class SeriesEvents:
    """Scalars of the series of ``source`` (the run directory the ranks write) into ``logdir``'s
    ``tensorboard/rank<R>/`` (the folder TensorBoard serves: the run directory, or view's copy of it)."""

    def __init__(self, source: Path, logdir: Path) -> None:
        self.source = Path(source)
        self.logdir = Path(logdir)
        self._ranks: dict[int, _Rank] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rows_written = 0

    def sync(self) -> int:
        """Write the rows appended since the last call (every rank); return how many."""
        folder = self.source / rundir.RANKS_DIR
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return 0
        written = 0
        for name in names:
            m = _SERIES.fullmatch(name)
            if m:
                written += self._sync_rank(int(m.group(1)), folder / name)
        self.rows_written += written
        return written

    def _sync_rank(self, rank: int, path: Path) -> int:
        try:
            with rundir.open_regular(path) as f:  # never a FIFO or a device (nor waited on)
                state = self._ranks.get(rank)
                f.seek(state.offset if state else 0)
                data = f.read()
        except OSError:
            return 0
        if state is None:
            state = self._ranks[rank] = _Rank(self._writer(rank))
        state.offset += len(data)
        data = state.rest + data
        cut = data.rfind(b"\n") + 1
        state.rest = data[cut:]
        count = 0
        for line in data[:cut].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict) or "kind" in row or not isinstance(row.get("step"), int):
                continue
            walltime = row.get("t") if isinstance(row.get("t"), (int, float)) else None
            for key, tag, scale in TAGS:
                value = row.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    state.writer.add_scalar(tag, value * scale, row["step"], walltime=walltime)
            ddp = row.get("ddp")
            if isinstance(ddp, list) and len(ddp) > 3 and isinstance(ddp[0], int):
                if isinstance(ddp[3], (int, float)):
                    state.writer.add_scalar("series/ddp_comm_ms", ddp[3] * 1e3, ddp[0], walltime=walltime)
            count += 1
        state.writer.flush()
        return count

    def _writer(self, rank: int) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        folder = self.logdir / rundir.TENSORBOARD_DIR / f"rank{rank}"
        if folder.is_symlink():
            raise OSError(f"{folder} is a symbolic link")
        folder.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(folder):  # an earlier view's series events: written again from the start
            if owned.EVENT_FILE_RE.match(name) and name.endswith(SUFFIX):
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.lstat(folder / name).st_mode):
                        os.unlink(folder / name)
        return SummaryWriter(log_dir=str(folder), filename_suffix=SUFFIX)

    def start(self, interval: float = 2.0) -> None:
        """Write what is there now, then follow the files in a daemon thread."""
        self.sync()

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    self.sync()
                except Exception:  # a file gone mid-read: the next round reads again
                    pass

        self._thread = threading.Thread(target=run, name="ddpdoctor-series-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for state in self._ranks.values():
            with contextlib.suppress(Exception):
                state.writer.close()


def has_series(run_dir: Path) -> bool:
    try:
        return any(_SERIES.fullmatch(n) for n in os.listdir(Path(run_dir) / rundir.RANKS_DIR))
    except OSError:
        return False
