"""TOML for ddpdoctor's data files: the rules, the metric catalog, ``[tool.ddpdoctor]`` and gate configs.

Parsed with rtoml (Rust) where it is installed, else with the standard library's tomllib (pure Python): on the files
a cold ``diagnose`` reads (the rules and the catalog, 32 files when measured) rtoml took ~3 ms where tomllib took
30-90 ms, most of what reading the rules cost a cold start. Both read TOML 1.0 to the same values (a test compares
them on every shipped file). Errors always carry tomllib's message (line and column): text that rtoml refuses is
parsed again by tomllib, which either says why in its words or, where the two differ on an edge of the format, reads
it.
"""

from __future__ import annotations

import sys
from typing import Any


class TOMLError(ValueError):
    """Text that is not valid TOML (or not UTF-8); the message says where, as tomllib words it."""


def loads(text: str) -> dict[str, Any]:
    """The document ``text`` as a dict; ``TOMLError`` when it is not valid TOML."""
    try:
        import rtoml
    except ImportError:
        rtoml = None
    if rtoml is not None:
        try:
            return dict(rtoml.loads(text))
        except Exception:  # rtoml.TomlParsingError (and anything else): tomllib decides, and words the error
            pass
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TOMLError(str(exc)) from None


def load_bytes(raw: bytes) -> dict[str, Any]:
    """A file's bytes as a TOML document (UTF-8, as TOML requires); ``TOMLError`` for text that is not UTF-8."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TOMLError(str(exc)) from None
    return loads(text)
