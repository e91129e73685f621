"""``ddpdoctor try``: run a traced job again with knobs applied by ddpdoctor's hooks and measure what they change.

The flow: ``plan`` reads RUN's command from its manifest; ``execute`` runs it (``trace --max-steps N --set ...``)
once without a knob (the control, A) and once per setting (B), each into ``<RUN>.trials/<n>/<setting>/``;
``measure`` compares each B with A through the one pipeline and ``ddpdoctor.compare``, with the gate's
bootstrap interval; ``render`` prints the result. ``results.json`` in the session folder keeps all of it,
including every rule's estimated gain against the measured one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor import knobs as knob_table
from ddpdoctor import rundir
from ddpdoctor.trial import measure as measure_mod
from ddpdoctor.trial.execute import TrialRun, run_trial
from ddpdoctor.trial.plan import RunCommand, setting_label

# Knobs whose trial runs processes the control has not (DataLoader workers; DataParallel as DDP ranks): a busier
# host in such a trial may be the knob's doing. (The ranks' child processes are left out of ``other_cpu_cores``
# since 2026-12-07, ``job_children_cpu_cores``; a trial of an older capture, or one whose new processes are not
# the ranks' children, still counts them there.)
SPAWNING_KNOBS = frozenset(("loader.num_workers", "loader.persistent_workers", "loader.prefetch_factor", "dp.as_ddp"))


@dataclass(frozen=True)
class Prescribed:
    """A finding of RUN and one setting its rule prescribes."""

    rule: str
    finding_id: str
    estimated_gain_ms: float | None
    settings: dict[str, str]


@dataclass
class Outcome:
    """One setting tried: the run, what it measured (None when it failed), and the findings it was tried for."""

    run: TrialRun
    measurement: measure_mod.Measurement | None
    prescribed: list[Prescribed] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return measure_mod.FAILED if self.measurement is None else self.measurement.verdict

    def code_lines(self) -> list[str]:
        return [knob_table.BY_NAME[k].code_line(knob_table.parse_value(k, v)) for k, v in self.run.settings.items()]


@dataclass
class Session:
    cmd: RunCommand
    folder: Path
    max_steps: int
    control: TrialRun  # before the trials
    outcomes: list[Outcome] = field(default_factory=list)
    control_after: TrialRun | None = None  # the same control, after the trials
    run_findings: list[Any] = field(default_factory=list)  # RUN's findings (ddpdoctor.diagnosis.Finding)

    def best(self) -> list[tuple[str, Outcome]]:
        """For each finding tried: the setting that helped most (only settings whose verdict is "helps")."""
        out = []
        for rule in dict.fromkeys(p.rule for o in self.outcomes for p in o.prescribed):
            helping = [
                o for o in self.outcomes if o.verdict == measure_mod.HELPS and any(p.rule == rule for p in o.prescribed)
            ]
            if helping:
                out.append((rule, max(helping, key=lambda o: o.measurement.gain_ms or 0.0)))  # type: ignore[union-attr]
        return out

    def to_json(self) -> dict[str, Any]:
        def run_json(t: TrialRun) -> dict[str, Any]:
            return {
                "settings": t.settings,
                "out": str(t.out),
                "log": str(t.log),
                "exit_code": t.exit_code,
                "seconds": round(t.seconds, 2),
                "error": t.error,
                "knobs": t.knobs,
            }

        trials = []
        for o in self.outcomes:
            entry = run_json(o.run)
            entry["verdict"] = o.verdict
            entry["measurement"] = o.measurement.to_json() if o.measurement else None
            entry["code"] = o.code_lines()
            entry["rules"] = [_estimate_json(p, o) for p in o.prescribed]
            trials.append(entry)
        return {
            "kind": "ddpdoctor-trials",
            "schema_version": 1,
            "run": str(self.cmd.run),
            "cwd": str(self.cmd.cwd),
            "max_steps": self.max_steps,
            "control": run_json(self.control),
            "control_after": run_json(self.control_after) if self.control_after else None,
            "trials": trials,
            "best": [{"rule": r, "settings": o.run.settings, "code": o.code_lines()} for r, o in self.best()],
        }


def _estimate_json(p: Prescribed, o: Outcome) -> dict[str, Any]:
    measured = o.measurement.gain_ms if o.measurement else None
    interval = o.measurement.gain_interval_ms if o.measurement else None
    ratio = None
    if measured is not None and p.estimated_gain_ms and not math.isclose(p.estimated_gain_ms, 0.0):
        ratio = measured / p.estimated_gain_ms
    return {
        "rule": p.rule,
        "finding": p.finding_id,
        "estimated_gain_ms": p.estimated_gain_ms,
        "measured_gain_ms": measured,
        "measured_gain_interval_ms": list(interval) if interval else None,
        "measured_over_estimated": ratio,
    }


def prescriptions(rules: Any, findings: Any, nproc_per_node: int) -> list[Prescribed]:
    """Every (finding, setting) the rules of RUN's findings prescribe, ``cpus_per_rank`` resolved."""
    from ddpdoctor.trial.plan import resolve

    by_name = {r.name: r for r in rules}
    out = []
    for f in findings:
        rule = by_name.get(f.name)
        for p in getattr(rule, "prescriptions", ()) or ():
            for value in p.values:
                settings = resolve({p.knob: value}, nproc_per_node)
                tried = Prescribed(f.name, f.id, f.estimated_gain_ms, settings)
                if tried not in out:  # cpus_per_rank may resolve to a value the list has already
                    out.append(tried)
    return out


