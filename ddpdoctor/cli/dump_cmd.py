"""``ddpdoctor dump RUN``: ask every rank of a running traced job to dump where it is, without stopping it.

Writes ``RUN/dumps/request.json`` (reason ``on_demand``); each rank's ddpdoctor thread answers with
``RUN/dumps/rank<R>.<id>.json`` (its step and phase, every thread's Python stack, the Flight Recorder buffer). Waits
for the answers (``--wait`` seconds at most), prints which ranks answered and what the dumps show.

Exit status: 0 when every running rank answered, 1 when some did not, 2 when RUN is not a run directory with a
running rank.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ddpdoctor import escape, rundir
from ddpdoctor.cli.argtypes import seconds
from ddpdoctor.errors import UsageError


def register(subparsers: Any, name: str, help_text: str) -> None:
    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument("run", metavar="RUN", help="the run directory of a running `ddpdoctor trace`")
    p.add_argument(
        "--wait",
        type=seconds(600.0),
        default=15.0,
        metavar="SECONDS",
        help="how long to wait for the ranks' answers (default 15)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ddpdoctor.capture import hang

    out = Path(args.run)
    if not out.is_dir() or not rundir.is_run_dir(out):
        raise UsageError(f"{args.run}: not a ddpdoctor run directory")
    running = hang.running_ranks(out)
    if not running:
        raise UsageError(f"{args.run}: no rank of this run is running (a finished run has nothing to dump)")
    ident = hang.write_request(out, reason="on_demand", by="ddpdoctor dump")
    print(f"ddpdoctor: asked {len(running)} running rank(s) of {out} to dump (request {ident})", file=sys.stderr)
    answered = hang.wait_for_answers(out, ident, running, wait_s=args.wait)
    missing = sorted(set(running) - set(answered))
    for rank in sorted(answered):
        dump = answered[rank]
        name = hang.dump_path(out, rank, ident)
        print(f"rank {rank}: answered at step {dump.step} ({escape.terminal(dump.phase)}): {name}")
    for rank in missing:
        print(f"rank {rank}: no answer within {args.wait:g} s")
    if answered:
        verdict = hang.judge(answered, world_size=max(len(hang.world_ranks(out)), 1))
        print(f"{verdict.kind}: {escape.terminal(verdict.summary)}")
    return 1 if missing else 0
