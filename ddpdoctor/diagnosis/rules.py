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
    passed = "exposed {mean(exposed_comm_ms):.1f} ms ..."   # optional: what the report says when the rule did
                                      # not fire (the values it tested against its thresholds are added to it);
                                      # or [{when = "...", message = "..."}, ...]: the sentences whose `when` holds
    undecided = "the host was busy: ..."  # optional: why there is no verdict where `when` is unknown
                                      # (e.g. `... or None`), under "Not evaluated"; default: the metrics it lacks
                                      # (a per-rank rule: with the values of each rank it leaves undecided)
    recommendation = "..."            # template too
    [[prescriptions]]                 # optional: knobs `ddpdoctor try --findings` tries (ddpdoctor.knobs)
    knob = "ddp.bucket_cap_mb"
    values = [5, 10, 25]              # one trial each
    [[clauses]]                       # optional: sentences appended to the message when their `when` holds
    when = "..."
    message = "..."
    recommendation = "..."            # optional: replaces the rule's recommendation when `when` holds
    [params]                          # thresholds; overridable in [tool.ddpdoctor.rules.<name>]
    min_overlap = 0.5
    [docs]                            # what a user reads in `ddpdoctor explain NAME` (ruff's rule docs)
    what_it_does, why_is_this_bad, example, fix, references = [...], [docs.options] one line per param
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ddpdoctor.diagnosis.expr import Expr, ExprError, Scope, compile_expr
from ddpdoctor.diagnosis.rule_schema import PARALLELISMS, DocsFile, PrescriptionFile, RuleFile, schema_message
from ddpdoctor.diagnosis.template import Template, compile_template
from ddpdoctor.errors import DDPDoctorError
from ddpdoctor.metrics import catalog
from ddpdoctor.tomlfile import TOMLError, load_bytes

_DEFAULT_PARALLELISM = {
    "dp": ("dp",),
    "ddp": ("ddp", "unknown"),
    "any": PARALLELISMS,
}
DOC_SECTIONS = ("what_it_does", "why_is_this_bad", "example", "fix", "references")
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
    recommendation: Template | None = None  # replaces the rule's recommendation when `when` holds


@dataclass(frozen=True)
class PassedSentence:
    """A sentence the report says of the rule when it passed: always (``when`` None) or when ``when`` holds."""

    when: Expr | None
    message: Template


@dataclass(frozen=True)
class Prescription:
    """A knob a rule prescribes (``ddpdoctor.knobs``) and the values ``ddpdoctor try --findings`` tries, as text."""

    knob: str
    values: tuple[str, ...]


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
    prescriptions: tuple[Prescription, ...] = ()
    passed: tuple[PassedSentence, ...] = ()
    undecided: Template | None = None  # why `when` could not decide (a per-rank rule: per rank)
    default_params: dict[str, float | int | bool] = field(default_factory=dict)  # the rule file's own [params]

    @property
    def metrics(self) -> frozenset[str]:
        """Every metric name the rule reads (condition, gain, message, clauses)."""
        exprs = [self.when, self.estimated_gain, self.ranks_where, *(c.when for c in self.clauses)]
        names = set().union(*(e.metrics for e in exprs if e is not None))
        names |= self.message.metrics | self.recommendation.metrics
        for sentence in self.passed:
            names |= sentence.message.metrics | (sentence.when.metrics if sentence.when is not None else frozenset())
        if self.undecided is not None:
            names |= self.undecided.metrics
        for clause in self.clauses:
            names |= clause.message.metrics
            if clause.recommendation is not None:
                names |= clause.recommendation.metrics
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
        import ddpdoctor._builtin_rules as package

        # a package on disk (what importlib.resources would return, without its ~5 ms of imports)
        folder = Path(package.__file__).parent if getattr(package, "__file__", None) else None
        if folder is not None and any(p.name.endswith(".toml") for p in folder.iterdir()):
            return folder
        import importlib.resources

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
        raw = res.read_bytes()
    except OSError as exc:
        raise RuleError(f"{where}: cannot read rule file: {exc.strerror or exc}") from None
    key = (where, raw)
    if key in _PARSED:  # the same file with the same bytes: checked already in this process
        return _PARSED[key]
    try:
        data = load_bytes(raw)
    except TOMLError as exc:
        raise RuleError(f"{where}: not valid TOML: {exc}") from None
    try:
        rule = _build(data, res.name, where)
    except ExprError as exc:
        raise RuleError(f"{where}: {exc}") from None
    except _Bad as exc:
        raise RuleError(f"{where}: {exc}") from None
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[key] = rule
    return rule


# Rules already parsed and checked in this process, by file and content (a Rule is frozen): a process that diagnoses
# again (the TensorBoard plugin, `watch`, the Python API in a loop) reads each file but parses its TOML and compiles
# its expressions once, about 0.03 s for the built-in rules. A file whose bytes changed is parsed again.
_PARSED: dict[tuple[str, bytes], Rule] = {}
_PARSED_MAX = 512


class _Bad(ValueError):
    pass


def _text(value: str, label: str) -> str:
    if not value.strip():
        raise _Bad(f"{label} must be a non-empty string")
    return value.strip()


