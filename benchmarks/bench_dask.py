"""The Dask path (issue 29): ``diagnose FOLDER --workers 2`` against ``diagnose FOLDER`` in one process, on a
folder of synthetic foreign rank traces (64 ranks of about 50 MB of JSON each; ``--quick``: 16 of 10 MB), each in a
fresh process: wall time, the client's peak RSS and the largest peak of its child processes (the Dask workers, or
the loader's own worker processes), and whether the two reports are the same.

The ranks are the recorded straggler sample's two traces, their events repeated (shifted by whole windows) up to
the size, renumbered 0..N-1. Cached in ``benchmarks/.cache/``."""

from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

from bench_common import CACHE, REPO, Report

NAME = "dask"
FULL = {"ranks": 64, "mb": 50}
QUICK = {"ranks": 16, "mb": 10}


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
import resource, sys, time, io, contextlib
from ddpdoctor.cli import main
out = io.StringIO()
t = time.perf_counter()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
wall = time.perf_counter() - t
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
import json, hashlib
print(json.dumps({"code": code, "wall_s": wall, "peak_kb": me, "children_peak_kb": kids,
                  "report_sha": hashlib.sha256(out.getvalue().encode()).hexdigest()}))
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
    alone = _measure(folder)
    clustered = _measure(folder, "--workers", "2")
    same = alone["report_sha"] == clustered["report_sha"]
    report.add(
        "dask-vs-one-process",
        clustered["wall_s"] / alone["wall_s"],
        note=(
            f"--workers 2: {clustered['wall_s']:.1f} s, client peak {clustered['peak_kb'] / 1024:.0f} MB, workers' "
            f"peak {clustered['children_peak_kb'] / 1024:.0f} MB; one process: {alone['wall_s']:.1f} s, peak "
            f"{alone['peak_kb'] / 1024:.0f} MB (its own decoding workers' peak "
            f"{alone['children_peak_kb'] / 1024:.0f} MB); reports {'the same' if same else 'DIFFERENT'}"
        ),
        status=None if same else "MISS",
        alone=alone,
        clustered=clustered,
    )


if __name__ == "__main__":
    r = Report()
    run(r, "--quick" in sys.argv)
