"""Large traces: real traces of >= 300 MB of JSON per rank, made here by tracing a deep DDP model on 2 CPU
ranks (``large_train.py`` under ``ddpdoctor trace``; cached in ``benchmarks/.cache/`` so reruns skip it), then
diagnosed in a cold process: time against the floor process, peak memory
against the largest rank trace (the same targets as the floor and memory measures), and the time from the
ranks' own summary files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import BENCH, CACHE, CHILD, Report, mb, run_child
from bench_floor import TARGET as FLOOR_TARGET
from bench_floor import compare
from bench_memory import line as memory_line
from bench_memory import measure as measure_memory

NAME = "large"
FULL = {"depth": 128, "active": 40}  # about 316 MB of JSON per rank, 45-60 s to make on 2 cores
QUICK = {"depth": 64, "active": 10}  # about 40 MB per rank


def generate(depth: int, active: int) -> tuple[Path, str]:
    """A traced 2-rank run of large_train.py (from the cache when it is there and complete)."""
    out = CACHE / f"large-d{depth}-a{active}"
    if _complete(out):
        return out, "cached"
    t = time.perf_counter()
    cmd = [
        sys.executable, "-m", "ddpdoctor", "trace", "-q", "--out", str(out), "--force",
        "--standalone", "--nproc-per-node", "2", "--wait", "1", "--warmup", "1", "--active", str(active),
        str(BENCH / "large_train.py"), "--depth", str(depth), "--steps", str(active + 4),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    if not _complete(out):
        raise RuntimeError(f"ddpdoctor trace did not leave a complete run in {out}")
    return out, f"traced in {time.perf_counter() - t:.0f} s"


def _complete(out: Path) -> bool:
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    traces = list(out.glob("rank*.pt.trace.json.gz"))
    summaries = list((out / "ranks").glob("rank*.summary.json"))
    return manifest.get("exit_code") == 0 and len(traces) == 2 and len(summaries) == 2


def run(report: Report, quick: bool) -> None:
    params = QUICK if quick else FULL
    path, how = generate(**params)
    timing = compare(path, reps=1 if quick else 2, warm=False)
    report.say(
        f"  {path.relative_to(BENCH.parent)}: 2 ranks, {timing['largest_rank_mb']:.0f} MB of JSON in the "
        f"largest ({timing['uncompressed_mb']:.0f} MB in all, gzipped on disk); {how}"
    )
    report.add(
        "large_analysis_vs_floor",
        timing["diagnose_s"] / timing["floor_s"],
        target=("<=", FLOOR_TARGET),
        note=f"diagnose {timing['diagnose_s']:.1f} s, floor process {timing['floor_s']:.1f} s (both cold processes)",
    )
    report.add(
        "large_diagnose_mb_per_s",
        timing["uncompressed_mb"] / timing["diagnose_s"],
        unit="MB/s",
        note="JSON diagnosed per second, both ranks together, 2 cores",
    )
    memory = measure_memory(path)
    memory_line(report, "large", memory)
    child = run_child([str(CHILD), "summaries", str(path)])
    report.add(
        "large_diagnose_from_summaries_s",
        child["child_wall_s"],
        unit="s",
        note=f"whole process, from ranks/rank<R>.summary.json (no trace decoded); peak "
        f"{mb((child['peak_rss_kb'] - child['baseline_rss_kb']) * 1024):.0f} MB over the baseline",
    )
    section: dict[str, Any] = {
        "run": str(path),
        "params": params,
        "made": how,
        "timing": timing,
        "memory": memory,
    }
    section["from_summaries"] = child
    report.sections[NAME] = section
