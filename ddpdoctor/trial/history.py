"""The trials of a run, as the reports show them next to it: every ``<RUN>.trials/<n>/results.json`` that
``ddpdoctor try`` wrote, one row per trial. Reads JSON only (no torch, no pandas); a file that cannot be read is
left out with a note, like every other file a report reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddpdoctor.rundir import trials_dir


def _label(settings: Any) -> str:
    if not isinstance(settings, dict) or not settings:
        return "?"
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def is_session(name: str) -> bool:
    """A session folder's name: ``1``, ``2``, ... (ASCII digits; ``isdigit`` alone takes '²', which int() refuses)."""
    return name.isascii() and name.isdigit()


def _row(session: str, trial: dict[str, Any]) -> dict[str, Any]:
    measurement = trial.get("measurement") if isinstance(trial.get("measurement"), dict) else {}
    step = next(
        (m for m in _list(measurement.get("metrics")) if isinstance(m, dict) and m.get("metric") == "step_ms.median"),
        {},
    )
    interval = measurement.get("measured_gain_interval_ms")
    rules = [r for r in _list(trial.get("rules")) if isinstance(r, dict)]
    return {
        "session": session,
        "settings": _label(trial.get("settings")),
        "verdict": str(trial.get("verdict") or "?"),
        "step_ratio": _number(step.get("ratio")),
        "gain_ms": _number(measurement.get("measured_gain_ms")),
        "gain_interval_ms": [_number(v) for v in interval]
        if isinstance(interval, list) and len(interval) == 2
        else None,
        "went_away": [str(f) for f in _list(measurement.get("findings_went_away"))],
        "appeared": [str(f) for f in _list(measurement.get("findings_appeared"))],
        "estimates": [
            {
                "rule": str(r.get("rule")),
                "estimated_gain_ms": _number(r.get("estimated_gain_ms")),
                "measured_gain_ms": _number(r.get("measured_gain_ms")),
            }
            for r in rules
        ],
        "error": str(trial["error"]).splitlines()[0] if trial.get("error") else None,
    }


def read_trials(run: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The trials of ``run`` (oldest session first) and notes on results files that could not be read."""
    base = trials_dir(Path(run))
    if not base.is_dir():
        return [], []
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    sessions = sorted((p for p in base.iterdir() if is_session(p.name)), key=lambda p: int(p.name))
    for folder in sessions:
        path = folder / "results.json"
        if not path.is_file():
            continue  # a session still running, or one that failed before writing
        try:
            data = json.loads(path.read_bytes())
            trials = data["trials"] if isinstance(data, dict) and data.get("kind") == "ddpdoctor-trials" else None
            if not isinstance(trials, list):
                raise ValueError("not a ddpdoctor try results file")
            rows += [_row(folder.name, t) for t in trials if isinstance(t, dict)]
        except (OSError, ValueError, RecursionError) as exc:
            notes.append(f"{base.name}/{folder.name}/results.json: skipped: {exc}")
    return rows, notes
