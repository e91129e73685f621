"""The text ``ddpdoctor try`` prints: per setting, A (control) vs B with B/A and its interval, the verdict, the
findings that appeared or went away, a rule's estimate against the measurement; with ``--findings`` one table of
every finding and setting tried and the best setting with the line of code to write."""

from __future__ import annotations

from typing import TextIO

from ddpdoctor.compare import units
from ddpdoctor.trial import Outcome, Session
from ddpdoctor.trial import measure as m


def _change(c: m.Change) -> str:
    """``x0.74 [0.67, 0.91]`` (B/A) or, for a ratio such as overlap, ``+0.31 [+0.12, +0.52]`` (B - A)."""
    if c.a is None or c.b is None:
        return "n/a"
    if c.relative:
        text = "—" if c.ratio is None else f"x{c.ratio:.2f}"
        return text + ("" if c.interval is None else f" [{1 + c.interval.low:.2f}, {1 + c.interval.high:.2f}]")
    text = f"{c.b - c.a:+.2f}"
    return text + ("" if c.interval is None else f" [{c.interval.low:+.2f}, {c.interval.high:+.2f}]")


def _ms(value: float) -> str:
    return f"{value:+.2f}" if abs(value) < 1 else f"{value:+.1f}"


def _gain(o: Outcome) -> str:
    if o.measurement is None or o.measurement.gain_ms is None:
        return "—"
    text = f"{_ms(o.measurement.gain_ms)} ms"
    if o.measurement.gain_interval_ms:
        lo, hi = o.measurement.gain_interval_ms
        text += f" [{_ms(lo)}, {_ms(hi)}]"
    return text


def _short(text: str | None, width: int = 300) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(rows: list[list[str]], stream: TextIO, indent: str = "  ") -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        stream.write(indent + "  ".join(cells).rstrip() + "\n")


def render(session: Session, stream: TextIO, *, findings_table: bool = False) -> None:
    w = stream.write
    w(f"ddpdoctor try {session.cmd.run}\n")
    w(
        f"A: control: the same command, {session.max_steps} steps, no knob, run before and after the trials "
        f"({session.control.out}, -after)\n"
    )
    if not session.control.ok:
        w(f"\nThe control run failed, so nothing can be measured: {_short(session.control.error)}\n")
        w(f"Its output: {session.control.log}\n")
        return
    after = session.control_after
    if after is not None and not after.ok:
        w(f"note: the control run after the trials failed ({_short(after.error, 120)}): A is the first one alone\n")
    for o in session.outcomes:
        w("\n")
        _outcome(o, stream)
    if findings_table:
        _findings(session, stream)
    w(f"\nResults: {session.folder / 'results.json'}\n")


def _outcome(o: Outcome, stream: TextIO) -> None:
    w = stream.write
    w(f"B: {o.run.label} ({o.run.out})\n")
    if o.measurement is None:
        w(f"  failed: {_short(o.run.error)}\n")
        w(f"  its output: {o.run.log}\n")
        return
    me = o.measurement
    step = me.change("step_ms.median")
    head = f"  verdict: {me.verdict}" + (f" ({me.reason})" if me.reason else "")
    if step is not None and step.a is not None and step.b is not None:
        head += f": median step {units.value(step.name, step.a)} -> {units.value(step.name, step.b)}"
        head += f", gain {_gain(o)} per step"
        if step.interval is not None:
            head += f" ({step.interval.confidence * 100:.0f}% interval)"
    w(head + "\n")
    if len(me.control_step_ms) > 1:
        each = "; ".join(
            f"{when} {units.value('step_ms.median', ms)}" + ("" if i is None else f" (B/A [{i[0]:.2f}, {i[1]:.2f}])")
            for when, ms, i in zip(("before", "after"), me.control_step_ms, me.step_vs_each_control, strict=False)
        )
        w(f"  control runs, median step: {each}\n")
    rows = [["metric", "A", "B", "B/A (B-A for ratios) [95% interval]"]]
    for c in me.changes:
        rows.append([c.label, units.value(c.name, c.a), units.value(c.name, c.b), _change(c)])
    _table(rows, stream, indent="    ")
    if me.went_away:
        w(f"  findings that went away: {', '.join(me.went_away)}\n")
    if me.appeared:
        w(f"  findings that appeared: {', '.join(me.appeared)}\n")
    if not me.went_away and not me.appeared:
        w("  findings: the same in A and B\n")
    for p in o.prescribed:
        est = "no estimate" if p.estimated_gain_ms is None else f"estimated {p.estimated_gain_ms:.1f} ms"
        ratio = ""
        if p.estimated_gain_ms and me.gain_ms is not None:
            ratio = f" (measured / estimated: {me.gain_ms / p.estimated_gain_ms:.2f})"
        w(f"  {p.rule}: {est}, measured {_gain(o)} per step{ratio}\n")
    for note in me.notes:
        w(f"  note: {_short(note, 240)}\n")
    if me.verdict == m.HELPS:
        w("  to keep it: " + "; ".join(o.code_lines()) + "\n")


def _findings(session: Session, stream: TextIO) -> None:
    w = stream.write
    tried = [(p, o) for o in session.outcomes for p in o.prescribed]
    w("\nPrescriptions tried\n")
    if not tried:
        w("  none: no finding of this run has a rule that prescribes a knob\n")
        return
    rows = [["finding", "knob", "estimated gain", "measured gain per step (95% interval)", "verdict"]]
    for p, o in tried:
        est = "—" if p.estimated_gain_ms is None else f"{p.estimated_gain_ms:.1f} ms"
        verdict = o.verdict if o.measurement is not None else f"failed: {_short(o.run.error, 60)}"
        rows.append([p.rule, o.run.label, est, _gain(o), verdict])
    _table(rows, stream)
    best = session.best()
    rules = dict.fromkeys(p.rule for p, _ in tried)
    for rule in rules:
        found = next((o for r, o in best if r == rule), None)
        if found is None:
            w(f"best for {rule}: none of its settings measurably helped\n")
        else:
            w(f"best for {rule}: {found.run.label} ({_gain(found)} per step): {'; '.join(found.code_lines())}\n")
