"""A window ``--keep`` removes is summarised first, so that a long run's findings over time cover every window.

``trace --every ... --keep N`` bounds the disk by removing the oldest window's trace. Before it goes, the rank
hard-links it to a hidden name (``rundir.window_pending_file``: no copy, and the trace's own name is gone at once,
as before) and starts this module as a process of its own, at the lowest CPU priority, outside the job (no
``DDPDOCTOR_CAPTURE``, so ddpdoctor's start-up hook leaves it alone). It decodes the window, summarises it over its
steps with the rank's capture file as it is then (``metrics.summary.summarize_rank``, what the rank does for its
kept windows at the end), writes ``ranks/rank<R>.window<first>-<last>.summary.json`` and removes the link; the
rank file's ``schedule.dropped`` entry names the summary. ``diagnose`` reads those summaries for the windows whose
traces are gone (``metrics.overtime``).

The training never waits for it: the rank looks at its summarisers when it writes a window (at most
``MAX_RUNNING`` at once, so the disk holds at most that many windows more than ``--keep``) and waits for them only
at the end of the run (at most ``FINISH_WAIT_S`` in all; one still running then is stopped, its link removed
and the entry says why). If the rank dies first, the summariser still finishes its window.

    python -m ddpdoctor.capture.window_summary RUN_DIR RANK FIRST LAST LINK
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor import rundir, runfiles

FINISH_WAIT_S = 60.0  # the end of the run waits this long, in all, for the windows still being summarised
# At most this many removed windows are being summarised at once (each holds its trace on disk until it is done):
# a window removed while they all run goes without a summary, and its entry says so.
MAX_RUNNING = 2
_MAX_ERROR = 400


@dataclass
class Pending:
    """A removed window being summarised: its ``schedule.dropped`` entry, its link and its process."""

    entry: dict[str, Any]
    link: Path
    proc: subprocess.Popen[bytes] | None = None


def link_for(out: Path, rank: int, steps: tuple[int, int] | None, trace: Path, entry: dict[str, Any]) -> Pending | None:
    """Hard-link ``trace`` (the window's file as it is now: plain, or gzipped) to its hidden name, before the rank
    removes the trace's own names; None where it cannot be (no steps known, another file system, an error): the
    window then goes without a summary, as before, and ``entry`` says why."""
    if steps is None:
        entry["summary_error"] = "the window's steps are not known"
        return None
    link = rundir.window_pending_file(out, rank, steps[0], steps[1], trace.name)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link)  # a link left by a run killed before its summariser started
        os.link(trace, link)
    except OSError as exc:
        entry["summary_error"] = f"its trace could not be kept to be summarised: {exc.strerror or exc}"
        return None
    entry["summary"] = rundir.window_summary_file(out, rank, steps[0], steps[1]).name  # unless it fails (below)
    return Pending(entry, link)


def start(out: Path, rank: int, pending: Pending) -> None:
    """Start the summariser of ``pending`` (its entry names the summary it writes; says why where it cannot)."""
    first, last = pending.entry["first_step"], pending.entry["last_step"]
    env = {k: v for k, v in os.environ.items() if k != "DDPDOCTOR_CAPTURE"}  # not a rank of the job
    cmd = [sys.executable, "-m", "ddpdoctor.capture.window_summary", str(out), str(rank), str(first), str(last)]
    try:
        pending.proc = subprocess.Popen(
            [*cmd, str(pending.link)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C for the job is not for it: it finishes its window
        )
    except OSError as exc:
        _failed(pending, f"its summariser could not start: {exc.strerror or exc}")


def reap(pendings: list[Pending], wait_s: float = 0.0) -> list[Pending]:
    """Settle the summarisers that ended (each entry keeps ``summary`` or gets ``summary_error``); with ``wait_s``,
    wait up to that long in all and stop those still running. Returns those still running."""
    deadline = time.monotonic() + wait_s
    running = []
    for p in pendings:
        if p.proc is None:
            continue
        try:
            p.proc.wait(timeout=max(deadline - time.monotonic(), 0.0) if wait_s else 0.0)
        except subprocess.TimeoutExpired:
            if not wait_s:
                running.append(p)
                continue
            p.proc.kill()
            p.proc.wait()
            _failed(p, f"still summarising after {wait_s:.0f} s at the end of the run: stopped")
            continue
        err = p.proc.stderr.read().decode(errors="replace").strip() if p.proc.stderr else ""
        if p.proc.stderr:
            p.proc.stderr.close()
        if p.proc.returncode != 0:
            why = err.splitlines()[-1] if err else f"exit status {p.proc.returncode}"
            _failed(p, why[:_MAX_ERROR])
    return running


def _failed(p: Pending, why: str) -> None:
    p.entry.pop("summary", None)
    p.entry["summary_error"] = why
    with contextlib.suppress(OSError):
        os.unlink(p.link)


def summarize_window(out: Path, rank: int, first: int, last: int, link: Path) -> Path:
    """Decode ``link`` (one window of rank ``rank``), summarise steps ``first``-``last`` with the rank's capture
    file and write the window's summary; returns its path. ``link`` is removed whatever happens."""
    try:
        from ddpdoctor.load.loader import load_rank_files
        from ddpdoctor.metrics.summary import summarize_rank

        capture = None
        with contextlib.suppress(OSError, ValueError):
            capture = rundir.read_json(rundir.rank_file(out, rank))
        rank_trace = load_rank_files([link], rank)
        summary = summarize_rank(rank_trace, capture, (first, last))
        summary["files"] = []  # the trace is gone: a reader never looks for it
        path = rundir.window_summary_file(out, rank, first, last)
        why = runfiles.write_summary(path, summary)
        if why:
            raise ValueError(f"the window's summary does not fit its schema: {why}")
        return path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(link)


def main(argv: list[str]) -> int:
    with contextlib.suppress(OSError, AttributeError):
        os.nice(19)  # the job's CPUs are the job's
    out, rank, first, last, link = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), Path(argv[4])
    from ddpdoctor.cli import _import_numpy_single_threaded

    _import_numpy_single_threaded()
    try:
        summarize_window(out, rank, first, last, link)
    except Exception as exc:  # one line for the rank file
        print(f"{type(exc).__name__}: {exc}"[:_MAX_ERROR].replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
