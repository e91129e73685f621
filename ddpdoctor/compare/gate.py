"""``gate(current, baseline, config) -> GateResult``: metric by metric, rule by rule, and the environment.

A metric is a **regression** when its change goes past its threshold in the worse direction **and** the
per-step samples show that the change is not noise: the bootstrap interval of the change
(``ddpdoctor.compare.stats``) does not contain 0. A change past the threshold that the interval cannot tell
from noise is reported as "within noise" (a warning, not a failure). A noisy metric (a timing) without
per-step samples in both runs can warn but never fail; memory peaks, which do not vary from run to run, fail
on the threshold alone.

With a baseline of several runs (``Snapshot.runs``), a timing past its threshold is also compared with the
spread between the baseline runs: within the range of their own values (``stats.run_spread``: each run's median
step, overlap, ...; never wider than the metric can move; one wild run of 3 or more left out, and said so:
``wild_note``), it is "within run-to-run noise", a warning. A baseline
whose runs differ by more than a threshold cannot detect a change that small, and every gate report says so
(``sensitivity_note``), as ``ddpdoctor baseline`` does when it writes one.

A run that did not complete (``Snapshot.incomplete``: a rank failed, died, hung or was interrupted, a rank
is missing, too few steps), current or baseline, fails the gate whatever its numbers say: a crashed run's
few fast steps would otherwise pass as an improvement.

A timing regression that the host's load can explain is a warning, not a failure ("host busier"): where other
processes kept more of the host's CPUs busy during the current run than during the baseline (``other_cpu_cores``,
0.25 CPUs or more) and the current run's training loop waited for a CPU (``cpu_wait_ms``, the run queue, per
step) at least half the regression longer than the baseline's did, a shared CI runner's neighbours can account
for it (``host_explains``). The job's own threads make its loop wait too, but not other processes' CPUs: a change
that oversubscribes the host itself still fails.

A drop of ``overlap_ratio`` past its threshold is a warning ("not material") where the drop times the current run's
communication time a step is within ``exposed_comm_ms``'s threshold: with little communication the ratio swings
between healthy runs, and the time it can leave exposed is what the step pays (``overlap_matters``).

A rule fails the gate when it fires on the current run, did not fire on the baseline, and its severity is at
or above ``fail_on``. A different environment (``snapshot.ENV_KEYS``) is a warning, a failure with
``strict_env``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ddpdoctor.compare import catalog, stats, units
from ddpdoctor.compare.snapshot import ENV_KEYS, Snapshot, work_per_step_differs
from ddpdoctor.compare.thresholds import GateConfig, Threshold, defaults
from ddpdoctor.diagnosis.findings import SEVERITY_RANK

FAIL, WARN, OK = "fail", "warn", "ok"
HOST_BUSIER = "host busier"  # the verdict of a timing regression the host's load explains (host_explains)
NOT_MATERIAL = "not material"  # an overlap drop that left little more communication exposed (overlap_matters)
EXPOSED = "exposed_comm_ms"


@dataclass(frozen=True)
class MetricCheck:
    metric: str
    threshold: Threshold
    baseline: float | None
    current: float | None
    change: float | None  # relative (fraction) or absolute (metric unit), as the threshold is
    interval: stats.Interval | None
    # "regression" | "within noise" | "within run-to-run noise" | "host busier" | "not material" | "no samples"
    # | "ok" | "improved" | "not measured"
    verdict: str
    outcome: str  # FAIL | WARN | OK
    message: str
    # a baseline of several runs: how far a run may land from it by run-to-run noise (threshold's unit)
    run_spread: float | None = None
    spread: stats.RunSpread | None = None


@dataclass(frozen=True)
class RuleCheck:
    rule: str
    rule_id: str | None
    severity: str | None
    # "new finding" | "new finding below fail-on" | "already in baseline" | "resolved" | "not evaluated"
    # | "pass"
    verdict: str
    outcome: str
    message: str


@dataclass(frozen=True)
class EnvDiff:
    key: str
    baseline: object
    current: object


@dataclass(frozen=True)
class GateResult:
    baseline: Snapshot
    current: Snapshot
    config: GateConfig
    metrics: tuple[MetricCheck, ...]
    rules: tuple[RuleCheck, ...]
    env_diffs: tuple[EnvDiff, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    # "current: rank 1 failed (...)", "baseline: ...": a run that did not complete fails the gate
    incomplete: tuple[str, ...] = field(default_factory=tuple)

    @property
    def env_failed(self) -> bool:
        return bool(self.env_diffs) and self.config.strict_env

    @property
    def failed(self) -> bool:
        return bool(self.incomplete) or self.env_failed or any(c.outcome == FAIL for c in (*self.metrics, *self.rules))

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def failures(self) -> list[MetricCheck | RuleCheck]:
        return [c for c in (*self.metrics, *self.rules) if c.outcome == FAIL]

    def warnings(self) -> list[MetricCheck | RuleCheck]:
        return [c for c in (*self.metrics, *self.rules) if c.outcome == WARN]


def format_change(threshold: Threshold, change: float | None) -> str:
    return units.change(threshold.metric, change, threshold.relative)


def format_interval(threshold: Threshold, interval: stats.Interval | None, confidence: bool = True) -> str:
    """``[+3.1%, +9.8%] (95%)`` (without ``(95%)`` when ``confidence`` is False), ``n/a`` without one."""
    if interval is None:
        return "n/a"
    low, high = format_change(threshold, interval.low), format_change(threshold, interval.high)
    return f"[{low}, {high}]" + (f" ({interval.confidence * 100:.0f}%)" if confidence else "")


def _change(t: Threshold, base: float, cur: float) -> float:
    if not t.relative:
        return cur - base
    if base == 0:
        return 0.0 if cur == 0 else math.copysign(math.inf, cur)
    return cur / base - 1.0


def check_metric(
    t: Threshold, baseline: Snapshot, current: Snapshot, spread_confidence: float = stats.CONFIDENCE
) -> MetricCheck:
    """One gated metric. ``spread_confidence``: of the baseline runs' prediction interval (see ``gate``)."""
    spec = catalog.spec(t.metric)
    base, cur = baseline.value(t.metric), current.value(t.metric)
    if base is None or cur is None:
        missing = "either run" if base is None and cur is None else "the current run" if cur is None else "the baseline"
        outcome = WARN if base is not None else OK  # a metric that stopped being measured deserves a look
        return MetricCheck(
            t.metric,
            t,
            base,
            cur,
            None,
            None,
            "not measured",
            outcome,
            f"{t.metric}: not measured in {missing}",
        )
    change = _change(t, base, cur)
    interval = None
    if spec.samples and spec.samples in baseline.samples and spec.samples in current.samples:
        interval = stats.change_interval(
            baseline.samples[spec.samples], current.samples[spec.samples], spec.statistic, relative=t.relative
        )
    worse = t.exceeded_by(change)
    better = (change < -t.amount) if t.worse == "up" else (change > t.amount)
    current_runs = [r.get(t.metric) for r in current.runs]
    spread = _spread(t, baseline, current_runs) if spec.noisy else None
    shown = (
        f"{t.metric}: {units.value(t.metric, base)} -> {units.value(t.metric, cur)} "
        f"({format_change(t, change)}"
        + (f", interval {format_interval(t, interval)}" if interval is not None else "")
        + (
            f", run-to-run range {format_change(t, spread.margin).lstrip('+')} over {spread.runs} baseline"
            + (f" and {spread.current} current runs" if spread.current > 1 else " runs")
            + (" (as far as it can move: no change can be seen)" if spread.bounded else "")
            + (" (from its worse side: twice the whole range is all it can move)" if spread.one_sided else "")
            + (
                f", baseline run {spread.left_out + 1}'s {units.value(t.metric, spread.left_out_value)} left out"
                " as wild"
                if spread.left_out is not None and spread.left_out_value is not None
                else ""
            )
            if spread is not None
            else ""
        )
        + f"; threshold {t.text()})"
    )
    if worse and spread is not None and abs(change) <= spread.margin:
        return MetricCheck(
            t.metric,
            t,
            base,
            cur,
            change,
            interval,
            "within run-to-run noise",
            WARN,
            f"{shown}: past the threshold, but within the spread between the baseline runs",
            spread.margin,
            spread,
        )
    check = _verdict(t, spec, base, cur, change, interval, worse, better, shown)
    return replace(check, run_spread=spread.margin, spread=spread) if spread is not None else check


