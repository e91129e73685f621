"""A rule's documentation as Markdown (``ddpdoctor explain NAME``), in ruff's order: what it does, why is this
bad, example, how to fix it, options, references; plus the exact condition and the metrics it reads."""

from __future__ import annotations

from ddpdoctor.diagnosis.rules import Rule
from ddpdoctor.metrics.catalog import rule_metric as describe


def rule_markdown(rule: Rule) -> str:
    """The documentation of ``rule`` (Markdown, readable as plain text)."""
    from ddpdoctor.diagnosis.applies import applies_summary

    scope = "decided per rank" if rule.scope == "rank" else "decided for the whole job"
    lines = [
        f"# {rule.name} ({rule.id})",
        "",
        # the one wording of what a rule applies to, as `ddpdoctor rules` and the README's rule table say it
        f"Severity: {rule.severity} · applies to: {applies_summary(rule)} · {scope}",
        f"Needs: {', '.join(rule.requires) or 'nothing measured'} (without them it is not evaluated, never passed)",
        "",
        rule.summary,
        "",
        "## What it does",
        rule.docs.what_it_does,
        "",
        "## Why is this bad?",
        rule.docs.why_is_this_bad,
        "",
        "## Example",
        rule.docs.example,
        "",
        "## How to fix it",
        rule.docs.fix,
        "",
        "## Condition",
        "```python",
        rule.when.source,
        "```",
    ]
    if rule.ranks_where is not None:
        lines += ["", f"Ranks named in the finding: those where `{rule.ranks_where.source}`"]
    if rule.clauses:
        lines += ["", "The message adds a sentence for each of these that holds:", ""]
        lines += [f"- `{clause.when.source}`" for clause in rule.clauses]
    if rule.estimated_gain is not None:
        lines += ["", f"Estimated gain (ms per step): `{rule.estimated_gain.source}`"]
    if rule.prescriptions:
        lines += ["", "Tried by `ddpdoctor try RUN --findings` (applied by ddpdoctor, no code change), one each:", ""]
        lines += [f"- `{p.knob}` = {', '.join(p.values)}" for p in rule.prescriptions]
    lines += ["", "## Options", ""]
    if rule.params:
        lines.append(f"Set in `[tool.ddpdoctor.rules.{rule.name}]` (pyproject.toml) or a `--config` file.")
        lines.append("")
        for key, value in rule.params.items():
            origin = rule.params_source.get(key, "default")
            where = "" if origin == "default" else f" (from {origin})"
            lines.append(
                f"- `{key}` = {str(value).lower() if isinstance(value, bool) else value}{where}: "
                f"{rule.docs.options.get(key, '')}"
            )
    else:
        lines.append("None.")
    lines += ["", "## Metrics used", ""]
    for name in sorted(rule.metrics - {"rank"}):
        info = describe(name)
        if info is not None:
            lines.append(f"- `{name}` ({info.unit}): {info.description}")
    lines += ["", "## References", ""]
    lines += [f"- {ref}" for ref in rule.docs.references]
    lines += ["", f"Rule file: {rule.path}"]
    return "\n".join(lines) + "\n"
