"""``ddpdoctor trace`` splits its command line without importing torch (the launcher's start-up is part of every
traced run's time), from a table of torchrun's options that must match the installed torchrun's own parser."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpdoctor.cli import trace_args
from ddpdoctor.errors import UsageError


def test_table_matches_torchrun_parser() -> None:
    real = trace_args._torchrun_options()
    assert trace_args.TORCHRUN_KNOWN == real


def test_split_without_importing_torch() -> None:
    code = (
        "import sys; from ddpdoctor.cli.trace_args import split_argv; "
        "r = split_argv(['--out', 'o', '--standalone', '--nproc-per-node', '2', '--rdzv_conf=x', 'train.py', '-q']); "
        "print(r); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0] == str(
        (["--out", "o"], ["--standalone", "--nproc-per-node", "2", "--rdzv_conf=x"], ["train.py", "-q"], None)
    )
    assert lines[1] == "False"


def test_option_missing_from_table_asks_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer torchrun's option (not in the table) is looked up in the installed torchrun's parser."""
    monkeypatch.setattr(trace_args, "TORCHRUN_KNOWN", {"--standalone": False})
    own, tr, target, command = trace_args.split_argv(["--nnodes", "1", "--standalone", "t.py"])
    assert (own, tr, target, command) == ([], ["--nnodes", "1", "--standalone"], ["t.py"], None)
    with pytest.raises(UsageError, match="unknown option '--no-such-option'"):
        trace_args.split_argv(["--no-such-option", "t.py"])
