"""The metric catalog is the one place metric names, units and descriptions are defined: no module keeps a list
of its own, the README's tables are generated from it, and what ``analyze`` produces is exactly what it lists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ddpdoctor.metrics import catalog

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ddpdoctor"
RECORDED = ROOT / "samples" / "recorded" / "ddp_straggler"
# Keys of RunMetrics.run that describe the input rather than measure it.
RUN_CONTEXT = {
    "path",
    "mode",
    "backend",
    "rank_source",
    "skipped",
    "notes",
    "parallelism",
    "parallelism_evidence",
    "not_measured",
}


def _metric_name_lists(tree: ast.AST) -> list[tuple[int, list[str]]]:
    """(line, names) of every tuple/list/set literal spelling out three or more metric names."""
    known = (set(catalog.RANK) | set(catalog.RUN) | set(catalog.PER_STEP_ONLY)) - {"rank"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in known]
            if len(names) >= 3:
                found.append((node.lineno, names))
    return found


def test_no_module_but_the_catalog_spells_out_a_list_of_metric_names():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "metrics" / "catalog.py":
            continue
        for line, names in _metric_name_lists(ast.parse(path.read_text())):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {names}")
    assert offenders == [], "use ddpdoctor.metrics.catalog (names(), group()) instead:\n" + "\n".join(offenders)


def test_the_check_finds_a_list_when_there_is_one():
    source = 'PARTS = ("forward_ms", "backward_ms", "optimizer_ms")\nOTHER = ("rank", "kind", "bytes")\n'
    assert _metric_name_lists(ast.parse(source)) == [(1, ["forward_ms", "backward_ms", "optimizer_ms"])]


def test_readme_metric_tables_are_generated_from_the_catalog():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- metric-tables:[^\n]*-->\n(.*?)<!-- /metric-tables -->", readme, re.S)
    assert match, "README.md has no <!-- metric-tables --> block"
    assert match.group(1) == catalog.markdown_tables(), "regenerate with: python -m ddpdoctor.metrics.catalog"


def test_contracts_doc_points_to_the_catalog_instead_of_listing_names():
    contracts = (ROOT / "docs" / "CONTRACTS.md").read_text()
    assert "ddpdoctor/metrics/catalog.py" in contracts
    listed = [n for n in catalog.RANK if n != "rank" and f"`{n}`" in contracts or f"{n}," in contracts]
    assert len(listed) < 10, f"docs/CONTRACTS.md lists metric names again: {listed}"


@pytest.mark.skipif(not RECORDED.is_dir(), reason="samples/recorded/ddp_straggler is missing")
@pytest.mark.parametrize("use_summaries", [True, False])
def test_analyze_produces_exactly_the_catalogs_metrics(use_summaries):
    from ddpdoctor.load import load
    from ddpdoctor.metrics import analyze

    metrics = analyze(load(RECORDED, use_summaries=use_summaries, workers=1))
    rank_keys = set().union(*(set(r) for r in metrics.ranks))
    expected = {m.name for m in catalog.RANK.values() if m.source != "collectives"}  # those the engine derives
    assert rank_keys == expected, (sorted(rank_keys - expected), sorted(expected - rank_keys))
    run_keys = set(metrics.run) - RUN_CONTEXT
    expected_run = {m.name for m in catalog.RUN.values() if m.source != "snapshot"}
    unknown = run_keys - expected_run
    assert not unknown, f"run-level values the catalog does not describe: {sorted(unknown)}"
    assert expected_run <= run_keys, sorted(expected_run - run_keys)
    per_step_only = set(metrics.per_step.columns) & set(catalog.PER_STEP_ONLY)
    assert per_step_only == set(catalog.PER_STEP_ONLY)


def test_rules_may_use_every_metric_but_compares_own():
    assert catalog.rule_metric("max_peak_allocated_bytes") is None
    assert catalog.rule_metric("straggler_rank").scope == "run"
    assert catalog.rule_metric("exposed_transfer_ms").unit == "ms"
    assert catalog.rule_metric("no_such_metric") is None
