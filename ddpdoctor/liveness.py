"""Whether a process is still there: for the hang watchdog and the launcher (is a rank or the launcher alive?) and
for the readers of a run directory (is a rank file that still says "running" from a process that is gone?).

Standard library only, below both ``ddpdoctor.capture`` and ``ddpdoctor.rundir``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

# process_state's answers
GONE, ENDED, ALIVE = "gone", "ended", "alive"


def process_state(pid: int) -> tuple[str, int | None]:
    """(GONE: no such process; ENDED: a zombie, ended and not yet reaped; ALIVE: there, or cannot tell), and for a
    live process of ours whose ``/proc/<pid>/stat`` reads, its start time in clock ticks since boot (else None)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return GONE, None
    except (PermissionError, OSError):
        return ALIVE, None  # there, and another user's (or cannot tell)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
        if fields[0] == b"Z":
            return ENDED, None
        return ALIVE, int(fields[19])
    except (OSError, IndexError, ValueError):
        return ALIVE, None


def exists(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie, not yet reaped by its parent, has)."""
    return process_state(pid)[0] == ALIVE


def pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[4026531836]``), None where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def rank_process_gone(data: dict[str, Any], path: str | Path | None = None) -> str | None:
    """Why the process of a rank file that still says "running" is known to be gone, or None: it ran on this host
    (``hostname``) and no process ``pid`` is there any more, or the one there now started after the file was last
    written (the pid was reused), or the host restarted since. None where it cannot be told (another host, no pid,
    /proc unreadable) or the process is still there: a run in progress."""
    pid, host = data.get("pid"), data.get("hostname")
    if not isinstance(pid, int) or pid <= 0 or not isinstance(host, str) or host != socket.gethostname():
        return None
    ns = data.get("pid_ns")
    if isinstance(ns, str) and ns != pid_namespace():
        return None  # another pid namespace (a container sharing the host's name): its pids are not ours to look up
    try:
        written = os.stat(path).st_mtime if path is not None else None
    except OSError:
        written = None
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        boot = None
    if boot is not None and written is not None and written < boot:
        return f"{host} restarted after its rank file was last written"
    state, ticks = process_state(pid)
    if state == GONE:
        return f"no process {pid} on {host} any more (killed, or ended by a fatal signal)"
    if state == ENDED:
        return f"process {pid} on {host} has ended (not yet reaped)"
    if ticks is None:
        return None  # there, and another user's (or cannot tell)
    started = boot + ticks / os.sysconf("SC_CLK_TCK") if boot is not None else None
    if started is not None and written is not None and started > written + 2.0:
        return f"no process {pid} on {host} any more (that pid is now another process, started later)"
    return None


# A launcher (torchrun, the command after --) that ended by one of these was stopped from outside: Ctrl-C, a
# `kill`, a scheduler's time limit. Its ranks then end with it, whatever state they were in.
_STOP_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 15: "SIGTERM"}


def stop_signal(exit_code: Any) -> str | None:
    """The stop signal (``"SIGTERM"``) a launcher's exit status says ended it: ``-15`` (ended by the signal, as
    ``subprocess`` reports it) or ``143`` (128 + 15, as a shell or a process that re-raised it reports it); None
    for any other status."""
    if isinstance(exit_code, bool) or not isinstance(exit_code, int):
        return None
    if exit_code < 0:
        return _STOP_SIGNALS.get(-exit_code)
    return _STOP_SIGNALS.get(exit_code - 128) if exit_code > 128 else None


_STOPPED_WITH_JOB = (
    "the rank process ended without finishing its files when the job was stopped by {} (the launcher's exit"
    " status), not by a failure of its own"
)


def stopped_with_job(signal_name: str | None) -> str:
    """The reason of a rank that ended without finishing its files when its launcher was stopped by a signal."""
    return _STOPPED_WITH_JOB.format(signal_name)


def stopped_with_job_signal(reason: str) -> str | None:
    """The signal a ``stopped_with_job`` reason names, or None for any other reason."""
    head, _, rest = _STOPPED_WITH_JOB.partition("{}")
    if reason.startswith(head) and reason.endswith(rest):
        return reason[len(head) : len(reason) - len(rest)] or None
    return None
