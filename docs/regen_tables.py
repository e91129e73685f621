"""Rewrite README.md's generated tables from their one source: the rule table (``rules/*.toml``), the knob table
(``ddpdoctor.knobs``) and the metric tables (``ddpdoctor.metrics.catalog``). Tests keep them equal
(tests/unit/test_readme.py, test_knobs.py, test_catalog.py).

    python docs/regen_tables.py
"""

from __future__ import annotations

import re
from pathlib import Path

from ddpdoctor import knobs
from ddpdoctor.diagnosis import load_rules
from ddpdoctor.diagnosis.applies import applies_summary
from ddpdoctor.metrics import catalog

README = Path(__file__).resolve().parent.parent / "README.md"
RULE_HEADER = "| id | name | severity | applies to (parallelism) | what it finds |\n|---|---|---|---|---|\n"


def rule_table() -> str:
    return RULE_HEADER + "".join(
        f"| {r.id} | `{r.name}` | {r.severity} | {applies_summary(r)} | {r.summary} |\n" for r in load_rules()
    )


def main() -> None:
    text = README.read_text()
    start = text.index(RULE_HEADER)
    end = start + len(RULE_HEADER)
    while text[end:].startswith("| "):
        end = text.index("\n", end) + 1
    text = text[:start] + rule_table() + text[end:]
    knob_start = text.index("| knob | what it changes in your program |")
    knob_end = knob_start
    while text[knob_end:].startswith("|"):
        knob_end = text.index("\n", knob_end) + 1
    text = text[:knob_start] + knobs.table_markdown().rstrip("\n") + "\n" + text[knob_end:]
    text = re.sub(
        r"(<!-- metric-tables:[^\n]*-->\n)(.*?)(<!-- /metric-tables -->)",
        lambda m: m.group(1) + catalog.markdown_tables() + m.group(3),
        text,
        flags=re.S,
    )
    README.write_text(text)


if __name__ == "__main__":
    main()
