"""Flight Recorder and phase tracking: the step time of one training loop with what every traced rank records for
its dumps (the Flight Recorder on, the phase tracker's hooks) vs the same loop without (issue 24). Target: <= 1.01x.

The two run in separate processes (the Flight Recorder's size is read when the process group is made), interleaved
round by round so that machine noise hits both alike; the medians over rounds of each process's 10th-percentile
step CPU time (all the process's threads) are compared: on a shared machine the wall time of a step mostly
measures the neighbours (the wall ratio is shown beside it).
Each step: forward, backward, 8 all_reduces (one per parameter, as DDP's buckets), the optimizer."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = HERE / "flight_child.py"
NAME = "flight"
FR_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def _step_us(recorded: bool, steps: int) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in FR_VARIABLES}
    env["BENCH_STEPS"] = str(steps)
    env["OMP_NUM_THREADS"] = "1"
    if recorded:
        env.update({name: "2000" for name in FR_VARIABLES}, BENCH_PHASE="1")
    out = subprocess.run([sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"flight_child failed: {out.stderr.strip()[-300:]}")
    result = json.loads(out.stdout)
    return _low(result["cpu_us"]), _low(result["step_us"])


def _low(values: list[float]) -> float:
    """The 10th percentile: a step's own cost (what neighbours on a shared machine add only makes steps longer)."""
    return statistics.quantiles(values, n=10)[0]


def compare(rounds: int, steps: int) -> dict:
    plain, recorded = [], []
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        for with_fr in order:
            (recorded if with_fr else plain).append(_step_us(with_fr, steps))
    plain_us, recorded_us = statistics.median(c for c, _ in plain), statistics.median(c for c, _ in recorded)
    wall = statistics.median(w for _, w in recorded) / statistics.median(w for _, w in plain)
    return {
        "plain_step_us": plain_us,
        "recorded_step_us": recorded_us,
        "ratio": recorded_us / plain_us,
        "cost_us": recorded_us - plain_us,
        "wall_ratio": wall,
        "round_ratios": [r[0] / p[0] for r, p in zip(recorded, plain, strict=True)],
    }


def run(report, quick: bool) -> None:
    result = compare(rounds=3 if quick else 7, steps=100 if quick else 300)
    report.add(
        "flight-recorder-step-cost",
        result["ratio"],
        target=("<=", 1.01),
        note=(
            f"median step CPU {result['recorded_step_us'] / 1e3:.2f} ms with the Flight Recorder and phase tracking, "
            f"{result['plain_step_us'] / 1e3:.2f} ms without ({result['cost_us']:+.0f} us/step; wall ratio "
            f"{result['wall_ratio']:.3f}; rounds " + ", ".join(f"{r:.3f}" for r in result["round_ratios"]) + ")"
        ),
        **result,
    )


if __name__ == "__main__":
    print(json.dumps(compare(rounds=3, steps=100), indent=1))
