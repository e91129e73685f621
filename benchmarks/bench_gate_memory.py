"""Gate memory: ``baseline`` and ``gate`` of a 10,000-rank run, peak RSS next to ``diagnose`` of the same run.

``gate`` was killed by the OOM killer at 24.1 GB on 10,000 synthetic ranks (issue 23, item 5): the baseline kept
one sample per rank per step and the bootstrap built a (resamples x samples) index array. Its samples are now
bounded (``ddpdoctor.compare.samples``) and the bootstrap batched (``ddpdoctor.compare.stats``), so ``gate``
should need about what reading the run needs: the target is ``gate``'s peak RSS at most 1.5x ``diagnose``'s.

The run is bench_scale's synthetic-from-real run (per-rank summaries of a real 2-rank run, rank ids rewritten;
made once and cached). Each command runs in a fresh process; its peak RSS is the child's ``ru_maxrss``.
``--quick``: 1,024 ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_scale
from bench_common import CACHE, REPO, Report

NAME = "gate-memory"
RANKS, QUICK_RANKS = 10_000, 1024
TARGET_RATIO = 1.5


def _run(args: list[str], timeout: float = 900) -> tuple[float, float, int, str]:
    """(peak RSS in MB, wall s, exit code, last stderr line) of ``python -m ddpdoctor ARGS`` in a fresh process."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "ddpdoctor", *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=err
        )
        deadline = time.monotonic() + timeout
        while True:  # os.wait4 gives this child's own peak RSS (RUSAGE_CHILDREN is the maximum over all of them)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise TimeoutError(f"ddpdoctor {args[0]} ran past {timeout:.0f} s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        err.seek(0)
        last = (err.read().decode(errors="replace").strip().splitlines() or [""])[-1]
    return usage.ru_maxrss / 1024, wall, proc.returncode, last


def run(report: Report, quick: bool) -> None:
    n = QUICK_RANKS if quick else RANKS
    source = bench_scale.source_run()
    run_dir = bench_scale.synthesize(n, source, CACHE / f"scale-{n}")
    report.say(f"  synthetic-from-real: {n:,} ranks ({run_dir.relative_to(REPO)}); each command in a fresh process")
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-gate-memory-") as tmp:
        base = Path(tmp) / "baseline.json"
        results = {}
        for name, args, ok in (
            ("diagnose", ["diagnose", str(run_dir), "--output", str(Path(tmp) / "report.txt")], (0, 1)),
            ("baseline", ["baseline", str(run_dir), "--output", str(base)], (0,)),
            ("gate", ["gate", str(run_dir), "--baseline", str(base)], (0, 1)),
        ):
            rss, wall, code, last = _run(args)
            if code not in ok:
                raise RuntimeError(f"ddpdoctor {name} exited {code}: {last[-300:]}")
            results[name] = (rss, wall)
        size = base.stat().st_size
    for name, (rss, wall) in results.items():
        note = f"{wall:.1f} s" + (f"; baseline file {size / 1e6:.2f} MB" if name == "baseline" else "")
        report.add(f"gate_memory_{name}_{n}_ranks", rss, unit="MB", note=note)
    ratio = results["gate"][0] / results["diagnose"][0]
    report.add(
        f"gate_memory_vs_diagnose_{n}_ranks",
        ratio,
        unit="x",
        target=("<=", TARGET_RATIO),
        note="peak RSS of gate RUN --baseline FILE / of diagnose RUN (was: OOM at 24.1 GB vs 474 MB)",
    )
    report.sections[NAME] = {
        "ranks": n,
        "baseline_bytes": size,
        **{k: {"rss_mb": v[0], "wall_s": v[1]} for k, v in results.items()},
    }
