"""``ddpdoctor rules`` (list the rules) and ``ddpdoctor explain NAME`` (one rule's documentation)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ddpdoctor import escape
from ddpdoctor.cli.diagnose_cmd import add_rule_options, rule_options
from ddpdoctor.diagnosis.applies import applies_summary
from ddpdoctor.pipeline import resolve_rules


def register(subparsers: Any, name: str, help_text: str) -> None:
    p = subparsers.add_parser(name, help=help_text, description=help_text)
    if name == "explain":
        p.add_argument("rule", metavar="NAME", help="rule name or id, e.g. poor-comm-compute-overlap or DDP002")
        p.set_defaults(func=run_explain)
    else:
        p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
        p.set_defaults(func=run_list)
    add_rule_options(p)


def _rules(args: argparse.Namespace) -> Any:
    return resolve_rules(rule_options(args))


def run_list(args: argparse.Namespace) -> int:
    rules = _rules(args)
    if args.format == "json":
        rows = [
            {
                "id": r.id,
                "name": r.name,
                "severity": r.severity,
                "applies_to": r.applies_to,
                "applies": applies_summary(r),
                "parallelism": list(r.parallelism),
                "requires": list(r.requires),
                "scope": r.scope,
                "summary": r.summary,
                "params": r.params,
                "path": r.path,
            }
            for r in rules
        ]
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from ddpdoctor.report.console import console as make_console

    table = Table(box=box.SIMPLE_HEAD)
    for col in ("id", "name", "severity", "applies to", "summary"):
        table.add_column(col, overflow="fold")
    for r in rules:
        table.add_row(*(Text(escape.terminal(v)) for v in (r.id, r.name, r.severity, applies_summary(r), r.summary)))
    console = make_console(sys.stdout, 140)
    console.print(table)
    console.print(Text("`ddpdoctor explain NAME` shows a rule's documentation and options."))
    return 0


def run_explain(args: argparse.Namespace) -> int:
    from ddpdoctor.diagnosis.rules import find_rule
    from ddpdoctor.report.rule_docs import rule_markdown

    # a user's rule file may hold escape sequences: shown escaped, whether stdout is a terminal or a file
    sys.stdout.write(escape.terminal_text(rule_markdown(find_rule(_rules(args), args.rule))))
    return 0


# `ddpdoctor.cli` calls args.func(args); `run` is the conventional name for the listing command.
run = run_list
