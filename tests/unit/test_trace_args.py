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


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--hang-timeout", "nan"),
        ("--hang-timeout", "inf"),
        ("--hang-timeout", "-1"),
        ("--hang-timeout", "1e300"),
        ("--no-step-limit", "nan"),
        ("--no-step-limit", "inf"),
        ("--no-step-limit", "0"),
        ("--wait", "-1"),
        ("--wait", "9" * 30),
        ("--warmup", "99999999999999999999"),
        ("--active", "0"),
        ("--repeat", "1e3"),
        ("--max-steps", "0"),
        ("--max-steps", "9" * 40),
    ],
)
def test_a_number_out_of_range_is_one_line_naming_the_option(option: str, value: str) -> None:
    """nan compares false with everything: `--hang-timeout nan` was accepted and ended a healthy job at once."""
    with pytest.raises(UsageError) as raised:
        trace_args._parse_own([option, value])
    message = str(raised.value)
    assert option in message and "\n" not in message, message


def test_numbers_in_range_are_accepted() -> None:
    args = trace_args._parse_own(["--hang-timeout", "2.5", "--no-step-limit", "30", "--wait", "0", "--max-steps", "7"])
    assert (args.hang_timeout, args.no_step_limit, args.wait, args.max_steps) == (2.5, 30.0, 0, 7)


def test_trace_refuses_nan_hang_timeout_before_running_anything(tmp_path) -> None:
    from helpers import run_cli

    marker = tmp_path / "ran"
    result = run_cli(
        "trace", "--out", str(tmp_path / "run"), "--hang-timeout", "nan", "--", "touch", str(marker), timeout=60
    )
    assert result.returncode == 2 and not marker.exists(), result.stderr
    assert result.stderr.strip().count("\n") == 0 and "--hang-timeout" in result.stderr, result.stderr


def test_the_help_states_the_window_the_banner_prints_for_the_defaults() -> None:
    parser = trace_args._own_parser()
    defaults = parser.parse_args([])
    first = defaults.wait + defaults.warmup + 1  # what `trace` prints as "profiling steps FIRST-LAST"
    last = first + defaults.active - 1
    wait_help = next(a.help for a in parser._actions if "--wait" in a.option_strings)
    assert f"{first}-{last} with the defaults" in wait_help.replace("\n", " ")
