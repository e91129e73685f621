"""Why a rule passed, and where a config file changed it: the sentence each passed rule gets (``passed_reason``:
the comparisons that decided it, with their values, per rank where the rule is per rank), how close a finding's
value was to its threshold, and the thresholds a config file set (``overrides``)."""

from __future__ import annotations

import ast
import copy
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from ddpdoctor.diagnosis.expr import _OPERATORS, ExprError, Values
from ddpdoctor.diagnosis.expr import _eval as _eval_node
from ddpdoctor.diagnosis.expr import evaluate as eval_expr
from ddpdoctor.diagnosis.findings import Override, format_ranks
from ddpdoctor.diagnosis.rules import Rule
from ddpdoctor.diagnosis.template import format_value
from ddpdoctor.diagnosis.vector import expr_per_rank, per_rank_values
from ddpdoctor.metrics.catalog import RULE_RUN

# A value within this share of the threshold it was compared with decided the verdict on an edge: the finding says so.
EDGE_SHARE = 0.1

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
    if isinstance(node, ast.BoolOp):
        parts = [_explain_ranks(part, base, rows) for part in node.values]
        either = isinstance(node.op, ast.Or)
        out: list[tuple[Any, list[Any]]] = []
        for results in zip(*parts, strict=True):  # each rank's (truth, deciders) of every part
            unknown, false, found, decided = False, False, [], None
            for truth, deciders in results:
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


@functools.lru_cache(maxsize=1024)
def _coalesces(key: str) -> tuple[ast.Call, ...]:
    """The ``coalesce(...)`` calls in a comparison's text (``key``)."""
    try:
        tree = ast.parse(key, mode="eval")
    except SyntaxError:
        return ()
    return tuple(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "coalesce" and n.args
    )


@functools.lru_cache(maxsize=4096)
def _stand_in(node: ast.expr) -> bool:
    """Whether ``node`` reads no metric (a constant, a rule parameter): a default that stands in for one."""
    return not any(isinstance(n, ast.Name) and n.id != "params" for n in ast.walk(node))


def _taken(call: ast.Call, values: Values) -> ast.expr | None:
    """The argument whose value ``coalesce(...)`` took: the first one that is not None."""
    return next((arg for arg in call.args if _node_value(arg, values) is not None), None)


def _unmeasured(key: str, values: Values) -> list[str]:
    """The metrics a comparison reads through ``coalesce()`` that were not measured, where a constant or a
    parameter stood in for them (not another metric): a passed line says "not measured" of them, never the
    default as if it were the value."""
    out: list[str] = []
    for call in _coalesces(key):
        taken = _taken(call, values)
        if taken is None or _stand_in(taken):
            out += [_unparse(arg) for arg in call.args if arg is not taken and not _stand_in(arg)]
    return out


class _Measured(ast.NodeTransformer):
    """``coalesce(x, y, ...)`` -> the argument it took, where that one was measured (not a default)."""

    def __init__(self, values: Values) -> None:
        self.values = values

    def visit_Call(self, node: ast.Call) -> ast.expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        if isinstance(node.func, ast.Name) and node.func.id == "coalesce" and node.args:
            taken = _taken(node, self.values)
            if taken is not None and not _stand_in(taken):
                return taken
        return node


def _measured_node(node: ast.expr | None, values: Values) -> ast.expr | None:
    """``node`` with each ``coalesce()`` call replaced by the measured argument it took (a passed line shows what
    was compared, not the defaults that did not apply)."""
    if node is None or not any(isinstance(n, ast.Call) for n in ast.walk(node)):
        return node
    return _Measured(values).visit(copy.deepcopy(node))


def _measured_text(text: str, values: Values) -> str:
    """``_measured_node`` of an expression's text."""
    if "coalesce(" not in text:
        return text
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    return ast.unparse(_measured_node(node, values))


