"""Evaluate rules over a run's metrics: ``evaluate(rules, metrics) -> Diagnosis``.

``metrics`` is a ``RunMetrics`` (``ddpdoctor.metrics.analyze``) or anything with the same ``run`` dict and
``ranks`` list of dicts. A rule that does not apply to the run (mode, backend, detected parallelism), whose
required metrics (``Rule.requires``) were not measured, or whose condition cannot be decided is listed in
``Diagnosis.not_evaluated`` with the reason (the one the metrics gave for this input, ``run["not_measured"]``,
where they gave one). "Passed" means the rule's inputs were measured and its condition is false."""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddpdoctor.diagnosis.expr import _OPERATORS, CleanColumns, Expr, ExprError, Values, compile_expr
from ddpdoctor.diagnosis.expr import _eval as _eval_node
from ddpdoctor.diagnosis.expr import evaluate as eval_expr
from ddpdoctor.diagnosis.findings import (
    Diagnosis,
    Finding,
    NotEvaluated,
    Override,
    Passed,
    format_ranks,
    sort_findings,
)
from ddpdoctor.diagnosis.rules import Rule
from ddpdoctor.diagnosis.template import format_value
from ddpdoctor.diagnosis.vector import per_rank_values
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics.derived import derived_rank_metrics
from ddpdoctor.metrics.setup import NO_STEP_REASON
from ddpdoctor.values import clean_value

ALL_RANK, RUN = catalog.RULE_RANK, catalog.RULE_RUN

_MODE_WORDS = {"dp": "DataParallel (dp)", "ddp": "DistributedDataParallel (ddp)"}


_PLAIN = frozenset((type(None), bool, int, str))


_PLAIN_OR_FLOAT = _PLAIN | {float}


