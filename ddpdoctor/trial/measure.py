"""What a knob changed: the trial (B) against the control (A: the same command, the same steps, no knob), read
through the one pipeline and compared with ``ddpdoctor.compare``; every timing with the bootstrap interval the
gate uses (``compare.stats.change_interval``), and a verdict only the interval can give.

- ``helps``: the job's median step time is lower and the interval of the change excludes no change;
- ``hurts``: higher, and the interval excludes no change;
- ``no measurable effect``: the interval holds no change (or too few steps to tell);
- ``failed``: the trial did not run to its end, or its knob did not apply (``execute``).

The measured gain is A's median step minus B's (ms per step); its interval is A's median times the interval of
the relative change. A rule's estimate is set against it (ratio measured / estimated) so that rules whose
estimates are off can be recalibrated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.compare import Comparison, compare, stats, units
from ddpdoctor.compare import snapshot as snap
from ddpdoctor.compare.catalog import METRICS
from ddpdoctor.compare.gate import OTHER_CPUS_MORE

HELPS, HURTS, NO_EFFECT, FAILED = "helps", "hurts", "no measurable effect", "failed"
# Other processes' CPUs (``other_cpu_cores``) in a trial beyond those in every control run (or below, for a gain):
# from ``OTHER_CPUS_MORE`` (the gate's margin for the same question), a run's change cannot be told from the
# host's. Both controls can agree, and still a trial that ran in a quieter spell of a busy machine looked faster
# (202 -> 110 ms, controls 203 and 182, beside a test suite): the drift between the controls cannot see that,
# what the runs recorded of the host can.


@dataclass(frozen=True)
class Change:
    """One metric, A (control) and B (trial). ``interval``: of B/A - 1, or of B - A for a ratio (0-1) such as
    overlap, whose B/A from a near-0 A says little (None: too few samples, or A is 0)."""

    name: str
    label: str
    a: float | None
    b: float | None
    interval: stats.Interval | None
    relative: bool = True

    @property
    def ratio(self) -> float | None:
        return None if self.a in (None, 0) or self.b is None else self.b / self.a

    def to_json(self) -> dict[str, Any]:
        interval = None if self.interval is None else [self.interval.low, self.interval.high]
        out: dict[str, Any] = {"metric": self.name, "a": self.a, "b": self.b, "ratio": self.ratio}
        if self.relative:
            out["ratio_interval"] = None if interval is None else [1 + interval[0], 1 + interval[1]]
        else:
            out["difference"] = None if self.a is None or self.b is None else self.b - self.a
            out["difference_interval"] = interval
        out["confidence"] = None if self.interval is None else self.interval.confidence
        return out


@dataclass(frozen=True)
class Measurement:
    changes: tuple[Change, ...]
    verdict: str
    gain_ms: float | None  # A's median step - B's (ms per step; > 0: B is faster)
    gain_interval_ms: tuple[float, float] | None
    appeared: tuple[str, ...]  # findings B has and A has not
    went_away: tuple[str, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    # B/A interval of the median step against each control run on its own (before, after), and their medians
    step_vs_each_control: tuple[tuple[float, float] | None, ...] = ()
    control_step_ms: tuple[float | None, ...] = ()
    reason: str = ""  # why the verdict is what it is, in a few words (printed beside it)
    # other processes' CPUs during each control run and during the trial (None: not recorded)
    control_foreign_cpus: tuple[float | None, ...] = ()
    foreign_cpus: float | None = None

    def change(self, name: str) -> Change | None:
        return next((c for c in self.changes if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "verdict_reason": self.reason,
            "measured_gain_ms": self.gain_ms,
            "measured_gain_interval_ms": list(self.gain_interval_ms) if self.gain_interval_ms else None,
            "metrics": [c.to_json() for c in self.changes],
            "step_ratio_interval_vs_each_control": [list(i) if i else None for i in self.step_vs_each_control],
            "control_step_ms_median": list(self.control_step_ms),
            "control_other_cpu_cores": list(self.control_foreign_cpus),
            "other_cpu_cores": self.foreign_cpus,
            "findings_appeared": list(self.appeared),
            "findings_went_away": list(self.went_away),
            "notes": list(self.notes),
        }


def read(run_dir: Path, rules: Any) -> tuple[snap.Snapshot, Any]:
    """A trial's run directory through the one pipeline: its Snapshot and its Analysis."""
    from ddpdoctor.pipeline import analyze_run

    analysis = analyze_run(run_dir, rules=rules, traces_optional=True)
    captures = [analysis.captures[rank] for rank in sorted(analysis.captures)]
    notes = analysis.notes if analysis.metrics is None else []
    return snap.build(str(run_dir), captures, analysis.metrics, analysis.diagnosis, notes), analysis


def foreign_cpus(analysis: Any) -> float | None:
    """The CPUs other processes kept busy beside a run, on its busiest host in the profiled window (the ranks'
    ``other_cpu_cores``), or None where no rank recorded it."""
    ranks = getattr(getattr(analysis, "metrics", None), "ranks", None) or []
    values = [r.get("other_cpu_cores") for r in ranks]
    values = [float(v) for v in values if isinstance(v, (int, float)) and v == v]
    return max(values, default=None)


