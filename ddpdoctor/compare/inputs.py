"""Read what ``compare``/``baseline``/``gate`` are given into Snapshots: a ddpdoctor run directory, a folder
of torch.profiler traces, one trace file, or a baseline JSON written by ``ddpdoctor baseline``.

A run directory gives its capture files (every step's wall time, memory of every device, GIL per step, the
environment) and, through ``ddpdoctor.load`` + ``ddpdoctor.metrics.analyze``, the trace metrics (breakdown,
exposed communication, overlap, bandwidth) and the diagnosis' findings. When this build has no
``ddpdoctor.metrics.analyze``, the capture files alone are used and the snapshot says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpdoctor import rundir
from ddpdoctor.compare import snapshot as snap
from ddpdoctor.errors import TraceError, UsageError

NO_METRICS = (
    "trace metrics (breakdown, exposed communication, overlap, bandwidth) and findings are missing: "
    "this build of ddpdoctor has no ddpdoctor.metrics.analyze"
)


def read_captures(path: Path) -> list[dict[str, Any]]:
    """The ``ranks/rank<R>.json`` files of a run directory, sorted by rank (empty for other inputs)."""
    folder = path / rundir.RANKS_DIR
    if not folder.is_dir():
        return []
    out = []
    for file in folder.glob("rank*.json"):
        if file.name.endswith(".summary.json") or not file.name[4:-5].isdigit():
            continue
        try:
            out.append(rundir.read_json(file))
        except (OSError, ValueError) as exc:
            raise TraceError(f"{file}: cannot read the capture file: {exc}") from None
    return sorted(out, key=lambda c: int(c.get("rank", 0)))


def _analyze(path: Path, rules: Sequence[Any] | None, has_capture: bool) -> tuple[Any, Any, list[str]]:
    try:
        from ddpdoctor.metrics import analyze
    except ImportError:
        return None, None, [NO_METRICS]
    from ddpdoctor.diagnosis import apply_config, evaluate, load_config, load_rules
    from ddpdoctor.load import load

    try:
        loaded = load(path)
    except TraceError as exc:
        if not has_capture:
            raise
        # e.g. a run shorter than the profiler's wait: the step times in the capture files still count
        return None, None, [f"trace metrics and findings are missing: {exc}"]
    metrics = analyze(loaded)
    if rules is None:
        rules = apply_config(load_rules([]), load_config())
    return metrics, evaluate(rules, metrics), []


def _is_baseline_file(path: Path) -> bool:
    if not path.is_file() or path.name.endswith((".gz", ".pt.trace.json")):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"ddpdoctor-baseline"' in head


def read_baseline(path: Path) -> snap.Snapshot:
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the baseline: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path}: the baseline is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a ddpdoctor baseline (a JSON object is expected)")
    try:
        return snap.from_json(data, str(path))
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None


def read_input(arg: str, *, rules: Sequence[Any] | None = None) -> snap.Snapshot:
    """The Snapshot of ``arg``: a baseline file, a run directory or traces. Input errors raise
    DDPDoctorError."""
    path = Path(arg)
    if not path.exists():
        raise UsageError(f"{arg}: no such file or directory")
    if _is_baseline_file(path):
        return read_baseline(path)
    if path.is_file() and path.suffix == ".json" and not path.name.endswith(".pt.trace.json"):
        try:  # a JSON that is neither a baseline nor a trace: say which it is not
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and "traceEvents" not in data:
            raise UsageError(f"{arg}: neither a ddpdoctor baseline nor a torch.profiler trace")
    captures = read_captures(path) if path.is_dir() else []
    metrics, diagnosis, notes = _analyze(path, rules, bool(captures))
    if metrics is None and not captures:
        raise UsageError(
            f"{arg}: not a ddpdoctor run directory (no {rundir.RANKS_DIR}/rank<R>.json), and this "
            "build cannot read traces without ddpdoctor.metrics"
        )
    return snap.build(arg, captures, metrics, diagnosis, notes)
