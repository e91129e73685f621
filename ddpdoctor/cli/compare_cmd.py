"""``ddpdoctor compare A B``: two runs (or baselines) side by side, with B/A for every metric.

Exit status: 0, or 2 on a usage or input error (one line on stderr). ``--output`` is written atomically once
the report is complete, so a failed run never leaves an empty or partial file.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ddpdoctor.cli.argtypes import output_file
from ddpdoctor.cli.cluster_opts import add_cluster_options
from ddpdoctor.cli.diagnose_cmd import add_rule_options, add_rule_selection, rule_options
from ddpdoctor.errors import DDPDoctorError
from ddpdoctor.pipeline import resolve_rules
from ddpdoctor.report import OutputFormat


def emit(render: Callable[[Any, TextIO], None], result: Any, output: str | None, *, announce: bool = True) -> None:
    """Render ``result`` to stdout, or atomically to ``output`` (and, with ``announce``, say so on stderr)."""
    if output is None:
        render(result, sys.stdout)
        sys.stdout.flush()
        return
    from ddpdoctor.rundir import atomic_write_bytes

    buffer = io.StringIO()
    render(result, buffer)
    try:
        atomic_write_bytes(Path(output), buffer.getvalue().encode("utf-8"))
    except OSError as exc:
        raise DDPDoctorError(f"{output}: cannot write: {exc.strerror or exc}") from None
    if announce:
        print(f"ddpdoctor: wrote the report to {output}", file=sys.stderr)


def register(subparsers: Any, name: str, help_text: str) -> None:
    p = subparsers.add_parser(
        name,
        help=help_text,
        description=help_text + ". A and B are run directories, trace folders or files, "
        "or baseline files from `ddpdoctor baseline`; ratios are B/A.",
    )
    p.add_argument("a", metavar="A", help="the reference run (e.g. the DataParallel run)")
    p.add_argument("b", metavar="B", help="the run to compare with it (e.g. the DDP run)")
    p.add_argument(
        "--format",
        choices=[f.value for f in OutputFormat],
        default=OutputFormat.TEXT.value,
        help="report format (default: text; html has charts)",
    )
    p.add_argument(
        "--output", "-o", metavar="FILE", type=output_file, help="write the report to FILE instead of stdout"
    )
    add_rule_selection(p)
    add_rule_options(p)
    add_cluster_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ddpdoctor.compare import compare, read_input
    from ddpdoctor.report import Document, renderer

    rules = resolve_rules(rule_options(args))
    a, b = read_input(args.a, rules=rules), read_input(args.b, rules=rules)
    emit(renderer(Document.COMPARISON, args.format), compare(a, b), args.output)
    return 0
