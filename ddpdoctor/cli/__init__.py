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
from ddpdoctor.errors import DDPDoctorError

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
    "try": (
        "ddpdoctor.cli.try_cmd",
        "run a traced job again with a knob applied (no code change) and measure the gain",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpdoctor",
        description="Profile and diagnose PyTorch DataParallel / DistributedDataParallel training.",
    )
    parser.add_argument("--version", action="version", version=f"ddpdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        importlib.import_module(module).register(sub, name, help_text)
    return parser


EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a program ended by SIGPIPE (`ddpdoctor ... | head`)


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
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    try:
        return int(args.func(args))
    except DDPDoctorError as exc:
        print(f"ddpdoctor: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
