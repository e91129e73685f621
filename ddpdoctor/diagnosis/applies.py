"""What a rule applies to, in one phrase: the one source for `ddpdoctor rules`, `explain` and the README's rule
table."""

from __future__ import annotations

from ddpdoctor.diagnosis.rule_schema import PARALLELISMS
from ddpdoctor.diagnosis.rules import Rule


def applies_summary(rule: Rule) -> str:
    """``any``, or the parallelisms the rule fits (``ddp, fsdp, tp, pipeline``), with its backends when limited.

    A rule limited to DDP runs (``applies_to = "ddp"``) lists the parallelisms of a DDP-mode run it fits; ``unknown``
    (a trace that does not say) is left out: it is a fallback, not a kind of job.
    """
    fits = tuple(p for p in rule.parallelism if p != "unknown")
    if rule.applies_to == "any" and set(rule.parallelism) == set(PARALLELISMS):
        text = "any"
    else:
        text = ", ".join(fits)
    if rule.backends:
        text += f" ({', '.join(rule.backends)} only)"
    return text
