"""``ddpdoctor diagnose RUN``: load -> analyze -> evaluate rules -> render.

Exit status: 0 no finding at or above ``--fail-on`` (off by default), 1 findings at or above it, 2 usage or
input error (one line on stderr). ``--output`` is written atomically once the report is complete, so a failed
run never leaves an empty or partial file."""

from __future__ import annotations

import argparse
import inspect
import io
import re
import sys
from pathlib import Path
from typing import Any

from ddpdoctor.diagnosis import SEVERITIES, apply_config, evaluate, load_config, load_rules, select_rules
from ddpdoctor.errors import DDPDoctorError, UsageError
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


def add_rule_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rules-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="also load the rule files (*.toml) in DIR (repeatable)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="read rule parameters from FILE ([tool.ddpdoctor.rules.<name>]) instead of the nearest "
        "pyproject.toml",
    )


def register(subparsers: Any, name: str, help_text: str) -> None:
    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument(
        "run", metavar="RUN", help="a ddpdoctor run directory, a folder of traces or one trace file"
    )
    p.add_argument(
        "--format",
        choices=[f.value for f in OutputFormat],
        default=OutputFormat.TEXT.value,
        help="report format (default: text)",
    )
    p.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument(
        "--fail-on",
        choices=SEVERITIES,
        default=None,
        help="exit 1 when a finding has this severity or a higher one",
    )
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
    p.add_argument("--steps", metavar="N..M", help="analyse only profiled steps N to M (M optional)")
    add_rule_options(p)
    p.set_defaults(func=run)


def _progress(done: int, total: int, label: str) -> None:
    sys.stderr.write(f"\rloading traces: {done}/{total} {label[:40]:<40}")
    if done == total:
        sys.stderr.write("\r" + " " * 70 + "\r")
    sys.stderr.flush()


def load_and_analyze(path: str, steps: tuple[int, int | None] | None) -> Any:
    """The ``RunMetrics`` of ``path``."""
    if not Path(path).exists():
        raise UsageError(f"{path}: no such file or directory")
    from ddpdoctor.load import load

    try:
        from ddpdoctor.metrics import analyze
    except ImportError:
        raise DDPDoctorError(
            "this build of ddpdoctor has no metrics module (ddpdoctor.metrics.analyze)"
        ) from None
    # The per-rank summaries the ranks computed at the end of `ddpdoctor trace` give the same metrics without
    # decoding a trace (a 1,000-rank run is read from 1,000 small files); a step range needs the traces.
    run_data = load(path, progress=_progress if sys.stderr.isatty() else None, use_summaries=steps is None)
    if steps is None:
        return _with_input_notes(analyze(run_data), run_data)
    if "steps" not in inspect.signature(analyze).parameters:
        raise UsageError("--steps is not supported by this build's metrics")
    metrics = analyze(run_data, steps=steps)
    if not metrics.run.get("steps_analyzed"):
        last = "" if steps[1] is None else str(steps[1])
        raise UsageError(f"--steps {steps[0]}..{last}: none of the run's profiled steps is in that range")
    return _with_input_notes(metrics, run_data)


def _with_input_notes(metrics: Any, run_data: Any) -> Any:
    """The files the loader skipped and its notes on the rest go into the report (run.skipped, run.notes)."""
    if isinstance(getattr(metrics, "run", None), dict):
        metrics.run.setdefault("skipped", list(getattr(run_data, "skipped", [])))
        metrics.run.setdefault("notes", list(getattr(run_data, "notes", [])))
    return metrics


def run(args: argparse.Namespace) -> int:
    steps = parse_steps(args.steps)
    rules = load_rules(args.rules_dir)
    rules = apply_config(rules, load_config(args.config))
    rules = select_rules(rules, args.select, args.ignore)
    metrics = load_and_analyze(args.run, steps)
    result = evaluate(rules, metrics)
    if args.output is None:
        render(result, args.format, sys.stdout)
        sys.stdout.flush()
    else:
        from ddpdoctor.rundir import atomic_write_bytes

        buffer = io.StringIO()
        render(result, args.format, buffer)
        try:
            atomic_write_bytes(Path(args.output), buffer.getvalue().encode("utf-8"))
        except OSError as exc:
            raise DDPDoctorError(f"{args.output}: cannot write the report: {exc.strerror or exc}") from None
    return 1 if result.fails(args.fail_on) else 0
