"""Gate thresholds: ``step_ms.median=+5%``, ``exposed_comm_ms=+2ms``, ``gpu0_peak_reserved=+10%``,
``overlap_ratio=-0.1``, ``busbw_gbps=-15%``, ``dataloader_ms=off``.

A threshold is how far a metric may move in its *worse* direction before the gate calls it a regression:
``%`` is relative to the baseline, anything else is absolute in the metric's unit (``ms``; bytes as ``B``,
``KiB``, ``MiB``, ``GiB``, ``KB``, ``MB``, ``GB``; ratios as plain numbers). The sign may be left out; when
given it must be the worse direction (``+`` for times and memory, ``-`` for overlap and bandwidth). ``off``
stops gating a metric.

Sources, later ones winning: the catalog defaults, ``[tool.ddpdoctor.gate]`` in the nearest pyproject.toml
(from the current directory upwards) or the ``--config`` file, then ``--threshold`` flags::

    [tool.ddpdoctor.gate]
    fail-on = "error"            # new findings at or above this severity fail the gate ("off": never)
    strict-env = false           # a different environment than the baseline's fails the gate
    [tool.ddpdoctor.gate.thresholds]
    "step_ms.median" = "+5%"
    exposed_comm_ms = "+2 ms"
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.compare import catalog
from ddpdoctor.errors import UsageError
from ddpdoctor.tomlfile import TOMLError, load_bytes

SEVERITIES_OR_OFF = ("info", "warning", "error", "off")
# New findings fail the gate from this severity on. Not "warning": the warning-level rules (straggler,
# overlap, GIL...) are timing heuristics without a noise test, and on a shared runner they come and go
# between two runs of the same code; a new warning is still reported (annotation, JUnit system-out), it just
# does not fail.
DEFAULT_FAIL_ON = "error"
_UNITS = {
    "ms": ("ms", 1.0),
    "s": ("ms", 1000.0),
    "us": ("ms", 1e-3),
    "b": ("bytes", 1.0),
    "kib": ("bytes", 2.0**10),
    "mib": ("bytes", 2.0**20),
    "gib": ("bytes", 2.0**30),
    "kb": ("bytes", 1e3),
    "mb": ("bytes", 1e6),
    "gb": ("bytes", 1e9),
    "gb/s": ("GB/s", 1.0),
}
_THRESHOLD_RE = re.compile(r"^(?P<sign>[+-])?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>%|[a-zA-Z/]+)?$")


@dataclass(frozen=True)
class Threshold:
    """``amount`` in the metric's unit (absolute) or a fraction (relative: 0.05 = 5 %), in the worse
    direction."""

    metric: str
    amount: float
    relative: bool
    source: str = "default"

    @property
    def worse(self) -> str:
        return catalog.spec(self.metric).worse

    def exceeded_by(self, change: float) -> bool:
        """True when ``change`` (same kind as the threshold) goes further than it in the worse direction."""
        return change > self.amount if self.worse == "up" else change < -self.amount

    def text(self) -> str:
        sign = "+" if self.worse == "up" else "-"
        if self.relative:
            return f"{sign}{self.amount * 100:g}%"
        unit = catalog.spec(self.metric).unit
        if unit == "bytes":
            return f"{sign}{self.amount / 2**20:g} MiB"
        return f"{sign}{self.amount:g}" + (f" {unit}" if unit in ("ms", "GB/s") else "")


@dataclass(frozen=True)
class GateConfig:
    thresholds: dict[str, Threshold] = field(default_factory=dict)
    fail_on: str | None = "error"
    strict_env: bool = False
    source: str | None = None


def parse_threshold(metric: str, text: str, source: str = "--threshold") -> Threshold | None:
    """One threshold (None for ``off``); UsageError naming the metric when it cannot be read."""
    name = catalog.canonical(metric)
    if name is None:
        known = ", ".join(m.name for m in catalog.METRICS)
        raise UsageError(f"{source}: unknown gate metric {metric!r} (known: {known})")
    spec = catalog.spec(name)
    raw = str(text).strip()
    if raw.lower() in ("off", "none", "false"):
        return None
    m = _THRESHOLD_RE.match(raw)
    if not m:
        raise UsageError(f"{source}: {name}={raw!r} is not a threshold (examples: +5%, +2ms, +512MiB, -0.1, off)")
    amount, unit = float(m.group("num")), (m.group("unit") or "").lower()
    want = "+" if spec.worse == "up" else "-"
    if m.group("sign") and m.group("sign") != want:
        raise UsageError(
            f"{source}: {name} gets worse when it goes {'up' if want == '+' else 'down'}; "
            f"write its threshold as {want}{m.group('num')}{m.group('unit') or ''}"
        )
    if unit == "%":
        return Threshold(name, amount / 100.0, True, source)
    if unit:
        kind, scale = _UNITS.get(unit, (None, 1.0))
        if kind != spec.unit:
            raise UsageError(f"{source}: {name} is in {spec.unit}; {raw!r} has unit {m.group('unit')!r}")
        amount *= scale
    return Threshold(name, amount, False, source)


def parse_assignment(text: str) -> tuple[str, str]:
    """``"step_ms.median=+5%"`` (or ``:`` instead of ``=``) -> (metric, threshold text)."""
    for sep in ("=", ":"):
        if sep in text:
            metric, value = text.split(sep, 1)
            if metric.strip() and value.strip():
                return metric.strip(), value.strip()
    raise UsageError(f"--threshold {text!r}: write METRIC=THRESHOLD, e.g. step_ms.median=+5%")


def defaults() -> dict[str, Threshold]:
    out = {}
    for m in catalog.METRICS:
        if m.threshold is not None:
            t = parse_threshold(m.name, m.threshold, "default")
            assert t is not None
            out[m.name] = t
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return load_bytes(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except TOMLError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None


def find_gate_table(config_file: str | None = None, cwd: str | Path | None = None) -> tuple[str | None, dict[str, Any]]:
    """``[tool.ddpdoctor.gate]`` of ``config_file`` (a pyproject.toml, or plain TOML with a ``[gate]``
    table), or of the nearest pyproject.toml with a ``[tool.ddpdoctor]`` table from ``cwd`` upwards."""
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise UsageError(f"{path}: config file does not exist")
        data = _read_toml(path)
        table = data.get("tool", {}).get("ddpdoctor", {}) if isinstance(data.get("tool"), dict) else data
        return str(path), dict(table.get("gate") or {})
    start = Path(cwd) if cwd is not None else Path.cwd()
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            tool = _read_toml(candidate).get("tool", {}).get("ddpdoctor")
            if tool is not None:
                return str(candidate), dict(tool.get("gate") or {})
    return None, {}


def load_config(
    config_file: str | None = None,
    flags: Iterable[str] = (),
    *,
    fail_on: str | None = None,
    strict_env: bool | None = None,
    cwd: str | Path | None = None,
) -> GateConfig:
    """Defaults, then the config table, then the flags (``--threshold``, ``--fail-on``, ``--strict-env``)."""
    source, table = find_gate_table(config_file, cwd)
    thresholds: dict[str, Threshold | None] = dict(defaults())
    known = {"thresholds", "fail-on", "fail_on", "strict-env", "strict_env"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise UsageError(
            f"{source}: unknown key(s) in [tool.ddpdoctor.gate]: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known))})"
        )
    conf_thresholds = table.get("thresholds") or {}
    if not isinstance(conf_thresholds, Mapping):
        raise UsageError(f'{source}: [tool.ddpdoctor.gate.thresholds] must be a table of METRIC = "THRESHOLD"')
    for metric, text in conf_thresholds.items():
        t = parse_threshold(metric, str(text), f"{source} [tool.ddpdoctor.gate.thresholds]")
        thresholds[catalog.canonical(metric) or metric] = t
    for flag in flags:
        metric, text = parse_assignment(flag)
        thresholds[catalog.canonical(metric) or metric] = parse_threshold(metric, text)
    conf_fail_on = table.get("fail-on", table.get("fail_on", DEFAULT_FAIL_ON))
    chosen = fail_on if fail_on is not None else str(conf_fail_on)
    if chosen not in SEVERITIES_OR_OFF:
        raise UsageError(
            f"{source or '--fail-on'}: fail-on must be one of {', '.join(SEVERITIES_OR_OFF)}, not {chosen!r}"
        )
    strict = strict_env if strict_env is not None else table.get("strict-env", table.get("strict_env", False))
    if not isinstance(strict, bool):
        raise UsageError(f"{source}: strict-env must be true or false")
    return GateConfig(
        thresholds={k: v for k, v in thresholds.items() if v is not None},
        fail_on=None if chosen == "off" else chosen,
        strict_env=strict,
        source=source,
    )
