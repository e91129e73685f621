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

from ddpdoctor.compare.diff import Comparison, compare
from ddpdoctor.compare.gate import GateResult, gate
from ddpdoctor.compare.inputs import read_input
from ddpdoctor.compare.snapshot import Snapshot
from ddpdoctor.compare.thresholds import GateConfig, load_config

__all__ = [
    "Comparison",
    "GateConfig",
    "GateResult",
    "Snapshot",
    "compare",
    "gate",
    "load_config",
    "read_input",
]
