"""The schema of a rule file (``rules/*.toml``; the keys are in ``ddpdoctor.diagnosis.rules``'s docstring) as
msgspec types, and its errors said in a rule file's words with did-you-mean suggestions. What a schema cannot say
(ids and names, expressions, docs that describe every param) is checked in ``ddpdoctor.diagnosis.rules``."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from ddpdoctor.diagnosis.findings import SEVERITIES

APPLIES_TO = ("dp", "ddp", "any")
# What ddpdoctor.metrics.parallelism detects; a run's parallelism is one of these or several joined by "+".
PARALLELISMS = ("dp", "ddp", "fsdp", "tp", "pipeline", "unknown", "none", "single")
SCOPES = ("run", "rank")


class DocsFile(msgspec.Struct, forbid_unknown_fields=True):
    what_it_does: str
    why_is_this_bad: str
    example: str
    fix: str
    references: list[str]
    options: dict[str, str] = {}


class ClauseFile(msgspec.Struct, forbid_unknown_fields=True):
    when: str
    message: str
    recommendation: str | None = None  # replaces the rule's recommendation when `when` holds (the last such)


class PassedFile(msgspec.Struct, forbid_unknown_fields=True):
    message: str
    when: str | None = None


class PrescriptionFile(msgspec.Struct, forbid_unknown_fields=True):
    knob: str
    values: list[bool | int | float | str]


class RuleFile(msgspec.Struct, forbid_unknown_fields=True):
    """The schema of a rule file (module docstring); what it cannot say is checked in ``_build``."""

    id: str
    name: str
    severity: Literal[SEVERITIES]  # type: ignore[valid-type]
    applies_to: Literal[APPLIES_TO]  # type: ignore[valid-type]
    scope: Literal[SCOPES]  # type: ignore[valid-type]
    summary: str
    when: str
    message: str
    recommendation: str
    docs: DocsFile
    backends: list[str] = []
    ranks_where: str | None = None
    estimated_gain_ms: str | None = None
    clauses: list[ClauseFile] = []
    params: dict[str, bool | int | float] = {}
    parallelism: list[Literal[PARALLELISMS]] | None = None  # type: ignore[valid-type]
    requires: list[str] | None = None
    prescriptions: list[PrescriptionFile] = []
    passed: str | list[PassedFile] | None = None
    undecided: str | None = None


_SECTION = {"$": "", "$.docs": "[docs]", "$.docs.options": "[docs.options]", "$.params": "[params]"}
_FIELDS = {"": RuleFile, "[docs]": DocsFile}
_CHOICES = {"severity": SEVERITIES, "applies_to": APPLIES_TO, "scope": SCOPES, "parallelism": PARALLELISMS}


def schema_message(exc: msgspec.ValidationError) -> str:
    """msgspec's message in the words of a rule file: ``missing [docs] fix``, ``unknown key(s) whne; did you
    mean when?``, ``severity must be one of info, warning, error, not 'fatal'``."""
    text = str(exc)
    where = text.rsplit(" - at `", 1)[1].rstrip("`") if " - at `" in text else "$"
    what = text.split(" - at `", 1)[0]
    section = _SECTION.get(re.sub(r"\[\d+\]$", "", where), "")
    key = where.rsplit(".", 1)[-1] if where != "$" else ""
    label = re.sub(r"\$\.?", "", where).replace(".", " ") or "the rule file"
    if match := re.match(r"Object missing required field `(.+)`", what):
        return f"missing {(section + ' ') if section else ''}{match.group(1)}"
    if match := re.match(r"Object contains unknown field `(.+)`", what):
        field = match.group(1)
        allowed = list(msgspec.structs.fields(_FIELDS.get(section, ClauseFile)))
        names = [f.name for f in allowed]
        import difflib  # only for an error message

        close = difflib.get_close_matches(field, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        kind = "key(s)" if not section else f"{section} section(s)" if section == "[docs]" else "key(s)"
        place = "" if kind.startswith("[") or not section else f" in {section}"
        return f"unknown {kind} {field}{place}{hint} (allowed: {', '.join(names)})"
    if match := re.match(r"Invalid enum value (.+)", what):
        choices = _CHOICES.get(re.sub(r"\[\d+\]$", "", key), ())
        return f"{label} must be one of {', '.join(choices)}, not {match.group(1)}"
    if where == "$" and what.startswith("Expected `object`"):
        return "a rule file is a TOML table of keys"
    return f"{label}: {what[0].lower()}{what[1:]}".replace("`", "")
