"""Analysis vs Holistic Trace Analysis (HTA): the same recorded GPU traces through HTA 0.5.0 (load + comm/comp
overlap + temporal breakdown) and through ``ddpdoctor diagnose``. Targets: >= 10x faster, the same overlap per
rank (within 1 percentage point: HTA rounds timestamps to whole µs).

HTA is installed by this harness into its own virtual environment, ``benchmarks/.venv-hta`` (gitignored; never
a ddpdoctor dependency); when it cannot be installed the measure says so and is skipped. HTA runs in a fresh
process each time (``hta_runner.py``) and times itself after its imports; ddpdoctor's time is the CLI's
``main`` in this process, after the imports, so neither counts interpreter start-up. The two take turns;
medians. ddpdoctor does more in its time than HTA in its: every metric, every rule and a report."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import BENCH, Report, label, median, real_set, run_child, trace_files, uncompressed_size

NAME = "hta"
HTA_VERSION = "0.5.0"
VENV = BENCH / ".venv-hta"
RUNNER = BENCH / "hta_runner.py"
SPEED_TARGET = 10.0
OVERLAP_TOLERANCE_PP = 1.0
SETS = (
    "hta/df_index_resolver",
    "astra-sim/megatron_tp8_a100_8ranks",
    "hta/nccl_parser_config",
    "hta/ns_resolution_trace",
    "tracelens/mi300_resnet_act_checkpoint",
)
QUICK_SETS = ("hta/df_index_resolver",)


def diagnose(path: Path, out_dir: str):  # noqa: ANN201 - a timed callable
    """``ddpdoctor diagnose`` through the CLI's own ``main`` in this process (after its imports), the report
    written to a file: like HTA's own timing, without interpreter start-up (bench_floor times cold processes)."""
    from ddpdoctor.cli import main

    def run() -> None:
        with contextlib.redirect_stderr(io.StringIO()):  # its "wrote the report to ..." line
            rc = main(["diagnose", str(path), "--output", str(Path(out_dir) / "report.txt")])
        if rc not in (0, 1):
            raise RuntimeError(f"ddpdoctor diagnose {path} exited {rc}")

    return run


