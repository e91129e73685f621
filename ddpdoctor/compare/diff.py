"""``compare(a, b) -> Comparison``: two snapshots side by side, the ratio B/A of every metric, the findings
only one of them has, and what cannot be compared between them (modes, world sizes, batch, devices, unmeasured
parts).

Noise: a metric with per-step samples in both runs gets the bootstrap interval of B/A - 1 (``stats.change_interval``,
the gate's); the headline claims "faster" and the "better" column names a run only when that interval excludes 0,
that is when the difference is larger than the runs' own step-to-step noise. A timing without samples in both
runs names no better run (its noise is not measured); memory peaks, which do not vary from run to run, do.
Two runs of one command on a busy machine can still differ by more than their steps' noise (load between runs
is not in it): ``gate`` with a baseline of several runs measures that.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.compare import catalog, stats
from ddpdoctor.compare.catalog import MetricSpec
from ddpdoctor.compare.snapshot import Snapshot, work_per_step_differs
from ddpdoctor.metrics import catalog as metric_catalog

# DataParallel's stages after its scatter: times above 0 only where it replicated the module (metrics/dp.py)
_DP_STAGES = tuple(name for name in metric_catalog.group("dp_stages") if name != "dp_scatter_ms")

_MODE = {"dp": "DataParallel (one process)", "ddp": "DistributedDataParallel", "single": "single process"}


@dataclass(frozen=True)
class Row:
    spec: MetricSpec
    a: float | None
    b: float | None
    # B/A - 1 over the runs' per-step samples (None: not both have samples)
    interval: stats.Interval | None = None

    @property
    def ratio(self) -> float | None:
        """B / A (None when either is missing or A is 0)."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a

    @property
    def better(self) -> str | None:
        """ "A" or "B": which run is better on this metric (None when equal or not comparable)."""
        if self.a is None or self.b is None or self.a == self.b:
            return None
        if self.spec.noisy and (self.interval is None or not self.interval.excludes_zero()):
            return None  # within the runs' step-to-step noise, or noise not measured
        b_higher = self.b > self.a
        return ("A" if b_higher else "B") if self.spec.worse == "up" else ("B" if b_higher else "A")


@dataclass(frozen=True)
class Comparison:
    a: Snapshot
    b: Snapshot
    rows: tuple[Row, ...]
    only_a: tuple[dict, ...]  # findings (see Snapshot.findings) A has and B does not
    only_b: tuple[dict, ...]
    both: tuple[str, ...]  # rule names that fired on both
    headline: tuple[str, ...]
    not_comparable: tuple[str, ...]

    def row(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.spec.name == name), None)


def _mode_text(s: Snapshot) -> str:
    env = s.environment
    mode = _MODE.get(str(env.get("mode")), str(env.get("mode") or "unknown mode"))
    devices = ", ".join(env.get("devices") or []) or "?"
    return f"{mode}, world size {env.get('world_size', '?')}, backend {env.get('backend') or 'none'}, {devices}"


def _global_batch(s: Snapshot) -> int | None:
    per_rank, world = s.environment.get("batch_size_per_rank"), s.environment.get("world_size")
    return int(per_rank) * int(world or 1) if per_rank else None


def _headline(rows: dict[str, Row], a: Snapshot, b: Snapshot) -> list[str]:
    out = []
    step = rows["step_ms.median"]
    if step.ratio:
        faster = "B" if step.ratio < 1 else "A"
        factor = 1 / step.ratio if step.ratio < 1 else step.ratio
        iv = step.interval
        shown = f"B/A = {step.ratio:.2f}" + (
            f", {iv.confidence * 100:.0f}% interval {1 + iv.low:.2f}-{1 + iv.high:.2f}" if iv is not None else ""
        )
        work = _work_per_step(a, b)
        if work:
            verdict = f"no faster claim: {work}."
        elif iv is None:
            verdict = "no faster claim: without per-step samples in both runs their step-to-step noise is not measured."
        elif not iv.excludes_zero():
            verdict = "no faster claim: the difference is within the runs' own step-to-step noise."
        else:
            verdict = f"{faster} is {factor:.2f}x faster per step (beyond the runs' step-to-step noise)."
        out.append(
            f"Speed: median step A {step.a:,.1f} ms, B {step.b:,.1f} ms ({shown}): {verdict} {_step_source(a, b)}"
        )
    for label, s in (("A", a), ("B", b)):
        balance = s.value("gpu0_vs_others_ratio")
        gpu0 = s.value("gpu0_peak_reserved_bytes")
        if balance is not None:
            out.append(
                f"Memory balance {label}: GPU 0 holds {balance:.2f}x the memory of the busiest other GPU"
                + (" (unbalanced: GPU 0 runs out first)." if balance > 1.2 else " (balanced).")
            )
        elif gpu0 is not None:
            out.append(f"Memory {label}: only GPU 0 used.")
    return out


def _work_per_step(a: Snapshot, b: Snapshot) -> str | None:
    """What differs in the two runs' steps, where they are not the same work (``snapshot.work_per_step_differs``)."""
    differs = work_per_step_differs(a, b)
    if differs is None:
        return None
    ra, rb = differs
    return (
        f"the steps are not the same work: A's hold about {ra:.2g} optimizer step(s) each, B's about {rb:.2g}"
        " (a plain trace whose profiler was stepped every few iterations, or several times an iteration; or two"
        " optimizers of one class stepping in each iteration, which a plain trace counts twice)"
    )


