"""The README and `--help` agree (issue 19, point 6): every option a command's `--help` lists is in that command's
part of the README, the options tables list only real options, and the defaults agree."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from ddpdoctor.cli import COMMANDS, build_parser, trace_args, trace_cmd

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _sections() -> dict[str, str]:
    """README text by `## ` heading."""
    parts = re.split(r"^## ", README, flags=re.M)
    return {part.splitlines()[0]: part for part in parts[1:]}


def _section_of(command: str) -> str:
    """The README section about ``ddpdoctor COMMAND`` (the whole README for commands without their own heading)."""
    found = [text for heading, text in _sections().items() if f"`ddpdoctor {command}`" in heading]
    return "\n".join(found) or README


def _parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parsers = dict(sub.choices)
    parsers["trace"] = trace_args._own_parser()  # trace parses its own argv; this is what `trace --help` prints
    return parsers


def _long_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def _table_rows(section: str) -> dict[str, list[str]]:
    """Options tables: each `--option` named in a row's first cell -> the row's other cells."""
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `--") or line.startswith("| `-"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            for option in re.findall(r"(--[a-z][a-z0-9-]*)", cells[0]):
                rows[option] = cells[1:]
    return rows


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_in_help_is_in_the_readme(command):
    section = _section_of(command)
    missing = [o for o in _long_options(_parsers()[command]) if not re.search(re.escape(o) + r"\b", section)]
    assert not missing, f"`ddpdoctor {command} --help` has options its README section does not mention: {missing}"


@pytest.mark.parametrize("command", ["trace", "diagnose"])
def test_options_tables_match_help(command):
    rows = _table_rows(_section_of(command))
    options = _long_options(_parsers()[command])
    assert set(rows) == set(options), (sorted(set(rows) - set(options)), sorted(set(options) - set(rows)))


def _default_text(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_trace_defaults_agree_between_help_and_readme():
    rows = _table_rows(_section_of("trace"))
    for option, action in _long_options(_parsers()["trace"]).items():
        if action.default in (None, False, []) or option == "--out":
            continue  # off, or a default that is a description (ddpdoctor-runs/<script>-<time>)
        default = _default_text(action.default)
        assert f"default {default}" in (action.help or "") or f"{default}:" in (action.help or ""), (
            f"`trace --help` does not give {option}'s default {default}: {action.help!r}"
        )
        assert rows[option][0] == default, f"README says {option} defaults to {rows[option][0]}, --help {default}"


def test_trace_help_lines_are_readable(capsys):
    assert trace_cmd.main(["--help"]) == 0
    out = capsys.readouterr().out
    long = [line for line in out.splitlines() if len(line) > 120]
    assert not long, long
    assert "--nproc-per-node" in out


def _code_lines(text: str) -> list[str]:
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    return [line.strip() for block in blocks for line in block.splitlines()]


@pytest.mark.parametrize("doc", ["README.md", "docs/ci.md"])
def test_install_lines_work_outside_this_machine(doc):
    """ddpdoctor is not on PyPI, and PyPI's torch is the CUDA build (issue 19, point 1)."""
    lines = [
        line for line in _code_lines((Path(__file__).resolve().parents[2] / doc).read_text()) if "pip install" in line
    ]
    assert lines
    for line in lines:
        assert not re.search(r"pip install (-\S+ )*ddpdoctor\b(?! @)", line), f"ddpdoctor is not on PyPI: {line}"
        command = line.split("#")[0]
        if re.search(r"pip install (-\S+ )*torch\b", command) and "CPU" in line.upper():
            assert "--index-url https://download.pytorch.org/whl/cpu" in command, line
