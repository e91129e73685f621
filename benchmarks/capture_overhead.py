"""Capture overhead: the same 2-rank DDP training bare, under `ddpdoctor trace`, and under a hand-written
torch.profiler with the same schedule. Targets (issue 7): steps outside the profiled window <= 2% slower than bare;
the whole traced run <= 1.1x the hand-written profiler.

Runs are interleaved (bare, traced, hand-written, bare, ...) so that machine noise hits all three alike, and the
medians over rounds are compared.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "bench_train.py"
WAIT, WARMUP, ACTIVE = 5, 2, 5


def _run(kind: str, work: Path, steps: int) -> dict:
    out = work / kind
    env_extra = {"BENCH_OUT": str(out), "BENCH_STEPS": str(steps), "BENCH_SCHEDULE": f"{WAIT},{WARMUP},{ACTIVE}"}
    torchrun = ["--standalone", "--nproc-per-node", "2"]
    if kind == "bare":
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun, str(SCRIPT)]
    elif kind == "handwritten":
        env_extra["BENCH_PROFILE"] = "1"
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun, str(SCRIPT)]
    else:
        cmd = [sys.executable, "-m", "ddpdoctor", "trace", "-q", "--out", str(work / "ddpdoctor-run"), "--force",
               "--wait", str(WAIT), "--warmup", str(WARMUP), "--active", str(ACTIVE), *torchrun, str(SCRIPT)]
    import os

    t = time.perf_counter()
    subprocess.run(cmd, env={**os.environ, **env_extra}, check=True, capture_output=True)
    wall = time.perf_counter() - t
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    # Iterations 1+WAIT+WARMUP .. +ACTIVE are profiled (iteration 0 is start-up); "outside" skips a margin after.
    first = 1 + WAIT + WARMUP
    window = range(first - WARMUP, first + ACTIVE + 1)
    outside = [ms for r in ranks for i, ms in enumerate(r["step_ms"]) if i >= 2 and i not in window]
    return {"wall_s": wall, "loop_s": max(r["loop_s"] for r in ranks), "outside_ms": statistics.median(outside)}


def measure(rounds: int = 3, steps: int = 80) -> dict:
    results: dict[str, list[dict]] = {"bare": [], "ddpdoctor": [], "handwritten": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for kind in results:
                results[kind].append(_run(kind, Path(tmp), steps))
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    return {
        "outside_window_vs_bare": med["ddpdoctor"]["outside_ms"] / med["bare"]["outside_ms"],
        "traced_loop_vs_handwritten": med["ddpdoctor"]["loop_s"] / med["handwritten"]["loop_s"],
        "traced_wall_vs_handwritten": med["ddpdoctor"]["wall_s"] / med["handwritten"]["wall_s"],
        "medians": med,
        "rounds": rounds,
        "steps": steps,
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))
