"""A fresh process for one measurement, so its peak memory and start-up belong to it alone:

    python benchmarks/diagnose_child.py MODE RUN OUT_JSON

MODE ``diagnose``: ``ddpdoctor diagnose RUN --steps 0..`` (decoding the traces) through the CLI's own ``main``
(report to a file);
``summaries``: ``ddpdoctor diagnose RUN`` (load -> analyze -> rules -> text report) from the per-rank summary
files, ``load(RUN, use_summaries=True)``; ``floor``: ``orjson.loads`` of every trace file under RUN, one after the
other (gunzip included).

Writes OUT_JSON: ``import_s`` (interpreter start to the end of the imports), ``baseline_rss_kb`` (RSS once
everything is imported: the interpreter + imports baseline the harness subtracts), ``peak_rss_kb`` (VmHWM of
this process at the end), ``children_peak_rss_kb`` (the largest peak of its worker processes),
``worker_baseline_rss_kb`` (RSS of a freshly forked worker that has done nothing: the part of a worker's peak
that is not its work), ``work_s`` (the measured part alone), ``work_cpu_s`` (its CPU time, this process's: on a
shared machine the part of ``work_s`` that waiting for a core does not inflate).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import orjson  # noqa: E402

import ddpdoctor.cli  # noqa: E402

if sys.argv[1:2] in (["diagnose"], ["summaries"]):
    ddpdoctor.cli._import_numpy_single_threaded()  # as `ddpdoctor diagnose` imports it (before the imports below)
import ddpdoctor.cli.diagnose_cmd  # noqa: E402,F401
import ddpdoctor.diagnosis  # noqa: E402
import ddpdoctor.load  # noqa: E402
import ddpdoctor.metrics  # noqa: E402
import ddpdoctor.pipeline  # noqa: E402,F401
import ddpdoctor.report  # noqa: E402
import ddpdoctor.report.text  # noqa: E402,F401

if sys.argv[1:2] == ["diagnose"]:  # what diagnose imports once it reads traces: code, not the analysis's memory
    import ddpdoctor.load.consistency  # noqa: F401
    import ddpdoctor.load.decode  # noqa: F401
    import ddpdoctor.load.frames  # noqa: F401
    import ddpdoctor.metrics.analysis  # noqa: F401
    import ddpdoctor.metrics.summary  # noqa: F401


def status_kb(field: str) -> int:
    """``VmRSS``/``VmHWM`` of this process in kB (Linux /proc); ru_maxrss where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker_rss_kb() -> int:
    return status_kb("VmRSS")


def diagnose(run: str, out_dir: str) -> int:
    # `--steps 0..` (every step) makes diagnose decode the traces even where the ranks left summaries: this mode
    # measures reading traces; the `summaries` mode measures the other path.
    return ddpdoctor.cli.main(["diagnose", run, "--steps", "0..", "--output", str(Path(out_dir) / "report.txt")])


def from_summaries(run: str, out_dir: str) -> int:
    if not all(Path(run, "ranks", f"rank{r}.summary.json").exists() for r in _capture_ranks(run)):
        raise SystemExit(f"{run}: not every rank has a summary file")
    # `ddpdoctor diagnose RUN` as a user runs it: the pipeline reads the summaries when every rank has one
    return ddpdoctor.cli.main(["diagnose", run, "--output", str(Path(out_dir) / "report.txt")])


def _capture_ranks(run: str) -> list[int]:
    names = Path(run, "ranks").glob("rank*.json")
    return sorted(int(p.name[4:-5]) for p in names if p.name[4:-5].isdigit())


def floor(run: str, out_dir: str) -> int:
    path = Path(run)
    names = (".json", ".json.gz")
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.name.endswith(names))
    for p in files:
        if p.name == "manifest.json":
            continue
        data = p.read_bytes()
        orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return 0


def main() -> None:
    mode, run, out = sys.argv[1:4]
    if mode == "diagnose":
        ddpdoctor.cli.build_parser()  # the CLI imports every command module (and their imports) at start-up
    imported = time.perf_counter() - T0
    baseline = status_kb("VmRSS")
    worker_baseline = None
    if mode == "diagnose":
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=1) as pool:  # forked like the loader's workers
            worker_baseline = pool.submit(worker_rss_kb).result()
    if mode in ("diagnose", "summaries"):
        # as `ddpdoctor` (cli.console_main) runs a command: the results it keeps are left to the OS at exit, not
        # freed one by one inside the measured call (seconds at 131,072 ranks); this process ends with os._exit
        ddpdoctor.cli._KEPT = []
    with tempfile.TemporaryDirectory() as tmp:
        t, cpu = time.perf_counter(), time.process_time()
        rc = {"diagnose": diagnose, "summaries": from_summaries, "floor": floor}[mode](run, tmp)
        work, work_cpu = time.perf_counter() - t, time.process_time() - cpu
    if rc not in (0, 1):
        raise SystemExit(f"{mode} {run}: exit code {rc}")
    result = {
        "mode": mode,
        "run": run,
        "import_s": imported,
        "work_s": work,
        "work_cpu_s": work_cpu,
        "baseline_rss_kb": baseline,
        "peak_rss_kb": status_kb("VmHWM"),
        "children_peak_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        "worker_baseline_rss_kb": worker_baseline,
    }
    Path(out).write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # what was kept (above) is not freed: the process ends as `ddpdoctor` does


if __name__ == "__main__":
    main()