def _bound(t: Threshold, base: float) -> float | None:
    """The most ``t.metric`` can move from ``base`` in its worse direction, in the threshold's unit (None: no
    bound, as for a time that grows)."""
    spec = catalog.spec(t.metric)
    if t.relative:
        return 1.0 if spec.worse == "down" else None  # a time or a bandwidth cannot fall by more than 100%
    if spec.unit == "ratio":
        return max(base, 0.0) if spec.worse == "down" else max(1.0 - base, 0.0)
    return max(base, 0.0) if spec.worse == "down" else None


def _spread(t: Threshold, baseline: Snapshot, current_runs: list[float | None] | tuple = ()) -> stats.RunSpread | None:
    base = baseline.value(t.metric)
    if base is None:
        return None
    runs = [r.get(t.metric) for r in baseline.runs]
    return stats.run_spread(
        runs, base, relative=t.relative, current=current_runs, bound=_bound(t, base), floor=t.amount, worse=t.worse
    )


def _timing_spreads(baseline: Snapshot, config: GateConfig) -> list[tuple[Threshold, stats.RunSpread]]:
    """Each gated noisy metric's threshold and run-to-run spread over ``baseline``'s runs (those that have one)."""
    out = []
    for m in catalog.METRICS:
        t = config.thresholds.get(m.name)
        if t is None or not m.noisy:
            continue
        spread = _spread(t, baseline)
        if spread is not None:
            out.append((t, spread))
    return out


