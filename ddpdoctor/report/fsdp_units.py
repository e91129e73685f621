"""The FSDP2 per-unit table of a diagnosis (``run.fsdp_units`` of the report document), in each format's shape.

One row per FSDP2 unit (a module ``fully_shard`` was called on; ``(root)`` is the last one, which holds what no
other unit took): the bytes its all-gather gathers and their share of all units', and per step the calls, time and
exposed time (no computation beside it on the rank) of its all-gathers and of its gradient reduces, the mean over
the ranks, and the rank where its exposed time was largest. Made by ``ddpdoctor.metrics.fsdp.run_units``.
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.report import fmt

TITLE = "FSDP2 units (ms per step, mean over ranks; exposed: with no computation beside it on the rank)"
COLUMNS = (
    ("unit", "l"),
    ("params", "r"),
    ("share", "r"),
    ("all-gathers", "r"),
    ("all-gather", "r"),
    ("exposed", "r"),
    ("reduces", "r"),
    ("reduce", "r"),
    ("exposed", "r"),
    ("worst rank", "r"),
)


def _count(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}".rstrip("0").rstrip(".")


def rows(doc: dict[str, Any]) -> list[list[str]]:
    """The table's cells, in ``COLUMNS`` order (none without FSDP2 units)."""
    out = []
    for u in doc["run"].get("fsdp_units") or []:
        out.append(
            [
                str(u.get("unit")),
                fmt.size(u.get("param_bytes")),
                fmt.ratio_pct(u.get("param_share")),
                _count(u.get("allgather_calls")),
                fmt.ms(u.get("allgather_ms")),
                fmt.ms(u.get("allgather_exposed_ms")),
                _count(u.get("reduce_calls")),
                fmt.ms(u.get("reduce_ms")),
                fmt.ms(u.get("reduce_exposed_ms")),
                "-" if u.get("worst_rank") is None else str(u["worst_rank"]),
            ]
        )
    return out


def note(doc: dict[str, Any]) -> str:
    """What the reduce column is on this backend."""
    if doc["run"].get("backend") == "gloo":
        return (
            "reduce: gloo has no reduce-scatter, so FSDP2's gradient reduce runs as an all-reduce of the whole "
            "gradient there (about twice the bytes a rank moves in NCCL's reduce-scatter), and on CPU FSDP2 waits "
            "for each collective in the training thread."
        )
    return "reduce: the gradient reduce-scatter (plus HSDP's all-reduce where there is one)."


def text_lines(doc: dict[str, Any]) -> list[str]:
    """The table as aligned plain-text lines (title excluded), then the note; none without units."""
    body = rows(doc)
    if not body:
        return []
    header = [name for name, _ in COLUMNS]
    widths = [max(len(header[i]), *(len(r[i]) for r in body)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return " ".join(
            c.ljust(w) if align == "l" else c.rjust(w) for c, w, (_, align) in zip(cells, widths, COLUMNS, strict=True)
        ).rstrip()

    return [line(header), *(line(r) for r in body), note(doc)]


def markdown_lines(doc: dict[str, Any]) -> list[str]:
    body = rows(doc)
    if not body:
        return []
    out = [f"## {TITLE}", ""]
    out.append("| " + " | ".join(name for name, _ in COLUMNS) + " |")
    out.append("|" + "|".join("---:" if a == "r" else ":---" for _, a in COLUMNS) + "|")
    out += ["| " + " | ".join(fmt.md(c) for c in r) + " |" for r in body]
    return [*out, "", fmt.md(note(doc)), ""]


def html_parts(doc: dict[str, Any]) -> list[str]:
    body = rows(doc)
    if not body:
        return []
    left = ' class="l"'
    head = "".join(f"<th{left if a == 'l' else ''}>{fmt.esc(n)}</th>" for n, a in COLUMNS)
    cells = [
        "<tr>"
        + "".join(f"<td{left if a == 'l' else ''}>{fmt.esc(c)}</td>" for c, (_, a) in zip(r, COLUMNS, strict=True))
        + "</tr>"
        for r in body
    ]
    return [
        f"<h2>{fmt.esc(TITLE)}</h2>",
        f"<table><tr>{head}</tr>{''.join(cells)}</table>",
        f'<p class="note">{fmt.esc(note(doc))}</p>',
    ]
