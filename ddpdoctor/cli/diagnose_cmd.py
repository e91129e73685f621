"""``ddpdoctor diagnose RUN``: the pipeline (``ddpdoctor.pipeline.analyze_run``) -> render.

Exit status: 0 no finding at or above ``--fail-on`` (off by default), 1 findings at or above it, 2 usage or
input error (one line on stderr). ``--output`` is written atomically once the report is complete, so a failed
run never leaves an empty or partial file."""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path
from typing import Any

from ddpdoctor.cli import keep_until_exit
from ddpdoctor.cli.argtypes import output_file
from ddpdoctor.cli.cluster_opts import add_cluster_options
from ddpdoctor.diagnosis.findings import SEVERITIES
from ddpdoctor.errors import DDPDoctorError, UsageError
from ddpdoctor.pipeline import RuleOptions, analyze_run, resolve_rules, without_gc
from ddpdoctor.report import OutputFormat, render

_STEPS_RE = re.compile(r"^(\d+)\.\.(\d+)?$")


def names_list(text: str) -> list[str]:
    """``"a,b , c"`` -> ``["a", "b", "c"]`` (for --select / --ignore)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_steps(text: str | None) -> tuple[int, int | None] | None:
    """``"N..M"`` -> (N, M); ``"N.."`` -> (N, None): the profiled steps to analyse (inclusive)."""
    if text is None:
        return None
    match = _STEPS_RE.match(text.strip())
    if not match:
        raise UsageError(f"--steps must look like N..M or N.. (e.g. 5..20), not {text!r}")
    first, last = int(match.group(1)), None if match.group(2) is None else int(match.group(2))
    if last is not None and last < first:
        raise UsageError(f"--steps {text}: the last step comes before the first")
    return first, last


def add_rule_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--select",
        type=names_list,
        action="extend",
        default=[],
        metavar="NAMES",
        help="only these rules (comma-separated names or ids)",
    )
    p.add_argument(
        "--ignore",
        type=names_list,
        action="extend",
        default=[],
        metavar="NAMES",
        help="skip these rules (comma-separated names or ids)",
    )


def add_rule_options(p: argparse.ArgumentParser, *, config: bool = True) -> None:
    p.add_argument(
        "--rules-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="also load the rule files (*.toml) in DIR (repeatable)",
    )
    if config:
        p.add_argument(
            "--config",
            metavar="FILE",
            help="read rule parameters from FILE ([tool.ddpdoctor.rules.<name>]) instead of the nearest pyproject.toml",
        )


def register(subparsers: Any, name: str, help_text: str) -> None:
    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument("run", metavar="RUN", help="a ddpdoctor run directory, a folder of traces or one trace file")
    p.add_argument(
        "--format",
        choices=[f.value for f in OutputFormat],
        default=OutputFormat.TEXT.value,
        help="report format (default: text)",
    )
    p.add_argument(
        "--output", "-o", metavar="FILE", type=output_file, help="write the report to FILE instead of stdout"
    )
    p.add_argument(
        "--fail-on",
        choices=SEVERITIES,
        default=None,
        help="exit 1 when a finding has this severity or a higher one",
    )
    add_rule_selection(p)
    p.add_argument("--steps", metavar="N..M", help="analyse only profiled steps N to M (M optional)")
    add_rule_options(p)
    add_cluster_options(p)
    p.set_defaults(func=run)


class Progress:
    """Trace loading, on stderr (never stdout: ``--format json`` stays clean), once it takes more than ``after_s``:
    at a terminal one line redrawn in place and cleared at the end; elsewhere (a log, CI) a line every
    ``every_s`` and one when done, for runs of ``MIN_RANKS`` ranks or more (fewer have little to count, and a
    small run's report stays alone on a busy machine)."""

    MIN_RANKS = 8

    def __init__(
        self,
        stream: Any = None,
        *,
        tty: bool | None = None,
        after_s: float = 2.0,
        every_s: float = 5.0,
        clock: Any = None,
    ) -> None:
        import time

        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock or time.monotonic
        self.after_s, self.every_s = after_s, every_s
        self.started = self.clock()
        self.shown: float | None = None  # when a line was last written

    def __call__(self, done: int, total: int, label: str) -> None:
        now = self.clock()
        if self.shown is None and (now - self.started < self.after_s or (not self.tty and total < self.MIN_RANKS)):
            return
        took = now - self.started
        if self.tty:
            self.stream.write(f"\rloading traces: {done}/{total} {label[:40]:<40}")
            if done == total:
                self.stream.write("\r" + " " * 70 + "\r")
        elif done == total:
            self.stream.write(f"ddpdoctor: loaded the traces of {total} rank(s) in {took:.0f} s; analysing\n")
        elif self.shown is None or now - self.shown >= self.every_s:
            self.stream.write(
                f"ddpdoctor: loading traces: {done}/{total} rank(s) after {took:.0f} s (last: {label[:40]})\n"
            )
        else:
            return
        self.shown = now
        self.stream.flush()


def rule_options(args: argparse.Namespace) -> RuleOptions:
    """The rule options of a command that took ``add_rule_options`` (and maybe ``add_rule_selection``)."""
    return RuleOptions(
        rules_dirs=tuple(args.rules_dir),
        config=args.config,
        select=tuple(getattr(args, "select", ())),
        ignore=tuple(getattr(args, "ignore", ())),
    )


def run(args: argparse.Namespace) -> int:
    with without_gc():  # the report of a large run is many small objects too
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    steps = parse_steps(args.steps)
    rules = resolve_rules(rule_options(args))  # rule errors before any trace is read
    progress = Progress()
    analysis = analyze_run(args.run, steps=steps, rules=rules, progress=progress, over_time=True)
    keep_until_exit(analysis)  # a large run's objects are left to the OS (console_main), not freed one by one
    result = analysis.diagnosis
    if args.output is None:
        render(result, args.format, sys.stdout)
        sys.stdout.flush()
    else:
        from ddpdoctor.rundir import atomic_write_bytes

        buffer = io.StringIO()
        render(result, args.format, buffer)
        try:
            # not synced: a report is output to regenerate, not a run's record (readers still never see half of it)
            atomic_write_bytes(Path(args.output), buffer.getvalue().encode("utf-8"), durable=False)
        except OSError as exc:
            raise DDPDoctorError(f"{args.output}: cannot write the report: {exc.strerror or exc}") from None
        print(f"ddpdoctor: wrote the {args.format} report to {args.output}", file=sys.stderr)
    return 1 if result.fails(args.fail_on) else 0
