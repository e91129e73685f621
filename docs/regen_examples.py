"""Rewrite the example outputs in README.md with what the current ddpdoctor prints (``make examples``).

Each example is a fenced block right after a marker line naming its command:

    <!-- example: ddpdoctor diagnose samples/recorded/ddp_straggler -->
    <!-- example, timed: ddpdoctor trace --out runs/sample --standalone --nproc-per-node 2 samples/ddp_train.py -->

The command runs in a fresh temporary folder that holds a link to ``samples/`` (so paths read as in the README),
with ``COLUMNS=100``; the block becomes ``$ COMMAND`` and the command's stdout and stderr as a terminal shows them,
trailing spaces removed. Several commands joined by `` && `` run one after the other in the same folder (a trace,
then a command that reads it), each shown with its output. "timed" examples print times and file names that
change from run to run; tests/unit/test_readme_examples.py checks the other ones equal the current output, and
that every example is marked.

    python docs/regen_examples.py            # rewrite every example (about a minute: one traced 2-rank run)
    python docs/regen_examples.py --check    # exit 1 when an untimed example differs, rewrite nothing
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKER = re.compile(r"^<!-- example(?P<timed>, timed)?: (?P<command>.+?) -->\n```\n(?P<body>.*?)```\n", re.M | re.S)
WIDTH = "100"


def run_example(command: str, timeout: float = 600) -> str:
    """The output of ``command`` (``ddpdoctor ...`` lines joined by `` && ``) as the README shows it: each
    ``$ command`` followed by what it printed."""
    steps = [shlex.split(part) for part in command.split(" && ")]
    for argv in steps:
        if argv[0] != "ddpdoctor":
            raise ValueError(f"an example runs ddpdoctor, not {argv[0]!r}")
    env = {**os.environ, "COLUMNS": WIDTH, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "TERM": "dumb"}
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-example-") as tmp:
        (Path(tmp) / "samples").symlink_to(REPO / "samples")
        for part, argv in zip(command.split(" && "), steps, strict=True):
            proc = subprocess.run(
                [sys.executable, "-m", "ddpdoctor", *argv[1:]],
                cwd=tmp,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,  # one stream, in the order a terminal shows them
                text=True,
                timeout=timeout,
            )
            lines += [f"$ {part}", *(line.rstrip() for line in proc.stdout.rstrip("\n").splitlines())]
    return "\n".join(lines) + "\n"


def examples(text: str) -> list[re.Match[str]]:
    return list(MARKER.finditer(text))


def regenerate(text: str, *, include_timed: bool = True, only: str | None = None) -> str:
    out, last = [], 0
    for match in examples(text):
        if (match["timed"] and not include_timed) or (only is not None and only not in match["command"]):
            continue
        print(f"running: {match['command']}", file=sys.stderr, flush=True)
        out.append(text[last : match.start("body")])
        out.append(run_example(match["command"]))
        last = match.end("body")
    out.append(text[last:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rewrite README.md's marked example outputs with real output.")
    parser.add_argument("--check", action="store_true", help="compare the untimed examples; rewrite nothing")
    parser.add_argument("--only", metavar="TEXT", help="rewrite only the examples whose command contains TEXT")
    args = parser.parse_args(argv)
    text = README.read_text()
    if not examples(text):
        print("README.md has no <!-- example: ... --> markers", file=sys.stderr)
        return 2
    if args.check:
        stale = [m["command"] for m in examples(text) if not m["timed"] and run_example(m["command"]) != m["body"]]
        for command in stale:
            print(f"README example out of date: {command}  (run: python docs/regen_examples.py)", file=sys.stderr)
        return 1 if stale else 0
    new = regenerate(text, only=args.only)
    if new != text:
        README.write_text(new)
        print("README.md: examples rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
