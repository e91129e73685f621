"""Rule files: one TOML file per rule, ``<name>.toml``, in the built-in ``rules/`` folder or a --rules-dir.

Keys (required unless marked optional)::

    id = "DDP002"                     # unique, letters then digits
    name = "poor-comm-compute-overlap"  # unique slug; also the file name and the config key
    severity = "warning"              # info | warning | error
    applies_to = "ddp"                # dp | ddp | any (run mode; "single" runs only get "any" rules)
    scope = "run"                     # run: one decision for the job; rank: decided per rank
    backends = ["nccl"]               # optional: only runs with one of these backends
    parallelism = ["ddp", "unknown"]  # optional: the detected parallelism every part of which the rule fits
                                      # (dp ddp fsdp tp pipeline unknown none single; default from applies_to)
    requires = ["busbw_gbps"]         # optional: metrics that must be measured for a verdict (default: every
                                      # metric `when` reads); otherwise the rule is "not evaluated", never passed
    summary = "one line for `ddpdoctor rules`"
    when = "mean(overlap_ratio) < params.min_overlap and ..."   # see ddpdoctor.diagnosis.expr
    ranks_where = "rank == straggler_rank"   # optional (run scope): which ranks the finding names
    estimated_gain_ms = "mean(exposed_comm_ms)"  # optional: ms per step a fix could save
    message = "{mean(exposed_comm_ms):.1f} ms ... on {ranks}"   # template filled with the numbers
    recommendation = "..."            # template too
    [[clauses]]                       # optional: sentences appended to the message when their `when` holds
    when = "..."
    message = "..."
    [params]                          # thresholds; overridable in [tool.ddpdoctor.rules.<name>]
    min_overlap = 0.5
    [docs]                            # what a user reads in `ddpdoctor explain NAME` (ruff's rule docs)
    what_it_does, why_is_this_bad, example, fix, references = [...], [docs.options] one line per param
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ddpdoctor.diagnosis.expr import Expr, ExprError, Scope, compile_expr
from ddpdoctor.diagnosis.findings import SEVERITIES
from ddpdoctor.diagnosis.template import Template, compile_template
from ddpdoctor.errors import DDPDoctorError
from ddpdoctor.metrics import catalog

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

APPLIES_TO = ("dp", "ddp", "any")
# What ddpdoctor.metrics.parallelism detects; a run's parallelism is one of these or several joined by "+".
PARALLELISMS = ("dp", "ddp", "fsdp", "tp", "pipeline", "unknown", "none", "single")
_DEFAULT_PARALLELISM = {
    "dp": ("dp",),
    "ddp": ("ddp", "unknown"),
    "any": PARALLELISMS,
}
SCOPES = ("run", "rank")
DOC_SECTIONS = ("what_it_does", "why_is_this_bad", "example", "fix", "references")
_REQUIRED = (
    "id",
    "name",
    "severity",
    "applies_to",
    "scope",
    "summary",
    "when",
    "message",
    "recommendation",
    "docs",
)
_OPTIONAL = ("backends", "ranks_where", "estimated_gain_ms", "clauses", "params", "parallelism", "requires")
_ID_RE = re.compile(r"^[A-Z]{2,}[0-9]{3,}$")
_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class RuleError(DDPDoctorError):
    """A rule file (or a rule override) that cannot be used; the message starts with the file."""


class _Resource(Protocol):  # pathlib.Path or an importlib.resources Traversable
    name: str

    def read_bytes(self) -> bytes: ...

    def iterdir(self) -> Iterable[_Resource]: ...

    def is_file(self) -> bool: ...


@dataclass(frozen=True)
class RuleDocs:
    what_it_does: str
    why_is_this_bad: str
    example: str
    fix: str
    references: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)  # param -> what it controls


@dataclass(frozen=True)
class Clause:
    when: Expr
    message: Template


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: str
    applies_to: str
    scope: Scope
    summary: str
    when: Expr
    message: Template
    recommendation: Template
    docs: RuleDocs
    path: str
    params: dict[str, float | int | bool] = field(default_factory=dict)
    params_source: dict[str, str] = field(default_factory=dict)  # param -> "default" or the config file
    estimated_gain: Expr | None = None
    ranks_where: Expr | None = None
    clauses: tuple[Clause, ...] = ()
    backends: tuple[str, ...] = ()
    parallelism: tuple[str, ...] = PARALLELISMS
    requires: tuple[str, ...] = ()

    @property
    def metrics(self) -> frozenset[str]:
        """Every metric name the rule reads (condition, gain, message, clauses)."""
        exprs = [self.when, self.estimated_gain, self.ranks_where, *(c.when for c in self.clauses)]
        names = set().union(*(e.metrics for e in exprs if e is not None))
        names |= self.message.metrics | self.recommendation.metrics
        for clause in self.clauses:
            names |= clause.message.metrics
        return frozenset(names)

    def with_params(self, overrides: Mapping[str, Any], source: str) -> Rule:
        """A copy with ``overrides`` applied (unknown names, wrong types: ``RuleError`` naming ``source``)."""
        params = dict(self.params)
        origin = dict(self.params_source)
        for key, value in overrides.items():
            if key not in params:
                known = ", ".join(sorted(params)) or "none"
                raise RuleError(f"{source}: rule {self.name} has no parameter {key!r} (its params: {known})")
            if not _same_kind(params[key], value):
                kind = "true/false" if isinstance(params[key], bool) else "a number"
                kind = "a finite number" if isinstance(value, float) and not math.isfinite(value) else kind
                raise RuleError(f"{source}: {self.name}.{key} must be {kind}, got {value!r}")
            params[key] = value
            origin[key] = source
        return dataclasses.replace(self, params=params, params_source=origin)


def _same_kind(default: Any, value: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    # NaN fails every comparison, so a NaN threshold would switch its rule off without a word
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------------------------------- loading
def builtin_rules_dir() -> _Resource:
    """The shipped rules: package data ``ddpdoctor._builtin_rules`` (the repo's ``rules/`` mapped into the
    wheel), or the repo's ``rules/`` folder in a source checkout that is not installed."""
    try:
        found = importlib.resources.files("ddpdoctor._builtin_rules")
        if any(p.name.endswith(".toml") for p in found.iterdir()):
            return found
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "rules"