def _clean_row(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``clean_value`` of every value (plain values and finite floats, nearly all of them, as they are)."""
    values = list(raw.values())
    kinds = set(map(type, values))
    # the usual row: only plain values and floats whose sum is finite (so is each): a copy, no test per value
    if kinds <= _PLAIN_OR_FLOAT and (float not in kinds or math.isfinite(sum([v for v in values if type(v) is float]))):
        return dict(raw)
    return {
        k: v if (t := type(v)) in _PLAIN or (t is float and v - v == 0.0) else clean_value(v) for k, v in raw.items()
    }


def _rows(metrics: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    raw_run = dict(getattr(metrics, "run", {}) or {})
    run = {k: v if k == "not_measured" else clean_value(v) for k, v in raw_run.items()}
    derived = derived_rank_metrics(metrics)
    rows = []
    for i, raw in enumerate(getattr(metrics, "ranks", []) or []):
        row = _clean_row(raw)
        rank = row.get("rank")
        row["rank"] = int(rank) if rank is not None else i
        extra = derived.get(row["rank"])
        rows.append({**{k: clean_value(v) for k, v in extra.items()}, **row} if extra else row)
    return run, rows


def _unavailable(name: str, run: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> bool:
    if name == "rank":
        return False
    if name in ALL_RANK and any(r.get(name) is not None for r in rows):
        return False
    return not (name in RUN and run.get(name) is not None)


def _missing_reason(
    rule: Rule, run: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], names: Iterable[str] | None = None
) -> str:
    """Why ``rule`` gets no verdict: the metrics among ``names`` (default: those ``when`` reads) this run lacks,
    with the reason the metrics said for this input (``run["not_measured"]``), else the catalog's."""
    missing = sorted(m for m in (rule.when.metrics if names is None else names) if _unavailable(m, run, rows))
    if not missing:
        return "its condition is undecidable on this run (a value it needs is missing or divides by zero)"
    noted = run.get("not_measured")
    said: Mapping[str, Any] = noted if isinstance(noted, Mapping) else {}
    hints: list[str] = []
    for m in missing:
        if isinstance(said.get(m), str) and said[m] not in hints:
            hints.append(said[m])
    entries = [e for e in (catalog.rule_metric(m) for m in missing if m not in said) if e is not None]
    if len(rows) < 2 and any(e.needs_peers for e in entries):
        hints.append(catalog.ONE_RANK)
        entries = [e for e in entries if not e.needs_peers]
    for key, hint in catalog.WHY_MISSING.items():
        if any(e.missing == key for e in entries):
            hints.append(hint)
    return f"not measured in this run: {', '.join(missing)}" + "".join(f"; {h}" for h in hints)


_PARALLELISM_WORDS = {
    "dp": "DataParallel (dp)",
    "ddp": "data parallel with gradient all-reduce (ddp)",
    "fsdp": "fully sharded data parallel (fsdp)",
    "fsdp2": "fully sharded data parallel, FSDP2 fully_shard (fsdp2)",
    "tp": "tensor parallel (tp)",
    "pipeline": "pipeline parallel (pipeline)",
    "unknown": "of unknown parallelism",
    "none": "without any synchronisation between its ranks (none)",
    "single": "a single process (single)",
}


# a rule that fits fsdp fits FSDP2 (fully_shard) jobs too; one that fits ddp fits ZeRO-1 (optimizer state sharded
# on top of DDP's gradient all-reduce: "ddp+zero1")
_FAMILY = {"fsdp2": "fsdp", "zero1": "ddp"}


def _not_applicable(rule: Rule, run: Mapping[str, Any]) -> str | None:
    mode, backend = run.get("mode"), run.get("backend")
    if rule.applies_to != "any" and mode is not None and mode != rule.applies_to:
        kind = run.get("parallelism")  # an FSDP or pipeline job's mode is ddp: say what it is
        words = " + ".join(_PARALLELISM_WORDS.get(p, p) for p in kind.split("+")) if kind and kind != mode else mode
        return f"applies to {_MODE_WORDS[rule.applies_to]} runs; this run is {words}"
    if rule.backends and backend is not None and backend not in rule.backends:
        return f"applies to {', '.join(rule.backends)} runs; this run uses {backend}"
    parallelism = run.get("parallelism") or {"single": "single", "dp": "dp"}.get(str(mode))
    if isinstance(parallelism, str) and parallelism:
        parts = parallelism.split("+")
        if not all(p in rule.parallelism or _FAMILY.get(p) in rule.parallelism for p in parts):
            words = " + ".join(_PARALLELISM_WORDS.get(p, p) for p in parts)
            evidence = run.get("parallelism_evidence")
            fits = ", ".join(p for p in rule.parallelism if p not in ("unknown", "none"))
            return f"applies to {fits} jobs; this run is {words}" + (f" ({evidence})" if evidence else "")
    return None


def _term_value(term: str, rule: Rule, values: Values) -> Any:
    return eval_expr(compile_expr(term, scope=rule.scope, params=rule.params), values)


def _evidence(rule: Rule, base: Values, rows_by_rank: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    evidence: dict[str, Any] = {}
    for term in rule.when.terms:
        if rule.scope == "rank" and term in ALL_RANK:
            evidence[term] = {str(rank): clean_value(row.get(term)) for rank, row in rows_by_rank.items()}
        else:
            evidence[term] = _term_value(term, rule, base)
    return evidence


def _gain(expr: Expr | None, values: Values) -> float | None:
    if expr is None:
        return None
    value = eval_expr(expr, values)
    if value is None or isinstance(value, bool):
        return None
    return round(max(0.0, float(value)), 3)


def _per_rank(
    rule: Rule, expr: Expr, run: dict[str, Any], rows: list[dict[str, Any]], columns: dict[str, Any]
) -> dict[int, Any]:
    """rank -> ``expr`` evaluated for that rank: every rank at once (``vector``), or rank by rank where that pass
    cannot vouch for a value (an error on some rank: raised here as it always was)."""
    values = per_rank_values(expr.tree, Values(run, rows, rule.params, columns=columns), rows)
    if values is None:
        return {r["rank"]: eval_expr(expr, Values(run, rows, rule.params, r, columns)) for r in rows}
    return dict(zip([r["rank"] for r in rows], values, strict=True))


def _gains(
    rule: Rule, run: dict[str, Any], rows: list[dict[str, Any]], columns: dict[str, Any], firing: dict[int, Any]
) -> dict[int, float | None]:
    """rank -> the estimated gain (``_gain``) of each firing rank."""
    expr = rule.estimated_gain
    if expr is None:
        return dict.fromkeys(firing)
    values = per_rank_values(expr.tree, Values(run, rows, rule.params, columns=columns), list(firing.values()))
    if values is None:
        return {rank: _gain(expr, Values(run, rows, rule.params, row, columns)) for rank, row in firing.items()}
    return {
        rank: None if v is None or isinstance(v, bool) else round(max(0.0, float(v)), 3)
        for rank, v in zip(firing, values, strict=True)
    }


def _fire(
    rule: Rule,
    run: dict[str, Any],
    rows: list[dict[str, Any]],
    columns: dict[str, Any] | None = None,
    outcomes_seen: dict[int, Any] | None = None,
) -> Finding | bool | None:
    """A Finding, False (evaluated, silent) or None (undecidable). ``columns``: the metric columns (and their
    aggregates) over ``rows``, shared by the rules of one evaluation; ``outcomes_seen``: filled with a per-rank
    rule's verdict per rank."""
    columns = {} if columns is None else columns
    base = Values(run, rows, rule.params, columns=columns)
    if rule.scope == "run":
        outcome = eval_expr(rule.when, base)
        if outcome is None or not outcome:
            return None if outcome is None else False
        if rule.ranks_where is None:
            ranks = [r["rank"] for r in rows]
        else:
            where = per_rank_values(rule.ranks_where.tree, base, rows)
            if where is None:  # rank by rank (an error on some rank, raised as it always was)
                where = [eval_expr(rule.ranks_where, Values(run, rows, rule.params, r, columns)) for r in rows]
            ranks = [r["rank"] for r, chosen in zip(rows, where, strict=True) if chosen]
        chosen = set(ranks)  # (a set: `in` a list of every rank was quadratic, 28 s at 16,384 ranks)
        firing = {r["rank"]: r for r in rows if r["rank"] in chosen}
        gain, shown = _gain(rule.estimated_gain, base), base
    else:
        outcomes = _per_rank(rule, rule.when, run, rows, columns)
        if outcomes_seen is not None:
            outcomes_seen.update(outcomes)
        if all(v is None for v in outcomes.values()):
            return None
        firing = {r["rank"]: r for r in rows if outcomes[r["rank"]]}
        if not firing:
            return False
        ranks = list(firing)
        gains = _gains(rule, run, rows, columns, firing)
        known = {rank: g for rank, g in gains.items() if g is not None}
        worst = max(known, key=known.__getitem__) if known else ranks[0]
        gain, shown = known.get(worst), Values(run, rows, rule.params, firing[worst], columns)
    specials = {"ranks": format_ranks(ranks), "worst": ""}
    if rule.scope == "rank" and len(firing) > 1:
        label = "worst:" if gain is not None else "figures for"
        specials["worst"] = f" ({label} rank {shown.rank['rank']})"  # type: ignore[index]
    message = rule.message.render(shown, specials)
    recommendation = rule.recommendation
    for clause in rule.clauses:
        if eval_expr(clause.when, shown):
            message += " " + clause.message.render(shown, specials)
            recommendation = clause.recommendation or recommendation  # advice that fits what the clause found
    steps = run.get("steps_analyzed")
    timed = any(m.endswith("_ms") or m.startswith("step_ms") for m in rule.when.metrics)
    if timed and isinstance(steps, int) and 0 < steps < MIN_STEPS and "Weak evidence" not in message:
        message += (
            f" Weak evidence: only {steps} step(s) analysed, so one unusual step decides it; profile more steps"
            " (--active) to confirm."
        )
    edges = _threshold_edges(rule, shown)
    if edges:
        message += (
            " Close to its threshold, so a small change in the run can flip this verdict: " + "; ".join(edges) + "."
        )
    overridden = _overrides(rule, rule.when.tree)
    if overridden:
        message += " " + _override_sentence(overridden)
    return Finding(
        id=rule.id,
        name=rule.name,
        severity=rule.severity,
        ranks=tuple(sorted(ranks)),
        message=message,
        recommendation=recommendation.render(shown, specials),
        evidence=_evidence(rule, base, firing),
        estimated_gain_ms=gain,
    )


# Timings from fewer analysed steps than this are weak evidence: the finding says so.
MIN_STEPS = 3
# A value within this share of the threshold it was compared with decided the verdict on an edge: the finding says so.
EDGE_SHARE = 0.1


def _threshold_edges(rule: Rule, values: Values) -> list[str]:
    """The comparisons of ``rule.when`` against a ``params.NAME`` threshold whose measured side lies within
    ``EDGE_SHARE`` of it, as "TERM = v (threshold NAME = t)" -- only where the verdict hinges on them: in a
    condition ``a or b``, a true part that is not on an edge keeps the verdict whatever the others do."""

    def evaluate_node(node: ast.expr) -> Any:
        try:
            return eval_expr(compile_expr(ast.unparse(node), scope=rule.scope, params=rule.params), values)
        except ExprError:
            return None

    def edges_of(part: ast.expr) -> list[str]:
        out: list[str] = []
        for node in ast.walk(part):
            if not isinstance(node, ast.Compare) or len(node.ops) != 1:
                continue
            for measured, threshold in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
                if not (isinstance(threshold, ast.Attribute) and isinstance(threshold.value, ast.Name)):
                    continue
                limit = rule.params.get(threshold.attr) if threshold.value.id == "params" else None
                if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit:
                    continue
                value = evaluate_node(measured)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    if abs(value - limit) <= EDGE_SHARE * abs(limit):
                        out.append(f"{ast.unparse(measured)} = {value:.3g} (threshold {threshold.attr} = {limit:g})")
        return out

    tree = rule.when.tree
    if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.Or):
        held = [part for part in tree.values if evaluate_node(part)]
        edges = [edges_of(part) for part in held]
        return [] if any(not e for e in edges) else [x for e in edges for x in e]
    return edges_of(tree)


def _timed(rule: Rule) -> bool:
    return any(m.endswith("_ms") or m.startswith("step_ms") for m in rule.when.metrics)


def evaluate(rules: Iterable[Rule], metrics: Any) -> Diagnosis:
    """Run every rule over ``metrics``; findings come back sorted most costly first."""
    run, rows = _rows(metrics)
    columns: dict[str, Any] = CleanColumns()  # _rows cleaned every value
    findings: list[Finding] = []
    not_evaluated: list[NotEvaluated] = []
    passed: list[Passed] = []
    rules = tuple(rules)
    for rule in rules:
        reason = _not_applicable(rule, run)
        if reason is None and not rows:
            reason = "the run has no ranks with metrics"
        if reason is None and run.get("steps_detected") is False and _timed(rule):
            reason = NO_STEP_REASON  # its "per step" times would be of the whole recording
        if reason is not None:
            not_evaluated.append(NotEvaluated(rule.name, reason))
            continue
        if any(_unavailable(m, run, rows) for m in rule.requires):
            # a rule whose inputs are absent is not evaluated, never "passed"
            not_evaluated.append(NotEvaluated(rule.name, _missing_reason(rule, run, rows, rule.requires)))
            continue
        outcomes: dict[int, Any] = {}
        try:
            result = _fire(rule, run, rows, columns, outcomes)
        except ExprError as exc:
            not_evaluated.append(NotEvaluated(rule.name, f"could not be evaluated: {exc}"))
            continue
        if result is None:
            not_evaluated.append(NotEvaluated(rule.name, _missing_reason(rule, run, rows)))
        elif result is False:
            passed.append(Passed(rule.name, _passed_reason(rule, run, rows, columns, outcomes or None)))
        else:
            findings.append(result)
    return Diagnosis(
        metrics,
        sort_findings(findings),
        tuple(not_evaluated),
        tuple(p.name for p in passed),
        tuple(passed),
        tuple(o for rule in rules for o in _overrides(rule)),
    )


# ------------------------------------------------------------------------------------------ why a rule passed
_NEGATED = {ast.Lt: ">=", ast.Gt: "<=", ast.LtE: ">", ast.GtE: "<", ast.Eq: "!=", ast.NotEq: "=="}
_SYMBOL = {ast.Lt: "<", ast.Gt: ">", ast.LtE: "<=", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_MIRRORED = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE, ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}
# ranks whose values a per-rank rule's passed line lists one by one (beyond: their range), and ranks its own
# passed sentences are said for
_LISTED_RANKS = 8
_SENTENCE_RANKS = 4


def _node_value(node: ast.expr, values: Values) -> Any:
    """The value of a sub-tree of a checked condition (None where it cannot be computed)."""
    try:
        return _eval_node(node, values)
    except (ExprError, ArithmeticError, TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=4096)
def _reads_metrics(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) for n in ast.walk(node))