def _step_interval(control: snap.Snapshot, trial: snap.Snapshot) -> stats.Interval | None:
    a, b = control.samples.get("step_ms"), trial.samples.get("step_ms")
    return None if not a or not b else stats.change_interval(a, b, "median", relative=True)


def measure(
    controls: list[snap.Snapshot],
    trial: snap.Snapshot,
    foreign: tuple[list[float | None], float | None] = ([], None),
    *,
    spawns_processes: bool = False,
) -> Measurement:
    """B (``trial``) against A: the control runs made before and after the trials, pooled (``snapshot.combine``).

    The verdict needs the median step's change to exclude no change against the pooled controls *and* against
    each control run on its own: load that changed between the runs (a busy machine) moves the two controls
    apart, and then a change no bigger than that drift is "no measurable effect", never a gain. ``foreign``: the
    CPUs other processes used during each control and during the trial (``foreign_cpus``): a gain measured in a
    trial that had ``OTHER_CPUS_MORE`` fewer of them than every control (a loss, more than every control) is
    no verdict either. ``spawns_processes``: the knob starts processes of its own (DataLoader workers), which
    count as other processes: more of them in the trial is the knob, not the host."""
    control = snap.combine(controls)
    comparison: Comparison = compare(control, trial)
    changes = []
    for spec in METRICS:  # what compare shows, in its order
        name = spec.name
        a, b = control.value(name), trial.value(name)
        if a is None and b is None:
            continue
        interval = None
        key = spec.samples
        relative = spec.unit != "ratio"
        if key and key in control.samples and key in trial.samples:
            interval = stats.change_interval(
                control.samples[key], trial.samples[key], spec.statistic, relative=relative
            )
        changes.append(Change(name, spec.label, a, b, interval, relative))
    step = next((c for c in changes if c.name == "step_ms.median"), None)
    each = [_step_interval(c, trial) for c in controls]
    verdict, gain, gain_interval = NO_EFFECT, None, None
    notes = []
    reason = ""
    if step is not None and step.a is not None and step.b is not None:
        gain = step.a - step.b
        if step.interval is not None and all(i is not None for i in each):
            gain_interval = (-step.interval.high * step.a, -step.interval.low * step.a)
            intervals = [step.interval, *each]
            if all(i.high < 0 for i in intervals):  # type: ignore[union-attr]
                verdict = HELPS
                reason = "B's median step is shorter beyond the interval, against each control run"
            elif all(i.low > 0 for i in intervals):  # type: ignore[union-attr]
                verdict = HURTS
                reason = "B's median step is longer beyond the interval, against each control run"
            elif step.interval.excludes_zero() or (
                any(i.high < 0 for i in each) and any(i.low > 0 for i in each)  # type: ignore[union-attr]
            ):
                medians = ", ".join(units.value("step_ms.median", c.value("step_ms.median")) for c in controls)
                reason = "the control runs drifted apart: the change is within that drift"
                notes.append(
                    f"the change is within the drift between the control runs (median step {medians}): the "
                    "machine's load changed between the runs, so no verdict"
                )
            else:
                reason = "the interval of B/A includes no change"
        else:
            reason = "too few steps for an interval"
            notes.append(f"too few steps for an interval (at least {stats.MIN_SAMPLES} per run): no verdict")
    else:
        reason = "no step time in one of the runs"
        notes.append("no step time in one of the runs: no verdict")
    control_loads, trial_load = foreign
    known = [c for c in control_loads if c is not None]
    if verdict in (HELPS, HURTS) and trial_load is not None and len(known) == len(controls) and known:
        quieter = verdict == HELPS and trial_load <= min(known) - OTHER_CPUS_MORE
        busier = verdict == HURTS and not spawns_processes and trial_load >= max(known) + OTHER_CPUS_MORE
        if quieter or busier:
            loads = ", ".join(f"{c:.2f}" for c in known)
            notes.append(
                f"other processes used {trial_load:.2f} CPUs during the trial and {loads} during the control runs: "
                f"the trial ran on a {'quieter' if quieter else 'busier'} host, so its change cannot be told from "
                f"the host's; no verdict (B's median step {units.value('step_ms.median', step.b if step else None)})"
            )
            verdict = NO_EFFECT
            reason = f"the host was {'quieter' if quieter else 'busier'} during the trial than during each control run"
    notes += list(comparison.not_comparable)
    return Measurement(
        changes=tuple(changes),
        verdict=verdict,
        gain_ms=gain,
        gain_interval_ms=gain_interval,
        appeared=tuple(f["name"] for f in comparison.only_b),
        went_away=tuple(f["name"] for f in comparison.only_a),
        notes=tuple(notes),
        reason=reason,
        step_vs_each_control=tuple(None if i is None else (1 + i.low, 1 + i.high) for i in each),
        control_step_ms=tuple(c.value("step_ms.median") for c in controls),
        control_foreign_cpus=tuple(control_loads),
        foreign_cpus=trial_load,
    )