def wild_note(baseline: Snapshot, config: GateConfig) -> str | None:
    """The baseline runs left out of a metric's run-to-run range as wild (``stats.wild_run``), said loudly: the
    gate is stricter than those runs, and if runs like them are normal for the job the baseline needs more runs.
    None when no gated timing has one."""
    parts = []
    for t, spread in _timing_spreads(baseline, config):
        if spread.left_out is None or spread.left_out_value is None:
            continue
        name = t.metric
        others = [r.get(name) for i, r in enumerate(baseline.runs) if i != spread.left_out]
        shown = ", ".join(units.value(name, v) for v in others if v is not None)
        parts.append(
            f"run {spread.left_out + 1}'s {name} {units.value(name, spread.left_out_value)} (the others: {shown})"
        )
    if not parts:
        return None
    return (
        f"of the {len(baseline.runs)} baseline runs, one lies far from the others and is left out of the run-to-run "
        "range: " + "; ".join(parts) + ". The gate fails a run like it; if such runs are normal for this job, "
        "record the baseline from more runs"
    )


def sensitivity_note(baseline: Snapshot, config: GateConfig) -> str | None:
    """What a baseline of several runs cannot detect: the timings whose run-to-run range is wider than their
    threshold ("the 3 baseline runs differ by 78% in step time: this baseline cannot detect a change smaller than
    +78% in step_ms.median (threshold +5%)"); None when every gated timing can see its threshold."""
    if len(baseline.runs) < stats.MIN_RUNS:
        return None
    blind = [(t, spread) for t, spread in _timing_spreads(baseline, config) if spread.margin > t.amount]
    if not blind:
        return None
    k = len(baseline.runs)
    head = ""
    step = next((sp for t, sp in blind if t.metric == "step_ms.median"), None)
    if step is not None and step.low is not None and step.high is not None and step.low > 0:
        head = (
            f"the {k} baseline runs differ by {(step.high / step.low - 1) * 100:.0f}% in step time (median step "
            f"{step.low:,.1f} to {step.high:,.1f} ms): "
        )
    else:
        head = f"the {k} baseline runs differ widely: "
    parts = [
        f"any change of {t.metric} (its runs span all it can move)"
        if sp.bounded
        else f"{format_change(t, sp.margin)} in {t.metric} (threshold {t.text()})"
        for t, sp in blind
    ]
    return (
        head
        + "this baseline cannot detect a change smaller than "
        + "; nor ".join(parts)
        + ". Record it again from runs on a quieter machine (or from more runs), or gate on memory and rules only"
    )


def _verdict(
    t: Threshold,
    spec: catalog.MetricSpec,
    base: float,
    cur: float,
    change: float,
    interval: stats.Interval | None,
    worse: bool,
    better: bool,
    shown: str,
) -> MetricCheck:
    if worse:
        if interval is not None:
            if interval.excludes_zero():
                return MetricCheck(t.metric, t, base, cur, change, interval, "regression", FAIL, f"{shown}: regression")
            return MetricCheck(
                t.metric,
                t,
                base,
                cur,
                change,
                interval,
                "within noise",
                WARN,
                f"{shown}: past the threshold but within noise (the interval contains no change)",
            )
        if spec.noisy:
            return MetricCheck(
                t.metric,
                t,
                base,
                cur,
                change,
                None,
                "no samples",
                WARN,
                f"{shown}: past the threshold, but without {stats.MIN_SAMPLES}+ per-step samples "
                "in both runs it cannot be told from noise",
            )
        return MetricCheck(t.metric, t, base, cur, change, None, "regression", FAIL, f"{shown}: regression")
    if better and (interval is None and not spec.noisy or interval is not None and interval.excludes_zero()):
        return MetricCheck(t.metric, t, base, cur, change, interval, "improved", OK, f"{shown}: improved")
    return MetricCheck(t.metric, t, base, cur, change, interval, "ok", OK, f"{shown}: ok")


