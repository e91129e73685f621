"""Rules over metrics -> findings.

- the metric names a rule may use, with units and meanings, are ``ddpdoctor.metrics.catalog``'s.
- ``expr``: the safe expression language of conditions and gains (a checked `ast` tree, evaluated by walking it).
- ``template``: message templates with expression fields, and number formatting.
- ``rules``: rule files (``rules/*.toml``, ``--rules-dir``), loading, checking, selection.
- ``config``: parameter overrides from ``[tool.ddpdoctor.rules.<name>]`` or ``--config``.
- ``engine``: ``evaluate(rules, metrics) -> Diagnosis``.
- ``findings``: ``Finding``, ``NotEvaluated``, ``Diagnosis``.
"""

from __future__ import annotations

from ddpdoctor.diagnosis.config import RuleConfig, apply_config, load_config
from ddpdoctor.diagnosis.engine import evaluate
from ddpdoctor.diagnosis.findings import SEVERITIES, Diagnosis, Finding, NotEvaluated
from ddpdoctor.diagnosis.rules import Rule, RuleError, find_rule, load_rules, select_rules

__all__ = [
    "SEVERITIES",
    "Diagnosis",
    "Finding",
    "NotEvaluated",
    "Rule",
    "RuleConfig",
    "RuleError",
    "apply_config",
    "evaluate",
    "find_rule",
    "load_config",
    "load_rules",
    "select_rules",
]
