"""Terminal report (rich): findings first (errors, then most costly first); then per-rank step breakdown and memory.

Nothing from a trace or a rule file is ever parsed as rich markup: every string goes in as ``rich.text.Text``
(and the console has markup, emoji and highlighting off); control characters are shown escaped."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from ddpdoctor.diagnosis.findings import Diagnosis, format_ranks
from ddpdoctor.report import fmt, fsdp_units, over_time
from ddpdoctor.report import timeline as step_timeline
from ddpdoctor.report.document import (
    RANK_STATUS_TITLE,
    Listed,
    build,
    grouped_not_evaluated,
    health_lines,
    health_title,
    listed_ranks,
    override_lines,
    rank_table,
    status_justify,
    trial_lines,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
WIDTH_NOT_A_TERMINAL = 100


def _console(stream: TextIO) -> Console:
    from ddpdoctor.report import console as report_console

    return report_console.console(stream, WIDTH_NOT_A_TERMINAL)


def _t(value: Any, style: str = "") -> Text:
    from ddpdoctor.report import console as report_console

    return report_console.text(value, style)


def _cell_len(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


class _NeedsRich(Exception):
    """The plain writer met something rich would do more with than write it as it is."""


class _PlainText:
    """The part of ``rich.text.Text`` the report uses, without styles: on a console without colour rich writes a
    Text's string as it is when each of its lines is printable and fits the width (``_PlainConsole`` checks)."""

    __slots__ = ("plain",)

    def __init__(self, text: str = "", style: str = "") -> None:
        self.plain = text

    def append(self, text: str, style: str = "") -> _PlainText:
        self.plain += text
        return self

    def __add__(self, other: _PlainText) -> _PlainText:
        return _PlainText(self.plain + other.plain)


def _plain_t(value: Any, style: str = "") -> _PlainText:
    return _PlainText(fmt.plain(value))


_ONE_COLUMN = frozenset("·→─")  # the report's own non-ASCII characters: one column each (rich.cells agrees)
_WORD = re.compile(r"\s*\S+\s*")  # rich._wrap's word: leading blanks, the word, its trailing blanks
_TRAILING_BLANKS = re.compile(r"\s+$")


class _PlainConsole:
    """Writes the text report as rich would on a console without colour (not a terminal), without importing rich
    (~25 ms of a cold start). Lines are wrapped at spaces as ``rich.text.Text.wrap`` wraps them (``_wrap``);
    anything else rich would do (a word wider than the console, a character that is not printable or not one
    column wide) raises ``_NeedsRich``, and the report is then drawn by rich from the start: the output is the
    same either way (tests/unit/test_report_plain.py compares them)."""

    is_terminal = False
    color_system = None

    def __init__(self, width: int) -> None:
        self.width = width
        self.file = io.StringIO()

    def _wrap(self, line: str) -> str:
        """``line`` as ``Text.wrap`` (justify and overflow left to their defaults, "fold") lays it out."""
        if not line.isprintable() or not (line.isascii() or all(c.isascii() or c in _ONE_COLUMN for c in line)):
            raise _NeedsRich
        width = self.width
        if len(line) <= width:  # every word fits: rich_wrap.divide_line breaks nowhere
            return line
        breaks = []
        offset = 0
        match = _WORD.match(line, 0)
        while match is not None:  # rich._wrap.divide_line, for words that fit on a line of their own
            start, end = match.span()
            word = match.group(0)
            length = len(word.rstrip())
            if width - offset >= length:
                offset += len(word)
            elif length > width:
                raise _NeedsRich  # rich folds the word
            elif offset and start:
                breaks.append(start)
                offset = len(word)
            match = _WORD.match(line, end)
        pieces = []
        for a, b in zip([0, *breaks], [*breaks, len(line)], strict=True):
            piece = line[a:b]
            if len(piece) > width:  # Text.rstrip_end: blanks beyond the width go
                blanks = _TRAILING_BLANKS.search(piece)
                if blanks:
                    piece = piece[: len(piece) - min(len(blanks.group(0)), len(piece) - width)]
                if len(piece) > width:
                    raise _NeedsRich  # rich crops it
            pieces.append(piece)
        return "\n".join(pieces)

    def print(self, *objects: Any, style: str = "", overflow: str = "") -> None:
        if not objects:
            self.file.write("\n")
            return
        if len(objects) != 1 or not isinstance(objects[0], _PlainText):
            raise _NeedsRich
        self.file.write("\n".join(map(self._wrap, objects[0].plain.split("\n"))) + "\n")


