"""``ddpdoctor try RUN (--set KNOB=VALUE ... | --findings)``: run RUN's own command again with knobs applied by
ddpdoctor's hooks (no code change) and measure what they change against a control run of the same steps.

Exit status: 0 when the trials ran (a knob that made the job fail is a result, reported with its error); 1 when
the control run (RUN's command without a knob) failed, so nothing could be measured; 2 on a usage or input error
(an unknown knob or value, a RUN that is not a run directory or cannot be run again, a command without this user's
mark that was not confirmed).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from ddpdoctor.cli.argtypes import MAX_SECONDS, count, seconds
from ddpdoctor.cli.diagnose_cmd import add_rule_options, add_rule_selection, rule_options
from ddpdoctor.errors import UsageError


def register(subparsers: Any, name: str, help_text: str) -> None:
    p = subparsers.add_parser(
        name,
        help=help_text,
        description=help_text
        + ". RUN's command (the `ddpdoctor trace` line its manifest records) and the directory it runs in are shown "
        "first; one your own trace did not mark runs only after --yes or a y at the prompt. The trials are written "
        "beside RUN, in RUN.trials/<n>/ (RUN is never written); results.json there holds every measurement and each "
        "rule's estimated gain against the measured one.",
    )
    p.add_argument("run", metavar="RUN", help="a run directory written by `ddpdoctor trace`")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="a knob to apply (several --set: applied together in one trial); the knobs: README 'Try the prescription'",
    )
    p.add_argument(
        "--findings",
        action="store_true",
        help="try every setting the rules of RUN's findings prescribe, one trial each, and print one table",
    )
    p.add_argument(
        "--as-ddp",
        action="store_true",
        help="run a DataParallel RUN as DDP, one process per device (torchrun), no code change, and compare",
    )
    p.add_argument(
        "--nproc-per-node",
        type=count(1, 1024),  # trial.plan.MAX_RANKS_PER_NODE
        default=None,
        metavar="N",
        help="with --as-ddp: ranks (default: the GPUs DataParallel used, 2 on a CPU)",
    )
    p.add_argument(
        "--max-steps",
        type=count(1),
        default=None,
        metavar="N",
        help="steps each trial runs (default: the end of RUN's profiled window + 10)",
    )
    p.add_argument(
        "--timeout",
        type=seconds(),
        default=None,
        metavar="SECONDS",
        help="stop a trial that runs longer (default: 4x RUN's duration, at least 180 s)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text (default), or json: the session's results.json on stdout",
    )
    p.add_argument(
        "--yes",
        action="store_true",
        help="run RUN's command (always shown first) even without the mark of your own `ddpdoctor trace` (a run "
        "directory someone handed you, or an edited one); otherwise try asks, or refuses when not at a terminal",
    )
    add_rule_selection(p)
    add_rule_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ddpdoctor import knobs
    from ddpdoctor import trial as trial_mod
    from ddpdoctor.pipeline import analyze_run, resolve_rules
    from ddpdoctor.trial import plan
    from ddpdoctor.trial.render import render

    if sum((bool(args.set), args.findings, args.as_ddp)) != 1:
        raise UsageError("give one of --set KNOB=VALUE (one trial), --findings (the rules' prescriptions) or --as-ddp")
    if args.nproc_per_node is not None and not args.as_ddp:
        raise UsageError("--nproc-per-node goes with --as-ddp")
    settings = knobs.parse_settings(args.set)
    cmd = plan.read_run(args.run)
    rules = resolve_rules(rule_options(args))
    analysis = analyze_run(cmd.run, rules=rules, traces_optional=True)
    findings = list(analysis.diagnosis.findings) if analysis.diagnosis is not None else []
    trial_cmd = None
    if args.as_ddp:
        trial_cmd = plan.as_ddp(cmd, analysis, args.nproc_per_node)
        prescribed = trial_mod.for_settings(rules, findings, {"dp.as_ddp": "true"})
        settings_list = [{"dp.as_ddp": "true"}]
    elif args.findings:
        prescribed = trial_mod.prescriptions(rules, findings, cmd.nproc_per_node)
        settings_list = list({plan.setting_label(p.settings): p.settings for p in prescribed}.values())
        if not settings_list:
            names = ", ".join(f.name for f in findings) or "none"
            print(f"ddpdoctor try: nothing to try: no rule of RUN's findings ({names}) prescribes a knob")
            return 0
    else:
        settings = plan.resolve(settings, cmd.nproc_per_node)
        prescribed = trial_mod.for_settings(rules, findings, settings)
        settings_list = [settings]
    max_steps = args.max_steps or cmd.default_max_steps()
    timeout_s = args.timeout or _default_timeout(cmd.manifest)
    _confirm(cmd, trial_cmd, yes=args.yes)
    folder = plan.new_session_dir(cmd.run)

    print(f"ddpdoctor try: every run goes to {folder} (<run>.log: what the job printed)", file=sys.stderr)

    def progress(text: str) -> None:
        print(f"ddpdoctor try: {text}", file=sys.stderr, flush=True)

    session = trial_mod.run_session(
        cmd,
        folder,
        settings_list,
        max_steps=max_steps,
        timeout_s=timeout_s,
        rules=rules,
        prescribed=prescribed,
        run_findings=findings,
        progress=progress,
        trial_cmd=trial_cmd,
    )
    if args.format == "json":
        import json

        json.dump(session.to_json(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        render(session, sys.stdout, findings_table=args.findings)
    return 0 if session.control.ok else 1


def _confirm(cmd: Any, trial_cmd: Any, *, yes: bool) -> None:
    """Show what will run, and where; run it without asking only when this user's own trace marked it.

    A run directory is data someone can hand you: its manifest can name any command and directory. A command
    without this user's mark (``ddpdoctor.capture.command_mark``) runs only after ``--yes`` or a "y" typed at
    the terminal; without a terminal it is refused (exit 2)."""
    from ddpdoctor.capture import command_mark
    from ddpdoctor.trial import plan

    for line in plan.describe(cmd, trial_cmd):
        print(f"ddpdoctor try: {line}" if not line.startswith(" ") else line, file=sys.stderr)
    why = command_mark.check(cmd.manifest)
    if why is None or yes:
        if why is not None:
            print(f"ddpdoctor try: run with --yes although {why}", file=sys.stderr)
        sys.stderr.flush()
        return
    where = cmd.run / "manifest.json"
    advice = "read the command above and run it only if you trust it"
    if not (sys.stdin is not None and sys.stdin.isatty()):
        raise UsageError(f"{where}: command not run: {why}; {advice} (--yes runs it)")
    print(f"ddpdoctor try: {why}: {advice}.", file=sys.stderr)
    print("Run it? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (OSError, KeyboardInterrupt):
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError(f"{where}: command not run (not confirmed)")


def _default_timeout(manifest: dict[str, Any]) -> float:
    started, finished = manifest.get("started_at"), manifest.get("finished_at")
    took = finished - started if isinstance(started, (int, float)) and isinstance(finished, (int, float)) else 0
    if not math.isfinite(took) or took < 0:
        took = 0
    return min(max(180.0, 4 * took), MAX_SECONDS)