def _step_source(a: Snapshot, b: Snapshot) -> str:
    """What the quoted medians are, and why they are not diagnose's."""
    notes = {s.sample_notes.get("step_ms") for s in (a, b)} - {None}
    outside = any("outside the profiled windows" in n for n in notes)
    return "(The median of each run's wall time per step, slowest rank per step" + (
        ", over the steps outside the profiled windows; diagnose's step_ms_median is each rank's median over "
        "the profiled steps, which recording slows, so it differs.)"
        if outside
        else "; diagnose's step_ms_median is each rank's own median, so it can differ.)"
    )


def _not_comparable(a: Snapshot, b: Snapshot, rows: list[Row]) -> list[str]:
    ea, eb = a.environment, b.environment
    out = []
    if ea.get("mode") != eb.get("mode") or ea.get("world_size") != eb.get("world_size"):
        out.append(
            f"Different set-ups: A is {_mode_text(a)}; B is {_mode_text(b)}. A step is comparable only "
            "when both process the same global batch."
        )
    ga, gb = _global_batch(a), _global_batch(b)
    if ga != gb:
        out.append(
            f"Global batch per step: A {ga if ga is not None else 'unknown'}, "
            f"B {gb if gb is not None else 'unknown'} (per-rank DataLoader batch x world size)"
            + (": step times are not the same work." if ga and gb else ".")
        )
    work = _work_per_step(a, b)
    if work:
        out.append(f"Steps: {work}, so every per-step number differs by that alone.")
    for label, s, side in (("A", a, "a"), ("B", b, "b")):
        env = s.environment
        if env.get("mode") != "dp":
            continue
        # a plain trace states no devices: its DP stages say whether DataParallel replicated the module
        staged = any((getattr(r, side) or 0) > 0 for r in rows if r.spec.name in _DP_STAGES)
        if env.get("devices") == ["cpu"]:
            out.append(
                f"{label} is DataParallel on CPU: DataParallel then calls the module directly (no scatter, "
                "replicas, gather or gradient reduction), so it measures a single process, not multi-GPU "
                "DataParallel; its DP stage times are 0."
            )
        elif env.get("devices") is None and not staged:
            out.append(
                f"{label} is DataParallel whose trace shows none of its stages: on CPU or over one device "
                "DataParallel calls the module directly (no replicas, gather or gradient reduction), so it "
                "measures a single process, not multi-GPU DataParallel."
            )
    for key in ("backend", "torch_version", "devices"):
        if ea.get(key) != eb.get(key) and ea.get(key) is not None and eb.get(key) is not None:
            out.append(f"{key.replace('_', ' ')} differs: A {ea.get(key)}, B {eb.get(key)}.")
    for section in catalog.SECTIONS:
        in_section = [r for r in rows if r.spec.section == section]
        only_a = [r.spec.name for r in in_section if r.a is not None and r.b is None]
        only_b = [r.spec.name for r in in_section if r.b is not None and r.a is None]
        for label, names in (("A", only_a), ("B", only_b)):
            if names:
                other = "B" if label == "A" else "A"
                out.append(
                    f"{section}: {', '.join(names)} measured only in {label} ({other} has none"
                    + (": no collectives in its trace)" if section == "communication" else ")")
                    + "."
                )
    if all(r.a is None and r.b is None for r in rows if r.spec.section == "memory"):
        out.append(
            "memory: no device memory peaks in either run (CPU runs, or traces without memory events): "
            "GPU 0 vs the other GPUs needs CUDA memory"
        )
    for label, s in (("A", a), ("B", b)):
        if s.findings is None:
            out.append(f"findings: {label} has no diagnosis, so findings are not compared.")
    return out


def compare(a: Snapshot, b: Snapshot) -> Comparison:
    """A and B side by side (B/A ratios; ``a`` is the reference)."""
    rows = [Row(m, a.value(m.name), b.value(m.name), _interval(m, a, b)) for m in catalog.METRICS]
    by_name = {r.spec.name: r for r in rows}
    fa = {f["name"]: f for f in a.findings or []}
    fb = {f["name"]: f for f in b.findings or []}
    return Comparison(
        a=a,
        b=b,
        rows=tuple(r for r in rows if r.a is not None or r.b is not None),
        only_a=tuple(f for n, f in fa.items() if n not in fb) if b.findings is not None else (),
        only_b=tuple(f for n, f in fb.items() if n not in fa) if a.findings is not None else (),
        both=tuple(sorted(set(fa) & set(fb))),
        headline=tuple(_headline(by_name, a, b)),
        not_comparable=tuple(_not_comparable(a, b, rows)),
    )


def _interval(m: MetricSpec, a: Snapshot, b: Snapshot) -> stats.Interval | None:
    """The interval of B/A - 1 of ``m``'s statistic over the runs' per-step samples (None without them)."""
    if not m.samples or a.value(m.name) is None or b.value(m.name) is None:
        return None
    sa, sb = a.samples.get(m.samples), b.samples.get(m.samples)
    if not sa or not sb:
        return None
    return stats.change_interval(sa, sb, m.statistic, relative=True)