def hta_python() -> tuple[Path | None, str]:
    """The HTA venv's python, installing HolisticTraceAnalysis==0.5.0 there first if needed; (None, why) when
    that fails."""
    python = VENV / "bin" / "python"
    check = [
        str(python),
        "-c",
        "import importlib.metadata as m, hta; print(m.version('HolisticTraceAnalysis'))",
    ]
    if python.exists():
        done = subprocess.run(check, capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == HTA_VERSION:
            return python, "cached"
    t = time.perf_counter()
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True, text=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"HolisticTraceAnalysis=={HTA_VERSION}"],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
        done = subprocess.run(check, capture_output=True, text=True, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        out = getattr(exc, "stderr", None) or str(exc)
        last = [ln for ln in str(out).strip().splitlines() if ln.strip()][-1:] or [str(exc)]
        return (
            None,
            f"could not install HolisticTraceAnalysis=={HTA_VERSION} into {VENV.name}: {last[0][:200]}",
        )
    return python, f"installed in {time.perf_counter() - t:.0f} s"


def ddpdoctor_overlap_pct(path: Path) -> dict[str, float | None]:
    """ddpdoctor's overlap per rank, in percent (HTA's unit)."""
    from ddpdoctor.pipeline import analyze_run

    return {
        str(r["rank"]): None if r["overlap_ratio"] is None else 100.0 * r["overlap_ratio"]
        for r in analyze_run(path).metrics.ranks
    }


def overlap_difference(hta: dict[str, float | None], ours: dict[str, float | None]) -> tuple[float | None, list[str]]:
    """Largest |HTA - ddpdoctor| in percentage points over the ranks, and the ranks where only one has a
    value."""
    worst, disagree = 0.0, []
    for rank in sorted(set(hta) | set(ours), key=int):
        a, b = hta.get(rank), ours.get(rank)
        if a is None and b is None:
            continue
        if a is None or b is None:
            disagree.append(f"rank {rank}: HTA {a}, ddpdoctor {b}")
            continue
        worst = max(worst, abs(a - b))
    return worst, disagree


def _pct(value: float | None, missing: str) -> str:
    return missing if value is None else f"{value:.2f}"


def compare(python: Path, path: Path, reps: int) -> dict[str, Any]:
    hta_runs: list[dict[str, Any]] = []
    ours: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        run_ours = diagnose(path, tmp)
        run_ours()  # warm: imports, page cache
        for i in range(reps):
            for who in ("hta", "ddpdoctor") if i % 2 == 0 else ("ddpdoctor", "hta"):
                if who == "hta":
                    hta_runs.append(run_child([str(RUNNER), str(path)], python=str(python)))
                    if not hta_runs[-1]["ok"]:
                        break
                else:
                    t = time.perf_counter()
                    run_ours()
                    ours.append(time.perf_counter() - t)
            if not hta_runs[-1]["ok"]:
                break
        if not ours:  # HTA failed first: time ddpdoctor on the same trace all the same
            t = time.perf_counter()
            run_ours()
            ours.append(time.perf_counter() - t)
    largest = max(uncompressed_size(p) for p in trace_files(path))
    first = hta_runs[0]
    out: dict[str, Any] = {"ddpdoctor_s": ours, "hta": hta_runs, "largest_rank_bytes": largest}
    if not first["ok"]:
        out["error"] = first["error"]
        return out
    out["hta_s"] = [r["analysis_s"] for r in hta_runs]
    out["hta_memory_ratio"] = (
        (max(first["peak_rss_kb"], first["children_peak_rss_kb"]) - first["baseline_rss_kb"]) * 1024 / largest
    )
    out["overlap_hta_pct"] = first["overlap_pct"]
    out["overlap_ddpdoctor_pct"] = ddpdoctor_overlap_pct(path)
    return out


def run(report: Report, quick: bool) -> None:
    sets = [(name, real_set(name)) for name in (QUICK_SETS if quick else SETS)]
    if not any(path for _, path in sets):
        report.skip("analysis_vs_hta", "no recorded trace set found (../shared/traces)")
        return
    python, how = hta_python()
    if python is None:
        report.skip("analysis_vs_hta", how)
        report.sections[NAME] = {"skipped": how}
        return
    report.say(f"  HTA {HTA_VERSION}: {VENV.relative_to(BENCH.parent)} ({how})")
    reps = 1 if quick else 3
    section: dict[str, Any] = {}
    for name, path in sets:
        if path is None:
            report.skip(f"analysis_vs_hta[{label(name)}]", "trace set not found (../shared/traces)")
            continue
        r = compare(python, path, reps)
        section[name] = r
        if "error" in r:
            report.add(
                f"analysis_vs_hta[{label(name)}]",
                None,
                status="INFO",
                note=f"HTA fails on this trace ({r['error'][:80]}); ddpdoctor diagnoses it in "
                f"{median(r['ddpdoctor_s']):.2f} s",
            )
            continue
        hta_s, ours_s = median(r["hta_s"]), median(r["ddpdoctor_s"])
        report.add(
            f"analysis_vs_hta[{label(name)}]",
            hta_s / ours_s,
            unit="x",
            target=(">=", SPEED_TARGET),
            note=f"HTA {hta_s:.2f} s, ddpdoctor {ours_s:.2f} s (times faster)",
        )
        worst, disagree = overlap_difference(r["overlap_hta_pct"], r["overlap_ddpdoctor_pct"])
        ours = r["overlap_ddpdoctor_pct"]
        shown = ", ".join(
            f"r{k} {_pct(v, 'NaN')}/{_pct(ours.get(k), 'None')}" for k, v in list(r["overlap_hta_pct"].items())[:4]
        )
        more = " ..." if len(r["overlap_hta_pct"]) > 4 else ""
        if disagree:
            report.add(f"overlap_vs_hta[{label(name)}]", None, status="MISS", note="; ".join(disagree[:3]))
        else:
            report.add(
                f"overlap_vs_hta[{label(name)}]",
                worst,
                unit="pp",
                target=("<=", OVERLAP_TOLERANCE_PP),
                note=f"overlap % HTA/ddpdoctor: {shown}{more}",
            )
        report.add(
            f"hta_memory_vs_largest_rank[{label(name)}]",
            r["hta_memory_ratio"],
            note="HTA's peak RSS less its imports, / the largest uncompressed rank trace (for measure 3)",
        )
    report.sections[NAME] = section