def _measured_text_ranks(text: str, base: Values, rows: Sequence[Mapping[str, Any]]) -> str:
    """``_measured_text`` for the ranks of ``rows`` at once: a ``coalesce()`` call is replaced only where every
    one of them took the same measured argument."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text

    class Taken(ast.NodeTransformer):
        def visit_Call(self, call: ast.Call) -> ast.expr:
            call = self.generic_visit(call)  # type: ignore[assignment]
            if not (isinstance(call.func, ast.Name) and call.func.id == "coalesce" and call.args):
                return call
            taken: set[int] = set()
            left = list(range(len(rows)))
            for i, arg in enumerate(call.args):
                if not left:
                    break
                values = _node_values(arg, base, [rows[k] for k in left])
                taken.update([i] if any(v is not None for v in values) else [])
                left = [k for k, v in zip(left, values, strict=True) if v is None]
            if left or len(taken) != 1:
                return call
            arg = call.args[taken.pop()]
            return call if _stand_in(arg) else arg

    return ast.unparse(Taken().visit(node))


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


def passed_reason(
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
        missing: list[str] = []
        for key, measured, value, op, right, limit in _explain(tree, shown[0])[1]:
            unmeasured = _unmeasured(key, shown[0])
            if unmeasured:  # a coalesce() default decided it, not a measured value: never shown as if measured
                missing += unmeasured
                continue
            measured, right = _measured_text(measured, shown[0]), _measured_node(right, shown[0])
            threshold, param = _threshold_text(right, limit)
            relation = _relation(value, limit, op) if op is not None else ""
            texts.append(f"{measured} = {_shown(value)}{_sep(relation)}{relation} {threshold}".rstrip())
            texts[-1] += _close(value, rule, param)
            params.update([param] if param else [])
        texts = list(dict.fromkeys(texts))  # a part that two branches of an `or` test is said once
        if missing:
            texts.append("not measured: " + ", ".join(dict.fromkeys(missing)))
    else:
        if outcomes is None:
            outcomes = expr_per_rank(rule, rule.when, run, rows, columns)
        by_rank = {r["rank"]: r for r in rows}
        decided = [rank for rank, outcome in outcomes.items() if outcome is False]
        groups: dict[str, tuple[str, Any, ast.expr | None, Any, dict[int, Any]]] = {}
        shown = [Values(run, rows, rule.params, by_rank[rank], columns) for rank in decided[:_SENTENCE_RANKS]]
        base = Values(run, rows, rule.params, columns=columns)
        explained = _explain_ranks(tree, base, [by_rank[rank] for rank in decided])
        for rank, (_, deciders) in zip(decided, explained, strict=True):
            for key, measured, value, op, right, limit in deciders:
                group = groups.get(key)  # (not setdefault: its default, a tuple and a dict, was made every rank)
                if group is None:
                    group = groups[key] = (measured, op, right, limit, {})
                group[4][rank] = value
        for measured, op, right, limit, per_rank in groups.values():
            if "coalesce(" in measured:  # said without the coalesce() where every rank it lists took one argument
                measured = _measured_text_ranks(measured, base, [by_rank[rank] for rank in per_rank])
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
        # the rule's own sentence for the first ranks it renders for (every value it shows measured), by text
        said_for: dict[str, list[int]] = {}
        for rank in unknown[:_SENTENCE_RANKS] if run_values_known(rule, run) else ():
            text = rank_undecided_sentence(rule, Values(run, rows, rule.params, by_rank[rank], columns))
            if text:
                said_for.setdefault(text, []).append(rank)
        said = {rank for on in said_for.values() for rank in on}
        plain = [rank for rank in unknown if rank not in said]
        if plain:
            undecided = (
                f"; undecided on {format_ranks(plain)}"
                " (a value it needs was not measured, or what was measured cannot decide it)"
            )
        for text, on in said_for.items():
            undecided += f"; undecided on {format_ranks(on)}: {text}"
    reason = "; ".join(dict.fromkeys(texts)) + undecided  # a part two branches test is said once
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
    overridden = [o for o in overrides(rule) if o.param in params]
    if overridden:
        reason += "; " + override_sentence(overridden, lead="").rstrip(".")
    return reason


def run_values_known(rule: Rule, run: Mapping[str, Any]) -> bool:
    """Whether the run has every run-level value ``rule``'s condition reads: where it lacks one, a rank may have
    been undecided for want of it, and a per-rank rule's ``undecided`` sentence is not its reason."""
    return rule.undecided is not None and not any(
        name in RULE_RUN and run.get(name) is None for name in rule.when.metrics
    )


def rank_undecided_sentence(rule: Rule, values: Values) -> str | None:
    """A per-rank rule's ``undecided`` sentence for the rank of ``values``, where that rank has every value the
    rule requires and the sentence shows (else it was undecided for want of one: None). The caller checks the
    run's values once (``run_values_known``)."""
    row = values.rank or {}
    names = set(rule.requires) | (rule.undecided.metrics if rule.undecided is not None else set())
    if any(name in row and row[name] is None for name in names):
        return None
    return undecided_sentence(rule, values)


def undecided_sentence(rule: Rule, values: Values) -> str | None:
    """``rule``'s ``undecided`` sentence with ``values`` (a rank's, for a per-rank rule); None where it has none,
    or a value it shows is missing."""
    if rule.undecided is None:
        return None
    try:
        text = rule.undecided.render(values, {"ranks": "", "worst": ""})
    except ExprError:
        return None
    return text if text and "n/a" not in text else None


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
        t = type(v)  # the usual value, a number, keyed here as _hashable keys it (no call a rank)
        key = (t, v) if t in _SCALARS and (t is not float or v != 0.0) else _hashable(v)
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


_SCALARS = frozenset((int, float, str, bool, type(None)))  # always hashable


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


def overrides(rule: Rule, tree: ast.expr | None = None) -> list[Override]:
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


def override_sentence(overrides: Sequence[Override], lead: str = "The ") -> str:
    noun = "threshold" if len(overrides) == 1 else "thresholds"
    return f"{lead}{noun} set by a config file: " + "; ".join(o.text() for o in overrides) + "."
