"""``ddpdoctor baseline RUN`` (write a baseline file) and ``ddpdoctor gate RUN --baseline FILE`` (fail CI on a
performance regression).

Exit status of ``gate``: 0 pass, 1 regression (or a new finding at/above ``--fail-on``, or with
``--strict-env`` a different environment), 2 usage or input error (one line on stderr). Files (``--output``,
``--junit``) are written atomically. With ``GITHUB_ACTIONS`` set, failures and warnings are also printed as
``::error``/``::warning`` workflow commands and the result table is appended to ``$GITHUB_STEP_SUMMARY``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ddpdoctor.cli.argtypes import output_file
from ddpdoctor.cli.cluster_opts import add_cluster_options
from ddpdoctor.cli.compare_cmd import emit
from ddpdoctor.cli.diagnose_cmd import add_rule_options, add_rule_selection, rule_options
from ddpdoctor.errors import DDPDoctorError
from ddpdoctor.pipeline import resolve_rules
from ddpdoctor.report import OutputFormat

_GATE_EPILOG = """\
thresholds (METRIC=THRESHOLD, repeatable; also [tool.ddpdoctor.gate.thresholds] in pyproject.toml):
  +5%% relative to the baseline, +2ms / +512MiB / -0.1 absolute, off to stop gating a metric.
  defaults: %(defaults)s
metrics: %(metrics)s
a metric regresses when its change passes the threshold AND the bootstrap interval of the change over the
per-step samples excludes 0 (not noise)."""


def _epilog() -> str:
    from ddpdoctor.metrics.catalog import COMPARED as METRICS

    defaults = ", ".join(f"{m.name}={m.threshold}" for m in METRICS if m.threshold)
    return _GATE_EPILOG % {"defaults": defaults, "metrics": ", ".join(m.name for m in METRICS)}


def register(subparsers: Any, name: str, help_text: str) -> None:
    if name == "baseline":
        p = subparsers.add_parser(
            name,
            help=help_text,
            description=help_text + " (metrics, per-step samples and "
            "environment as small, reviewable JSON meant to be committed).",
        )
        p.add_argument(
            "run",
            metavar="RUN",
            nargs="+",
            help="a ddpdoctor run directory (or traces); several runs of the same job (3 or more recommended) "
            "let the gate measure the noise between runs",
        )
        p.add_argument(
            "--output", "-o", metavar="FILE", type=output_file, help="write the baseline to FILE (default: stdout)"
        )
        add_rule_selection(p)
        add_rule_options(p)
        add_cluster_options(p)
        p.set_defaults(func=run_baseline)
        return

    p = subparsers.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run",
        metavar="RUN",
        nargs="+",
        help="the run to check (a ddpdoctor run directory); several runs of the same job are checked as a set",
    )
    p.add_argument(
        "--baseline",
        "-b",
        required=True,
        metavar="FILE",
        help="baseline file from `ddpdoctor baseline` (or a run directory)",
    )
    p.add_argument(
        "--threshold",
        "-t",
        action="append",
        default=[],
        metavar="METRIC=THRESHOLD",
        help="override a threshold, e.g. step_ms.median=+5%% (repeatable)",
    )
    p.add_argument(
        "--fail-on",
        choices=("info", "warning", "error", "off"),
        default=None,
        help="fail on new findings at or above this severity (default: error)",
    )
    p.add_argument(
        "--strict-env",
        action="store_true",
        default=None,
        help="fail when the environment (world size, backend, devices, torch) differs from the baseline",
    )
    p.add_argument(
        "--format",
        choices=[f.value for f in OutputFormat],
        default=OutputFormat.TEXT.value,
        help="output format (default: text)",
    )
    p.add_argument(
        "--output", "-o", metavar="FILE", type=output_file, help="write the result to FILE instead of stdout"
    )
    p.add_argument("--junit", metavar="FILE", type=output_file, help="also write JUnit XML to FILE")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="read [tool.ddpdoctor.gate] and the rule parameters from FILE instead of the nearest pyproject.toml",
    )
    add_rule_selection(p)
    add_rule_options(p, config=False)
    add_cluster_options(p)
    p.set_defaults(func=run_gate)


def run_baseline(args: argparse.Namespace) -> int:
    from ddpdoctor.compare import read_input
    from ddpdoctor.compare.baseline_file import MAX_FILE_BYTES, dumps, from_json
    from ddpdoctor.compare.snapshot import combine
    from ddpdoctor.errors import UsageError

    rules = resolve_rules(rule_options(args))
    try:
        snapshot = combine([read_input(run, rules=rules) for run in args.run])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    text = dumps(snapshot)
    size = len(text.encode())
    # never write a baseline that gate would refuse to read: the same checks as reading it
    if size > MAX_FILE_BYTES:
        raise UsageError(
            f"{', '.join(args.run)}: the baseline would be {size / 2**20:.1f} MiB; gate reads at most "
            f"{MAX_FILE_BYTES >> 20} MiB (its devices and findings grow with the world size)"
        )
    try:
        from_json(json.loads(text), args.output or "-")
    except ValueError as exc:
        raise UsageError(f"{', '.join(args.run)}: cannot make a baseline of this run: {exc}") from None
    from dataclasses import replace

    from ddpdoctor.compare import load_config

    loud = noise_warnings(snapshot, load_config())
    if loud:  # written into the file too: gate shows the baseline's notes
        snapshot = replace(snapshot, notes=[*loud, *snapshot.notes])
        text = dumps(snapshot)
    emit(lambda _, stream: stream.write(text), None, args.output, announce=False)  # says more below
    for line in loud:
        print(f"ddpdoctor: warning: {line}", file=sys.stderr)
    if args.output is not None:
        metrics = sum(v is not None for v in snapshot.metrics.values())
        print(
            f"ddpdoctor: wrote baseline {args.output}: {metrics} metrics, "
            f"{len(snapshot.samples.get('step_ms', []))} step samples"
            + (f" from {len(args.run)} runs" if len(args.run) > 1 else ""),
            file=sys.stderr,
        )
    return 0


def noise_warnings(snapshot: Any, config: Any) -> list[str]:
    """What a baseline of several runs cannot detect under the gate's thresholds (empty when it sees them all)."""
    from ddpdoctor.compare.gate import sensitivity_note, wild_note

    return [n for n in (sensitivity_note(snapshot, config), wild_note(snapshot, config)) if n]


