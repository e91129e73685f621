"""Run Holistic Trace Analysis on one trace folder and write what it found, how long it took and its peak
memory:

    benchmarks/.venv-hta/bin/python benchmarks/hta_runner.py TRACE_DIR OUT_JSON

Runs with HTA's own virtual environment (benchmarks/.venv-hta, made by bench_hta.py); imports nothing from
ddpdoctor. Timed after the imports: ``TraceAnalysis(trace_dir)`` (parse + align), ``get_comm_comp_overlap``
and ``get_temporal_breakdown``, no plots."""

from __future__ import annotations

import time

T0 = time.perf_counter()

import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402


def status_kb(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    trace_dir, out = sys.argv[1:3]
    result: dict = {"ok": False}
    try:
        from hta.trace_analysis import TraceAnalysis

        result["import_s"] = time.perf_counter() - T0
        result["baseline_rss_kb"] = status_kb("VmRSS")
        t = time.perf_counter()
        analyzer = TraceAnalysis(trace_dir=trace_dir)
        t_load = time.perf_counter()
        overlap = analyzer.get_comm_comp_overlap(visualize=False)
        t_overlap = time.perf_counter()
        temporal = analyzer.get_temporal_breakdown(visualize=False)
        t_end = time.perf_counter()
        result.update(
            ok=True,
            load_s=t_load - t,
            overlap_s=t_overlap - t_load,
            breakdown_s=t_end - t_overlap,
            analysis_s=t_end - t,
            overlap_pct={
                str(int(r)): (None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
                for r, v in zip(overlap["rank"], overlap["comp_comm_overlap_pctg"], strict=True)
            },
            temporal=json.loads(temporal.to_json(orient="records")),
        )
    except Exception as exc:  # noqa: BLE001 - HTA failing on a trace is a result, reported as such
        result["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        result["traceback"] = traceback.format_exc()[-2000:]
    result["peak_rss_kb"] = status_kb("VmHWM")
    result["children_peak_rss_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
