"""One pipeline from a path to findings: ``analyze_run(path) -> Analysis``.

Every command that reads a run — ``diagnose``, ``compare``, ``baseline``, ``gate``, ``view`` — and the pytest
plugin and the benchmarks call this, so they cannot disagree about the same run: the same loader (per-rank
summaries where this version wrote them, the traces otherwise), the same metrics, and the same rules, resolved
in one place from the built-in rules, ``--rules-dir``, the ``[tool.ddpdoctor.rules.<name>]`` overrides of the
nearest pyproject.toml (or ``--config FILE``), and ``--select``/``--ignore``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.errors import TraceError, UsageError

Steps = tuple[int, int | None]


@dataclass(frozen=True)
class RuleOptions:
    """Which rules run and with which parameters (the command line's rule options)."""

    rules_dirs: Sequence[str] = ()  # --rules-dir: more rule files
    config: str | None = None  # --config FILE: parameter overrides (else the nearest pyproject.toml)
    select: Sequence[str] = ()  # --select: only these rules (names or ids)
    ignore: Sequence[str] = ()  # --ignore: not these


def resolve_rules(options: RuleOptions | None = None) -> tuple[Any, ...]:
    """The rules ``options`` ask for, with their configured parameters (``ddpdoctor.diagnosis.Rule``)."""
    from ddpdoctor.diagnosis import apply_config, load_config, load_rules, select_rules

    options = options or RuleOptions()
    rules = apply_config(load_rules(list(options.rules_dirs)), load_config(options.config))
    return tuple(select_rules(rules, list(options.select), list(options.ignore)))


@dataclass
class Analysis:
    """A run as every command sees it.

    ``metrics``/``diagnosis`` are None only when ``traces_optional`` was asked for and the traces could not be
    read (``notes`` says why); ``captures`` are the run directory's ``ranks/rank<R>.json`` (rank -> data),
    ``manifest`` its ``manifest.json`` (empty for foreign traces)."""

    path: Path
    metrics: Any  # ddpdoctor.metrics.RunMetrics | None
    diagnosis: Any  # ddpdoctor.diagnosis.Diagnosis | None
    captures: dict[int, dict[str, Any]] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def analyze_run(
    path: str | Path,
    *,
    steps: Steps | None = None,
    rules: RuleOptions | Sequence[Any] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    traces_optional: bool = False,
    over_time: bool = False,
) -> Analysis:
    """Load ``path`` (a run directory, a folder of traces or one trace file), compute its metrics and run the
    rules over them.

    ``steps``: analyse only profiled steps N..M (needs the traces; a range with none of the run's steps is a
    usage error). ``rules``: ``RuleOptions`` or already resolved rules (default: built-in rules with the
    nearest pyproject.toml's overrides). ``traces_optional``: when the traces cannot be read but the run
    directory has capture files, return an Analysis without metrics and say why in ``notes`` instead of
    raising (``compare`` and ``view`` still show the step times the ranks recorded). ``over_time`` (what
    ``diagnose`` asks): a run directory with an always-on series or two windows or more gets ``run["over_time"]``
    (``ddpdoctor.metrics.overtime``: each finding across the windows, the series' trends).
    Input errors raise ``ddpdoctor.errors.DDPDoctorError`` subclasses (one line, exit 2)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    resolved = resolve_rules(rules) if rules is None or isinstance(rules, RuleOptions) else tuple(rules)
    path, attempt_note = _attempt_to_read(path)
    with without_gc():
        result = _analyze(path, steps, resolved, progress, traces_optional)
        # a folder of foreign traces (no ranks/: no series, no capture files) has nothing over time: not imported
        has_ranks = bool(result.captures) or (path / "ranks").is_dir()
        if over_time and steps is None and path.is_dir() and result.metrics is not None and has_ranks:
            from ddpdoctor.metrics.overtime import analyze_over_time

            section = analyze_over_time(path, resolved, result.captures, result.metrics.run.get("world_size"))
            if section is not None:
                result.metrics.run["over_time"] = section
    if attempt_note:
        result.notes.insert(0, attempt_note)
        if result.metrics is not None:
            result.metrics.run.setdefault("notes", []).insert(0, attempt_note)
    return result


def _attempt_to_read(path: Path) -> tuple[Path, str | None]:
    """A job torchrun restarted keeps each attempt in ``attempts/attempt<k>/`` (never merged): the run directory
    reads as its last attempt, and the note says which attempt that is and how the earlier ones ended."""
    from ddpdoctor import rundir

    if not path.is_dir():
        return path, None
    attempts = rundir.attempt_dirs(path)
    if not attempts:
        return path, None
    try:
        manifest = rundir.read_json(path / rundir.MANIFEST)
    except (OSError, ValueError):
        manifest = {}
    records = {
        a.get("attempt"): a
        for a in (manifest.get("attempts") or [])
        if isinstance(manifest, dict) and isinstance(a, dict)
    }
    k, folder = attempts[-1]
    earlier = []
    for j, other in attempts[:-1]:
        rec = records.get(j) or {}
        how = f"{rec.get('status', 'ended')}: {rec['summary']}" if rec.get("summary") else "ended"
        earlier.append(f"attempt {j} {how} (`ddpdoctor diagnose {other}` reads it)")
    note = f"attempt {k} of {len(attempts)} diagnosed ({folder}); torchrun restarted the job: " + "; ".join(earlier)
    return folder, note


@contextmanager
def without_gc() -> Iterator[None]:
    """Run the block without the cyclic garbage collector. It walks every live object each time enough new ones
    are made: over the many small objects of a large run's files that is most of the time (seconds at 16,384
    ranks). Reading and reporting a run makes no reference cycles to collect."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            if not gc.get_freeze_count():
                # what the block made (and still holds) joins the oldest generation now, without a collection
                # walking all of it at the next allocation (20 ms after a small run, as the process ends)
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _analyze(
    path: Path,
    steps: Steps | None,
    resolved: tuple[Any, ...],
    progress: Callable[[int, int, str], None] | None,
    traces_optional: bool,
) -> Analysis:
    from ddpdoctor import rundir, runfiles
    from ddpdoctor.diagnosis import evaluate
    from ddpdoctor.load import load
    from ddpdoctor.metrics import analyze

    try:
        # The per-rank summaries the ranks computed at the end of `ddpdoctor trace` give the same metrics
        # without decoding a trace (a 1,000-rank run is read from 1,000 small files); a step range needs the
        # traces.
        # Ranks decoded from traces are summarised one at a time as they are read: memory holds one rank's
        # events, not the run's.
        run = load(path, progress=progress, use_summaries=steps is None, summarize=True, steps=steps)
    except TraceError as exc:
        captures, manifest, notes = runfiles.read_run_files(path) if path.is_dir() else ({}, {}, [])
        # a job that failed or hung before its profiled window, or a folder of Flight Recorder dumps: no trace,
        # but a diagnosis of how it ended
        health = _health_only(path, exc, captures, manifest, notes, resolved)
        if health is not None:
            return health
        if not (traces_optional and captures):
            raise
        notes.append(f"trace metrics and findings are missing: {exc}")
        return Analysis(path, None, None, captures, manifest, notes)
    verdict, dump_notes = _verdict(path, run.manifest or {}, run.world_size)
    metrics = analyze(run, steps=steps, verdict=verdict)
    if steps is not None and not metrics.run.get("steps_analyzed"):
        last = "" if steps[1] is None else str(steps[1])
        have = sorted(
            {int(x) for rt in run.ranks for x in ((rt.summary or {}).get("per_step") or {}).get("step") or []}
        )
        listed = f"the run's profiled steps are {_step_list(have)}" if have else "the run has no profiled step"
        raise UsageError(f"--steps {steps[0]}..{last}: none of the run's profiled steps is in that range ({listed})")
    cut_note = None
    if steps is None and metrics.run.get("job_failed") and not metrics.run.get("startup_failed"):
        metrics, cut_note = _without_cut_steps(path, run, metrics, verdict, progress)
    # The files the loader skipped and its notes on the rest go into every report (run.skipped, run.notes).
    metrics.run.setdefault("skipped", list(run.skipped))
    metrics.run.setdefault("notes", list(run.notes))
    metrics.run["notes"] += dump_notes + ([cut_note] if cut_note else []) + _groups_notes(run.manifest or {})
    if path.is_dir() and rundir.trials_dir(path).is_dir():  # the trials `ddpdoctor try` ran, shown in every report
        from ddpdoctor.trial.history import read_trials

        trials, trial_notes = read_trials(path)
        if trials:
            metrics.run["trials"] = trials
        metrics.run["skipped"] += trial_notes
    return Analysis(path, metrics, evaluate(resolved, metrics), dict(run.capture), dict(run.manifest or {}))


