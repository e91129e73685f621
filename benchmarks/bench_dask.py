"""The Dask path (issue 29): ``diagnose FOLDER --workers 2`` against ``diagnose FOLDER`` in one process, on a
folder of synthetic foreign rank traces (64 ranks of about 50 MB of JSON each; ``--quick``: 16 of 10 MB), each in a
fresh process: wall time; peak RSS of the client and of each process under it (the Dask workers, or the loader's
own decoding processes: each one's VmHWM, read every 50 ms), the most memory all of them held at once (the sum of
their PSS, sampled every 50 ms); and whether the two reports are the same. Full: 3 rounds, interleaved.

The ranks are the recorded straggler sample's two traces, their events repeated (shifted by whole windows) up to
the size, renumbered 0..N-1. Cached in ``benchmarks/.cache/``."""

from __future__ import annotations

import copy
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_common import CACHE, REPO, Report

NAME = "dask"
FULL = {"ranks": 64, "mb": 50, "reps": 3}
QUICK = {"ranks": 16, "mb": 10, "reps": 1}


def generate(ranks: int, mb_each: int) -> Path:
    out = CACHE / f"dask-{ranks}x{mb_each}mb"
    done = out / ".complete"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    sources = sorted((REPO / "samples" / "recorded" / "ddp_straggler").glob("rank*.pt.trace.json.gz"))
    for rank in range(ranks):
        doc = json.loads(gzip.decompress(sources[rank % 2].read_bytes()))
        events = doc["traceEvents"]
        size = len(json.dumps(events))
        span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) - min(e["ts"] for e in events if "ts" in e)
        grown = list(events)
        k = 1
        while size * k < mb_each * 1e6:
            for e in events:
                if "ts" in e and e.get("ph") != "M":
                    e2 = copy.copy(e)
                    e2["ts"] = e["ts"] + k * (span + 1000)
                    if isinstance(e2.get("name"), str) and e2["name"].startswith("ProfilerStep#"):
                        e2["name"] = f"ProfilerStep#{int(e2['name'][13:]) + 100 * k}"
                    grown.append(e2)
            k += 1
        doc["traceEvents"] = grown
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": rank, "world_size": ranks}
        (out / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    done.write_text("")
    return out


CHILD = """
import contextlib, hashlib, io, json, os, sys, threading, time
import psutil
from ddpdoctor.cli import main

# Peak RSS of this process and of each process under it (the Dask workers, or the loader's own decoding processes):
# VmHWM, the kernel's high-water mark of each, read every 50 ms while the process lives (ru_maxrss is not used: it
# keeps the peak of the process this one was forked from, across exec). And the largest sum of PSS over all of them
# at one sample, what the machine had to hold (PSS splits the pages a forked process shares with its parent).
me = psutil.Process()
hwm, total = {}, [0]
stop = threading.Event()

def vm_hwm_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0

def sample():
    while True:
        now = 0
        for proc in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.Error, OSError):
                hwm[proc.pid] = max(hwm.get(proc.pid, 0), vm_hwm_kb(proc.pid))
                now += proc.memory_full_info().pss
        total[0] = max(total[0], now // 1024)
        if stop.wait(0.05):
            return

sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
out = io.StringIO()
t = time.perf_counter()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
wall = time.perf_counter() - t
stop.set()
sampler.join()
mine = vm_hwm_kb(os.getpid())
print(json.dumps({
    "code": code,
    "wall_s": wall,
    "peak_kb": mine,
    # each process's peak, largest first; those under 30 MB (multiprocessing's resource tracker) left out
    "child_peaks_kb": sorted((v for pid, v in hwm.items() if pid != os.getpid() and v >= 30 << 10), reverse=True),
    "total_peak_kb": total[0],
    "report_sha": hashlib.sha256(out.getvalue().encode()).hexdigest(),
}))
"""


def _measure(folder: Path, *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "diagnose", str(folder), "--format", "json", *extra],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"diagnose {' '.join(extra)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mb(kb: float) -> str:
    return f"{kb / 1024:.0f}"


def _memory(m: dict) -> str:
    kids = m["child_peaks_kb"]
    workers = f"{'+'.join(_mb(k) for k in kids)} MB in its {len(kids)} worker(s)" if kids else "no worker process"
    return f"peaks: {_mb(m['peak_kb'])} MB in the client, {workers}"


def run(report: Report, quick: bool) -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        report.skip("dask-vs-one-process", "needs ddpdoctor[dask]")
        return
    params = QUICK if quick else FULL
    t = time.perf_counter()
    folder = generate(params["ranks"], params["mb"])
    took = time.perf_counter() - t
    report.say(f"  {params['ranks']} synthetic ranks of ~{params['mb']} MB of JSON each ({took:.0f} s to make or find)")
    # Interleaved, the order swapped each round, and paired: the machine is shared and its load drifts over minutes.
    alones, clustereds = [], []
    for i in range(params["reps"]):
        for path in ("alone", "clustered") if i % 2 == 0 else ("clustered", "alone"):
            if path == "alone":
                alones.append(_measure(folder))
            else:
                clustereds.append(_measure(folder, "--workers", "2"))
    same = len({m["report_sha"] for m in alones + clustereds}) == 1
    ratios = sorted(c["wall_s"] / a["wall_s"] for a, c in zip(alones, clustereds, strict=True))

    def times(ms: list[dict]) -> str:
        walls = sorted(m["wall_s"] for m in ms)
        return f"{statistics.median(walls):.1f} s" + (f" ({walls[0]:.1f}-{walls[-1]:.1f})" if len(walls) > 1 else "")

    spread = f" (pairs {ratios[0]:.2f}-{ratios[-1]:.2f}x)" if len(ratios) > 1 else ""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    report.add(
        "dask-vs-one-process",
        statistics.median(ratios),
        note=(
            f"time, median of {len(ratios)}{spread}: --workers 2 {times(clustereds)}, one process {times(alones)} "
            f"({len(alones[0]['child_peaks_kb']) or 'no'} decoding process(es) of its own); reports "
            f"{'the same' if same else 'DIFFERENT'}; load average after: {load}"
        ),
        status=None if same else "MISS",
        alone=alones,
        clustered=clustereds,
    )
    alone = max(alones, key=lambda m: m["total_peak_kb"])
    clustered = max(clustereds, key=lambda m: m["total_peak_kb"])
    report.add(
        "dask-peak-memory-vs-one-process",
        clustered["total_peak_kb"] / alone["total_peak_kb"],
        note=(
            f"most memory held at once (PSS of all processes; the largest of the runs): --workers 2 "
            f"{_mb(clustered['total_peak_kb'])} MB ({_memory(clustered)}), one process "
            f"{_mb(alone['total_peak_kb'])} MB ({_memory(alone)})"
        ),
    )


if __name__ == "__main__":
    r = Report()
    run(r, "--quick" in sys.argv)
