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

from typing import Any

# Imported on first use: the command line reads SEVERITIES at start-up without loading the rule machinery.
_EXPORTS = {
    "RuleConfig": "config",
    "apply_config": "config",
    "load_config": "config",
    "evaluate": "engine",
    "SEVERITIES": "findings",
    "Diagnosis": "findings",
    "Finding": "findings",
    "NotEvaluated": "findings",
    "Rule": "rules",
    "RuleError": "rules",
    "find_rule": "rules",
    "load_rules": "rules",
    "select_rules": "rules",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"ddpdoctor.diagnosis.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'ddpdoctor.diagnosis' has no attribute {name!r}")
