"""``ddpdoctor export RUN --perfetto FILE``: one clock-aligned trace of every rank, with the findings marked.

Opens in the Perfetto UI (ui.perfetto.dev: "Open trace file") and in ``chrome://tracing``. A process per rank
(``rank N on HOST``), clocks aligned on the collectives, ddpdoctor's findings as instant events on the ranks they
name. ``--steps N..M`` chooses the steps; at most ``--max-events`` events are written (whole steps, those closest
to the median step time first; where one step or the window alone is over the cap, the events that start first), and
the file says what was left out (a cut inside the steps is also a warning on stderr). ``diagnose FILE`` reads the
file back as its ranks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ddpdoctor.cli.argtypes import count
from ddpdoctor.cli.cluster_opts import add_cluster_options
from ddpdoctor.cli.diagnose_cmd import add_rule_options, add_rule_selection, parse_steps, rule_options
from ddpdoctor.errors import UsageError


def register(subparsers: Any, name: str, help_text: str) -> None:
    from ddpdoctor.export.perfetto import DEFAULT_MAX_EVENTS

    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument("run", metavar="RUN", help="a ddpdoctor run directory, a folder of traces or one trace file")
    p.add_argument("--perfetto", required=True, metavar="FILE", help="write the trace here (Chrome trace JSON)")
    p.add_argument("--steps", metavar="N..M", help="export only profiled steps N to M (default: every step, capped)")
    p.add_argument(
        "--max-events",
        type=count(1, 50_000_000),
        default=DEFAULT_MAX_EVENTS,
        metavar="N",
        help=f"write at most N events, whole steps (default {DEFAULT_MAX_EVENTS:,}, about 150 MB)",
    )
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    add_rule_selection(p)
    add_rule_options(p)
    add_cluster_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ddpdoctor.export.perfetto import export_perfetto, step_ranges
    from ddpdoctor.pipeline import resolve_rules

    out = Path(args.perfetto)
    if out.is_dir():
        raise UsageError(f"--perfetto {out}: is a folder; give a file name (e.g. {out / 'run.perfetto.json'})")
    if out.exists() and not args.force:
        raise UsageError(f"--perfetto {out}: exists; choose another name or add --force to replace it")
    if not out.parent.is_dir():
        raise UsageError(f"--perfetto {out}: the folder {out.parent} does not exist")
    if not Path(args.run).exists():
        raise UsageError(f"{args.run}: no such file or directory")
    done = export_perfetto(
        args.run,
        out,
        steps=parse_steps(args.steps),
        max_events=args.max_events,
        rules=resolve_rules(rule_options(args)),
    )
    steps = f"step(s) {step_ranges(done.steps)}" if done.steps else "the profiled window"
    print(
        f"ddpdoctor: wrote {out} ({done.events:,} events, {len(done.ranks)} rank(s), {steps}"
        f"{', cut by the cap' if done.cut else ''}, clocks aligned on the collectives)",
        flush=True,
    )
    for note in done.notes:
        if note == done.cut:  # less than the chosen steps or window: a warning, on stderr
            print(f"ddpdoctor: warning: {note}", file=sys.stderr, flush=True)
        else:
            print(f"ddpdoctor: note: {note}", flush=True)
    print("ddpdoctor: open it in ui.perfetto.dev (Open trace file) or chrome://tracing", flush=True)
    return 0
