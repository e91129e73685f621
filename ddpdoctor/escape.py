"""One escaping function per output sink, for text ddpdoctor did not write itself (names from traces, paths,
fields of a baseline file, messages that quote them).

- ``terminal``: one line of text for a terminal or a CI log. Control characters (ANSI/OSC escapes, CR, LF,
  tab), Unicode line separators, bidirectional overrides and lone surrogates are shown as ``\\xNN`` /
  ``\\uNNNN``: a value can neither colour nor retitle the terminal, nor start a new log line (where a CI
  runner would read ``::error::`` or ``::add-mask::`` as a workflow command).
- ``terminal_text``: the same for text of several lines (rule documentation): LF and tab are kept.
- ``workflow_data`` / ``workflow_property``: the message and a property value of a GitHub Actions workflow
  command (``%``, CR, LF, and in properties ``:`` and ``,``, encoded as the runner decodes them).
- ``markdown`` / ``markdown_code``: inert Markdown text (markup and HTML escaped), and a code span whose fence
  is longer than any run of backticks in the value, so the value cannot close it.
- ``xml``: text and attribute values of XML (JUnit): ElementTree escapes ``&<>"``; the characters XML 1.0
  forbids are shown as in ``terminal``.
"""

from __future__ import annotations

import html
import re
from typing import Any

_INVISIBLE = r"\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"  # C1, separators, bidi
_UNSAFE = re.compile(rf"[\x00-\x1f{_INVISIBLE}]")
_UNSAFE_TEXT = re.compile(rf"[\x00-\x08\x0b-\x1f{_INVISIBLE}]")  # LF and tab kept
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def _show(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal(value: Any) -> str:
    """``value`` as one line of inert text (see the module docstring)."""
    return _UNSAFE.sub(_show, str(value))


def terminal_text(value: Any) -> str:
    """``value`` as inert text of one or more lines (see the module docstring)."""
    return _UNSAFE_TEXT.sub(_show, str(value))


def workflow_data(value: Any) -> str:
    """The message of a ``::error ...::MESSAGE`` workflow command."""
    return terminal(value).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def workflow_property(value: Any) -> str:
    """A property value (``title=VALUE``) of a workflow command."""
    return workflow_data(value).replace(":", "%3A").replace(",", "%2C")


def markdown(value: Any) -> str:
    """Inert Markdown text on one line: markup characters backslash-escaped, HTML entities escaped."""
    return html.escape(_MD_SPECIAL.sub(r"\\\1", terminal(value)), quote=False)


def markdown_code(value: Any) -> str:
    """A Markdown code span showing ``value`` literally (one line)."""
    text = terminal(value)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest or text.startswith(" ") or text.endswith(" ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def xml(value: Any) -> str:
    """Text or an attribute value of an XML element built with ElementTree."""
    return terminal(value)
