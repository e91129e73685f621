"""Memory: peak RSS while ``ddpdoctor diagnose`` runs, over the size of the largest uncompressed rank trace.
Target: <= 1.5x (HTA needs about 4x; bench_hta.py measures it on the same files).

Each diagnosis runs in a fresh process (``diagnose_child.py``). From its peak (VmHWM) we subtract its RSS once
the interpreter and every module the CLI imports are loaded (the baseline, printed); ranks decoded in worker
processes (from ``ddpdoctor.load.loader.parallel_min_bytes()`` of JSON) are measured the same way (peak over all
workers, less a fresh worker's RSS). The parts of one large file (``ddpdoctor.load.decode``) are decoded by
processes forked while the main process holds the file's JSON: their RSS counts those pages, shared copy-on-write
and counted in the main process's peak already, so the file's size is subtracted from theirs too. The figure is
the larger of the two."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_common import CHILD, Report, label, mb, real_set, run_child, uncompressed_size

NAME = "memory"
TARGET = 1.5
SETS = ("hta/df_index_resolver", "tb-profiler/resnet50_num_workers_0", "astra-sim/megatron_tp8_a100_8ranks")
QUICK_SETS = ("hta/df_index_resolver",)


def measure(path: Path, *, floor: bool = False) -> dict[str, Any]:
    """Peak memory of diagnosing ``path`` in a fresh process (and, with ``floor``, of orjson-decoding it)."""
    from ddpdoctor.load.decode import PARTS_MIN_BYTES
    from ddpdoctor.load.discover import group_by_worker
    from ddpdoctor.load.discover import trace_files as ddpdoctor_trace_files
    from ddpdoctor.load.loader import parallel_min_bytes

    files = ddpdoctor_trace_files(path)
    sizes = [uncompressed_size(p) for p in files]
    # the loader's rule: worker processes for more than one rank and enough JSON in all; the decoder's: a large
    # file of one rank in parts, in forked processes
    ranks = len(group_by_worker(files))
    in_parts = ranks == 1 and max(sizes) >= PARTS_MIN_BYTES
    in_workers = (ranks > 1 and sum(sizes) >= parallel_min_bytes()) or in_parts
    child = run_child([str(CHILD), "diagnose", str(path)])
    base, peak = child["baseline_rss_kb"] * 1024, child["peak_rss_kb"] * 1024
    main = peak - base
    workers = None
    if in_workers and child.get("children_peak_rss_kb") and child.get("worker_baseline_rss_kb"):
        workers = max(0, child["children_peak_rss_kb"] - child["worker_baseline_rss_kb"]) * 1024
        if in_parts:  # forked while the main process held the file's JSON: its RSS counts those shared pages
            workers = max(0, workers - max(sizes))
    out = {
        "largest_rank_bytes": max(sizes),
        "total_bytes": sum(sizes),
        "ranks_files": len(sizes),
        "baseline_bytes": base,
        "peak_bytes": peak,
        "main_bytes": main,
        "workers_bytes": workers,
        "workers_share_the_file": in_parts,
        "ratio": max(main, workers or 0) / max(sizes),
        "whole_process_s": child["child_wall_s"],
        "import_s": child["import_s"],
        "work_s": child["work_s"],
    }
    if floor:
        f = run_child([str(CHILD), "floor", str(path)])
        out["floor_ratio"] = (f["peak_rss_kb"] - f["baseline_rss_kb"]) * 1024 / max(sizes)
    return out


def line(report: Report, label: str, m: dict[str, Any]) -> None:
    workers = "" if m["workers_bytes"] is None else f", workers {mb(m['workers_bytes']):.0f} MB"
    if m.get("workers_share_the_file") and m["workers_bytes"] is not None:
        workers += " besides the file's JSON they share with main"
    report.add(
        f"memory_vs_largest_rank[{label}]",
        m["ratio"],
        target=("<=", TARGET),
        note=f"peak {mb(m['peak_bytes']):.0f} MB - {mb(m['baseline_bytes']):.0f} MB interpreter+imports = "
        f"{mb(m['main_bytes']):.0f} MB main{workers}; largest trace file "
        f"{mb(m['largest_rank_bytes']):.1f} MB of {m['ranks_files']}, {mb(m['total_bytes']):.1f} MB in all",
    )
    if "floor_ratio" in m:
        report.add(
            f"orjson_memory_vs_largest_rank[{label}]",
            m["floor_ratio"],
            note="orjson.loads of the same files, one at a time (for contrast)",
        )


def run(report: Report, quick: bool) -> None:
    section: dict[str, Any] = {}
    for name in QUICK_SETS if quick else SETS:
        path = real_set(name)
        if path is None:
            report.skip(f"memory_vs_largest_rank[{label(name)}]", "trace set not found (../shared/traces)")
            continue
        m = measure(path, floor=not quick)
        section[name] = m
        line(report, label(name), m)
        report.add(
            f"startup_s[{label(name)}]",
            m["import_s"],
            unit="s",
            note=f"interpreter + imports of `ddpdoctor diagnose` (the analysis itself: {m['work_s']:.2f} s)",
        )
    report.sections[NAME] = section