# The share of a timing regression (ms per step) the loop's extra wait for a CPU must reach to explain it, and
# how many more CPUs other processes must have used (``try`` uses the same margin, trial.measure).
HOST_SHARE = 0.5
OTHER_CPUS_MORE = 0.25


def host_explains(check: MetricCheck, baseline: Snapshot, current: Snapshot) -> MetricCheck:
    """A timing regression in ms (step time, data loading, exposed communication) as a warning where the
    current run's training loop waited at least ``HOST_SHARE`` of it longer per step for a CPU than the
    baseline's, and other processes used ``OTHER_CPUS_MORE`` more CPUs: the host's neighbours can explain it, the
    code need not be slower. Where either run did not record these (foreign traces, an older baseline), the
    check stands."""
    spec = catalog.spec(check.metric)
    if check.verdict != "regression" or check.outcome != FAIL or not spec.noisy or spec.unit != "ms":
        return check
    if check.baseline is None or check.current is None:
        return check
    before, after = baseline.value("cpu_wait_ms"), current.value("cpu_wait_ms")
    others_before, others = baseline.value("other_cpu_cores"), current.value("other_cpu_cores")
    regression = check.current - check.baseline
    if before is None or after is None or regression <= 0 or after - before < HOST_SHARE * regression:
        return check
    if others_before is None or others is None or others - others_before < OTHER_CPUS_MORE:
        return check  # the loop waited on the job's own threads (or it cannot be told)
    return replace(
        check,
        verdict=HOST_BUSIER,
        outcome=WARN,
        message=(
            f"{check.message.removesuffix(': regression')}: past the threshold, but the training loop waited "
            f"{after - before:,.1f} ms more per step for a CPU than in the baseline ({before:,.1f} -> {after:,.1f} ms) "
            f"while other processes used {others:.2f} CPUs "
            f"(baseline {others_before:.2f}): the host's load can explain the {regression:,.1f} ms; rerun on a "
            "quiet machine to decide"
        ),
    )


def overlap_matters(check: MetricCheck, baseline: Snapshot, current: Snapshot, config: GateConfig) -> MetricCheck:
    """An ``overlap_ratio`` regression as a warning where the communication it can have left exposed, the drop
    times the current run's communication time a step (``comm_ms``), is within ``exposed_comm_ms``'s threshold (as
    configured, else its default, also where that metric is not gated): the ratio of a job with under a millisecond
    of communication swings between healthy runs (a clean-clone CI run, 2026-12-06: 0.324 and 0.016 with about
    0.7 ms of communication a 33 ms step), and what a user pays is the time left exposed. Not the runs' own
    ``exposed_comm_ms``: it holds the wait for late ranks too, and a noisy baseline's can exceed a one-big-bucket
    run's (CI, 2026-12-07: 30.4 and 18.0 ms while the overlap fell from 0.64 to 0.08 of 85 ms). Where either run
    lacks the communication time, or the threshold is relative and the baseline has no exposed time, the check
    stands."""
    if check.metric != "overlap_ratio" or check.outcome != FAIL or check.baseline is None or check.current is None:
        return check
    t = config.thresholds.get(EXPOSED) or defaults().get(EXPOSED)
    comm = current.value("comm_ms")
    if t is None or comm is None:
        return check
    base_exposed = baseline.value(EXPOSED)
    if t.relative and base_exposed is None:
        return check
    limit = t.amount * base_exposed if t.relative and base_exposed is not None else t.amount
    exposed_more = max(0.0, check.baseline - check.current) * comm
    if exposed_more > limit:
        return check
    return replace(
        check,
        verdict=NOT_MATERIAL,
        outcome=WARN,
        message=(
            f"{check.message.removesuffix(': regression')}: past the threshold, but of {comm:,.2f} ms of"
            f" communication a step the drop leaves at most {exposed_more:,.2f} ms more exposed, within {EXPOSED}'s"
            f" threshold ({t.text()}): too little communication for its overlap to cost the step"
        ),
    )