def load_rule_file(path: _Resource | str | Path) -> Rule:
    """Load and check one rule file; any problem is a ``RuleError`` starting with the file."""
    res: Any = Path(path) if isinstance(path, (str, Path)) else path
    where = str(res)
    try:
        data = tomllib.loads(res.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise RuleError(f"{where}: cannot read rule file: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RuleError(f"{where}: not valid TOML: {exc}") from None
    try:
        return _build(data, res.name, where)
    except ExprError as exc:
        raise RuleError(f"{where}: {exc}") from None
    except _Bad as exc:
        raise RuleError(f"{where}: {exc}") from None


class _Bad(ValueError):
    pass


def _text(data: Mapping[str, Any], key: str, section: str = "") -> str:
    value = data.get(key)
    label = f"[{section}] {key}" if section else key
    if value is None:
        raise _Bad(f"missing {label}")
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"{label} must be a non-empty string")
    return value.strip()


def _build(data: Mapping[str, Any], filename: str, where: str) -> Rule:
    for key in _REQUIRED:
        if key not in data:
            raise _Bad(f"missing {key}")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise _Bad(f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(_REQUIRED + _OPTIONAL)})")
    rule_id, name = _text(data, "id"), _text(data, "name")
    if not _ID_RE.match(rule_id):
        raise _Bad(f"id {rule_id!r} must be capital letters then digits, e.g. DDP012")
    if not _NAME_RE.match(name):
        raise _Bad(f"name {name!r} must be a lowercase slug, e.g. poor-comm-compute-overlap")
    if filename != f"{name}.toml":
        raise _Bad(f"the file of rule {name} must be named {name}.toml")
    severity, applies_to, scope = _text(data, "severity"), _text(data, "applies_to"), _text(data, "scope")
    for key, value, allowed in (
        ("severity", severity, SEVERITIES),
        ("applies_to", applies_to, APPLIES_TO),
        ("scope", scope, SCOPES),
    ):
        if value not in allowed:
            raise _Bad(f"{key} must be one of {', '.join(allowed)}, not {value!r}")
    params = data.get("params", {})
    if not isinstance(params, dict) or not all(_same_kind(v, v) and not isinstance(v, dict) for v in params.values()):
        raise _Bad("[params] must map names to finite numbers or true/false")
    backends = data.get("backends", [])
    if not isinstance(backends, list) or not all(isinstance(b, str) for b in backends):
        raise _Bad('backends must be a list of strings, e.g. ["nccl"]')
    parallelism = data.get("parallelism", list(_DEFAULT_PARALLELISM[applies_to]))
    if not isinstance(parallelism, list) or not parallelism or not all(p in PARALLELISMS for p in parallelism):
        raise _Bad(f"parallelism must be a non-empty list of {', '.join(PARALLELISMS)}")
    s: Scope = scope  # type: ignore[assignment]

    def expr(key: str, text: str, expr_scope: Scope = s) -> Expr:
        try:
            return compile_expr(text, scope=expr_scope, params=params)
        except ExprError as exc:
            raise _Bad(f"{key}: {exc}") from None

    def template(key: str, text: str) -> Template:
        try:
            return compile_template(text, scope=s, params=params)
        except ExprError as exc:
            raise _Bad(f"{key}: {exc}") from None

    ranks_where = data.get("ranks_where")
    if ranks_where is not None and scope != "run":
        raise _Bad('ranks_where is only for scope = "run" (a per-rank rule names the ranks where `when` holds)')
    gain = data.get("estimated_gain_ms")
    clauses = []
    for i, raw in enumerate(data.get("clauses", [])):
        if not isinstance(raw, dict) or set(raw) != {"when", "message"}:
            raise _Bad(f"[[clauses]] #{i + 1} must have exactly `when` and `message`")
        clauses.append(
            Clause(
                expr(f"clauses #{i + 1} when", _text(raw, "when")),
                template("clauses message", raw["message"]),
            )
        )
    when = expr("when", _text(data, "when"))
    requires = data.get("requires")
    if requires is None:
        requires = sorted(when.metrics)
    elif not isinstance(requires, list) or not all(isinstance(m, str) for m in requires):
        raise _Bad('requires must be a list of metric names, e.g. ["busbw_gbps"]')
    else:
        unknown_metrics = [m for m in requires if catalog.rule_metric(m) is None]
        if unknown_metrics:
            raise _Bad(f"requires names unknown metric(s) {', '.join(unknown_metrics)}")
    return Rule(
        id=rule_id,
        name=name,
        severity=severity,
        applies_to=applies_to,
        scope=s,
        summary=_text(data, "summary"),
        when=when,
        message=template("message", _text(data, "message")),
        recommendation=template("recommendation", _text(data, "recommendation")),
        docs=_docs(data.get("docs"), params),
        path=where,
        params=dict(params),
        params_source={k: "default" for k in params},
        estimated_gain=None if gain is None else expr("estimated_gain_ms", _text(data, "estimated_gain_ms")),
        ranks_where=None if ranks_where is None else expr("ranks_where", _text(data, "ranks_where"), "rank"),
        clauses=tuple(clauses),
        backends=tuple(backends),
        parallelism=tuple(parallelism),
        requires=tuple(requires),
    )


