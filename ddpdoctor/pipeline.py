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
) -> Analysis:
    """Load ``path`` (a run directory, a folder of traces or one trace file), compute its metrics and run the
    rules over them.

    ``steps``: analyse only profiled steps N..M (needs the traces; a range with none of the run's steps is a
    usage error). ``rules``: ``RuleOptions`` or already resolved rules (default: built-in rules with the
    nearest pyproject.toml's overrides). ``traces_optional``: when the traces cannot be read but the run
    directory has capture files, return an Analysis without metrics and say why in ``notes`` instead of
    raising (``compare`` and ``view`` still show the step times the ranks recorded).
    Input errors raise ``ddpdoctor.errors.DDPDoctorError`` subclasses (one line, exit 2)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    resolved = resolve_rules(rules) if rules is None or isinstance(rules, RuleOptions) else tuple(rules)
    with without_gc():
        return _analyze(path, steps, resolved, progress, traces_optional)


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
    from ddpdoctor import rundir
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
        captures, manifest, notes = rundir.read_run_files(path) if path.is_dir() else ({}, {}, [])
        if not (traces_optional and captures):
            raise
        notes.append(f"trace metrics and findings are missing: {exc}")
        return Analysis(path, None, None, captures, manifest, notes)
    metrics = analyze(run, steps=steps)
    if steps is not None and not metrics.run.get("steps_analyzed"):
        last = "" if steps[1] is None else str(steps[1])
        raise UsageError(f"--steps {steps[0]}..{last}: none of the run's profiled steps is in that range")
    # The files the loader skipped and its notes on the rest go into every report (run.skipped, run.notes).
    metrics.run.setdefault("skipped", list(run.skipped))
    metrics.run.setdefault("notes", list(run.notes))
    if path.is_dir() and rundir.trials_dir(path).is_dir():  # the trials `ddpdoctor try` ran, shown in every report
        from ddpdoctor.trial.history import read_trials

        trials, trial_notes = read_trials(path)
        if trials:
            metrics.run["trials"] = trials
        metrics.run["skipped"] += trial_notes
    return Analysis(path, metrics, evaluate(resolved, metrics), dict(run.capture), dict(run.manifest or {}))