def _groups_notes(manifest: dict[str, Any]) -> list[str]:
    """The manifest's note on a job with more than one process group (which one this run directory's top level
    holds, where the others' files are kept apart: ``capture/groups.py``), and on a profiled window the job's end
    cut short (fewer steps than ``--active``: more of them would not help), for every report."""
    from ddpdoctor.rundir import WINDOW_CUT

    notes = [str(n) for n in manifest.get("notes") or []]
    cut = [n for n in notes if n.startswith(WINDOW_CUT)]
    if len(manifest.get("groups") or []) < 2:
        return cut
    return [n for n in notes if n.startswith("the job created")] + cut


def _verdict(
    path: Path, manifest: dict[str, Any], world_size: int | None, *, traced: bool = True
) -> tuple[Any, list[str]]:
    """``ddpdoctor.flight``'s verdict over the dumps at ``path`` (a run directory's dumps/; without traces
    (``traced`` False) also a folder of torch's own dump files, or one such file), and notes on the dumps;
    (None, []) when there are none."""
    if traced and not (path / "dumps").is_dir():
        return None, []
    from ddpdoctor import flight  # only where there may be dumps (start-up of a plain diagnose)

    try:
        found = flight.find_dumps(path)
    except TraceError as exc:
        return None, [f"dumps: {exc}"]
    except (RecursionError, ValueError, OSError) as exc:  # a file that is no dump (a trace nested too deeply)
        return None, [f"dumps: {type(exc).__name__}: {exc}"]
    if not found.dumps:
        return None, list(found.skipped)
    entries = [e for e in manifest.get("ranks") or [] if isinstance(e, dict)]
    if (
        all(d.reason == "exit" for d in found.dumps.values())
        and entries
        and all(e.get("status") == "ok" for e in entries)
    ):
        # ranks that dumped as they returned while their peers were still finishing, in a job that ended well:
        # nothing to diagnose (a dump at exit exists for the rank that leaves while its peers wait)
        return None, list(found.skipped)
    status = {
        e["rank"]: {k: e.get(k) for k in ("status", "exit_code", "reason")}
        for e in manifest.get("ranks") or []
        if isinstance(e, dict) and isinstance(e.get("rank"), int)
    }
    verdict = flight.analyze(found.dumps, world_size=world_size or manifest.get("world_size"), rank_status=status)
    what = "torch's own Flight Recorder dumps" if found.source == "torch" else "the ranks' dumps"
    ranks = sorted(found.dumps)
    notes = [
        f"health from {what} of rank(s) {', '.join(map(str, ranks))}"
        + (f" (request {found.request})" if found.request else "")
    ]
    return verdict, notes + list(found.notes) + list(found.skipped)