def _header(doc: dict[str, Any], Text: Any = None) -> Text:
    if Text is None:
        from rich.text import Text
    run = doc["run"]
    title = Text("ddpdoctor diagnosis: ", style="bold")
    title.append(fmt.plain(run["path"] or "(unknown run)"))
    facts = [
        f"mode {run['mode'] or '?'}",
        *([f"parallelism {run['parallelism']}"] if run.get("parallelism") else []),
        f"world size {run['world_size'] if run['world_size'] is not None else '?'}",
        f"backend {run['backend'] or 'none'}",
        fmt.steps_analysed(run["steps_analyzed"]),
    ]
    title.append("\n" + " · ".join(fmt.plain(f) for f in facts), style="dim")
    if run.get("ddp_comm_hook"):
        title.append("\ncomm hook: " + fmt.plain(run["ddp_comm_hook"]), style="dim")
    overrides = override_lines(doc)
    if overrides:
        title.append("\nthresholds from a config file: " + "; ".join(fmt.plain(o) for o in overrides), style="dim")
    return title


def _input(console: Console, doc: dict[str, Any], Text: Any, _t: Callable[..., Any]) -> None:
    """Files that could not be used and what else to know about the input, before any finding."""
    skipped, notes = doc["run"]["skipped"], doc["run"]["notes"]
    if skipped:
        console.print(Text(f"Skipped ({len(skipped)})", style="bold yellow"))
        for line in skipped:
            console.print(_t("  " + line), overflow="fold")
    if notes:
        console.print(Text("Notes", style="bold"))
        for line in notes:
            console.print(_t("  " + line), overflow="fold")
    if skipped or notes:
        console.print()


def _findings(console: Console, result: Diagnosis, Text: Any, _t: Callable[..., Any]) -> None:
    if not result.findings:
        console.print(Text("No findings.", style="bold green"))
        return
    console.print(Text(f"Findings ({len(result.findings)}), errors first, then most costly", style="bold underline"))
    for i, f in enumerate(result.findings, 1):
        head = Text(f"{i}. ")
        head.append(f"{f.severity.upper():<8}", style=SEVERITY_STYLE.get(f.severity, ""))
        head.append(f" {f.id} {f.name}", style="bold")
        head.append(f"  [{format_ranks(f.ranks)}]")
        if f.estimated_gain_ms is not None:
            head.append(f"  {fmt.gain(f.estimated_gain_ms)}", style="bold")
        console.print(head)
        console.print(_t(f.message), style="", overflow="fold")
        console.print(Text("→ ", style="green") + _t(f.recommendation))
        evidence = "; ".join(f"{k} = {fmt.evidence_value(v)}" for k, v in f.evidence.items())
        console.print(Text("evidence: ", style="dim") + _t(evidence, "dim"))
        console.print()


_RANK_TITLE = "Per-rank step breakdown (ms per step; p50/p90: step time)"


def _rank_table_parts(
    doc: dict[str, Any], listed: Listed | None = None
) -> tuple[str, list[str], str, list[list[str]], str | None] | None:
    """(title, header, justification, rows, note) of the per-rank table (``document.rank_table``), None for
    none."""
    table = rank_table(doc, listed)
    if table is None:
        return None
    header = [short for _, short in table.columns]
    if table.kind == "status":
        return RANK_STATUS_TITLE, header, status_justify(table.columns), table.rows, table.note
    return _RANK_TITLE, header, "r" * len(header), table.rows, table.note


