"""ddpdoctor.tomlfile: rtoml where installed, with tomllib's values and tomllib's error messages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomllib

from ddpdoctor import tomlfile

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "rules").glob("*.toml")) + [
    REPO / "ddpdoctor" / "metrics" / "catalog.toml",
    REPO / "pyproject.toml",
]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_file_reads_as_tomllib_reads_it(path):
    text = path.read_text(encoding="utf-8")
    assert tomlfile.loads(text) == tomllib.loads(text)


def test_rtoml_is_what_parses_when_installed(monkeypatch):
    rtoml = pytest.importorskip("rtoml")
    calls = []
    monkeypatch.setattr(rtoml, "loads", lambda text: calls.append(text) or {"a": 1})
    assert tomlfile.loads("a = 2") == {"a": 1} and calls == ["a = 2"]


@pytest.mark.parametrize("use_rtoml", [True, False])
@pytest.mark.parametrize(
    "text",
    ['a = "unterminated\n', "a = 1\na = 2\n", "[t]\nx = 1\n[t]\n", "a = 0x\n", "= 3\n", 'a = """\n'],
)
def test_errors_carry_tomllibs_message_with_or_without_rtoml(monkeypatch, text, use_rtoml):
    if not use_rtoml:
        monkeypatch.setitem(sys.modules, "rtoml", None)  # import fails: the standard library alone
    with pytest.raises(tomllib.TOMLDecodeError) as expected:
        tomllib.loads(text)
    with pytest.raises(tomlfile.TOMLError) as got:
        tomlfile.loads(text)
    assert str(got.value) == str(expected.value)


def test_bytes_that_are_not_utf8_are_a_toml_error():
    with pytest.raises(tomlfile.TOMLError, match="utf-8"):
        tomlfile.load_bytes(b'a = "\xff"\n')
    assert tomlfile.load_bytes('a = "é"\n'.encode()) == {"a": "é"}
