"""Python interpreters that ddpdoctor's start-up hook cannot reach, and watching a job for them.

``ddpdoctor trace`` reaches every process of a job through a ``sitecustomize`` on ``PYTHONPATH``
(``capture/_startup``). An interpreter started with ``-I`` (isolated: implies ``-E``) or ``-E`` ignores
``PYTHONPATH``; one started with ``-S`` never imports ``site``, which is what imports ``sitecustomize``. Such a
process runs untraced, and so do its ``multiprocessing`` children (spawned with the same options, or forked from
it). :func:`untraceable` reads an interpreter's command line as Python's own option parser does (``-IE``,
``-uI``; ``-X``/``-W`` take a value, ``-c``/``-m`` end the options), so that ``trace -- python -I job.py`` is
refused before anything runs. torchrun started that way is not refused: it starts its workers as
``python -u SCRIPT``, without the options.

A job can also start such an interpreter itself (a script that re-execs itself with ``-I``). :class:`Watch` looks
at the command lines of the job's processes (Linux: ``/proc/<pid>/task/<tid>/children``) once a second while the
job runs and remembers those; when a rank then leaves no data, the launcher names the likely cause.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

# python, python3, python3.12, python3.13t, python3.12d (free-threaded, debug builds)
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?[td]?)?$")
_NO_VALUE = set("bBdEhiIOPqsSuvVx?R")  # one-letter options without a value (Python 3.8 to 3.13)
_WITH_VALUE = set("WX")  # the rest of the word, or the next word
_ENDS = set("cm")  # -c COMMAND / -m MODULE: what follows is the program's
_LONG_WITH_VALUE = {"--check-hash-based-pycs"}
# Launchers whose workers start as a new interpreter without the launcher's own options (`python -u SCRIPT`).
_LAUNCHERS = {"torch.distributed.run", "torch.distributed.launch"}

_FLAG = {"I": "-I (isolated mode)", "E": "-E", "S": "-S"}
_EFFECT = {
    "I": "ignore PYTHONPATH",
    "E": "ignore PYTHONPATH",
    "S": "skip the site module, and so the sitecustomize on PYTHONPATH",
}
_AND = {"I": " (-s -P do the rest of what -I does)", "E": "", "S": ""}


def is_python(executable: str) -> bool:
    """Whether ``executable`` (a command's first word) is a Python interpreter: ``python``, ``python3.12``, or
    this interpreter by any path."""
    if _PYTHON_NAME.match(os.path.basename(executable)):
        return True
    try:
        return os.path.realpath(executable) == os.path.realpath(sys.executable)
    except (OSError, ValueError):
        return False


def _options(argv: list[str]) -> tuple[list[str], list[str]]:
    """The one-letter options of the interpreter command ``argv`` (``-IE`` gives I and E) and what follows them
    (the script, or ``-c``/``-m`` and theirs)."""
    letters: list[str] = []
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return letters, argv[i + 1 :]
        if word.startswith("--"):
            i += 2 if word in _LONG_WITH_VALUE else 1
            continue
        if not word.startswith("-") or word == "-":
            return letters, argv[i:]
        for j, letter in enumerate(word[1:], start=1):
            if letter in _ENDS:
                rest = word[j + 1 :]
                return letters, [f"-{letter}", *([rest] if rest else []), *argv[i + 1 :]]
            if letter in _WITH_VALUE:
                if j == len(word) - 1:
                    i += 1  # its value is the next word
                break
            if letter in _NO_VALUE:
                letters.append(letter)
            else:
                return letters, argv[i:]  # not an option Python knows: Python itself will refuse the command
        i += 1
    return letters, []


def untraceable(argv: list[str]) -> str | None:
    """Why the command ``argv`` starts a Python interpreter that ddpdoctor's start-up hook cannot reach, and what
    to do ("-I (isolated mode) makes Python ignore PYTHONPATH, ...; run it without -I ..."); None when it is not
    Python, or nothing in its options keeps the hook out."""
    if not argv or not is_python(argv[0]):
        return None
    letters, program = _options(argv)
    if program[:1] == ["-m"] and len(program) > 1 and program[1] in _LAUNCHERS:
        return None  # torchrun's agent is never traced; its workers start without these options
    flag = next((f for f in "ISE" if f in letters), None)
    if flag is None:
        return None
    return (
        f"{_FLAG[flag]} makes Python {_EFFECT[flag]}, which is how ddpdoctor's start-up hook reaches the job's "
        f"processes: such a process, and those it starts with multiprocessing, run untraced; run it without "
        f"-{flag}{_AND[flag]}"
    )


def this_interpreter() -> str | None:
    """When this Python itself runs with -I, -E or -S: the warning that the processes a script run in it starts
    with multiprocessing (which passes these options on) go untraced; the script itself is traced in-process."""
    flag = "I" if sys.flags.isolated else "E" if sys.flags.ignore_environment else "S" if sys.flags.no_site else None
    if flag is None:
        return None
    return (
        f"this Python runs with {_FLAG[flag]}, which makes it {_EFFECT[flag]}: the script is traced in this "
        f"process, but the ranks it starts with multiprocessing (mp.spawn) get -{flag} too and run untraced; run "
        f"ddpdoctor without -{flag}{_AND[flag]} to trace them"
    )


@dataclass(frozen=True)
class Untraced:
    """A process of the job that ran an interpreter the start-up hook cannot reach."""

    pid: int
    command: str  # as a shell would show it
    why: str  # untraceable()'s text


class Watch:
    """Once a second while a job runs (Linux), the command lines of the processes under ``root_pid``; ``stop()``
    returns those that ran untraceable interpreters for more than a second (a rank, not a tool that runs
    ``python -I -c ...`` to look at an interpreter). Elsewhere, or without ``/proc/<pid>/task/*/children``, it
    watches nothing."""

    INTERVAL_S = 1.0

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.found: list[Untraced] = []
        self._seen: set[tuple[int, tuple[str, ...]]] = set()  # done with
        self._once: set[tuple[int, tuple[str, ...]]] = set()  # untraceable, seen once so far
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watch:
        if Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children").exists():
            self._thread = threading.Thread(target=self._run, name="ddpdoctor-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> list[Untraced]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        return list(self.found)

    def _run(self) -> None:
        while True:
            try:
                self.look()
            except Exception:  # a process that ended as it was read, /proc oddities: watch on, never fail the job
                pass
            if self._stop.wait(self.INTERVAL_S):
                return

    def look(self) -> None:
        """Read the command line of every process under the root once."""
        for pid in _descendants(self.root_pid):
            argv = _cmdline(pid)
            key = (pid, tuple(argv))
            if not argv or key in self._seen:
                continue
            why = untraceable(argv)
            if why is None:
                self._seen.add(key)
            elif key in self._once:  # seen twice: it lives like a rank, not a tool's quick look at Python
                self._seen.add(key)
                self.found.append(Untraced(pid, shlex.join(argv), why))
            else:
                self._once.add(key)


def _descendants(root: int) -> list[int]:
    out: list[int] = []
    todo = [root]
    while todo and len(out) < 100_000:
        pid = todo.pop()
        out.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                todo.extend(int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
            except (OSError, ValueError):
                continue
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def no_data_reason(found: list[Untraced]) -> str | None:
    """The likely cause of a rank with no data when the job ran untraceable interpreters (None when it ran none)."""
    if not found:
        return None
    first = found[0]
    more = f" (and {len(found) - 1} other process(es) like it)" if len(found) > 1 else ""
    command = first.command if len(first.command) <= 200 else first.command[:197] + "..."
    return (
        f"no data: the rank never started ddpdoctor's capture, likely because process {first.pid} ran "
        f"`{command}`{more}: {first.why}"
    )