def _rank_table(doc: dict[str, Any], parts: Any = None) -> Table | None:
    """The rank table for rich (``parts``: ``_rank_table_parts(doc)`` when the caller has them)."""
    from rich import box
    from rich.table import Table

    parts = _rank_table_parts(doc) if parts is None else parts
    if parts is None:
        return None
    title, columns, justify, rows, _ = parts
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", padding=(0, 0))
    for i, col in enumerate(columns):
        # numbers never get squeezed into "3…": the column is at least as wide as its widest value
        table.add_column(
            col,
            justify="right" if justify[i] == "r" else "left",
            min_width=max([len(row[i]) for row in rows] + [len(col)]),
        )
    for row in rows:
        table.add_row(*(_t(cell) for cell in row))
    return table


def _rank_table_lines(doc: dict[str, Any], console: Console, parts: Any = None) -> list[str] | None:
    """The rank table as rich draws it (``_rank_table``), as plain lines (``_plain_table``); ``parts``:
    ``_rank_table_parts(doc)`` when the caller has them (16,384 rows are formatted once, not twice)."""
    parts = _rank_table_parts(doc) if parts is None else parts
    if parts is None:
        return []
    title, header, justify, rows, _ = parts
    return _plain_table(console, title, header, justify, rows, padding=0)


def _plain_table(
    console: Console, title: str, header: list[str], justify: str, rows: list[list[str]], padding: int
) -> list[str] | None:
    """A ``box.SIMPLE_HEAD`` table with a left-justified title exactly as rich draws it on a console without
    colour, as plain lines: each column as wide as its widest cell, cells padded by ``padding`` and justified
    ``justify`` ("r"/"l" per column). None where rich would do more than pad the cells (colour, a table wider
    than the console, a cell with a character that is not one column wide or that ``fmt.plain`` escapes). rich
    takes ~2 ms a row: half a minute for the 16,384 rows of a large job."""
    if console.is_terminal or console.color_system is not None:
        return None
    cells = [header, *rows]
    for row in cells:  # printable (nothing for fmt.plain to escape), each character one column wide
        joined = "".join(row)
        if not (joined.isprintable() and (joined.isascii() or all(_cell_len(c) == len(c) for c in row))):
            return None
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    width = 2 + sum(w + 2 * padding for w in widths) + len(widths) - 1
    if width > console.width or len(title) > width:
        return None
    pad = " " * padding
    just = [str.rjust if j == "r" else str.ljust for j in justify]

    def line(row: list[str]) -> str:
        return " " + " ".join(pad + j(c, w) + pad for c, w, j in zip(row, widths, just, strict=True)) + " "

    blank = " " * width
    return [title.ljust(width), blank, line(header), " " + "─" * (width - 2) + " ", *map(line, rows), blank]


def _print_table(
    console: Console, lines: list[str] | None, table: Any, note: str | None = None, text: Callable[..., Any] = _t
) -> None:
    """``lines`` (``_plain_table``) written as they are, else ``table()`` printed by rich; then ``note`` (which
    rows the table shows, where not every rank's), made by ``text`` (the console's kind of Text)."""
    if lines is None:
        if isinstance(console, _PlainConsole):
            raise _NeedsRich
        console.print(table())
    else:
        console.file.write("\n".join(lines) + "\n")
    if note:
        console.print(text(f"  ({note})"), overflow="fold")
        console.print()


_MEMORY_COLUMNS = (
    ("rank", "right"),
    ("device", "left"),
    ("allocated", "right"),
    ("reserved", "right"),
    ("capacity", "right"),
    ("used", "right"),
)


def _memory_rows(doc: dict[str, Any], listed: Listed | None = None) -> list[list[str]]:
    out = []
    for r in (listed or listed_ranks(doc))[0]:
        for d in r["devices"]:
            used = None
            if d["peak_reserved_bytes"] is not None and d["capacity_bytes"]:
                used = d["peak_reserved_bytes"] / d["capacity_bytes"]
            out.append(
                [
                    str(r["rank"]),
                    str(d["device"] if d["device"] is not None else "?"),
                    fmt.size(d["peak_allocated_bytes"]),
                    fmt.size(d["peak_reserved_bytes"]),
                    fmt.size(d["capacity_bytes"]),
                    fmt.ratio_pct(used),
                ]
            )
    return out


