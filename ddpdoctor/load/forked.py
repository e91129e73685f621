"""Worker processes forked from this one: ``load.loader`` decodes ranks in them, ``load.decode`` the parts of one
large trace file. A forked worker starts with what this process imported and holds (the decoder, the file's
bytes), so it costs a few milliseconds instead of an interpreter's start and imports."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from typing import Any


def fork_context() -> Any:
    """The "fork" start method where it is safe, else None: POSIX, the main process (not one of its workers), no
    other Python thread in it, and no torch imported (a test session or a training process that calls ``load``:
    its native thread pools)."""
    if (
        threading.active_count() != 1
        or "torch" in sys.modules
        or multiprocessing.parent_process() is not None
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return None
    return multiprocessing.get_context("fork")


def cores() -> int:
    """The CPUs this process may run on (its affinity, as taskset or a batch scheduler's cpuset leaves it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
