"""A per-rank rule's expression over many ranks at once: the values ``expr.evaluate`` gives rank by rank, in one
pass per node of the tree instead of one walk of the tree per rank (16,384 walks of each per-rank rule at 16,384
ranks).

Each node gives one value (it reads no per-rank metric: a parameter, a run-level metric, an aggregate over
ranks) or a list with one value per rank, made by the very functions the rank-by-rank walk calls
(``expr._OPERATORS``), so every value is the same. The pass evaluates every part for every rank, where the walk
skips the parts a rank's ``and``/``or``/``if`` already decided; those parts only matter when they raise, so any
error gives None here and the caller evaluates rank by rank (the same errors, in the same order, as before)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ddpdoctor.diagnosis.expr import (
    _OPERATORS,
    _RAW_OPERATORS,
    AGGREGATES,
    ALL_RANK,
    Expr,
    Values,
    _compiled,
    _lift,
    describe,
    evaluate,
)
from ddpdoctor.values import clean_value

if TYPE_CHECKING:
    from ddpdoctor.diagnosis.rules import Rule


class _PerRank(list):  # type: ignore[type-arg]
    """One value per rank (a list), told apart from a value the same for every rank."""


def expr_per_rank(
    rule: Rule, expr: Expr, run: dict[str, Any], rows: list[dict[str, Any]], columns: dict[str, Any]
) -> dict[int, Any]:
    """rank -> ``expr`` evaluated for that rank: every rank at once (``vector``), or rank by rank where that pass
    cannot vouch for a value (an error on some rank: raised here as it always was)."""
    values = per_rank_values(expr.tree, Values(run, rows, rule.params, columns=columns), rows)
    if values is None:
        return {r["rank"]: evaluate(expr, Values(run, rows, rule.params, r, columns)) for r in rows}
    return dict(zip([r["rank"] for r in rows], values, strict=True))


def per_rank_values(tree: ast.AST, base: Values, rows: Sequence[Mapping[str, Any]]) -> list[Any] | None:
    """``tree``'s value on each of ``rows`` (each rank's ``Values`` is ``base`` with ``rank=row``), or None where
    some part raised (the caller then evaluates rank by rank)."""
    if rows is not base.ranks and len(rows) == len(base.ranks) and all(map(operator.is_, rows, base.ranks)):
        rows = base.ranks  # every rank: its metric columns are the ones the evaluation keeps (``Values.column``)
    try:
        out = _values(tree, base, rows)
    except Exception:  # noqa: BLE001 - any error: the rank-by-rank walk raises it, or not, as it always has
        return None
    return list(out) if isinstance(out, _PerRank) else [out] * len(rows)


def _reads_rank(node: ast.AST) -> bool:
    """Whether ``node`` reads a per-rank metric of the rank it is evaluated for (not through an aggregate)."""
    if isinstance(node, ast.Name):
        return node.id in ALL_RANK
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in AGGREGATES
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Name)
    ):
        return False  # an aggregate over every rank
    return any(_reads_rank(child) for child in ast.iter_child_nodes(node))


def _spread(value: Any, n: int) -> Any:
    return value if isinstance(value, _PerRank) else repeat(value, n)


def _values(node: ast.AST, base: Values, rows: Sequence[Mapping[str, Any]]) -> Any:
    if not _reads_rank(node):
        return _compiled(node)(base)  # the same for every rank
    n = len(rows)
    if isinstance(node, ast.Name):
        name = node.id
        if describe(name) is None:
            raise ValueError(f"unknown metric {name!r}")
        if rows is base.ranks:
            return _PerRank(base.column(name))
        return _PerRank(clean_value(row.get(name)) for row in rows)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        fn = _RAW_OPERATORS[type(node.op)]  # as ``_OPERATORS`` applies it: None where a side is unknown
        left, right = _values(node.left, base, rows), _values(node.right, base, rows)
        pairs = zip(_spread(left, n), _spread(right, n), strict=False)
        return _PerRank([None if a is None or b is None else fn(a, b) for a, b in pairs])
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _PerRank(map(_OPERATORS[type(node.op)], _spread(_values(node.operand, base, rows), n)))
    if isinstance(node, ast.Compare) and all(type(op) in _OPERATORS for op in node.ops):
        sides = [_spread(_values(part, base, rows), n) for part in (node.left, *node.comparators)]
        fns = [_OPERATORS[type(op)] for op in node.ops]
        if len(fns) == 1:  # nearly every comparison: a bool or None, as ``expr`` gives it
            fn = _RAW_OPERATORS[type(node.ops[0])]
            pairs = zip(*sides, strict=False)
            return _PerRank([None if a is None or b is None else fn(a, b) is not False for a, b in pairs])
        return _PerRank(_chain(fns, values) for values in zip(*sides, strict=False))
    if isinstance(node, ast.BoolOp):
        stop_on = isinstance(node.op, ast.Or)
        parts = [_spread(_values(part, base, rows), n) for part in node.values]
        return _PerRank(_boolop(stop_on, values) for values in zip(*parts, strict=False))
    if isinstance(node, ast.IfExp):
        test = _spread(_values(node.test, base, rows), n)
        body = _spread(_values(node.body, base, rows), n)
        orelse = _spread(_values(node.orelse, base, rows), n)
        return _PerRank(None if t is None else (b if t else o) for t, b, o in zip(test, body, orelse, strict=False))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = node.func.id
        args = [_spread(_values(a, base, rows), n) for a in node.args]
        if fn == "coalesce":
            return _PerRank(next((v for v in values if v is not None), None) for values in zip(*args, strict=False))
        if fn == "abs" and len(args) == 1:
            return _PerRank(map(_lift(abs), args[0]))
        if fn in ("max", "min") and len(args) >= 2:
            return _PerRank(map(_lift(max if fn == "max" else min), *args))
    raise ValueError(f"{type(node).__name__}: evaluated rank by rank")


def _chain(fns: list[Any], values: tuple[Any, ...]) -> Any:
    """``expr``'s comparison chain on one rank's values (left, comparators...)."""
    result: Any = True
    for fn, left, right in zip(fns, values, values[1:], strict=False):
        outcome = fn(left, right)
        if outcome is False:
            return False
        if outcome is None:
            result = None
    return result


def _boolop(stop_on: bool, values: tuple[Any, ...]) -> Any:
    """``expr``'s three-valued ``and`` (``stop_on`` False) / ``or`` (True) on one rank's values."""
    unknown = False
    for result in values:
        if result is None:
            unknown = True
        elif bool(result) is stop_on:
            return stop_on
    return None if unknown else not stop_on
