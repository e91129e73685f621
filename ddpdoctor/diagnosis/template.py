"""Message templates of rule files: text with ``{expression:format}`` fields, checked when a rule loads, and
the number formatting of those fields."""

from __future__ import annotations

import re
import string
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.diagnosis.expr import TEMPLATE_SPECIALS, Expr, ExprError, Scope, Values, compile_expr, evaluate

_SPEC_RE = re.compile(r"^[<>^]?[+ -]?\d{0,2},?(\.\d{1,2})?[defg%]?$")


@dataclass(frozen=True)
class Template:
    """A message with ``{expression:format}`` fields.

    ``{ranks}`` is the list of ranks the finding is about; ``{worst}`` names the rank whose numbers a per-rank
    rule shows when several ranks fire (empty otherwise).
    """

    source: str
    parts: tuple[tuple[str, Expr | None, str], ...] = field(repr=False, compare=False)

    @property
    def metrics(self) -> frozenset[str]:
        return frozenset().union(*(e.metrics for _, e, _ in self.parts if e is not None))

    def render(self, values: Values, specials: Mapping[str, str]) -> str:
        out = []
        for literal, expr, spec in self.parts:
            out.append(literal)
            if expr is None:
                out.append(specials.get(spec, ""))
                continue
            out.append(format_value(evaluate(expr, values), spec))
        return "".join(out)


def compile_template(source: str, *, scope: Scope, params: Collection[str] = ()) -> Template:
    """Check a message template; every field must be an allowed expression with a plain number format."""
    parts: list[tuple[str, Expr | None, str]] = []
    try:
        parsed = list(string.Formatter().parse(source))
    except ValueError as exc:
        raise ExprError(f"bad template: {exc} (write {{{{ and }}}} for literal braces)") from None
    for literal, field_name, spec, conversion in parsed:
        if field_name is None:
            parts.append((literal, None, ""))
            continue
        if conversion:
            raise ExprError(f"!{conversion} conversions are not allowed in templates ({field_name!r})")
        if field_name.strip() in TEMPLATE_SPECIALS:
            parts.append((literal, None, field_name.strip()))
            continue
        if spec and not _SPEC_RE.match(spec):
            raise ExprError(f"format spec {spec!r} is not allowed (use e.g. .1f, .0%, ,.0f)")
        if not field_name.strip():
            raise ExprError("empty {} field in template")
        # a text metric is shown as it is (``{health_summary}``), never computed with
        parts.append((literal, compile_expr(field_name, scope=scope, params=params, text=not spec), spec or ""))
    return Template(source, tuple(parts))


def format_value(value: Any, spec: str = "") -> str:
    """Format a number for a message: ``n/a`` when unknown, ``spec`` when given, else ~3 significant digits"""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if spec:
        try:
            return format(value, spec)
        except (ValueError, TypeError):
            try:
                return format(float(value), spec.rstrip("d") or "g")
            except (ValueError, TypeError):
                return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)