@functools.lru_cache(maxsize=4096)
def _unparse(node: ast.expr) -> str:
    """A rule's sub-expression as its text (the same nodes come back for every rank of a per-rank rule)."""
    return ast.unparse(node)


# One part of a condition that made it false: (key, measured text, measured value, compare op or None, threshold
# node or None, threshold value); formatted by ``_decider_text`` once per part (not per rank).
_Decider = tuple[str, str, Any, "type | None", "ast.expr | None", Any]


def _explain(node: ast.expr, values: Values) -> tuple[Any, list[_Decider]]:
    """The truth of ``node`` (True, False or None, as the rule engine decides it) and, when it is false, the parts
    that made it so: in ``a and b`` the false parts, in ``a or b`` every part, in ``a if t else b`` those of the
    branch taken; a comparison's sides are evaluated once."""
    if isinstance(node, ast.BoolOp):
        unknown, false, out = False, False, []
        for part in node.values:
            truth, deciders = _explain(part, values)
            if truth is None:
                unknown = True
            elif truth and isinstance(node.op, ast.Or):
                return True, []  # `or`: one true part decides
            elif not truth:
                false = True
                out += deciders
        if isinstance(node.op, ast.And) and false:
            return False, out
        if isinstance(node.op, ast.And):
            return (None if unknown else True), []
        return (None, []) if unknown else (False, out)
    if isinstance(node, ast.IfExp):  # `a if test else b`: the branch the test took decides
        test = _node_value(node.test, values)
        return (None, []) if test is None else _explain(node.body if test else node.orelse, values)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _NEGATED:
        left, right, op = node.left, node.comparators[0], type(node.ops[0])
        lv, rv = _node_value(left, values), _node_value(right, values)
        truth = _OPERATORS[op](lv, rv) if lv is not None and rv is not None else None
        if truth is not False:
            return truth, []
        if not _reads_metrics(left) and _reads_metrics(right):
            left, right, op, lv, rv = right, left, _MIRRORED[op], rv, lv
        return False, [(_unparse(node), _unparse(left), lv, op, right, rv)]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value = _node_value(node.operand, values)
        if value is None:
            return None, []
        if not value:
            return True, []
        text = _unparse(node.operand)
        return False, [(text, text, value, None, None, None)]
    value = _node_value(node, values)
    if value is None or value:
        return (None if value is None else True), []
    text = _unparse(node)
    return False, [(text, text, value, None, None, None)]


