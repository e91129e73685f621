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


_LISTED_RANKS = 8  # per-rank evidence of up to this many ranks is listed rank by rank
_VALUE_GROUPS = 3  # else, up to this many distinct values are each shown with their ranks


def evidence_value(value: Any) -> str:
    """One evidence value: a number, or per-rank numbers ``r0=1.2, r1=3.4``. Of more than 8 ranks: each value with
    its ranks (``1 on ranks 0-16383``) where they take 3 values or fewer, else the range with the ranks that hold
    its ends (``9.8 (r3) to 64.1 (r1021) over 4,096 ranks``): a report of 131,072 ranks lists no rank by rank
    (the JSON report keeps every value)."""
    if isinstance(value, dict):
        if len(value) <= _LISTED_RANKS:
            return ", ".join(f"r{k}={evidence_value(v)}" for k, v in value.items())
        return _many_ranks(value)
    value = clean_value(value)
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e5 else f"{value:.4g}"
    return plain(value)


def _many_ranks(by_rank: dict[Any, Any]) -> str:
    try:  # evidence is keyed by str(rank), as JSON keeps it
        values = {int(k): v for k, v in by_rank.items()}
    except (TypeError, ValueError):
        return ", ".join(f"{plain(k)}={evidence_value(v)}" for k, v in by_rank.items())
    groups = _by_text(values)
    if len(groups) <= _VALUE_GROUPS:
        return _groups_text(groups)
    numbers = {k: float(v) for k, v in values.items() if _finite_number(v)}
    if not numbers:
        shown = dict(sorted(groups.items(), key=lambda g: -len(g[1]))[:_VALUE_GROUPS])
        return _groups_text(shown) + f"; {len(groups) - len(shown)} more values"
    low, high = min(numbers, key=numbers.__getitem__), max(numbers, key=numbers.__getitem__)
    ends = f"{evidence_value(values[low])} (r{low}) to {evidence_value(values[high])} (r{high})"
    text = f"{ends} over {len(numbers):,} ranks"
    rest = _by_text({k: v for k, v in values.items() if k not in numbers})  # n/a, true/false, text
    if len(rest) > _VALUE_GROUPS:
        return text + f"; {len(values) - len(numbers):,} ranks with other values"
    return "; ".join(filter(None, (text, _groups_text(rest))))


def _by_text(values: dict[Any, Any]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for rank, v in values.items():
        groups.setdefault(evidence_value(v), []).append(rank)
    return groups


def _groups_text(groups: dict[str, list[Any]]) -> str:
    from ddpdoctor.diagnosis.findings import format_ranks

    return "; ".join(f"{t} on {format_ranks(ranks)}" for t, ranks in sorted(groups.items(), key=lambda g: -len(g[1])))


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < float("inf")


def steps_analysed(n: Any) -> str:
    """The header's "N steps analysed" ("1 step", "? steps" when unknown)."""
    return f"{n if n is not None else '?'} step{'' if n == 1 else 's'} analysed"