def check_rules(baseline: Snapshot, current: Snapshot, fail_on: str | None) -> tuple[list[RuleCheck], list[str]]:
    if current.findings is None:
        return [], ["rules not checked: the current run has no diagnosis (trace metrics unavailable)"]
    if baseline.findings is None:
        return [], ["rules not checked: the baseline was made without a diagnosis (no findings recorded)"]
    before = {f["name"]: f for f in baseline.findings}
    now = {f["name"]: f for f in current.findings}
    threshold = SEVERITY_RANK[fail_on] if fail_on else None
    checks = []
    for name in sorted(set(current.rules_evaluated or []) | set(now) | set(before)):
        f = now.get(name) or before.get(name) or {}
        rid, sev = f.get("id"), f.get("severity")
        if name in now and name not in before:
            failing = threshold is not None and SEVERITY_RANK.get(sev, 0) >= threshold
            verdict = "new finding" if failing else "new finding below fail-on"
            checks.append(
                RuleCheck(
                    name,
                    rid,
                    sev,
                    verdict,
                    FAIL if failing else WARN,
                    f"{name} ({sev}): new finding: {now[name]['message']}",
                )
            )
        elif name in now:
            checks.append(
                RuleCheck(
                    name,
                    rid,
                    sev,
                    "already in baseline",
                    OK,
                    f"{name} ({sev}): also in the baseline: {now[name]['message']}",
                )
            )
        elif name in before and name in (current.rules_evaluated or []):
            checks.append(RuleCheck(name, rid, sev, "resolved", OK, f"{name}: in the baseline, gone now"))
        elif name in before:
            checks.append(
                RuleCheck(
                    name,
                    rid,
                    sev,
                    "not evaluated",
                    OK,
                    f"{name}: in the baseline; could not be evaluated on the current run",
                )
            )
        else:
            checks.append(RuleCheck(name, rid, sev, "pass", OK, f"{name}: no finding"))
    return checks, []


def env_diffs(baseline: Snapshot, current: Snapshot) -> list[EnvDiff]:
    out = []
    for key in ENV_KEYS:
        a, b = baseline.environment.get(key), current.environment.get(key)
        unknown = key in ("torch_version", "devices") and (a is None or b is None)  # foreign traces lack them
        if a != b and not unknown:
            out.append(EnvDiff(key, "none" if a is None else a, "none" if b is None else b))
    differs = work_per_step_differs(baseline, current)  # plain traces whose steps are not the same work
    if differs is not None:
        out.append(EnvDiff("optimizer_steps_per_step", *differs))
    return out


def gate(current: Snapshot, baseline: Snapshot, config: GateConfig) -> GateResult:
    """Compare ``current`` with ``baseline`` under ``config``'s thresholds (see the module docstring)."""
    order = [m.name for m in catalog.METRICS]
    gated = [name for name in order if name in config.thresholds]
    checks = [
        overlap_matters(
            host_explains(check_metric(config.thresholds[name], baseline, current), baseline, current),
            baseline,
            current,
            config,
        )
        for name in gated
    ]
    rules, notes = check_rules(baseline, current, config.fail_on)
    loud = sensitivity_note(baseline, config)
    wild = wild_note(baseline, config)
    if wild:
        notes.insert(0, wild)
    if loud:
        notes.insert(0, loud)
    timed = any(c.current is not None and c.baseline is not None and catalog.spec(c.metric).noisy for c in checks)
    if len(baseline.runs) < stats.MIN_RUNS and timed:
        notes.append(
            "the baseline is one run: its run-to-run noise (machine load, clocks, placement) is not measured, so "
            "a rerun of the same job can fail on timings; record it from 3 or more runs "
            "(ddpdoctor baseline RUN1 RUN2 RUN3 --output FILE)"
        )
    notes += [f"current: {n}" for n in current.notes] + [
        f"baseline: {n}"
        for n in baseline.notes
        # said above, for this gate's thresholds
        if not (loud and "cannot detect a change smaller than" in n)
        and not (wild and "left out of the run-to-run" in n)
    ]
    return GateResult(
        baseline,
        current,
        config,
        tuple(checks),
        tuple(rules),
        tuple(env_diffs(baseline, current)),
        tuple(notes),
        tuple(f"current run: {r}" for r in current.incomplete) + tuple(f"baseline: {r}" for r in baseline.incomplete),
    )
