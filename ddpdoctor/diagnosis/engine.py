"""Evaluate rules over a run's metrics: ``evaluate(rules, metrics) -> Diagnosis``.

``metrics`` is a ``RunMetrics`` (``ddpdoctor.metrics.analyze``) or anything with the same ``run`` dict and
``ranks`` list of dicts. A rule that does not apply to the run (mode, backend, detected parallelism), whose
required metrics (``Rule.requires``) were not measured, or whose condition cannot be decided is listed in
``Diagnosis.not_evaluated`` with the reason (the one the metrics gave for this input, ``run["not_measured"]``,
where they gave one). "Passed" means the rule's inputs were measured and its condition is false."""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddpdoctor.diagnosis.expr import CleanColumns, Expr, ExprError, Values, compile_expr
from ddpdoctor.diagnosis.expr import evaluate as eval_expr
from ddpdoctor.diagnosis.findings import (
    Diagnosis,
    Finding,
    NotEvaluated,
    Passed,
    format_ranks,
    sort_findings,
)
from ddpdoctor.diagnosis.passed import (
    EDGE_SHARE,
    override_sentence,
    overrides,
    passed_reason,
    rank_undecided_sentence,
    run_values_known,
    undecided_sentence,
)
from ddpdoctor.diagnosis.rules import Rule
from ddpdoctor.diagnosis.vector import expr_per_rank, per_rank_values
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics.derived import derived_rank_metrics
from ddpdoctor.metrics.setup import NO_STEP_REASON
from ddpdoctor.values import clean_value

ALL_RANK, RUN = catalog.RULE_RANK, catalog.RULE_RUN

_MODE_WORDS = {"dp": "DataParallel (dp)", "ddp": "DistributedDataParallel (ddp)"}


_PLAIN = frozenset((type(None), bool, int, str))


_PLAIN_OR_FLOAT = _PLAIN | {float}


def _is_clean(raw: Mapping[str, Any]) -> bool:
    """True where every value of ``raw`` is clean already (``clean_value`` would keep it): the usual row, only plain
    values and floats whose sum is finite (so is each); no test per value. False means: test them one by one."""
    values = list(raw.values())
    kinds = set(map(type, values))
    return kinds <= _PLAIN_OR_FLOAT and (
        float not in kinds or math.isfinite(sum([v for v in values if type(v) is float]))
    )


def _clean_row(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``clean_value`` of every value (plain values and finite floats, nearly all of them, as they are)."""
    if _is_clean(raw):
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
        clean = raw if _is_clean(raw) else _clean_row(raw)
        rank = clean.get("rank")
        rank = int(rank) if rank is not None else i
        extra = derived.get(rank)
        # one new dict a rank (the derived metrics first, then the row's own, which win), never the metrics' row:
        # the copy of a clean row before the merge was a second 250-key dict a rank
        row = {**{k: clean_value(v) for k, v in extra.items()}, **clean} if extra else dict(clean)
        row["rank"] = rank  # where the row has no rank: last, as before the merge
        rows.append(row)
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


def _undecided_reason(rule: Rule, run: dict[str, Any], rows: list[dict[str, Any]], columns: dict[str, Any]) -> str:
    """Why ``rule``'s condition decided nothing: its ``undecided`` sentence where it has one and every value the
    sentence shows was measured (a per-rank rule's: the first rank's it renders for), else the metrics it lacks
    (``_missing_reason``)."""
    if rule.undecided is not None and not any(_unavailable(m, run, rows) for m in rule.undecided.metrics):
        if rule.scope == "run":
            text = undecided_sentence(rule, Values(run, rows, rule.params, columns=columns))
        elif run_values_known(rule, run):
            said = (rank_undecided_sentence(rule, Values(run, rows, rule.params, r, columns)) for r in rows)
            text = next((t for t in said if t), None)
        else:
            text = None
        if text:
            return text
    return _missing_reason(rule, run, rows)


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
        outcomes = expr_per_rank(rule, rule.when, run, rows, columns)
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
    overridden = overrides(rule, rule.when.tree)
    if overridden:
        message += " " + override_sentence(overridden)
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
            not_evaluated.append(NotEvaluated(rule.name, _undecided_reason(rule, run, rows, columns)))
        elif result is False:
            passed.append(Passed(rule.name, passed_reason(rule, run, rows, columns, outcomes or None)))
        else:
            findings.append(result)
    return Diagnosis(
        metrics,
        sort_findings(findings),
        tuple(not_evaluated),
        tuple(p.name for p in passed),
        tuple(passed),
        tuple(o for rule in rules for o in overrides(rule)),
    )
