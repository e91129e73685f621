"""A run reduced to what ``compare`` and ``gate`` need: environment, summary metrics, per-step samples,
devices, findings. A baseline file is a Snapshot written as JSON. Pure: ``build`` takes already-read data,
never files.

The baseline file (a Snapshot as JSON) is read and written by ``ddpdoctor.compare.baseline_file``.

Units: ms per step, bytes, ratios 0-1, GB/s.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ddpdoctor._version import __version__
from ddpdoctor.compare import samples as smp
from ddpdoctor.compare.catalog import METRICS
from ddpdoctor.metrics.catalog import RANK, RUN, group
from ddpdoctor.runfiles import PROCESS_GONE

SCHEMA_VERSION = 1
KIND = "ddpdoctor-baseline"
ENV_KEYS = ("world_size", "mode", "backend", "devices", "torch_version")  # a difference here is a warning
# Compared metrics that are a mean over the ranks, and those the run has as a whole (compare's own
# max_peak_allocated_bytes is computed from the devices table).
_RANK_MEAN = tuple(m.name for m in METRICS if m.of == m.name and m.of in RANK)
_RUN_LEVEL = tuple(m.name for m in METRICS if m.of in RUN and RUN[m.of].source != "snapshot")


@dataclass(frozen=True)
class Snapshot:
    source: str
    environment: dict[str, Any]
    metrics: dict[str, float | None]
    samples: dict[str, list[float]] = field(default_factory=dict)
    sample_notes: dict[str, str] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] | None = None
    rules_evaluated: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    created_at: str = ""
    is_baseline: bool = False  # read from a baseline file (not a run directory)
    origin: str | None = None  # for a baseline file: the run it was made from
    # a baseline made of several runs: each run's metrics (the spread between runs is the gate's noise)
    runs: list[dict[str, float | None]] = field(default_factory=list)
    # why the run did not complete (a rank failed, died, hung or was interrupted, a rank is missing, too few
    # steps): such a run cannot pass the gate, nor serve as its baseline. Empty: complete (or unknown)
    incomplete: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``runs/a`` or ``perf/baseline.json (baseline of runs/a)``."""
        return f"{self.source} (baseline of {self.origin})" if self.origin else self.source

    def value(self, name: str) -> float | None:
        return self.metrics.get(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": KIND,
            "created_at": self.created_at,
            "run": self.origin or self.source,
            "environment": self.environment,
            "metrics": {k: _round(v) for k, v in self.metrics.items()},
            "samples": {k: [_round(v, 5) for v in vs] for k, vs in self.samples.items()},
            "sample_notes": self.sample_notes,
            "devices": self.devices,
            "findings": self.findings,
            "rules_evaluated": self.rules_evaluated,
            "notes": self.notes,
            **({"incomplete": self.incomplete} if self.incomplete else {}),
            **({"runs": [{"metrics": {k: _round(v) for k, v in r.items()}} for r in self.runs]} if self.runs else {}),
        }