def _build(data: Mapping[str, Any], filename: str, where: str) -> Rule:
    try:
        raw = msgspec.convert(data, RuleFile)
    except msgspec.ValidationError as exc:
        raise _Bad(schema_message(exc)) from None
    rule_id, name = _text(raw.id, "id"), _text(raw.name, "name")
    if not _ID_RE.match(rule_id):
        raise _Bad(f"id {rule_id!r} must be capital letters then digits, e.g. DDP012")
    if not _NAME_RE.match(name):
        raise _Bad(f"name {name!r} must be a lowercase slug, e.g. poor-comm-compute-overlap")
    if filename != f"{name}.toml":
        raise _Bad(f"the file of rule {name} must be named {name}.toml")
    params = raw.params
    if not all(_same_kind(v, v) for v in params.values()):
        raise _Bad("[params] must map names to finite numbers or true/false")
    parallelism = raw.parallelism if raw.parallelism is not None else list(_DEFAULT_PARALLELISM[raw.applies_to])
    if not parallelism:
        raise _Bad(f"parallelism must be a non-empty list of {', '.join(PARALLELISMS)}")
    s: Scope = raw.scope

    def expr(key: str, text: str, expr_scope: Scope = s) -> Expr:
        try:
            return compile_expr(_text(text, key), scope=expr_scope, params=params)
        except ExprError as exc:
            raise _Bad(f"{key}: {exc}") from None

    def template(key: str, text: str) -> Template:
        try:
            return compile_template(_text(text, key), scope=s, params=params)
        except ExprError as exc:
            raise _Bad(f"{key}: {exc}") from None

    if raw.ranks_where is not None and s != "run":
        raise _Bad('ranks_where is only for scope = "run" (a per-rank rule names the ranks where `when` holds)')
    clauses = [
        Clause(
            expr(f"clauses #{i + 1} when", c.when),
            template("clauses message", c.message),
            None if c.recommendation is None else template("clauses recommendation", c.recommendation),
        )
        for i, c in enumerate(raw.clauses)
    ]
    when = expr("when", raw.when)
    requires = raw.requires if raw.requires is not None else sorted(when.metrics)
    unknown_metrics = [m for m in requires if catalog.rule_metric(m) is None]
    if unknown_metrics:
        raise _Bad(f"requires names unknown metric(s) {', '.join(unknown_metrics)}")
    return Rule(
        id=rule_id,
        name=name,
        severity=raw.severity,
        applies_to=raw.applies_to,
        scope=s,
        summary=_text(raw.summary, "summary"),
        when=when,
        message=template("message", raw.message),
        recommendation=template("recommendation", raw.recommendation),
        docs=_docs(raw.docs, params),
        path=where,
        params=dict(params),
        params_source={k: "default" for k in params},
        estimated_gain=None if raw.estimated_gain_ms is None else expr("estimated_gain_ms", raw.estimated_gain_ms),
        ranks_where=None if raw.ranks_where is None else expr("ranks_where", raw.ranks_where, "rank"),
        clauses=tuple(clauses),
        backends=tuple(raw.backends),
        parallelism=tuple(parallelism),
        requires=tuple(requires),
        prescriptions=tuple(_prescription(p) for p in raw.prescriptions),
        passed=_passed(raw.passed, expr, template),
        undecided=None if raw.undecided is None else template("undecided", raw.undecided),
        default_params=dict(params),
    )


def _passed(raw: str | list[Any] | None, expr: Any, template: Any) -> tuple[PassedSentence, ...]:
    """The ``passed`` key: one sentence, or sentences each said when its ``when`` holds."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (PassedSentence(None, template("passed", raw)),)
    return tuple(
        PassedSentence(None if p.when is None else expr(f"passed #{i + 1} when", p.when), template("passed", p.message))
        for i, p in enumerate(raw)
    )


def _prescription(p: PrescriptionFile) -> Prescription:
    from ddpdoctor import knobs

    if not p.values:
        raise _Bad(f"prescriptions {p.knob}: values must list at least one value")
    texts = tuple(str(v).lower() if isinstance(v, bool) else str(v) for v in p.values)
    try:
        for text in texts:
            knobs.parse_value(p.knob, text)
    except knobs.KnobError as exc:
        raise _Bad(f"prescriptions: {exc}") from None
    return Prescription(p.knob, texts)


def _docs(docs: DocsFile, params: Mapping[str, Any]) -> RuleDocs:
    texts = {key: _text(getattr(docs, key), f"[docs] {key}") for key in DOC_SECTIONS if key != "references"}
    if not docs.references or not all(r.strip() for r in docs.references):
        raise _Bad("missing [docs] references (a non-empty list of strings)")
    if "```" not in texts["fix"]:
        raise _Bad("[docs] fix must show the fix in a ``` code block")
    if set(docs.options) != set(params):
        missing, extra = sorted(set(params) - set(docs.options)), sorted(set(docs.options) - set(params))
        raise _Bad(
            f"[docs.options] must describe every param (missing: {missing or 'none'}, unknown: {extra or 'none'})"
        )
    return RuleDocs(**texts, references=tuple(docs.references), options=dict(docs.options))


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