def _docs(docs: Any, params: Mapping[str, Any]) -> RuleDocs:
    if not isinstance(docs, dict):
        raise _Bad("[docs] must be a table")
    unknown = sorted(set(docs) - set(DOC_SECTIONS) - {"options"})
    if unknown:
        raise _Bad(f"unknown [docs] section(s) {', '.join(unknown)} (allowed: {', '.join(DOC_SECTIONS)}, options)")
    texts = {key: _text(docs, key, "docs") for key in DOC_SECTIONS if key != "references"}
    refs = docs.get("references")
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise _Bad("missing [docs] references (a non-empty list of strings)")
    if "```" not in texts["fix"]:
        raise _Bad("[docs] fix must show the fix in a ``` code block")
    options = docs.get("options", {})
    if not isinstance(options, dict) or set(options) != set(params):
        missing = sorted(set(params) - set(options)) if isinstance(options, dict) else sorted(params)
        extra = sorted(set(options) - set(params)) if isinstance(options, dict) else []
        raise _Bad(
            f"[docs.options] must describe every param (missing: {missing or 'none'}, unknown: {extra or 'none'})"
        )
    return RuleDocs(**texts, references=tuple(refs), options={k: str(v) for k, v in options.items()})


def load_rules(extra_dirs: Iterable[str | Path] = (), *, builtin: bool = True) -> tuple[Rule, ...]:
    """The built-in rules plus those in ``extra_dirs``, sorted by id. Duplicate ids or names are an error."""
    dirs: list[_Resource] = [builtin_rules_dir()] if builtin else []
    for d in extra_dirs:
        path = Path(d)
        if not path.is_dir():
            raise RuleError(f"{path}: rules directory does not exist")
        if not any(path.glob("*.toml")):
            raise RuleError(f"{path}: no rule files (*.toml) in this rules directory")
        dirs.append(path)
    rules: dict[str, Rule] = {}
    ids: dict[str, Rule] = {}
    for directory in dirs:
        for entry in sorted(directory.iterdir(), key=lambda p: p.name):
            if not entry.name.endswith(".toml") or not entry.is_file():
                continue
            rule = load_rule_file(entry)
            for key, seen in ((rule.name, rules), (rule.id, ids)):
                if key in seen:
                    raise RuleError(f"{rule.path}: rule {key} is already defined in {seen[key].path}")
            rules[rule.name] = ids[rule.id] = rule
    return tuple(sorted(rules.values(), key=lambda r: r.id))


def select_rules(rules: Iterable[Rule], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> tuple[Rule, ...]:
    """Keep the rules named (by name or id) in ``select`` (all when empty), minus those in ``ignore``."""
    rules = tuple(rules)
    by_key = {r.name: r for r in rules} | {r.id: r for r in rules}
    for key in (*select, *ignore):
        if key not in by_key:
            from difflib import get_close_matches

            close = get_close_matches(key, list(by_key), n=1)
            hint = f"; did you mean {close[0]}?" if close else " (see `ddpdoctor rules`)"
            raise DDPDoctorError(f"unknown rule {key!r}{hint}")
    chosen = {by_key[k].name for k in select} if select else {r.name for r in rules}
    chosen -= {by_key[k].name for k in ignore}
    return tuple(r for r in rules if r.name in chosen)


def find_rule(rules: Iterable[Rule], key: str) -> Rule:
    """The rule named ``key`` (name or id, case-insensitive id)."""
    rules = tuple(rules)
    for rule in rules:
        if key in (rule.name, rule.id) or key.upper() == rule.id:
            return rule
    (rule,) = select_rules(rules, [key])  # raises the "unknown rule" error with a suggestion
    return rule
