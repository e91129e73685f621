"""The "Over time" section of a diagnosis (``run.over_time`` of the report document, made by
``ddpdoctor.metrics.overtime``), as lines for each format: each finding with when and how often it held across
the profiled windows, and the trends of the always-on series (step time drift, memory growth and the step at
which it runs out, the rank that kept reaching DDP's all-reduce last and since when). Every part that could not
be decided says "not evaluated" and why.

``lines(doc)`` is format-free text (the HTML report can show it as a list: ``html_items(doc)``).
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.report import fmt

TITLE = "Over time"


def lines(doc: dict[str, Any]) -> list[str]:
    """The section's lines (none when the run has no over-time record)."""
    ot = doc["run"].get("over_time")
    if not isinstance(ot, dict):
        return []
    out: list[str] = []
    found = ot.get("findings") or {}
    step_time, memory, arrivals = ot.get("step_time") or {}, ot.get("memory") or {}, ot.get("arrivals") or {}
    if not any(part.get("evaluated") for part in (found, step_time, memory, arrivals)):
        # a short run (one window, a few steps): one line, not three "not evaluated" in every report
        return [
            f"not evaluated: {found.get('reason')}; {step_time.get('reason')} "
            "(a long run traced with `--every` has them)"
        ]
    if found.get("evaluated"):
        n = found.get("windows")
        steps = found.get("window_steps") or []
        span = f" (steps {steps[0][0]}-{steps[-1][1]})" if steps else ""
        records = found.get("findings") or []
        if not records:
            out.append(f"findings over {n} windows{span}: none fired in any window")
        else:
            out.append(f"findings over {n} windows{span}:")
            out += [f"  {r['name']}: {r['text']}" for r in records]
    else:
        out.append(f"findings over time: not evaluated: {found.get('reason')}")
    for key, title in (("step_time", "step time"), ("memory", "memory"), ("arrivals", "late arrivals")):
        part = ot.get(key) or {}
        if not part.get("evaluated"):
            out.append(f"{title}: not evaluated: {part.get('reason')}")
        elif key == "memory":
            out += [
                d["text"] if d.get("evaluated") else f"{d['device']}: not evaluated: {d['reason']}"
                for d in part.get("devices") or []
            ]
        elif key == "arrivals":
            out.append(f"{title}: {part['text']}")
        else:
            out.append(part["text"])
    return out


def text_lines(doc: dict[str, Any]) -> list[str]:
    return lines(doc)


def markdown_lines(doc: dict[str, Any]) -> list[str]:
    body = lines(doc)
    if not body:
        return []
    out = [f"## {TITLE}", ""]
    for line in body:
        indent = "  " if line.startswith("  ") else ""
        out.append(f"{indent}- {fmt.md(line.strip())}")
    return out + [""]


def html_items(doc: dict[str, Any]) -> str:
    """The section as an HTML fragment (``<h2>`` and a list), escaped, `code spans` as code; "" without a record."""
    body = lines(doc)
    if not body:
        return ""
    items = "".join(f"<li>{fmt.esc_code(line.strip())}</li>" for line in body)
    return f'<h2>{TITLE}</h2><ul class="over-time">{items}</ul>'
