"""The small expression language of rule conditions, gains and message-template fields: a Python expression
parsed with ``ast``, checked against a whitelist when a rule loads, and evaluated by walking the checked tree.

Grammar (a strict subset of Python expressions, checked when a rule loads, so a bad rule fails before any
trace is read): numbers, ``True``/``False``/``None``, metric names (``ddpdoctor.metrics.catalog``), ``params.NAME``,
``+ - * / %``, ``**`` with a literal exponent of at most 64, comparisons, ``and``/``or``/``not``, ``a if c
else b``, aggregates over ranks ``max min mean median p90 sum count`` applied to one per-rank metric name, and
the scalar helpers ``abs(x)``, ``max(a, b, ...)``, ``min(a, b, ...)``, ``coalesce(a, b, ...)`` (the first
known value). Nothing else: no strings, attributes (other than ``params.NAME``), indexing, comprehensions,
lambdas or other calls, so ``__import__``, dunder access and huge powers are rejected before evaluation; the
evaluator admits the same node types only, a second fence.

Missing data: a metric that is ``None`` (not measurable on this run) makes arithmetic and comparisons ``None``
("unknown"); ``and``/``or``/``not`` use three-valued logic, so ``a or b`` is true when ``a`` is true even if
``b`` is unknown. Division by zero is unknown too. Aggregates skip ranks without a value; with no value at all
they are unknown. ``count(x)`` is the number of ranks where ``x`` is set and non-zero (for flags: true)."""

from __future__ import annotations

import ast
import math
import operator
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ddpdoctor.metrics.catalog import RULE_RANK as ALL_RANK
from ddpdoctor.metrics.catalog import RULE_RUN as RUN
from ddpdoctor.metrics.catalog import rule_metric as describe
from ddpdoctor.values import clean_value

Scope = Literal["rank", "run"]

AGGREGATES = ("max", "min", "mean", "median", "p90", "sum", "count")
SCALAR_FUNCTIONS = ("abs", "max", "min", "coalesce")
TEMPLATE_SPECIALS = ("ranks", "worst")  # {ranks}: "ranks 0-3"; {worst}: " (worst: rank 2)" or ""
MAX_EXPR_CHARS = 2000
MAX_DEPTH = 40
MAX_EXPONENT = 64


class ExprError(ValueError):
    """An expression that is not allowed or cannot be evaluated; the message says which part and why."""


@dataclass(frozen=True)
class Expr:
    """A checked expression: its source, parsed tree, the metric names it reads and its evidence terms."""

    source: str
    tree: ast.expr = field(repr=False, compare=False)
    metrics: frozenset[str]
    terms: tuple[str, ...]  # sub-expressions worth reporting: aggregates, metric names, params


# --------------------------------------------------------------------------------------------------- checking
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Mod: "%", ast.Pow: "**"}
_UNARYOPS = (ast.Not, ast.USub, ast.UAdd)
_CMPOPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_FRIENDLY = {
    "Subscript": "indexing",
    "Lambda": "lambda",
    "ListComp": "comprehensions",
    "GeneratorExp": "comprehensions",
    "SetComp": "comprehensions",
    "DictComp": "comprehensions",
    "JoinedStr": "f-strings",
    "NamedExpr": "assignment (:=)",
    "Starred": "*args",
}