def _health_only(
    path: Path,
    exc: TraceError,
    captures: dict[int, dict[str, Any]],
    manifest: dict[str, Any],
    notes: list[str],
    resolved: tuple[Any, ...],
) -> Analysis | None:
    """The Analysis of a run without traces that failed, hung or dumped (health metrics only, every other rule
    "not evaluated": no trace), or None when there is nothing to diagnose without traces."""
    from ddpdoctor.diagnosis import evaluate
    from ddpdoctor.metrics import catalog
    from ddpdoctor.metrics.health import HEALTH_METRICS, health_metrics
    from ddpdoctor.metrics.result import RunMetrics
    from ddpdoctor.table import Table

    world_size = manifest.get("world_size") or max([c.get("world_size") or 0 for c in captures.values()] + [0]) or None
    verdict, dump_notes = _verdict(path, manifest, world_size, traced=False)
    if verdict is None and not captures and not manifest:
        return None
    health, doc = health_metrics(manifest, captures, verdict)
    if not health.get("job_failed") and verdict is None:
        return None  # a run that ended well before its window: the loader's error says what is missing
    ranks = sorted(
        {
            *captures,
            *(e.get("rank") for e in manifest.get("ranks") or [] if isinstance(e, dict)),
            *(r["rank"] for r in (doc or {}).get("ranks", [])),
        }
        - {None}
    )
    world_size = world_size or (max(ranks) + 1 if ranks else None)
    backend = next((c.get("backend") for c in captures.values() if c.get("backend")), None)
    before_window = next((n for n in manifest.get("notes") or [] if "profiled window" in str(n)), None)
    if before_window:
        reason = f"no trace was recorded: {before_window}"
    elif captures or manifest:
        reason = "no trace was recorded: the job ended before its profiled window"
    else:
        reason = "no profiler trace: only the ranks' Flight Recorder dumps were read"
    if backend is None and verdict is not None:
        refs = [verdict.collective, *(st.collective for st in verdict.ranks.values())]
        backend = next((c.backend for c in refs if c is not None and c.backend), None)
    why = {m: reason for m in (*catalog.RULE_RANK, *catalog.RULE_RUN) if m not in HEALTH_METRICS and m != "rank"}
    run: dict[str, Any] = {
        "path": str(path),
        "mode": "ddp" if (world_size or 1) > 1 else "single",
        "world_size": world_size,
        "backend": backend,
        "ranks_loaded": 0,
        "rank_source": None,
        "steps_analyzed": 0,
        **health,
        "not_measured": why,
        "skipped": list(notes),
        "notes": [reason, *dump_notes, *_groups_notes(manifest)],
    }
    if doc is not None:
        run["health"] = doc
    metrics = RunMetrics(
        run=run, ranks=[{"rank": r} for r in ranks], per_step=Table(), collectives=Table(), devices=Table()
    )
    return Analysis(path, metrics, evaluate(resolved, metrics), captures, manifest, list(notes))