def _github(result: Any, report_on_stdout: bool) -> None:
    if os.environ.get("GITHUB_ACTIONS", "").lower() in ("", "0", "false"):
        return
    from ddpdoctor.report import github

    # workflow commands are read from stdout and stderr; keep a JSON/Markdown report on stdout clean
    github.write_annotations(result, sys.stderr if report_on_stdout else sys.stdout)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            github.append_step_summary(result, summary)
        except OSError as exc:
            raise DDPDoctorError(f"{summary}: cannot append the step summary: {exc.strerror or exc}") from None


def run_gate(args: argparse.Namespace) -> int:
    from ddpdoctor.compare import load_config, read_input
    from ddpdoctor.compare.gate import gate  # the function (the package's `gate` is the module once imported)
    from ddpdoctor.report import Document, junit, renderer
    from ddpdoctor.rundir import atomic_write_bytes

    config = load_config(args.config, args.threshold, fail_on=args.fail_on, strict_env=args.strict_env)
    rules = resolve_rules(rule_options(args))
    from ddpdoctor.compare.snapshot import combine
    from ddpdoctor.errors import UsageError

    baseline = read_input(args.baseline, rules=rules)
    try:
        current = combine([read_input(run, rules=rules) for run in args.run])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = gate(current, baseline, config)
    if args.junit:  # files first: a closed stdout (`| head`) must not cost the CI its JUnit report
        try:
            atomic_write_bytes(Path(args.junit), junit.to_bytes(result))
        except OSError as exc:
            raise DDPDoctorError(f"{args.junit}: cannot write: {exc.strerror or exc}") from None
    emit(renderer(Document.GATE, args.format), result, args.output)
    _github(result, report_on_stdout=args.output is None and args.format != OutputFormat.TEXT.value)
    return result.exit_code