def _snippet(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


class _Checker:
    def __init__(self, scope: Scope, params: Collection[str], text: bool = False) -> None:
        self.scope = scope
        self.text = text  # a text metric may be the whole expression (a message template's field)
        self.params = set(params)
        self.metrics: set[str] = set()
        self.terms: dict[str, None] = {}

    def check(self, node: ast.AST, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise ExprError(f"expression nested more than {MAX_DEPTH} levels deep")
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            what = _FRIENDLY.get(type(node).__name__, type(node).__name__)
            raise ExprError(f"{what} is not allowed ({_snippet(node)!r})")
        method(node, depth + 1)

    def _Constant(self, node: ast.Constant, depth: int) -> None:
        if node.value is not None and type(node.value) not in (bool, int, float):
            raise ExprError(f"only numbers, True, False and None are allowed as literals ({_snippet(node)!r})")

    def _Name(self, node: ast.Name, depth: int) -> None:
        name = node.id
        if name == "params":
            raise ExprError("write params.NAME to use a rule parameter")
        if name in AGGREGATES or name in SCALAR_FUNCTIONS:
            raise ExprError(f"{name} is a function; call it, e.g. {name}(step_ms_median)")
        info = describe(name)
        if info is None:
            raise ExprError(_unknown("metric", name, [*ALL_RANK, *RUN]))
        if name not in RUN and self.scope == "run":
            raise ExprError(
                f"{name} is a per-rank metric; aggregate it over ranks in a run-level rule, e.g. mean({name})"
            )
        if info.kind == "text" and not (self.text and depth == 1):
            raise ExprError(f"{name} is text; it can only be counted, e.g. count({name}) > 0")
        self.metrics.add(name)
        self.terms[name] = None

    def _Attribute(self, node: ast.Attribute, depth: int) -> None:
        if not (isinstance(node.value, ast.Name) and node.value.id == "params"):
            raise ExprError(f"attribute access is not allowed ({_snippet(node)!r}); only params.NAME")
        if node.attr not in self.params:
            known = ", ".join(sorted(self.params)) or "none"
            raise ExprError(f"unknown parameter params.{node.attr} (this rule's params: {known})")
        self.terms[f"params.{node.attr}"] = None

    def _Call(self, node: ast.Call, depth: int) -> None:
        if not isinstance(node.func, ast.Name):
            raise ExprError(f"only {', '.join(dict.fromkeys(AGGREGATES + SCALAR_FUNCTIONS))} can be called")
        fn = node.func.id
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ExprError(f"{fn}() takes positional arguments only ({_snippet(node)!r})")
        if fn in AGGREGATES and (len(node.args) == 1 or fn not in ("max", "min")):
            self._aggregate(node, fn)
        elif fn in SCALAR_FUNCTIONS:
            if fn == "abs" and len(node.args) != 1:
                raise ExprError(f"abs() takes one argument ({_snippet(node)!r})")
            if not node.args:
                raise ExprError(f"{fn}() needs arguments")
            for arg in node.args:
                self.check(arg, depth)
        else:
            raise ExprError(_unknown("function", fn, [*AGGREGATES, *SCALAR_FUNCTIONS]))

    def _aggregate(self, node: ast.Call, fn: str) -> None:
        args = node.args
        if len(args) != 1 or not isinstance(args[0], ast.Name):
            raise ExprError(f"{fn}() over ranks takes one per-rank metric name ({_snippet(node)!r})")
        name = args[0].id
        info = describe(name)
        if info is None:
            raise ExprError(_unknown("metric", name, [*ALL_RANK, *RUN]))
        if name not in ALL_RANK:
            raise ExprError(f"{name} is a run-level metric; use it directly, not inside {fn}()")
        if info.kind == "text" and fn != "count":
            raise ExprError(f"{name} is text; it can only be counted, e.g. count({name}) > 0")
        self.metrics.add(name)
        self.terms[f"{fn}({name})"] = None

    def _BinOp(self, node: ast.BinOp, depth: int) -> None:
        if type(node.op) not in _BINOPS:
            raise ExprError(f"operator {type(node.op).__name__} is not allowed ({_snippet(node)!r})")
        if isinstance(node.op, ast.Pow):
            exponent = node.right
            if isinstance(exponent, ast.UnaryOp) and isinstance(exponent.op, (ast.USub, ast.UAdd)):
                exponent = exponent.operand
            if not (
                isinstance(exponent, ast.Constant)
                and type(exponent.value) in (int, float)
                and abs(exponent.value) <= MAX_EXPONENT
            ):
                raise ExprError(f"** needs a literal exponent of at most {MAX_EXPONENT} ({_snippet(node)!r})")
        self.check(node.left, depth)
        self.check(node.right, depth)

    def _UnaryOp(self, node: ast.UnaryOp, depth: int) -> None:
        if not isinstance(node.op, _UNARYOPS):
            raise ExprError(f"operator {type(node.op).__name__} is not allowed ({_snippet(node)!r})")
        self.check(node.operand, depth)

    def _BoolOp(self, node: ast.BoolOp, depth: int) -> None:
        for value in node.values:
            self.check(value, depth)

    def _Compare(self, node: ast.Compare, depth: int) -> None:
        for op in node.ops:
            if not isinstance(op, _CMPOPS):
                raise ExprError(f"comparison {type(op).__name__} is not allowed ({_snippet(node)!r})")
        self.check(node.left, depth)
        for comp in node.comparators:
            self.check(comp, depth)

    def _IfExp(self, node: ast.IfExp, depth: int) -> None:
        for part in (node.test, node.body, node.orelse):
            self.check(part, depth)


def _unknown(kind: str, name: str, choices: Collection[str]) -> str:
    import difflib  # only for an error message: not imported at start-up

    close = difflib.get_close_matches(name, list(choices), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown {kind} {name!r}{hint}"


def compile_expr(source: str, *, scope: Scope, params: Collection[str] = (), text: bool = False) -> Expr:
    """Parse and check ``source``; raise ``ExprError`` saying what is wrong. ``text``: the expression may be one
    text metric's name alone (a message template's ``{health_summary}`` field), nothing else with text."""
    if not isinstance(source, str) or not source.strip():
        raise ExprError("empty expression")
    if len(source) > MAX_EXPR_CHARS:
        raise ExprError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExprError(f"syntax error: {exc.msg} in {source.strip()!r}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ExprError("expression cannot be parsed (too deeply nested or invalid characters)") from None
    checker = _Checker(scope, params, text)
    checker.check(tree)
    return Expr(source.strip(), tree, frozenset(checker.metrics), tuple(checker.terms))


# ------------------------------------------------------------------------------------------------ evaluation
@dataclass(frozen=True)
class Values:
    """What an expression reads: run-level metrics, every rank's metrics, params and (rank scope) one rank."""

    run: Mapping[str, Any]
    ranks: Sequence[Mapping[str, Any]]
    params: Mapping[str, Any]
    rank: Mapping[str, Any] | None = None
    # metric -> its column over ``ranks``, shared by the Values of one evaluation (each rank of a per-rank rule
    # would otherwise build the same column again: 16,384 x 16,384 lookups at 16,384 ranks)
    columns: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def scalar(self, name: str) -> Any:
        if self.rank is not None and name in ALL_RANK:
            return clean_value(self.rank.get(name))
        if name in RUN:
            return clean_value(self.run.get(name))
        raise ExprError(f"{name} is a per-rank metric; aggregate it over ranks")

    def column(self, name: str) -> list[Any]:
        if self.columns is None:
            return [clean_value(r.get(name)) for r in self.ranks]
        if name not in self.columns:
            if type(self.columns) is CleanColumns:  # the rows hold clean values: each as it is
                self.columns[name] = [r.get(name) for r in self.ranks]
            else:
                self.columns[name] = [clean_value(r.get(name)) for r in self.ranks]
        return self.columns[name]


class CleanColumns(dict):  # type: ignore[type-arg]
    """A ``Values.columns`` cache for rows whose every value is ``clean_value``'d already (the engine's rows): a
    column is each row's value as it is (131,072 ``clean_value`` calls a column fewer at 131,072 ranks)."""


def _lift(fn: Any) -> Any:
    def op(*args: Any) -> Any:
        for a in args:  # a loop, not any(): called for every operator of every rank's condition
            if a is None:
                return None
        return fn(*args)

    return op


def _div(a: Any, b: Any) -> Any:
    return None if b == 0 else a / b


def _mod(a: Any, b: Any) -> Any:
    return None if b == 0 else a % b


def _pow(base: Any, exponent: Any) -> Any:
    if abs(exponent) > MAX_EXPONENT:  # the checker allows literal exponents only; this guards unchecked trees
        raise ExprError(f"** exponent larger than {MAX_EXPONENT}")
    return base**exponent


_RAW_OPERATORS: dict[type, Callable[..., Any]] = {  # each applied only to known values (``_OPERATORS``)
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _div,
    ast.Mod: _mod,
    ast.Pow: _pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_OPERATORS = {node: _lift(fn) for node, fn in _RAW_OPERATORS.items()}


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    pos = 0.9 * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _mean(values: list[float]) -> float:
    """``statistics.fmean`` of a non-empty list, its very arithmetic (statistics imports random, fractions, ...:
    ~3 ms of start-up; tests/unit/test_rules_aggregates.py compares the two)."""
    return math.fsum(values) / len(values)


def _median(values: list[float]) -> float:
    """``statistics.median`` of a non-empty list, its very arithmetic."""
    ordered = sorted(values)
    n = len(ordered)
    if n % 2 == 1:
        return ordered[n // 2]
    i = n // 2
    return (ordered[i - 1] + ordered[i]) / 2


_AGG_FUNCS = {
    "max": max,
    "min": min,
    "mean": _mean,
    "median": _median,
    "p90": _p90,
    "sum": math.fsum,
}


def aggregate(fn: str, values: Sequence[Any]) -> Any:
    """Aggregate one metric over ranks, skipping ranks without a value; None when no rank has one."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    if fn == "count":
        return sum(1 for v in known if v)
    return _AGG_FUNCS[fn]([float(v) for v in known])


def _eval(node: ast.AST, values: Values) -> Any:
    """The value of a checked tree: numbers, bools, or None for unknown. Node types the checker does not admit
    are refused here too (a second fence for trees that did not come through ``compile_expr``)."""
    return _compiled(node)(values)


# node -> its closure (``_build``): a per-rank rule's tree is evaluated for every rank, 16,384 times at 16,384
# ranks, and a walk that asks each node's type every time was most of the rule engine's time
_CLOSURES: weakref.WeakKeyDictionary[ast.AST, Callable[[Values], Any]] = weakref.WeakKeyDictionary()


def _compiled(node: ast.AST) -> Callable[[Values], Any]:
    """``node`` as a function of the values: the same value, the same errors at the same moment as a walk of
    the tree (an error is raised when the node is evaluated, never when it is built)."""
    fn = _CLOSURES.get(node)
    if fn is None:
        fn = _CLOSURES[node] = _build(node)
    return fn


def _raises(message: str) -> Callable[[Values], Any]:
    def fail(values: Values) -> Any:
        raise ExprError(message)

    return fail


def _build(node: ast.AST) -> Callable[[Values], Any]:
    if isinstance(node, ast.Constant) and (node.value is None or type(node.value) in (bool, int, float)):
        constant = node.value
        return lambda values: constant
    if isinstance(node, ast.Name):
        if describe(node.id) is None:
            return _raises(f"unknown metric {node.id!r}")
        name = node.id
        return lambda values: values.scalar(name)
    if isinstance(node, ast.Attribute):
        if not (isinstance(node.value, ast.Name) and node.value.id == "params") or node.attr.startswith("_"):
            return _raises("only params.NAME attributes are allowed")
        attr = node.attr

        def param(values: Values) -> Any:
            if attr not in values.params:
                raise ExprError(f"unknown parameter params.{attr}")
            return clean_value(values.params[attr])

        return param
    if isinstance(node, ast.Call):
        return _build_call(node)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        binop, left, right = _OPERATORS[type(node.op)], _compiled(node.left), _compiled(node.right)
        return lambda values: binop(left(values), right(values))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        unop, operand = _OPERATORS[type(node.op)], _compiled(node.operand)
        return lambda values: unop(operand(values))
    if isinstance(node, ast.BoolOp):
        return _build_boolop(node)
    if isinstance(node, ast.Compare) and all(type(op) in _OPERATORS for op in node.ops):
        return _build_compare(node)
    if isinstance(node, ast.IfExp):
        test, body, orelse = _compiled(node.test), _compiled(node.body), _compiled(node.orelse)

        def choose(values: Values) -> Any:
            truth = test(values)
            if truth is None:
                return None
            return body(values) if truth else orelse(values)

        return choose
    return _raises(f"{type(node).__name__} is not allowed ({_snippet(node)!r})")


def _build_call(node: ast.Call) -> Callable[[Values], Any]:
    fn = node.func.id if isinstance(node.func, ast.Name) else None
    if node.keywords:
        return _raises(f"call not allowed: {_snippet(node)!r}")
    if fn in AGGREGATES and len(node.args) == 1 and isinstance(node.args[0], ast.Name):
        name = node.args[0].id
        if name not in ALL_RANK:
            return _raises(f"{fn}() over ranks needs a per-rank metric, not {name!r}")
        key = f"{fn}({name})"  # the same over all ranks: once per evaluation

        def over_ranks(values: Values) -> Any:
            if values.columns is None:
                return aggregate(fn, values.column(name))
            if key not in values.columns:
                values.columns[key] = aggregate(fn, values.column(name))
            return values.columns[key]

        return over_ranks
    args = [_compiled(a) for a in node.args]
    if fn == "coalesce":

        def coalesce(values: Values) -> Any:
            for arg in args:
                value = arg(values)
                if value is not None:
                    return value
            return None

        return coalesce
    if fn == "abs" and len(args) == 1:
        lifted_abs, arg = _lift(abs), args[0]
        return lambda values: lifted_abs(arg(values))
    if fn in ("max", "min") and len(args) >= 2:
        pick = _lift(max if fn == "max" else min)
        return lambda values: pick(*[a(values) for a in args])
    return _raises(f"call not allowed: {_snippet(node)!r}")


def _build_boolop(node: ast.BoolOp) -> Callable[[Values], Any]:
    parts = [_compiled(v) for v in node.values]
    stop_on = isinstance(node.op, ast.Or)  # `or` stops at the first true, `and` at the first false

    def boolop(values: Values) -> Any:
        unknown = False
        for part in parts:
            result = part(values)
            if result is None:
                unknown = True
            elif bool(result) is stop_on:
                return stop_on
        return None if unknown else not stop_on

    return boolop


def _build_compare(node: ast.Compare) -> Callable[[Values], Any]:
    first = _compiled(node.left)
    if len(node.ops) == 1:  # nearly every comparison of a rule
        compare, right = _OPERATORS[type(node.ops[0])], _compiled(node.comparators[0])

        def single(values: Values) -> Any:
            outcome = compare(first(values), right(values))
            return outcome if outcome is None or outcome is False else True

        return single
    steps = [(_OPERATORS[type(op)], _compiled(comp)) for op, comp in zip(node.ops, node.comparators, strict=True)]

    def chain(values: Values) -> Any:
        left = first(values)
        result: Any = True
        for compare, comp in steps:
            right = comp(values)
            outcome = compare(left, right)
            if outcome is False:
                return False
            if outcome is None:
                result = None
            left = right
        return result

    return chain


def evaluate(expr: Expr | str, values: Values, *, scope: Scope = "run") -> Any:
    """Evaluate a checked expression (a string is checked first). Returns a number, bool or None (unknown)."""
    if isinstance(expr, str):
        expr = compile_expr(expr, scope=scope, params=values.params)
    try:
        return _compiled(expr.tree)(values)
    except ExprError:
        raise
    except (ArithmeticError, TypeError, ValueError, RecursionError) as exc:
        raise ExprError(f"{expr.source!r}: {type(exc).__name__}: {exc}") from None
