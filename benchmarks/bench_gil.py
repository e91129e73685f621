"""The GIL probe's own cost: the step time of one job with ddpdoctor's GIL probe running (what `trace` does in
the profiled window: gilknocker and the snapshots of the job's threads' waits) vs the same job without it (what
`trace --no-gil` does), quiet and with two CPU burners beside it (issue 25 item 5). Target: <= 1.02x.

The job is samples/gil_small_ops.py's step (small torch ops and Python bookkeeping, the worst case for a probe
that takes the GIL: the job lets go of it at every op), on the main thread (a DDP rank's training loop) and on
four threads. One child process per job and load runs blocks of steps with and without the probe, alternating, so
that what the machine does hits both alike; the ratio is of the medians of the blocks' median step times.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAME = "gil"


def _child(threads: int, blocks: int, steps: int) -> dict:
    sys.path.insert(0, str(REPO / "samples"))
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from ddpdoctor.capture.gil import GilProbe

    torch.manual_seed(0)
    torch.set_num_threads(1)
    weights = [torch.randn(16, 16, requires_grad=True) for _ in range(4)]
    optimizer = torch.optim.SGD(weights, lr=1e-4)

    def piece(i: int) -> torch.Tensor:
        x, seen = torch.ones(4, 16), []
        for k in range(60):
            x = torch.tanh(x @ weights[i]) * 0.5 + 0.1
            seen.append(sum(j * k for j in range(40)))
        return x.square().mean()

    pool = ThreadPoolExecutor(threads) if threads else None

    def step() -> None:
        losses = list(pool.map(piece, range(4))) if pool else [piece(i) for i in range(4)]
        optimizer.zero_grad()
        torch.stack(losses).sum().backward()
        optimizer.step()

    for _ in range(5):
        step()
    out: dict[str, list[float]] = {"on": [], "off": []}
    for b in range(blocks):
        for probed in (True, False) if b % 2 == 0 else (False, True):
            probe = GilProbe() if probed else None
            if probe is not None:
                probe.start()
            times = []
            for s in range(steps):
                t = time.perf_counter()
                step()
                if probe is not None:
                    probe.sample(s)
                times.append(time.perf_counter() - t)
            if probe is not None:
                probe.stop()
            out["on" if probed else "off"].append(statistics.median(times) * 1e3)
    if pool is not None:
        pool.shutdown()
    return out


def measure(threads: int, loaded: bool, blocks: int, steps: int) -> dict:
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(2 if loaded else 0)
    ]
    try:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, __file__, "--child", str(threads), str(blocks), str(steps)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    if done.returncode != 0:
        raise RuntimeError(f"bench_gil child failed: {done.stderr.strip()[-300:]}")
    blocks_ms = json.loads(done.stdout)
    on, off = statistics.median(blocks_ms["on"]), statistics.median(blocks_ms["off"])
    return {"on_ms": on, "off_ms": off, "ratio": on / off, **blocks_ms}


CASES = [(0, False), (0, True), (4, False), (4, True)]


def run(report, quick: bool) -> None:
    blocks, steps = (4, 10) if quick else (10, 20)
    for threads, loaded in CASES:
        r = measure(threads, loaded, blocks, steps)
        who = "main thread" if threads == 0 else f"{threads} threads"
        report.add(
            f"gil-probe-step-cost-{'1' if threads == 0 else threads}t-{'loaded' if loaded else 'quiet'}",
            r["ratio"],
            target=("<=", 1.02),
            note=(
                f"{who}, {'2 CPU burners beside it' if loaded else 'quiet'}: median step {r['on_ms']:.1f} ms with "
                f"the GIL probe, {r['off_ms']:.1f} ms with --no-gil"
            ),
            **r,
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
    else:
        for threads, loaded in CASES:
            r = measure(threads, loaded, 6, 15)
            times = f"{r['on_ms']:.1f} vs {r['off_ms']:.1f} ms"
            print(threads, "loaded" if loaded else "quiet", f"{r['ratio']:.3f}", times)
