"""Compare two runs, write baselines, gate CI on regressions.

- ``catalog``: the metrics compared and gated (unit, worse direction, default threshold, samples).
- ``samples``: per-step samples from the capture files, leaving out steps the profiler disturbs.
- ``snapshot``: a run reduced to environment + metrics + samples + findings; a baseline file is one, as JSON.
- ``inputs``: read a run directory, traces or a baseline file into a Snapshot (the only module here doing
I/O).
- ``stats``: bootstrap interval of a change (is it noise?).
- ``thresholds``: ``+5%`` / ``+2ms`` / ``-0.1`` thresholds and ``[tool.ddpdoctor.gate]``.
- ``gate``: ``gate(current, baseline, config) -> GateResult``; ``diff``: ``compare(a, b) -> Comparison``.
- ``render``: text/json/markdown/html of both, JUnit XML and GitHub Actions output.
"""

from __future__ import annotations

from typing import Any

# Imported on first use (numpy, scipy and the pipeline are not needed to print `gate --help`).
_EXPORTS = {
    "Comparison": "diff",
    "compare": "diff",
    "GateResult": "gate",
    "gate": "gate",
    "read_input": "inputs",
    "Snapshot": "snapshot",
    "GateConfig": "thresholds",
    "load_config": "thresholds",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"ddpdoctor.compare.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'ddpdoctor.compare' has no attribute {name!r}")
