"""Analysis vs the floor: a cold ``ddpdoctor diagnose --format json`` of a trace set against the floor process
(``floor_process.py``: gunzip with ISA-L and decode only the fields ddpdoctor reads into msgspec structs).
Target: <= 1.5x the floor.

Both are timed as a user runs them: a fresh process each time, interpreter start-up and imports included
(``run.py`` compiles the package to .pyc first, as pip does), taking turns, after one untimed run of each (page
cache); medians. ``diagnose`` decodes the traces even in a run directory whose ranks left summaries
(``--steps 0..``); there the ranks are decoded the way ``diagnose`` chooses (in worker processes when that pays).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_common import BENCH, REPO, Report, interleave, label, mb, median, real_set, trace_files, uncompressed_size

NAME = "floor"
TARGET = 1.5
FLOOR = BENCH / "floor_process.py"
SETS = (
    "hta/df_index_resolver",
    "tb-profiler/resnet50_num_workers_0",
    "astra-sim/megatron_tp8_a100_8ranks",
    "hta/nccl_parser_config",
)
QUICK_SETS = ("hta/df_index_resolver", "astra-sim/megatron_tp8_a100_8ranks", "hta/nccl_parser_config")


def _child(cmd: list[str]) -> Callable[[], None]:
    def run() -> None:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode not in (0, 1):  # diagnose exits 1 when it has findings
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-500:]}")

    return run


def floor_process(files: list[Path]) -> Callable[[], None]:
    """One cold process decoding ``files`` (see floor_process.py)."""
    return _child([sys.executable, str(FLOOR), *map(str, files)])


def diagnose(path: Path, out_dir: str) -> Callable[[], None]:
    """One cold ``ddpdoctor diagnose --format json`` of ``path``, the report written to a file."""
    cmd = [sys.executable, "-m", "ddpdoctor", "diagnose", str(path), "--format", "json"]
    if any(path.glob("ranks/rank*.summary.json")):
        cmd += ["--steps", "0.."]  # decode the traces, not the ranks' summaries
    return _child([*cmd, "--output", str(Path(out_dir) / "report.json")])


def compare(path: Path, reps: int, *, warm: bool = True) -> dict[str, Any]:
    """Median seconds of a cold diagnose and of the floor process on ``path`` (a folder of traces or a run)."""
    files = [p for p in trace_files(path) if p.name != "manifest.json"]
    with tempfile.TemporaryDirectory() as tmp:
        times = interleave({"diagnose": diagnose(path, tmp), "floor": floor_process(files)}, reps, warm=warm)
    sizes = [uncompressed_size(p) for p in files]
    return {
        "files": len(files),
        "uncompressed_mb": mb(sum(sizes)),
        "largest_rank_mb": mb(max(sizes)),
        "times_s": times,
        **{f"{k}_s": median(v) for k, v in times.items()},
    }


def run(report: Report, quick: bool) -> None:
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
            note=f"diagnose {r['diagnose_s']:.2f} s, floor process {r['floor_s']:.2f} s; {what}",
        )
    section["startup"] = startup(report, reps)
    report.sections[NAME] = section


STARTUP_TARGET_S = 0.15
SAMPLE_RUN = REPO / "samples" / "recorded" / "ddp_straggler"


def startup(report: Report, reps: int) -> dict[str, Any]:
    """Cold ``ddpdoctor --help`` and ``ddpdoctor diagnose`` of a run with per-rank summaries (the bundled
    recorded sample: 2 ranks, no trace decoded), as a user runs them, against a bare interpreter's start."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "report.txt")
        times = interleave(
            {
                "python": _child([sys.executable, "-c", "pass"]),
                "help": _child([sys.executable, "-m", "ddpdoctor", "--help"]),
                "summaries": _child([sys.executable, "-m", "ddpdoctor", "diagnose", str(SAMPLE_RUN), "--output", out]),
            },
            max(reps, 5),
        )
    medians = {k: median(v) for k, v in times.items()}
    for key, what in (("help", "ddpdoctor --help"), ("summaries", "ddpdoctor diagnose of a run from its summaries")):
        report.add(
            f"startup_{key}_s",
            medians[key],
            unit="s",
            target=("<=", STARTUP_TARGET_S),
            note=f"cold process, {what}; a bare `python -c pass` takes {medians['python']:.3f} s here",
        )
    return {"times_s": times, **{f"{k}_s": v for k, v in medians.items()}}