def _memory_table_lines(doc: dict[str, Any], console: Console, listed: Listed | None = None) -> list[str] | None:
    """The memory table as rich draws it (``_memory_table``), as plain lines (``_plain_table``)."""
    rows = _memory_rows(doc, listed)
    header = [name for name, _ in _MEMORY_COLUMNS]
    justify = "".join(j[0] for _, j in _MEMORY_COLUMNS)
    return _plain_table(console, "Memory per device (peak)", header, justify, rows, padding=1)


def _memory_table(doc: dict[str, Any], listed: Listed | None = None) -> Table | None:
    from rich import box
    from rich.table import Table

    rows = _memory_rows(doc, listed)
    if not rows:
        return None
    table = Table(title="Memory per device (peak)", box=box.SIMPLE_HEAD, title_justify="left")
    for col, justify in _MEMORY_COLUMNS:
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(_t(cell) for cell in row))
    return table


def render(result: Diagnosis, stream: TextIO) -> None:
    """Write the terminal report of ``result`` to ``stream`` (colour only when it is a terminal)."""
    doc = build(result)
    if not bool(getattr(stream, "isatty", lambda: False)()):  # the same test as report.console.console
        plain = _PlainConsole(WIDTH_NOT_A_TERMINAL)
        try:
            _write(plain, result, doc, _PlainText, _plain_t)
        except _NeedsRich:
            pass
        else:
            stream.write(plain.file.getvalue())
            stream.flush()
            return
    from rich.text import Text

    _write(_console(stream), result, doc, Text, _t)


def _write(console: Any, result: Diagnosis, doc: dict[str, Any], Text: Any, _t: Callable[..., Any]) -> None:
    """The report on ``console``: rich's, or ``_PlainConsole`` with ``_PlainText`` for Text."""
    console.print(_header(doc, Text))
    console.print()
    _input(console, doc, Text, _t)
    _findings(console, result, Text, _t)
    pointer = step_timeline.perfetto_pointer(result)
    if pointer:  # where the HTML report draws its step timeline
        console.print(Text(step_timeline.TITLE, style="bold"))
        console.print(_t("  " + pointer), overflow="fold")
        console.print()
    health = health_lines(doc)
    if health:
        console.print(Text(health_title(doc), style="bold"))
        for line in health:
            console.print(_t("  " + line), overflow="fold")
        console.print()
    trials = trial_lines(doc)
    if trials:
        console.print(Text(f"Trials of this run ({len(trials)}, ddpdoctor try)", style="bold"))
        for line in trials:
            console.print(_t("  " + line), overflow="fold")
        console.print()
    listed = listed_ranks(doc)  # once: the rank table's and the memory table's rows
    parts = _rank_table_parts(doc, listed)
    if parts is not None:
        _print_table(console, _rank_table_lines(doc, console, parts), lambda: _rank_table(doc, parts), parts[4], _t)
    if any(r["devices"] for r in doc["ranks"]):
        lines = _memory_table_lines(doc, console, listed)
        _print_table(console, lines, lambda: _memory_table(doc, listed), listed[1], _t)
    timeline = over_time.text_lines(doc)
    if timeline:
        console.print(Text(over_time.TITLE, style="bold"))
        for line in timeline:
            console.print(_t("  " + line), overflow="fold")
        console.print()
    units = fsdp_units.text_lines(doc)
    if units:
        console.print(Text(fsdp_units.TITLE, style="bold"))
        for line in units:
            console.print(_t("  " + line), overflow="fold")
        console.print()
    if result.not_evaluated:
        console.print(Text(f"Not evaluated ({len(result.not_evaluated)})", style="bold"))
        for reason, names in grouped_not_evaluated(result).items():
            console.print(Text("  " + ", ".join(names), style="bold") + _t(": " + reason), overflow="fold")
    if doc["passed_reasons"]:
        console.print(Text(f"Passed ({len(doc['passed_reasons'])})", style="bold"))
        for p in doc["passed_reasons"]:
            line = Text("  " + p["name"], style="bold")
            console.print(line + _t(": " + p["reason"]) if p["reason"] else line, overflow="fold")
