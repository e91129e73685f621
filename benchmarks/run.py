"""The ddpdoctor benchmark harness (issue 7): every measure side by side in one run, one line each with its
ratio and target, and the results as JSON in benchmarks/results/<timestamp>.json.

    python benchmarks/run.py                 # everything (under 15 minutes on 2 cores)
    python benchmarks/run.py --quick         # smaller inputs, fewer repetitions (a couple of minutes)
    python benchmarks/run.py --only floor,hta
    python benchmarks/run.py --list

Measures: floor (a cold diagnose vs a cold process that only decodes the traces), hta (vs Holistic Trace
Analysis 0.5.0, in benchmarks/.venv-hta), memory (peak RSS vs the largest rank trace), large (>= 300 MB traces
made here), capture (trace overhead vs bare and vs a hand-written profiler), scale (up to 16,384 ranks from
summary files), gate-memory (peak RSS of baseline and gate of a 10,000-rank run vs diagnose of it), flight (the
step-time cost of the Flight Recorder and phase tracking every traced rank has, vs the same loop without), dask
(diagnose of 64 synthetic 50 MB ranks on a local Dask cluster of 2 workers vs in one process); gate-noise
(the gate's false alarms on reruns of one job under load; only with --only, it takes minutes); gil (the GIL
probe's cost on the step time of the rank it watches, quiet and beside 2 CPU burners; only with --only); series
(the always-on step series' cost on a DDP loop's step vs the same loop bare, in the same run, and what each
`--every` window adds to a traced 2-rank job vs the series only: time per window and per profiled step, MB on disk).
Real GPU traces come from ../shared/traces (or $DDPDOCTOR_TRACES); measures that need them are skipped without
them. Generated traces and runs are cached in benchmarks/.cache/. A MISS (or an UNSURE: a measure whose interval
straddles its target) does not change the exit code (1 only when a benchmark errors)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_dask  # noqa: E402
import bench_flight  # noqa: E402
import bench_floor  # noqa: E402
import bench_gate_memory  # noqa: E402
import bench_gate_noise  # noqa: E402
import bench_gil  # noqa: E402
import bench_hta  # noqa: E402
import bench_large  # noqa: E402
import bench_memory  # noqa: E402
import bench_scale  # noqa: E402
import bench_series  # noqa: E402
import capture_overhead  # noqa: E402
from bench_common import REPO, RESULTS, TRACES, Report, environment  # noqa: E402

BENCHMARKS = {
    m.NAME: m
    for m in (
        bench_floor,
        bench_hta,
        bench_memory,
        bench_large,
        capture_overhead,
        bench_scale,
        bench_gate_memory,
        bench_flight,
        bench_dask,
        bench_gate_noise,
        bench_gil,
        bench_series,
    )
}
OPT_IN = {bench_gate_noise.NAME, bench_gil.NAME}  # minutes of training runs under load: only with --only


def compile_package() -> None:
    """Write ddpdoctor's .pyc files, as pip does when it installs the package: cold-process measures must not
    time Python compiling its sources (which PYTHONDONTWRITEBYTECODE would otherwise make them do every run)."""
    import compileall

    compileall.compile_dir(str(REPO / "ddpdoctor"), quiet=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs and fewer repetitions")
    parser.add_argument("--only", metavar="NAMES", help=f"comma-separated, from: {', '.join(BENCHMARKS)}")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/<timestamp>.json")
    args = parser.parse_args(argv)
    if args.list:
        for name, module in BENCHMARKS.items():
            opt_in = " (only with --only)" if name in OPT_IN else ""
            print(f"{name:<8} {(module.__doc__ or '').strip().splitlines()[0]}{opt_in}")
        return 0
    names = [n for n in BENCHMARKS if n not in OPT_IN]
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BENCHMARKS]
        if unknown:
            parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")

    compile_package()
    env = environment()
    started = dt.datetime.now()
    report = Report()
    report.say(
        f"ddpdoctor benchmarks {'(quick) ' if args.quick else ''}{started:%Y-%m-%d %H:%M} - "
        f"{env['cpus']} CPUs, "
        f"load average {', '.join(f'{x:.1f}' for x in env['load_average'] or [])}; python {env['python']}, "
        f"torch {env['torch']}, git {env['git']}; traces: {TRACES if TRACES.is_dir() else 'not found'}"
    )
    durations: dict[str, float] = {}
    errors = 0
    t_all = time.perf_counter()
    for name in names:
        module = BENCHMARKS[name]
        report.say(f"\n== {name}: {(module.__doc__ or '').strip().splitlines()[0]}")
        t = time.perf_counter()
        try:
            module.run(report, args.quick)
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
            errors += 1
            report.add(name, None, status="ERROR", note=f"{type(exc).__name__}: {exc}"[:300])
            traceback.print_exc(file=sys.stderr)
        durations[name] = time.perf_counter() - t
        report.say(f"   ({name}: {durations[name]:.0f} s)")
    total = time.perf_counter() - t_all
    counts = {s: sum(m.status == s for m in report.measures) for s in ("PASS", "MISS", "UNSURE", "SKIP", "ERROR")}
    report.say(f"\n{', '.join(f'{v} {k}' for k, v in counts.items() if v)} in {total / 60:.1f} min")
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"{started:%Y%m%d-%H%M%S}{'-quick' if args.quick else ''}.json"
        result = {
            "started": started.isoformat(timespec="seconds"),
            "quick": args.quick,
            "benchmarks": names,
            "durations_s": durations,
            "total_s": total,
            "environment": env,
            **report.to_json(),
        }
        path.write_text(json.dumps(result, indent=1, default=str))
        report.say(f"results: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
