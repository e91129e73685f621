"""The always-on step series' cost: the step time of one DDP training loop with the series recorded (what every
traced rank does at each step end: capture/series.py, its writer thread, DDP's logging data read at its bounded
rate) vs the same loop without it, in the same run (issue 28 item 1). Target: <= 1.01x.

One child process (a 1-rank gloo DDP job: forward, backward through DDP's all-reduce, the optimizer; the phase
tracker installed in both, as in every traced rank) runs blocks of steps with and without the recorder,
alternating, so that what the machine does hits both alike. Compared: the medians over blocks of each block's
10th-percentile step time, in CPU time of the whole process (the writer thread's work included) and in wall time;
and, with little noise, the CPU time of the recorder's call at each step end plus its writer thread's per step, as
a share of the bare step's CPU time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAME = "series"
WIDTH = 512  # the model: Linear(WIDTH, WIDTH), ReLU, Linear(WIDTH, 10) on a batch of 64; a ~5 ms CPU step


def _low(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[0]


def _child(blocks: int, steps: int, width: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpdoctor.capture import ddp as ddp_capture
    from ddpdoctor.capture.memory import DeviceMemory
    from ddpdoctor.capture.phase import PhaseTracker
    from ddpdoctor.capture.series import SeriesRecorder, read_rank_series, series_file
    from ddpdoctor.capture.step_clock import StepClock

    torch.manual_seed(0)
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    ddp_capture.install()  # as in a traced rank: DDP modules tracked, DDP timing every iteration
    model = DDP(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, width)
    out_dir = Path(tempfile.mkdtemp(prefix="bench-series-"))
    clock, phase, memory = StepClock(), PhaseTracker(), DeviceMemory()
    phase.install()
    session = SimpleNamespace(
        clock=clock,
        phase=phase,
        memory=memory,
        claimed=True,
        out=out_dir,
        root=out_dir,
        rank=0,
        identity=SimpleNamespace(rank=0, world_size=1, local_rank=0),
        pid=os.getpid(),
        started_at=time.time(),
        config=SimpleNamespace(extra={}),
        capture_errors=[],
    )
    recorder = SeriesRecorder(session)

    def block(recorded: bool) -> tuple[list[float], list[float], float]:
        cpu, wall, own = [], [], 0.0
        for _ in range(steps):
            c, t = time.process_time(), time.perf_counter()
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            iteration = clock.iteration
            clock.tick("optimizer", recording=False)  # what the session does at every step end, both ways
            phase.step_ended(clock.iteration)
            memory.sample(iteration)
            if recorded:
                r = time.thread_time()  # CPU of this thread: a preemption on a loaded machine is not counted
                recorder.step(iteration)
                own += time.thread_time() - r
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - t)
        return cpu, wall, own / steps

    for _ in range(20):
        block(False)  # warm-up
    block(True)  # the recorder's first step and first write (its thread, the file, imports) are a one-off
    time.sleep(1.5)
    writer_cpu0, steps0 = recorder.writer_cpu_s, recorder.steps
    out: dict[str, list[float]] = {"on_cpu": [], "off_cpu": [], "on_wall": [], "off_wall": [], "own": []}
    for b in range(blocks):
        for recorded in (True, False) if b % 2 == 0 else (False, True):
            cpu, wall, own = block(recorded)
            key = "on" if recorded else "off"
            out[f"{key}_cpu"].append(_low(cpu) * 1e6)
            out[f"{key}_wall"].append(_low(wall) * 1e6)
            if recorded:
                out["own"].append(own * 1e6)
    time.sleep(1.5)  # the writer's last round for the measured steps
    done = recorder.steps - steps0
    out["writer_cpu_per_step"] = [(recorder.writer_cpu_s - writer_cpu0) / max(1, done) * 1e6]
    recorder.close()
    phase.uninstall()
    rows = read_rank_series(series_file(out_dir, 0)).rows
    out["rows"] = len(rows)
    out["ddp_rows"] = sum(r["ddp_comm_s"] is not None for r in rows)
    dist.destroy_process_group()
    return out


def measure(blocks: int, steps: int, width: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--child", str(blocks), str(steps), str(width)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bench_series child failed: {done.stderr.strip()[-300:]}")
    r = json.loads(done.stdout)
    on_cpu, off_cpu = statistics.median(r["on_cpu"]), statistics.median(r["off_cpu"])
    on_wall, off_wall = statistics.median(r["on_wall"]), statistics.median(r["off_wall"])
    own = statistics.median(r["own"])
    writer = r["writer_cpu_per_step"][0]
    return {
        "on_cpu_us": on_cpu,
        "off_cpu_us": off_cpu,
        "ratio": on_cpu / off_cpu,
        "wall_ratio": on_wall / off_wall,
        "off_wall_us": off_wall,
        "own_us": own,
        "writer_us": writer,
        "added_ratio": 1 + (own + writer) / off_cpu,
        "rows": r["rows"],
        "ddp_rows": r["ddp_rows"],
    }


def run(report, quick: bool) -> None:
    blocks, steps = (4, 100) if quick else (10, 200)
    r = measure(blocks, steps, width=WIDTH)
    report.add(
        "series-step-cost",
        r["ratio"],
        target=("<=", 1.01),
        note=(
            f"step CPU time (whole process) {r['on_cpu_us'] / 1e3:.3f} ms with the series, "
            f"{r['off_cpu_us'] / 1e3:.3f} ms bare (wall ratio {r['wall_ratio']:.3f}); {r['rows']} rows written, "
            f"{r['ddp_rows']} with DDP's timing"
        ),
        **r,
    )
    report.add(
        "series-added-work",
        r["added_ratio"],
        target=("<=", 1.01),
        note=(
            f"the bare step's CPU time, {r['off_cpu_us'] / 1e3:.3f} ms, plus what the series adds: its call at each "
            f"step end {r['own_us']:.1f} us and its writer thread {r['writer_us']:.1f} us per step (CPU times of "
            "those threads: what a loaded machine's preemptions add is not counted)"
        ),
        **r,
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
    else:
        print(json.dumps(measure(4, 100, WIDTH), indent=1))
