"""The baseline file: a Snapshot written as JSON by ``ddpdoctor baseline`` and read back by ``gate`` and
``compare``. Reading is strict, because CI trusts the file.

Baseline JSON (``kind`` "ddpdoctor-baseline", schema_version 1; keys are added, never renamed)::

    {"schema_version": 1, "kind": "ddpdoctor-baseline", "created_at": "2026-01-31T12:00:00Z", "run": "runs/a",
     "environment": {"ddpdoctor_version", "torch_version", "python", "mode", "world_size", "backend",
                     "devices": ["NVIDIA H100 80GB HBM3", ...] | ["cpu"], "batch_size_per_rank"},
     "metrics": {"step_ms.median": 31.2, "exposed_comm_ms": 1.4, ...},  # every catalog name; null: unmeasured
     "samples": {"step_ms": [30.9, 31.4, ...], "exposed_comm_ms": [...], ...},  # per-step values
     "sample_notes": {"step_ms": "21 steps outside the profiled windows, steps 2-29, slowest rank per step"},
     "devices": [{"rank", "host", "device", "name", "peak_allocated_bytes", "peak_reserved_bytes",
                  "capacity_bytes"}],
     "findings": [{"id", "name", "severity", "ranks", "message"}] | null,   # null: the rules did not run
     "rules_evaluated": [rule names that were decided on this run] | null,
     "notes": ["..."]}

Units: ms per step, bytes, ratios 0-1, GB/s.

Bounds when read: the file at most ``MAX_FILE_BYTES``, each list of samples at most ``MAX_FILE_SAMPLES`` (this
version writes at most ``samples.MAX_POOLED``; earlier ones kept one per rank per step, which such a file still
holds and the gate still reads, said in a note), every number at most ``MAX_MAGNITUDE`` in magnitude (no ms, byte,
ratio or GB/s of a training run comes near it, and the statistics of larger ones overflow).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ddpdoctor.compare.samples import MAX_POOLED
from ddpdoctor.compare.snapshot import KIND, SCHEMA_VERSION, Snapshot

MAX_FILE_BYTES = 32 << 20  # a baseline of 10,000 ranks with a device each is ~3 MB
MAX_FILE_SAMPLES = 50_000  # per metric
MAX_MAGNITUDE = 1e15  # 1e15 bytes is a petabyte, 1e15 ms 31,000 years

_NUMBER_LIST = re.compile(r"\[\s*((?:-?[\d.eE+-]+\s*,\s*)*-?[\d.eE+-]+)\s*\]")


def dumps(snapshot: Snapshot) -> str:
    """The baseline file's text: one key per line, each list of numbers on one line (reviewable diffs)."""
    text = json.dumps(snapshot.to_json(), indent=1, allow_nan=False, ensure_ascii=False)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text) + "\n"