def build(
    source: str,
    captures: Sequence[Mapping[str, Any]],
    metrics: Any = None,
    diagnosis: Any = None,
    notes: Sequence[str] = (),
) -> Snapshot:
    """The Snapshot of a run from its capture files (``ranks/rank<R>.json``, sorted by rank; may be empty for
    foreign traces), its ``RunMetrics`` (None when the traces were not analysed) and its ``Diagnosis``."""
    values: dict[str, float | None] = {m.name: None for m in METRICS}
    samples: dict[str, list[float]] = {}
    sample_notes: dict[str, str] = {}
    if metrics is not None:
        _from_metrics(metrics, values, samples, sample_notes)
    steps, how = smp.job_step_times(captures)
    if steps:
        samples["step_ms"], sample_notes["step_ms"] = steps, how
    elif "step_ms" in samples:
        sample_notes["step_ms"] = "profiled steps (from the traces), slowest rank per step"
    gil = smp.gil_samples(captures)
    if gil:
        samples["gil_contention"] = gil
    for m in METRICS:  # a metric with samples is the statistic of its samples: one number everywhere
        if m.samples and samples.get(m.samples):
            values[m.name] = smp.statistic(samples[m.samples], m.statistic)
    devices = _capture_devices(captures) or _metrics_devices(metrics)
    values.update({k: v for k, v in _memory(devices).items() if v is not None})
    return Snapshot(
        source=source,
        environment=environment(captures, metrics),
        metrics=values,
        samples=samples,
        sample_notes=sample_notes,
        devices=devices,
        findings=None if diagnosis is None else [_finding(f) for f in diagnosis.findings],
        rules_evaluated=None
        if diagnosis is None
        else sorted({*(f.name for f in diagnosis.findings), *diagnosis.passed}),
        notes=list(notes),
        incomplete=incomplete(captures),
        created_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


MIN_STEPS = 5  # fewer recorded steps per rank: the statistics (and the gate's noise test) cannot be made
_STATUS = {
    "failed": "failed",
    "hung": "hung",
    "interrupted": "was interrupted",
    # a rank file that still says "running" whose process is not known to be gone (runfiles.read_run_files): still
    # there, or on another host
    "running": "has not finished: its rank file still says running (a run in progress, or a rank that ended on"
    " another host without a word)",
}


def incomplete(captures: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why a ddpdoctor run did not complete, from its capture files (empty for foreign traces): a rank whose
    status is not ``ok``, a rank without a capture file, no training step, fewer than ``MIN_STEPS`` steps."""
    if not captures:
        return []
    out = []
    for c in captures:
        status = c.get("status")
        if status == "running" and c.get(PROCESS_GONE):  # runfiles.read_run_files: its process is gone
            out.append(f"rank {c.get('rank')} died without finishing ({str(c[PROCESS_GONE])[:200]})")
            continue
        if status != "ok":
            why = _STATUS.get(str(status), f"ended with status {str(status)[:40]!r}")
            error = c.get("error")
            out.append(f"rank {c.get('rank')} {why}" + (f" ({str(error)[:200]})" if error else ""))
    world = _int_or_none(captures[0].get("world_size"))
    if world is not None and 0 < world <= 100_000:
        seen = {c.get("rank") for c in captures}
        missing = [r for r in range(world) if r not in seen]
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            out.append(f"rank {shown} is missing (no capture file; world size {world})")
    counts = [len(smp.rank_step_times(c)) for c in captures]
    if max(counts, default=0) == 0:
        out.append("no training step was recorded")
    elif min(counts) < MIN_STEPS:
        out.append(f"only {min(counts)} steps recorded on a rank (at least {MIN_STEPS} are needed for the statistics)")
    return out


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def combine(snapshots: Sequence[Snapshot]) -> Snapshot:
    """One baseline from several runs of the same job (``ddpdoctor baseline RUN1 RUN2 RUN3``): per-step samples
    pooled, each metric the statistic of the pooled samples (or the median over the runs), and each run's own
    metrics kept in ``runs``, so that the gate can measure the spread between runs. ValueError when the runs'
    environments differ (they would not be runs of the same job)."""
    if len(snapshots) == 1:
        return snapshots[0]
    first = snapshots[0]
    for s in snapshots[1:]:
        for key in ENV_KEYS:
            if s.environment.get(key) != first.environment.get(key):
                raise ValueError(
                    f"the baseline runs are not runs of the same job: {key} is {first.environment.get(key)} in "
                    f"{first.label} but {s.environment.get(key)} in {s.label}"
                )
    samples: dict[str, list[float]] = {}
    trimmed: dict[str, int] = {}
    for key in dict.fromkeys(k for s in snapshots for k in s.samples):
        samples[key], each = smp.pool([s.samples.get(key, []) for s in snapshots])
        if each is not None:
            trimmed[key] = each
    sample_notes = {k: f"{v} (pooled over {len(snapshots)} runs)" for k, v in first.sample_notes.items()}
    for key, each in trimmed.items():
        sample_notes[key] = (f"{first.sample_notes[key]}; " if key in first.sample_notes else "") + (
            f"pooled over {len(snapshots)} runs, the last {each} of each (at most {smp.MAX_POOLED} in all)"
        )
    values: dict[str, float | None] = {}
    for name in {k for s in snapshots for k in s.metrics}:
        spec = next((m for m in METRICS if m.name == name), None)
        if spec is not None and spec.samples and samples.get(spec.samples):
            values[name] = smp.statistic(samples[spec.samples], spec.statistic)
        else:
            found = [v for v in (s.metrics.get(name) for s in snapshots) if v is not None]
            values[name] = float(np.median(found)) if found else None
    findings = None
    if all(s.findings is not None for s in snapshots):
        by_name: dict[str, dict[str, Any]] = {}
        for s in snapshots:  # a finding of any baseline run is "already in the baseline"
            for f in s.findings or []:
                by_name.setdefault(f["name"], f)
        findings = list(by_name.values())
    evaluated = None
    if all(s.rules_evaluated is not None for s in snapshots):
        evaluated = sorted({r for s in snapshots for r in s.rules_evaluated or []})
    return replace(
        first,
        source=", ".join(s.label for s in snapshots),
        origin=", ".join(s.origin or s.source for s in snapshots),
        metrics=values,
        samples=samples,
        sample_notes=sample_notes,
        findings=findings,
        rules_evaluated=evaluated,
        notes=[f"{s.label}: {n}" for s in snapshots for n in s.notes],
        incomplete=[f"{s.label}: {r}" for s in snapshots for r in s.incomplete],
        runs=[dict(s.metrics) for s in snapshots],
    )


def with_source(snapshot: Snapshot, source: str) -> Snapshot:
    return replace(snapshot, source=source)


# ---- helpers
# ---------------------------------------------------------------------------------------------------
def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) or math.isinf(out) else out


def _round(value: float | None, digits: int = 6) -> float | None:
    if value is None:
        return None
    return float(f"{value:.{digits}g}") if abs(value) < 1e6 else float(round(value))


def _from_metrics(
    metrics: Any, values: dict[str, float | None], samples: dict[str, list[float]], notes: dict[str, str]
) -> None:
    ranks = [dict(r) for r in (getattr(metrics, "ranks", None) or [])]
    for name in _RANK_MEAN:
        found = [v for v in (_num(r.get(name)) for r in ranks) if v is not None]
        values[name] = float(np.mean(found)) if found else None
    run = dict(getattr(metrics, "run", None) or {})
    for name in _RUN_LEVEL:
        if _num(run.get(name)) is not None:
            values[name] = _num(run.get(name))
    per_step = getattr(metrics, "per_step", None)
    if per_step is None or len(per_step) == 0:
        return
    # the statistics below are pandas' (compare and gate may import it; diagnose does not come here)
    df = per_step.to_pandas() if hasattr(per_step, "to_pandas") else per_step.copy()
    if "analyzed" in df.columns:  # steps the metrics leave out (a window's last step on a GPU) stay out here too
        df = df[df["analyzed"].astype(bool)]
    by_rank_step = {"rank", "step"} <= set(df.columns)
    for m in METRICS:
        key = m.samples
        if key and key != "step_ms" and key in df.columns and key not in samples:
            # pooled over ranks and steps (its mean is the mean over ranks), reduced per step beyond MAX_SAMPLES
            if by_rank_step:
                col = _floats(df[key])
                found, note = smp.reduce_rank_steps(_floats(df["rank"]), _floats(df["step"]), col, m.statistic)
            else:
                found, note = _floats(df[key]).dropna().tolist()[-smp.MAX_SAMPLES :], None
            if found:
                samples[key] = found
                if note:
                    notes[key] = note
    if "step_ms" in df.columns and by_rank_step:
        job = df.groupby("step")["step_ms"].max().dropna()
        if len(job):
            samples["step_ms"] = job.astype(float).tolist()[-smp.MAX_SAMPLES :]


def _floats(column: Any) -> Any:
    """A pandas column as floats (None and non-numbers: NaN)."""
    import pandas as pd

    return pd.to_numeric(column, errors="coerce").astype(float)


def environment(captures: Sequence[Mapping[str, Any]], metrics: Any = None) -> dict[str, Any]:
    """What must match for two runs' numbers to be comparable (see ``ENV_KEYS``), plus context."""
    run = dict(getattr(metrics, "run", None) or {})
    first = captures[0] if captures else {}
    names: list[str] = []
    for c in captures:
        devs = (c.get("memory") or {}).get("devices") or []
        names += [str(d.get("name") or d.get("device")) for d in devs] or [str(c.get("device") or "cpu")]
    mode = run.get("mode") or _capture_mode(captures)
    batch = None
    for c in captures:
        for loader in (c.get("setup") or {}).get("data_loaders") or []:
            if loader.get("batches_yielded") and loader.get("batch_size"):
                batch = int(loader["batch_size"])
                break
        if batch is not None:
            break
    return {
        "ddpdoctor_version": __version__,
        "torch_version": first.get("torch_version"),
        "python": first.get("python"),
        "mode": mode,
        "world_size": int(first.get("world_size") or run.get("world_size") or len(captures) or 1),
        "backend": first.get("backend") or run.get("backend"),
        "devices": sorted(set(names)) or None,
        "batch_size_per_rank": batch,
        # 1.0 where ddpdoctor marked the steps; from a plain trace, what its own profiler's steps hold
        "optimizer_steps_per_step": 1.0 if captures else run.get("optimizer_steps_per_step"),
    }


def work_per_step_differs(a: Snapshot, b: Snapshot) -> tuple[float, float] | None:
    """Both runs' optimizer steps per step (``environment["optimizer_steps_per_step"]``) where both are known and
    differ by a quarter or more: their steps are not the same work (a plain trace whose profiler was stepped every
    few iterations, or several times an iteration). None otherwise."""
    ra, rb = (s.environment.get("optimizer_steps_per_step") for s in (a, b))
    if not isinstance(ra, (int, float)) or not isinstance(rb, (int, float)) or ra <= 0 or rb <= 0:
        return None
    return (float(ra), float(rb)) if max(ra, rb) / min(ra, rb) >= 1.25 else None


def _capture_mode(captures: Sequence[Mapping[str, Any]]) -> str | None:
    if not captures:
        return None
    if any(c.get("ddp") for c in captures):
        return "ddp"
    if any(c.get("dp") for c in captures):
        return "dp"
    return "ddp" if int(captures[0].get("world_size") or 1) > 1 else "single"


def _capture_devices(captures: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in captures:
        for d in (c.get("memory") or {}).get("devices") or []:
            out.append(
                {
                    "rank": c.get("rank"),
                    "host": c.get("hostname"),
                    "device": d.get("device"),
                    "index": d.get("index"),
                    "name": d.get("name"),
                    **{k: _num(d.get(k)) for k in group("device_memory")},
                }
            )
    return out


def _metrics_devices(metrics: Any) -> list[dict[str, Any]]:
    df = getattr(metrics, "devices", None)
    if df is None or len(df) == 0:
        return []
    from ddpdoctor.metrics.result import records

    out = []
    for row in records(df):
        device = str(row.get("device"))
        index = int(device.split(":")[-1]) if device.split(":")[-1].isdigit() else None
        out.append(
            {
                "rank": row.get("rank"),
                "host": None,
                "device": device,
                "index": index,
                "name": None,
                **{k: _num(row.get(k)) for k in group("device_memory")},
            }
        )
    return out


def _memory(devices: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """GPU 0 vs the rest: reserved bytes summed over the processes using a device (per host)."""
    reserved: dict[tuple[Any, Any], float] = {}
    for d in devices:
        if d.get("index") is None or d.get("peak_reserved_bytes") is None:
            continue
        key = (d.get("host"), int(d["index"]))
        reserved[key] = reserved.get(key, 0.0) + float(d["peak_reserved_bytes"])
    gpu0 = max((v for (_, i), v in reserved.items() if i == 0), default=None)
    others = max((v for (_, i), v in reserved.items() if i != 0), default=None)
    allocated = [float(d["peak_allocated_bytes"]) for d in devices if d.get("peak_allocated_bytes") is not None]
    return {
        "gpu0_peak_reserved_bytes": gpu0,
        "others_max_peak_reserved_bytes": others,
        "gpu0_vs_others_ratio": gpu0 / others if gpu0 is not None and others else None,
        "max_peak_allocated_bytes": max(allocated) if allocated else None,
    }


def _finding(f: Any) -> dict[str, Any]:
    return {"id": f.id, "name": f.name, "severity": f.severity, "ranks": list(f.ranks), "message": f.message}
