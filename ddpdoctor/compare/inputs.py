"""Read what ``compare``/``baseline``/``gate`` are given into Snapshots: a ddpdoctor run directory, a folder
of torch.profiler traces, one trace file, or a baseline JSON written by ``ddpdoctor baseline``.

A run or traces go through the one pipeline (``ddpdoctor.pipeline.analyze_run``), so the metrics and findings
are those ``diagnose`` reports for the same run and rule options. A run directory also gives its capture files
(every step's wall time, memory of every device, GIL per step, the environment); when its traces cannot be
read, those alone are used and the snapshot says why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpdoctor.compare import snapshot as snap
from ddpdoctor.compare.baseline_file import MAX_FILE_BYTES, from_json
from ddpdoctor.errors import UsageError
from ddpdoctor.pipeline import RuleOptions, analyze_run
from ddpdoctor.rundir import MANIFEST, RANKS_DIR


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
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # bounded: json.loads needs several times the text's size
        if len(raw) > MAX_FILE_BYTES:
            size = max(path.stat().st_size, len(raw))
            raise UsageError(
                f"{path}: the baseline is {size / 2**20:.1f} MiB; a baseline file is at most "
                f"{MAX_FILE_BYTES >> 20} MiB (ddpdoctor baseline writes a few MB at most)"
            )
        data = json.loads(raw)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the baseline: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path}: the baseline is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"{path}: the baseline is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a ddpdoctor baseline (a JSON object is expected)")
    try:
        return from_json(data, str(path))
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None


def read_input(arg: str, *, rules: RuleOptions | Sequence[Any] | None = None) -> snap.Snapshot:
    """The Snapshot of ``arg``: a baseline file, a run directory or traces, with ``rules`` (rule options or
    resolved rules; default: the built-in rules with the nearest pyproject.toml's overrides). Input errors
    raise DDPDoctorError."""
    path = Path(arg)
    if not path.exists():
        raise UsageError(f"{arg}: no such file or directory")
    if _is_baseline_file(path):
        return read_baseline(path)
    if path.is_file() and path.suffix == ".json" and not path.name.endswith(".pt.trace.json"):
        try:  # a JSON that is neither a baseline nor a trace: say which it is not (a large one is a trace)
            data = json.loads(path.read_bytes()) if path.stat().st_size <= MAX_FILE_BYTES else None
        except (OSError, ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and "traceEvents" not in data:
            raise UsageError(f"{arg}: neither a ddpdoctor baseline nor a torch.profiler trace")
    analysis = analyze_run(path, rules=rules, traces_optional=True)
    captures = [analysis.captures[rank] for rank in sorted(analysis.captures)]
    notes = analysis.notes if analysis.metrics is None else _run_file_notes(analysis.metrics.run)
    return snap.build(arg, captures, analysis.metrics, analysis.diagnosis, notes)


_RUN_FILE_NOTE = re.compile(rf"^({re.escape(RANKS_DIR)}/rank\d+\.json|{re.escape(MANIFEST)}): ")


def _run_file_notes(run: dict[str, Any]) -> list[str]:
    """The notes on capture files left out or read in part (``ranks/rank1.json: skipped: ... - at
    `$.memory.devices[0].index```): what the gate's "rank 1 is missing" comes from, named with the file and field."""
    return [
        n for n in [*run.get("skipped", []), *run.get("notes", [])] if isinstance(n, str) and _RUN_FILE_NOTE.match(n)
    ]
