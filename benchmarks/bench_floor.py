"""Analysis vs the floor: ``ddpdoctor diagnose`` of a trace set against merely decoding the same files with
``orjson.loads`` (gunzip included for .gz): the cost of reading the JSON at all. Target: <= 1.3x the floor.

Both run in this process, after the imports (interpreter start-up is measured by the memory benchmark), turn
about, with a warm-up run first; medians. ``diagnose`` is the CLI's own ``main`` with the report written to a
file: load (ranks in parallel worker processes), every metric, every rule, the text report. The floor is one
process decoding the files one after the other, with Python's garbage collector on, as any program calling
``orjson.loads`` has it; the same floor with the collector off (which orjson's hundreds of thousands of dicts
trigger over and over) is printed too, as the stricter bound.
"""

from __future__ import annotations

import gc
import gzip
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_common import Report, interleave, label, mb, median, real_set, trace_files, uncompressed_size

NAME = "floor"
TARGET = 1.3
SETS = (
    "hta/df_index_resolver",
    "tb-profiler/resnet50_num_workers_0",
    "astra-sim/megatron_tp8_a100_8ranks",
    "hta/nccl_parser_config",
)
QUICK_SETS = ("hta/df_index_resolver", "astra-sim/megatron_tp8_a100_8ranks")


def orjson_floor(files: list[Path], *, collect: bool = True) -> Callable[[], None]:
    import orjson

    def decode() -> None:
        enabled = gc.isenabled()
        if not collect:
            gc.disable()
        try:
            for p in files:
                data = p.read_bytes()
                orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        finally:
            if enabled:
                gc.enable()

    return decode


def diagnose(path: Path, out_dir: str) -> Callable[[], None]:
    from ddpdoctor.cli import main

    def run() -> None:
        # `--steps 0..` (every step): decode the traces even where the ranks left per-rank summaries
        rc = main(["diagnose", str(path), "--steps", "0..", "--output", str(Path(out_dir) / "report.txt")])
        if rc not in (0, 1):
            raise RuntimeError(f"ddpdoctor diagnose {path} exited {rc}")

    return run


def compare(path: Path, reps: int, *, warm: bool = True) -> dict[str, Any]:
    """Median seconds of diagnose and of the two floors on ``path`` (a folder of traces or a run)."""
    files = [p for p in trace_files(path) if p.name != "manifest.json"]
    with tempfile.TemporaryDirectory() as tmp:
        times = interleave(
            {
                "diagnose": diagnose(path, tmp),
                "floor": orjson_floor(files),
                "floor_gc_off": orjson_floor(files, collect=False),
            },
            reps,
            warm=warm,
        )
    sizes = [uncompressed_size(p) for p in files]
    return {
        "files": len(files),
        "uncompressed_mb": mb(sum(sizes)),
        "largest_rank_mb": mb(max(sizes)),
        "times_s": times,
        **{f"{k}_s": median(v) for k, v in times.items()},
    }


def run(report: Report, quick: bool) -> None:
    try:
        import orjson  # noqa: F401
    except ImportError:
        report.skip("analysis_vs_floor", "orjson is not installed (pip install -e '.[test]')")
        return
    reps = 3 if quick else 5
    section: dict[str, Any] = {}
    for name in QUICK_SETS if quick else SETS:
        path = real_set(name)
        if path is None:
            report.skip(f"analysis_vs_floor[{label(name)}]", "trace set not found (../shared/traces)")
            continue
        r = compare(path, reps)
        section[name] = r
        what = f"{r['files']} file(s), {r['uncompressed_mb']:.1f} MB JSON"
        report.add(
            f"analysis_vs_floor[{label(name)}]",
            r["diagnose_s"] / r["floor_s"],
            target=("<=", TARGET),
            note=f"diagnose {r['diagnose_s']:.2f} s, orjson {r['floor_s']:.2f} s; {what}",
        )
        report.add(
            f"analysis_vs_floor_gc_off[{label(name)}]",
            r["diagnose_s"] / r["floor_gc_off_s"],
            note=f"orjson with the garbage collector off: {r['floor_gc_off_s']:.2f} s",
        )
    report.sections[NAME] = section