def for_settings(rules: Any, findings: Any, settings: dict[str, str]) -> list[Prescribed]:
    """RUN's findings whose rules prescribe one of the knobs of ``settings`` (their estimate is checked)."""
    by_name = {r.name: r for r in rules}
    out = []
    for f in findings:
        rule = by_name.get(f.name)
        knobs = {p.knob for p in getattr(rule, "prescriptions", ()) or ()}
        if knobs & set(settings):
            out.append(Prescribed(f.name, f.id, f.estimated_gain_ms, settings))
    return out


def run_session(
    cmd: RunCommand,
    folder: Path,
    settings_list: list[dict[str, str]],
    *,
    max_steps: int,
    timeout_s: float,
    rules: Any,
    prescribed: list[Prescribed] | None = None,
    run_findings: list[Any] | None = None,
    progress: Any = None,
    trial_cmd: RunCommand | None = None,
) -> Session:
    """The control, then every setting; each measured against the control. ``trial_cmd``: the command the
    settings run with when it is not RUN's own (``--as-ddp``: torchrun with one process per device)."""
    say = progress or (lambda _text: None)
    total = len(settings_list)
    say(f"control, before the trials: {max_steps} steps, no knob ({total} trial(s) and a second control follow)")
    control = run_trial(cmd, folder, {}, max_steps=max_steps, timeout_s=timeout_s)
    say(run_done("control", control))
    session = Session(cmd, folder, max_steps, control, run_findings=list(run_findings or []))
    if not control.ok:
        write_results(session)
        return session
    runs = []
    for n, settings in enumerate(settings_list, 1):
        say(f"trial {n}/{total}: {setting_label(settings)}, {max_steps} steps")
        runs.append(run_trial(trial_cmd or cmd, folder, settings, max_steps=max_steps, timeout_s=timeout_s))
        say(run_done(f"trial {n}/{total}", runs[-1]))
        session.outcomes.append(Outcome(runs[-1], None, [p for p in prescribed or [] if p.settings == settings]))
        write_results(session)
    # A second control after the trials: load that changed meanwhile shows as a drift between the two.
    say("control, after the trials (load that changed meanwhile shows as a drift between the two controls)")
    session.control_after = run_trial(cmd, folder, {}, max_steps=max_steps, timeout_s=timeout_s, label="control-after")
    say(run_done("control, after the trials", session.control_after))
    read = [measure_mod.read(control.out, rules)]
    if session.control_after.ok:
        read.append(measure_mod.read(session.control_after.out, rules))
    controls = [snapshot for snapshot, _ in read]
    control_loads = [measure_mod.foreign_cpus(analysis) for _, analysis in read]
    for outcome in session.outcomes:
        if outcome.run.ok:
            trial, analysis = measure_mod.read(outcome.run.out, rules)
            outcome.measurement = measure_mod.measure(
                controls,
                trial,
                (control_loads, measure_mod.foreign_cpus(analysis)),
                spawns_processes=any(name in SPAWNING_KNOBS for name in outcome.run.settings),
            )
    write_results(session)
    return session


def run_done(what: str, run: TrialRun) -> str:
    """The line ``try`` prints when one of its runs ended: how long it took, and why it failed if it did."""
    took = f"{what}: done in {run.seconds:.0f} s"
    return took if run.ok else f"{took}, failed: {run.error}"


def write_results(session: Session) -> Path:
    path = session.folder / "results.json"
    rundir.atomic_write_bytes(path, (json.dumps(session.to_json(), indent=1, default=str) + "\n").encode())
    return path
