"""Terminal escape sequences in a user's rule file are shown escaped by ``ddpdoctor rules`` and
``ddpdoctor explain`` (issue 13, item 16): a rule file from a shared repository can neither recolour nor
retitle the terminal, nor rewrite lines already printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.cli import main
from ddpdoctor.diagnosis.rules import builtin_rules_dir

CSI, OSC, CR, BIDI = "\x1b[2J\x1b[31m", "\x1b]0;pwned\x07", "\r", "\u202e"
HOSTILE = f"{CSI}red{OSC}{CR}over{BIDI}txt"
_RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")


def _toml(text: str) -> str:
    """``text`` inside a TOML basic string: every character as a \\uXXXX escape."""
    return "".join(f"\\u{ord(c):04x}" for c in text)


@pytest.fixture
def rules_dir(tmp_path) -> Path:
    text = (Path(str(builtin_rules_dir())) / "dataloader-bound.toml").read_text()
    text = text.replace('id = "DDP', 'id = "USR', 1)  # a user rule beside the shipped one
    text = text.replace('name = "dataloader-bound"', 'name = "my-loader"', 1)
    for key in ("summary", "what_it_does", "fix"):
        text = re.sub(rf'(?m)^{key} = ("""|")', lambda m: m.group(0) + _toml(HOSTILE), text, count=1)
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "my-loader.toml").write_text(text)
    return folder


def test_rules_list_shows_escapes_escaped(rules_dir, capsys):
    assert main(["rules", "--rules-dir", str(rules_dir)]) == 0
    out = capsys.readouterr().out
    assert "my-loader" in out and not _RAW.search(out) and "\\x1b[2J" in out


def test_explain_shows_escapes_escaped_and_keeps_its_lines(rules_dir, capsys):
    assert main(["explain", "my-loader", "--rules-dir", str(rules_dir)]) == 0
    out = capsys.readouterr().out
    assert not _RAW.search(out), out
    assert "\\x1b]0;pwned\\x07" in out and "\\u202e" in out
    assert "## What it does\n" in out and "## How to fix it\n" in out  # still Markdown on several lines