def _node_values(node: ast.expr, base: Values, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
    """``_node_value`` of ``node`` on each of ``rows`` (every rank at once where no rank's value raises)."""
    values = per_rank_values(node, base, rows)
    if values is None:
        return [_node_value(node, Values(base.run, base.ranks, base.params, row, base.columns)) for row in rows]
    return values


def _explain_ranks(node: ast.expr, base: Values, rows: Sequence[Mapping[str, Any]]) -> list[tuple[Any, list[Any]]]:
    """``_explain(node, values)`` for each of ``rows`` (``values``: ``base`` with ``rank=row``), node by node over
    every rank at once: the same truths and the same parts. (``_explain`` explains only the parts a rank's ``or``
    or ``if`` reaches; here every part is explained for every rank and those not reached are dropped: explaining
    raises nothing, ``_node_value`` says None instead.)"""
    n = len(rows)
    if isinstance(node, ast.BoolOp):
        parts = [_explain_ranks(part, base, rows) for part in node.values]
        either = isinstance(node.op, ast.Or)
        out: list[tuple[Any, list[Any]]] = []
        for i in range(n):
            unknown, false, found, decided = False, False, [], None
            for part in parts:
                truth, deciders = part[i]
                if truth is None:
                    unknown = True
                elif truth and either:
                    decided = (True, [])
                    break
                elif not truth:
                    false = True
                    found += deciders
            if decided is not None:
                out.append(decided)
            elif not either and false:
                out.append((False, found))
            elif not either:
                out.append(((None if unknown else True), []))
            else:
                out.append((None, []) if unknown else (False, found))
        return out
    if isinstance(node, ast.IfExp):
        tests = _node_values(node.test, base, rows)
        body, orelse = _explain_ranks(node.body, base, rows), _explain_ranks(node.orelse, base, rows)
        return [(None, []) if t is None else (body[i] if t else orelse[i]) for i, t in enumerate(tests)]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _NEGATED:
        left, right, op = node.left, node.comparators[0], type(node.ops[0])
        compare = _OPERATORS[op]
        swap = not _reads_metrics(left) and _reads_metrics(right)
        key = _unparse(node)
        measured = _unparse(right if swap else left)
        shown_op, threshold = (_MIRRORED[op], left) if swap else (op, right)
        out = []
        for lv, rv in zip(_node_values(left, base, rows), _node_values(right, base, rows), strict=True):
            truth = compare(lv, rv) if lv is not None and rv is not None else None
            if truth is not False:
                out.append((truth, []))
            elif swap:
                out.append((False, [(key, measured, rv, shown_op, threshold, lv)]))
            else:
                out.append((False, [(key, measured, lv, shown_op, threshold, rv)]))
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        text = _unparse(node.operand)
        return [
            (None, []) if v is None else (True, []) if not v else (False, [(text, text, v, None, None, None)])
            for v in _node_values(node.operand, base, rows)
        ]
    text = _unparse(node)
    return [
        ((None if v is None else True), []) if v is None or v else (False, [(text, text, v, None, None, None)])
        for v in _node_values(node, base, rows)
    ]


def _threshold_text(right: ast.expr | None, limit: Any) -> tuple[str, str | None]:
    """How a comparison's threshold is shown ("0.5 (min_overlap)", "0", "cpu_count * ... = 2") and its param."""
    if right is None:
        return "", None
    shown = format_value(limit)
    if isinstance(right, ast.Attribute) and isinstance(right.value, ast.Name) and right.value.id == "params":
        return f"{shown} ({right.attr})", right.attr
    if isinstance(right, ast.Constant):
        return shown, None
    return f"{ast.unparse(right)} = {shown}", None


def _relation(value: Any, limit: Any, op: Any) -> str:
    """How a measured value stands to its limit ("<", "=", ">"), or the negated comparison where they are not
    both numbers."""
    numbers = [v for v in (value, limit) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) < 2 or op in (ast.Eq, ast.NotEq):
        return _NEGATED[op]
    return "<" if value < limit else ">" if value > limit else f", not {_SYMBOL[op]}"


def _sep(relation: str) -> str:
    return "" if relation.startswith(",") else " "


def _shown(value: Any) -> str:
    return format_value(value) if not isinstance(value, bool) else str(value).lower()


def _passed_reason(
    rule: Rule,
    run: dict[str, Any],
    rows: list[dict[str, Any]],
    columns: dict[str, Any],
    outcomes: Mapping[int, Any] | None = None,
) -> str:
    """Why ``rule`` did not fire, in the numbers it tested: its ``passed`` sentences where it has them, then each
    comparison that was false with the measured value against its threshold (per rank for a per-rank rule), and
    the thresholds a config file set among them. ``outcomes``: a per-rank rule's verdict per rank, as ``_fire``
    found them."""
    tree = rule.when.tree
    params: set[str] = set()
    texts: list[str] = []
    undecided = ""
    if rule.scope == "run":
        shown = [Values(run, rows, rule.params, columns=columns)]
        for _, measured, value, op, right, limit in _explain(tree, shown[0])[1]:
            threshold, param = _threshold_text(right, limit)
            relation = _relation(value, limit, op) if op is not None else ""
            texts.append(f"{measured} = {_shown(value)}{_sep(relation)}{relation} {threshold}".rstrip())
            texts[-1] += _close(value, rule, param)
            params.update([param] if param else [])
    else:
        if outcomes is None:
            outcomes = _per_rank(rule, rule.when, run, rows, columns)
        by_rank = {r["rank"]: r for r in rows}
        decided = [rank for rank, outcome in outcomes.items() if outcome is False]
        groups: dict[str, tuple[str, Any, ast.expr | None, Any, dict[int, Any]]] = {}
        shown = [Values(run, rows, rule.params, by_rank[rank], columns) for rank in decided[:_SENTENCE_RANKS]]
        base = Values(run, rows, rule.params, columns=columns)
        explained = _explain_ranks(tree, base, [by_rank[rank] for rank in decided])
        for rank, (_, deciders) in zip(decided, explained, strict=True):
            for key, measured, value, op, right, limit in deciders:
                groups.setdefault(key, (measured, op, right, limit, {}))[4][rank] = value
        for measured, op, right, limit, per_rank in groups.values():
            threshold, param = _threshold_text(right, limit)
            numbers = [v for v in per_rank.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if op is None:
                relation = ""
            elif len(numbers) == len(per_rank) and numbers:
                low, high = _relation(min(numbers), limit, op), _relation(max(numbers), limit, op)
                relation = low if low == high else _NEGATED[op]
            else:
                relation = _NEGATED[op]
            texts.append(
                f"{measured} = {_rank_values(per_rank, decided)}{_sep(relation)}{relation} {threshold}".rstrip()
            )
            params.update([param] if param else [])
        unknown = [rank for rank, outcome in outcomes.items() if outcome is None]
        if unknown:
            undecided = f"; undecided on {format_ranks(unknown)} (a value it needs was not measured)"
    reason = "; ".join(texts) + undecided
    if rule.passed:
        specials = {"ranks": format_ranks(r["rank"] for r in rows), "worst": ""}
        said = [
            "; ".join(
                s.message.render(v, specials) for s in rule.passed if s.when is None or eval_expr(s.when, v) is True
            )
            for v in shown
        ]
        lead = "; ".join(t for t in dict.fromkeys(said) if t)
        lead += "; ..." if rule.scope == "rank" and len(decided) > _SENTENCE_RANKS else ""
        reason = f"{lead}; {reason}" if lead and reason else lead or reason
    overridden = [o for o in _overrides(rule) if o.param in params]
    if overridden:
        reason += "; " + _override_sentence(overridden, lead="").rstrip(".")
    return reason


def _close(value: Any, rule: Rule, param: str | None) -> str:
    limit = rule.params.get(param) if param else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit:
        return ""
    return " (close to its threshold)" if abs(value - limit) <= EDGE_SHARE * abs(limit) else ""


def _rank_values(values: Mapping[int, Any], decided: Sequence[int]) -> str:
    """Per-rank values as a passed line shows them: one value (and the ranks, when not all of them), each rank's
    value, or their range over many ranks."""
    # each distinct value formatted once (at 131,072 ranks most share a few values)
    texts: dict[Any, str] = {}
    for v in values.values():
        key = _hashable(v)
        if key not in texts:
            texts[key] = _shown(v)
    distinct = set(texts.values())
    where = "" if len(values) == len(decided) else f" on {format_ranks(values)}"
    if len(distinct) == 1:
        return next(iter(distinct)) + where
    if len(values) <= _LISTED_RANKS:
        return ", ".join(f"r{rank}={_shown(v)}" for rank, v in values.items())
    numbers = [v for v in values.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) == len(values):
        return f"{format_value(min(numbers))} to {format_value(max(numbers))}{where}"
    return ", ".join(sorted(distinct)) + where


def _hashable(value: Any) -> Any:
    """``value`` as a key of the formatted texts: itself, or its repr where it cannot be a key, with its type
    (1, 1.0 and True are equal keys but are shown differently, and so may 0.0 and -0.0)."""
    try:
        hash(value)
    except TypeError:
        return (type(value), repr(value))
    if type(value) is float and value == 0.0:
        return (float, repr(value))
    return (type(value), value)


def _overrides(rule: Rule, tree: ast.expr | None = None) -> list[Override]:
    """The parameters of ``rule`` a config file set (those ``tree`` reads, when given)."""
    used = None
    if tree is not None:
        used = {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "params"
        }
    return [
        Override(rule.name, name, rule.params[name], rule.default_params.get(name), source)
        for name, source in rule.params_source.items()
        if source != "default" and (used is None or name in used) and name in rule.params
    ]


def _override_sentence(overrides: Sequence[Override], lead: str = "The ") -> str:
    noun = "threshold" if len(overrides) == 1 else "thresholds"
    return f"{lead}{noun} set by a config file: " + "; ".join(o.text() for o in overrides) + "."
