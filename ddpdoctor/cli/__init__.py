"""Command line: ``ddpdoctor <command> ...``.

Only this package touches argparse and ``sys.exit``. Each command lives in its own module exposing
``register(subparsers)`` and ``run(args) -> int``; modules are imported lazily so ``ddpdoctor --help`` does not
import torch.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from collections.abc import Sequence

from ddpdoctor._version import __version__
from ddpdoctor.errors import DDPDoctorError, UsageError

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "trace": (
        "ddpdoctor.cli.trace_cmd",
        "run a training script under the profiler and write a run directory",
    ),
    "diagnose": (
        "ddpdoctor.cli.diagnose_cmd",
        "analyse a run (or any torch.profiler traces) and report findings",
    ),
    "rules": ("ddpdoctor.cli.rules_cmd", "list the diagnosis rules"),
    "explain": ("ddpdoctor.cli.rules_cmd", "print the documentation of one rule"),
    "compare": ("ddpdoctor.cli.compare_cmd", "compare two runs side by side (e.g. DataParallel vs DDP)"),
    "baseline": ("ddpdoctor.cli.gate_cmd", "write a run's metrics as a baseline file to commit"),
    "gate": ("ddpdoctor.cli.gate_cmd", "fail CI when a run regresses against a baseline"),
    "view": ("ddpdoctor.cli.view_cmd", "open a run in TensorBoard with the ddpdoctor dashboard"),
    "dump": (
        "ddpdoctor.cli.dump_cmd",
        "ask every rank of a running traced job to dump where it is (stacks, Flight Recorder), without stopping it",
    ),
    "export": (
        "ddpdoctor.cli.export_cmd",
        "write one clock-aligned trace of every rank, findings marked, for ui.perfetto.dev (--perfetto FILE)",
    ),
    "try": (
        "ddpdoctor.cli.try_cmd",
        "run a traced job again with a knob applied (no code change) and measure the gain",
    ),
}


_ALL = object()
# the commands that read runs with numpy (not `trace` and `try`, which run the user's job)
_READERS = frozenset(("diagnose", "compare", "baseline", "gate", "view", "export"))


# Read by numpy once, at its import (a user's own setting wins):
_NUMPY_IMPORT_ENV = {
    # its OpenBLAS starts a thread per core when it loads, which only spins here (no command does linear
    # algebra): ~0.07 s of CPU at every start, and start-up time on a busy machine
    "OPENBLAS_NUM_THREADS": "1",
    # numpy asks the kernel for huge pages for every array of 4 MB or more (madvise). Where the kernel then
    # compacts memory on the fault (transparent_hugepage/defrag "madvise", many distributions' default) a fresh
    # array can stall for a fraction of a second: 1 cold diagnose in 3 of a 50 MB trace set took 0.22-0.30 s
    # of system time against 0.05 s, and 131,072 ranks from summaries 8.9 s against 2.3 s of it
    "NUMPY_MADVISE_HUGEPAGE": "0",
}


def _import_numpy_single_threaded() -> None:
    """Import numpy with one OpenBLAS thread and without huge-page advice (``_NUMPY_IMPORT_ENV``). The variables
    are read once, at that import, and put back at once: nothing this process starts later (and no other command
    run in this process) sees them. A user's own setting wins."""
    saved = {key: os.environ.get(key) for key in _NUMPY_IMPORT_ENV}
    for key, value in _NUMPY_IMPORT_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import numpy  # noqa: F401
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)


class _Parser(argparse.ArgumentParser):
    """A usage error as one line (``UsageError``, printed as ``ddpdoctor: error: ...``, exit 2), naming the help to
    read, instead of argparse's usage block above it. The commands' parsers are made of this class too."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser(only: str | None | object = _ALL) -> argparse.ArgumentParser:
    """The command line's parser. ``only``: register only that command's options (None: no command's) and list
    the others by their one-line help alone, so that a command imports its own module and nothing else
    (``ddpdoctor --help`` imports none); by default every command is registered."""
    parser = _Parser(
        prog="ddpdoctor",
        description="Profile and diagnose PyTorch DataParallel / DistributedDataParallel training.",
    )
    parser.add_argument("--version", action="version", version=f"ddpdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        if only is _ALL or only == name:
            importlib.import_module(module).register(sub, name, help_text)
        else:
            sub.add_parser(name, help=help_text)  # listed in --help; never parsed (argv names another command)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option), or None."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a program ended by SIGPIPE (`ddpdoctor ... | head`)


# Objects a command leaves for the operating system to reclaim when the process ends (``console_main``): freeing a
# 16,384-rank analysis object by object takes 0.8 s (3% of its diagnose), a 131,072-rank one several seconds. None
# where ``main`` runs inside another program (tests, the TensorBoard plugin): nothing is kept there.
_KEPT: list[object] | None = None


def keep_until_exit(obj: object) -> None:
    """Leave ``obj`` alive until the process ends, where ``console_main`` ends it without freeing it."""
    if _KEPT is not None:
        _KEPT.append(obj)


def console_main() -> None:
    """The ``ddpdoctor`` command and ``python -m ddpdoctor``: ``main``, then exit. Where a command kept its
    results (``keep_until_exit``), the process ends with ``os._exit`` once stdout and stderr are flushed, without
    freeing them; every file it writes is complete and renamed into place before (``rundir.atomic_write_bytes``),
    and a Dask cluster it started is closed as ``main`` returns."""
    global _KEPT
    _KEPT = []
    code = main()
    if not _KEPT:
        raise SystemExit(code)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = EXIT_BROKEN_PIPE
    except (OSError, ValueError):
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. A reader that goes away (``| head -1``) ends it quietly with 141."""
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    return code


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not fail (and print)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):  # not a real file (tests capture stdout)
        pass


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `trace` parses its own argv: everything after the script belongs to the script.
    if argv and argv[0] == "trace":
        from ddpdoctor.cli import trace_cmd

        try:
            return trace_cmd.main(argv[1:])
        except DDPDoctorError as exc:
            print(f"ddpdoctor: error: {exc}", file=sys.stderr)
            return exc.exit_code
    command = _command(argv)
    if command in _READERS and "numpy" not in sys.modules:
        _import_numpy_single_threaded()
    parser = build_parser(command)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help or --version (0)
        return int(exc.code or 0)
    except UsageError as exc:
        print(f"ddpdoctor: error: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        from ddpdoctor.cli.cluster_opts import cluster_from_args

        with cluster_from_args(args):
            return int(args.func(args))
    except DDPDoctorError as exc:
        print(f"ddpdoctor: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
