"""The rule engine's all-ranks passes (``diagnosis.vector``, ``passed._explain_ranks``) give what the rank-by-rank
walk gives, on every built-in rule and on rows made to hit its edges: missing values, zeros, values at and near
each threshold, flags. And they walk each tree once per rule, not once per rank (what made the engine's time grow
with ranks times nodes)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ddpdoctor.diagnosis import engine, load_rules, passed, vector
from ddpdoctor.diagnosis.expr import ALL_RANK, RUN, ExprError, Values
from ddpdoctor.diagnosis.expr import evaluate as eval_expr

RULES = load_rules()


def _pool(rule: Any) -> list[Any]:
    near = [v * f for v in rule.params.values() if type(v) in (int, float) for f in (0.5, 0.95, 1.0, 1.05, 2.0)]
    return [None, 0, 0.0, 1, 2, -1.5, 0.001, 3.7, 1e6, True, False, *near]


def _rows(rule: Any, n: int, rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    pool = _pool(rule)
    names = sorted(rule.when.metrics | (rule.estimated_gain.metrics if rule.estimated_gain else frozenset()))
    run = {m: rng.choice(pool) for m in names if m in RUN}
    rows = [{"rank": r, **{m: rng.choice(pool) for m in names if m in ALL_RANK}} for r in range(n)]
    return run, rows


def _each_rank(expr: Any, run: dict[str, Any], rows: list[dict[str, Any]], params: Any) -> list[Any]:
    out = []
    for row in rows:
        try:
            out.append(eval_expr(expr, Values(run, rows, params, row, {})))
        except ExprError as exc:
            out.append(("error", str(exc)))
    return out


@pytest.mark.parametrize("rule", [r for r in RULES if r.scope == "rank"], ids=lambda r: r.name)
def test_every_rank_at_once_is_each_rank_alone(rule: Any) -> None:
    rng = random.Random(rule.name)
    vouched = 0
    for _ in range(40):
        run, rows = _rows(rule, 30, rng)
        for expr in (rule.when, rule.estimated_gain):
            if expr is None:
                continue
            want = _each_rank(expr, run, rows, rule.params)
            got = vector.per_rank_values(expr.tree, Values(run, rows, rule.params, columns={}), rows)
            if got is None:  # some part raised on some rank: the engine walks rank by rank, as before
                continue
            vouched += 1
            assert got == want and [type(v) for v in got] == [type(v) for v in want]
        base = Values(run, rows, rule.params, columns={})
        explained = passed._explain_ranks(rule.when.tree, base, rows)
        alone = [passed._explain(rule.when.tree, Values(run, rows, rule.params, row, {})) for row in rows]
        assert explained == alone
    assert vouched >= 40  # the all-ranks pass gave the values, not only the fallback


def test_a_per_rank_rule_walks_its_tree_once_whatever_the_ranks(monkeypatch) -> None:
    rule = next(r for r in RULES if r.scope == "rank")
    calls = []
    walk = vector._values

    def counted(node: Any, base: Any, rows: Any) -> Any:
        calls.append(node)
        return walk(node, base, rows)

    monkeypatch.setattr(vector, "_values", counted)
    seen = []
    for n in (10, 1000):
        run, rows = _rows(rule, n, random.Random(1))
        calls.clear()
        vector.per_rank_values(rule.when.tree, Values(run, rows, rule.params, columns={}), rows)
        seen.append(len(calls))
    assert seen[0] == seen[1] > 0


HANDWRITTEN = [  # the shapes the built-in rules lack: a threshold on the left, chains, ``if``, ``not``, helpers
    "0.5 < backward_ms and not ddp_find_unused_parameters and params.x <= comm_ms",
    "(comm_ms if batch_size else dataloader_ms) > params.x or 2 <= backward_ms < params.x",
    "coalesce(collective_wait_ms, comm_ms, 0) / max(batch_size, 1) >= params.x * mean(comm_ms)",
    "abs(backward_ms - median(backward_ms)) > params.x and -comm_ms < 0 or hang_detected",
    "min(comm_ms, dataloader_ms) ** 2 % 3 != 1 and count(batch_size) > 1",
]


@pytest.mark.parametrize("source", HANDWRITTEN)
def test_handwritten_conditions_at_once_and_alone(source: str) -> None:
    from ddpdoctor.diagnosis.expr import compile_expr

    expr = compile_expr(source, scope="rank", params={"x": 1.0})
    rng = random.Random(source)
    pool = [None, 0, 0.0, 1, 2, -1.5, 0.5, 1.0, 1.05, 3.7, True, False]
    names = sorted(expr.metrics)
    for _ in range(60):
        params = {"x": rng.choice([0.5, 1.0, 2.0])}
        run = {m: rng.choice(pool) for m in names if m in RUN}
        rows = [{"rank": r, **{m: rng.choice(pool) for m in names if m in ALL_RANK}} for r in range(20)]
        got = vector.per_rank_values(expr.tree, Values(run, rows, params, columns={}), rows)
        if got is not None:
            assert got == _each_rank(expr, run, rows, params)
        explained = passed._explain_ranks(expr.tree, Values(run, rows, params, columns={}), rows)
        assert explained == [passed._explain(expr.tree, Values(run, rows, params, row, {})) for row in rows]


def test_a_clean_row_is_each_value_cleaned() -> None:
    from ddpdoctor.values import clean_value

    rows = [
        {"rank": 0, "a": 1.5, "b": None, "c": True, "d": "x", "e": 3},
        {"rank": 1, "a": float("nan"), "b": 2.0},
        {"rank": 2, "a": float("inf"), "b": -float("inf")},
        {"rank": 3, "a": 1e308, "b": 1e308},  # a sum that overflows: each value is still finite
    ]
    for raw in rows:
        got = engine._clean_row(raw)
        assert got == {k: clean_value(v) for k, v in raw.items()} and got is not raw
        assert list(got) == list(raw)
