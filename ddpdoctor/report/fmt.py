"""Number and text formatting shared by the renderers (no I/O)."""

from __future__ import annotations

import re
from typing import Any

from ddpdoctor.values import clean_value

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def plain(value: Any) -> str:
    """Text from a trace made safe for a terminal: control characters (ANSI escapes...) shown as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def md(value: Any) -> str:
    """Text made inert in Markdown: markup characters backslash-escaped, HTML entities escaped, one line."""
    import html  # not at start-up: the text report does not need it

    text = plain(value).replace("\r", " ").replace("\n", " ")
    return html.escape(_MD_SPECIAL.sub(r"\\\1", text), quote=False)


def esc(value: Any) -> str:
    """Text made inert in HTML (content and attribute values)."""
    import html

    return html.escape(plain(value), quote=True)


def esc_code(value: Any) -> str:
    """``value`` escaped for HTML, with the `code spans` that rule messages, reasons and report lines use shown as
    ``<code>``."""
    return _CODE_SPAN.sub(r"<code>\1</code>", esc(value))


def ms(value: Any, digits: int = 1) -> str:
    value = clean_value(value)
    return "—" if value is None else f"{float(value):,.{digits}f}"


def ratio_pct(value: Any) -> str:
    value = clean_value(value)
    return "—" if value is None else f"{100 * float(value):.0f}%"


def size(value: Any) -> str:
    """Bytes as GiB/MiB/KiB with 3 significant digits."""
    value = clean_value(value)
    if value is None:
        return "—"
    value = float(value)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def gain(value: float | None) -> str:
    return "—" if value is None else f"~{value:,.1f} ms/step"


def evidence_value(value: Any) -> str:
    """One evidence value: a number, or per-rank numbers ``r0=1.2, r1=3.4``."""
    if isinstance(value, dict):
        return ", ".join(f"r{k}={evidence_value(v)}" for k, v in value.items())
    value = clean_value(value)
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e5 else f"{value:.4g}"
    return plain(value)