def from_json(data: Mapping[str, Any], source: str) -> Snapshot:
    """A Snapshot from a baseline document; ValueError naming what is wrong.

    Strict, because CI trusts the file: a number that is not finite (NaN passes every comparison), a
    ``schema_version`` that is not the integer 1, or a value of the wrong type is refused, never read as
    "nothing to compare"."""
    if data.get("kind") != KIND:
        raise ValueError('not a ddpdoctor baseline (no "kind": "ddpdoctor-baseline")')
    version = data.get("schema_version")
    if type(version) is int and version > SCHEMA_VERSION:
        raise ValueError(
            f"baseline schema_version {version} is newer than this ddpdoctor reads "
            f"({SCHEMA_VERSION}); upgrade ddpdoctor"
        )
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ValueError(f"baseline schema_version must be the integer {SCHEMA_VERSION}, got {version!r}")
    metrics = _mapping(data, "metrics", required=True)
    samples = _mapping(data, "samples")
    read = {str(k): _finite_list(f"samples.{k}", v) for k, v in samples.items()}
    many = [f"samples.{k} has {len(v)}" for k, v in read.items() if len(v) > MAX_POOLED]
    runs = data.get("runs")
    if runs is not None and not (
        isinstance(runs, list) and all(isinstance(r, dict) and isinstance(r.get("metrics"), dict) for r in runs)
    ):
        raise ValueError('"runs" must be a list of objects, each with "metrics"')
    return Snapshot(
        source=source,
        origin=_text_or_none(data, "run"),
        environment=_mapping(data, "environment"),
        metrics={str(k): _finite_or_none(f"metrics.{k}", v) for k, v in metrics.items()},
        samples=read,
        sample_notes={str(k): str(v) for k, v in _mapping(data, "sample_notes").items()},
        devices=_list_of_objects(data, "devices"),
        findings=_findings(data.get("findings")),
        rules_evaluated=_strings_or_none(data, "rules_evaluated"),
        notes=[str(n) for n in _list(data, "notes")]
        + (
            [
                f"{', '.join(many)} samples (an earlier ddpdoctor kept one per rank per step): the noise test uses "
                f"{MAX_POOLED} quantiles of each, which widens its interval; record the baseline again"
            ]
            if many
            else []
        ),
        incomplete=_strings_or_none(data, "incomplete") or [],
        created_at=str(data.get("created_at") or ""),
        is_baseline=True,
        runs=[
            {str(k): _finite_or_none(f"runs[{i}].metrics.{k}", v) for k, v in r["metrics"].items()}
            for i, r in enumerate(runs or [])
        ],
    )


def _finite_or_none(where: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f'"{where}" must be a number or null, got {_short(value)}')
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f'"{where}" is too large to be a float') from None
    if not math.isfinite(out):
        raise ValueError(f'"{where}" must be a finite number, got {out}')
    if abs(out) > MAX_MAGNITUDE:
        raise ValueError(f'"{where}" is {out:g}: larger than any value a run records (at most {MAX_MAGNITUDE:g})')
    return out


def _finite_list(where: str, value: Any) -> list[float]:
    if not isinstance(value, list):
        raise ValueError(f'"{where}" must be a list of numbers, got {_short(value)}')
    if len(value) > MAX_FILE_SAMPLES:
        raise ValueError(
            f'"{where}" has {len(value)} samples; a baseline holds at most {MAX_FILE_SAMPLES} per metric '
            f"(ddpdoctor baseline writes at most {MAX_POOLED})"
        )
    out = [_finite_or_none(f"{where}[{i}]", x) for i, x in enumerate(value)]
    if any(x is None for x in out):
        raise ValueError(f'"{where}" must be a list of numbers, not null')
    return [float(x) for x in out if x is not None]


def _mapping(data: Mapping[str, Any], key: str, required: bool = False) -> dict[str, Any]:
    value = data.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f'"{key}" must be an object, got {_short(value)}')
    return dict(value)


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f'"{key}" must be a list, got {_short(value)}')
    return value


def _list_of_objects(data: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    items = _list(data, key)
    if not all(isinstance(x, dict) for x in items):
        raise ValueError(f'"{key}" must be a list of objects')
    return [dict(x) for x in items]


def _strings_or_none(data: Mapping[str, Any], key: str) -> list[str] | None:
    if data.get(key) is None:
        return None
    items = _list(data, key)
    if not all(isinstance(x, str) for x in items):
        raise ValueError(f'"{key}" must be a list of strings')
    return list(items)


def _text_or_none(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f'"{key}" must be a string, got {_short(value)}')
    return value


def _findings(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    ok = isinstance(value, list) and all(
        isinstance(f, dict)
        and isinstance(f.get("name"), str)
        and isinstance(f.get("message", ""), str)
        and isinstance(f.get("severity", ""), (str, type(None)))
        for f in value
    )
    if not ok:
        raise ValueError('"findings" must be a list of objects with a string "name" and "message"')
    return [dict(f) for f in value]


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
