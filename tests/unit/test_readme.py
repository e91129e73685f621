"""The README is for users; these keep it true as rules, metrics and commands change."""

from __future__ import annotations

import re
from pathlib import Path

from ddpdoctor.cli import COMMANDS
from ddpdoctor.diagnosis import load_rules
from ddpdoctor.metrics import catalog

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_rule_is_listed():
    for rule in load_rules():
        assert f"`{rule.name}`" in README and rule.id in README, rule.name


def test_every_metric_is_documented_with_its_unit():
    for table in (catalog.RANK, catalog.RUN):
        for name, meta in table.items():
            if meta.source == "snapshot":  # compare's own, documented with compare
                continue
            assert re.search(rf"\| `{name}` \| {re.escape(meta.unit)} \|", README), name


def test_every_command_is_documented():
    for name in COMMANDS:
        assert f"ddpdoctor {name}" in README, name


def test_ci_runs_the_readme_test_command():
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in README and "test-command" in ci


def test_the_rule_table_says_what_each_rule_applies_to_as_ddpdoctor_rules_does():
    from ddpdoctor.diagnosis.applies import applies_summary

    rows = {
        m.group(2): m.group(3)
        for m in re.finditer(r"^\| ([A-Z]+\d+) \| `([a-z0-9-]+)` \| \w+ \| ([^|]+) \|", README, re.M)
    }
    for rule in load_rules():
        assert rows.get(rule.name, "").strip() == applies_summary(rule), rule.name