def _without_cut_steps(path: Path, run: Any, metrics: Any, verdict: Any, progress: Any) -> tuple[Any, str | None]:
    """A failed run's metrics without the profiled steps its failure cut short: the steps after the last one
    every failed rank completed (a survivor's wait for a dead or stuck peer is not communication). Returns the
    metrics (recomputed from the traces over the steps kept) and the report's note, or the metrics unchanged."""
    from ddpdoctor.load import load
    from ddpdoctor.metrics import analyze

    per_step = metrics.per_step
    if not len(per_step) or "step" not in per_step.columns:
        return metrics, None
    analysed = sorted({int(s) for s in per_step["step"].tolist()})
    done = []
    for cap in run.capture.values():
        if (cap.get("status") or "ok") == "ok":
            continue
        profiled = (cap.get("steps") or {}).get("profiled") or []
        ends = [int(p[1]) for p in profiled if isinstance(p, (list, tuple)) and len(p) == 2]
        done.append(max(ends) if ends else None)
    if not done:
        return metrics, None
    if any(d is None for d in done):  # a failed rank that completed no profiled step: every analysed step is cut
        last = analysed[0] - 1
    else:
        last = min(d for d in done if d is not None)
    cut = [s for s in analysed if s > last]
    if not cut:
        return metrics, None
    shown = _step_list(cut)
    kept = [s for s in analysed if s <= last]
    if not kept:
        metrics.run["steps_cut_short"] = len(cut)
        note = (
            f"profiled step(s) {shown} were cut short by the failure: no step is left for the timing metrics, so"
            " the timing rules are not evaluated"
        )
        from ddpdoctor.metrics import catalog
        from ddpdoctor.metrics.health import HEALTH_METRICS

        why = "every profiled step was cut short by the failure (a wait for a dead or stuck peer is not communication)"
        for m in (*catalog.RULE_RANK, *catalog.RULE_RUN):
            if m not in HEALTH_METRICS and m not in ("rank", "world_size"):
                metrics.run["not_measured"][m] = why
                if m in metrics.run:
                    metrics.run[m] = None
                for r in metrics.ranks:
                    if m in r:
                        r[m] = None
        return metrics, note
    again = load(path, progress=progress, use_summaries=False, summarize=True, steps=(kept[0], last))
    trimmed = analyze(again, steps=(kept[0], last), verdict=verdict)
    trimmed.run["steps_cut_short"] = len(cut)
    note = (
        f"profiled step(s) {shown} were left out of the timing metrics: the failure cut them short (a wait for a"
        f" dead or stuck peer is not communication); the metrics cover steps {_step_list(kept)}"
    )
    return trimmed, note


def _step_list(steps: list[int]) -> str:
    """``[7, 8, 9, 12]`` -> ``7-9, 12``."""
    spans: list[str] = []
    start = prev = steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(spans)
