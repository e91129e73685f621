"""The always-on step series' cost: the step time of one DDP training loop with the series recorded (what every
traced rank does at each step end: capture/series.py, its writer thread, DDP's logging data read at its bounded
rate) vs the same loop without it, in the same run (issue 28 item 1). Target: <= 1.01x.

One child process (a 1-rank gloo DDP job: forward, backward through DDP's all-reduce, the optimizer; the phase
tracker installed in both, as in every traced rank) runs blocks of steps with and without the recorder,
alternating, so that what the machine does hits both alike. Compared: the medians over blocks of each block's
10th-percentile step time, in CPU time of the whole process (the writer thread's work included) and in wall time;
and, with little noise, the CPU time of the recorder's call at each step end plus its writer thread's per step, as
a share of the bare step's CPU time.

The per-window cost (``--every``, issue 28 item 2), in the same benchmark run: the same 2-rank DDP job
(torchrun + gloo, this file with ``--job``) traced by ``ddpdoctor trace`` with the series only (``--wait`` beyond its
last step: no profiled window) and with ``--every EVERY`` (a window of ``--warmup 2 --active 5`` every EVERY steps),
alternating, REPS times each. Compared: the training loop's time (the first step's end to the last one's, from the
series files, the slowest rank), the difference per window and per profiled step, and the traces written per
window (MB on disk, both ranks).
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
WARMUP, ACTIVE = 2, 5  # each window of the per-window measure: --warmup 2 --active 5
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


def _job(steps: int, width: int) -> None:
    """A rank of the traced job of the per-window measure: ``steps`` DDP steps of the model of ``_child``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, width)
    for _ in range(steps):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    del model, opt
    dist.barrier()
    dist.destroy_process_group()


def _traced(out: Path, steps: int, width: int, every: int | None) -> dict:
    """One ``ddpdoctor trace`` of the job: its loop time (s), windows taken and their traces' bytes."""
    from ddpdoctor.capture.series import read_series

    window = ["--every", str(every), "--wait", "5"] if every else ["--wait", str(steps + 100)]  # no window
    cmd = [sys.executable, "-m", "ddpdoctor", "trace", "--out", str(out), *window]
    cmd += ["--warmup", str(WARMUP), "--active", str(ACTIVE)]
    cmd += ["-q", "--standalone", "--nproc-per-node", "2", __file__, "--job", str(steps), str(width)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"ddpdoctor trace of the job failed: {done.stderr.strip()[-300:]}")
    series = read_series(out)
    if sorted(series) != [0, 1] or any(len(s.rows) != steps for s in series.values()):
        raise RuntimeError(f"the series of {out} does not hold {steps} steps per rank")
    loop = max(s.rows[-1]["t"] - s.rows[0]["t"] for s in series.values())
    traces = sorted(out.glob("rank*.pt.trace.json*"))
    windows = {r: sum(p.name.startswith(f"rank{r}.") for p in traces) for r in (0, 1)}
    if windows[0] != windows[1]:
        raise RuntimeError(f"the ranks took different numbers of windows: {windows}")
    # the job's step: the slowest rank's (they leave each step together, through DDP's all-reduce)
    walls = [max(s.rows[k]["wall_s"] for s in series.values()) for k in range(1, steps)]
    # each window's steps: its warm-up and recorded steps (the rank file's steps.profiled, numbered as the series'
    # steps), and the 2 after it, where its trace is exported
    spans = []
    for first, last in json.loads((out / "ranks" / "rank0.json").read_text())["steps"]["profiled"] if every else []:
        spans.append(range(max(1, first - WARMUP), min(steps, last + 3)))
    inside = {k for span in spans for k in span}
    outside = [w for k, w in enumerate(walls, start=1) if k not in inside]
    base = statistics.median(outside)
    return {
        "loop_s": loop,
        "wall_s": wall,
        "windows": windows[0],
        "trace_bytes": sum(p.stat().st_size for p in traces),
        "step_s": base,
        # what each window's steps took beyond as many of this run's steps outside every window
        "excess_s": [sum(walls[k - 1] for k in span) - len(span) * base for span in spans],
        "span_steps": [len(span) for span in spans],
    }


def measure_windows(steps: int, every: int, reps: int, width: int = WIDTH) -> dict:
    """The job traced with the series only and with ``--every every``, alternating, ``reps`` times each."""
    runs: dict[str, list[dict]] = {"series": [], "every": []}
    with tempfile.TemporaryDirectory(prefix="bench-window-") as tmp:
        for rep in range(reps):
            for kind in ("series", "every") if rep % 2 == 0 else ("every", "series"):
                out = Path(tmp) / f"{kind}{rep}"
                runs[kind].append(_traced(out, steps, width, every if kind == "every" else None))
    windows = runs["every"][0]["windows"]
    if windows == 0 or any(r["windows"] != windows for r in runs["every"]) or any(r["windows"] for r in runs["series"]):
        raise RuntimeError(f"windows taken: {[r['windows'] for k in runs for r in runs[k]]}")
    loop_series = statistics.median(r["loop_s"] for r in runs["series"])
    loop_every = statistics.median(r["loop_s"] for r in runs["every"])
    excess = [e for r in runs["every"] for e in r["excess_s"]]
    per_window = statistics.median(excess)
    step_series = statistics.median(r["step_s"] for r in runs["series"])
    step_every = statistics.median(r["step_s"] for r in runs["every"])
    return {
        "steps": steps,
        "every": every,
        "reps": reps,
        "windows": windows,
        "profiled_steps_per_window": WARMUP + ACTIVE,
        "per_window_s": per_window,
        "per_window_iqr_s": statistics.quantiles(excess, n=4)[::2] if len(excess) > 1 else [per_window] * 2,
        "per_profiled_step_ms": per_window / (WARMUP + ACTIVE) * 1e3,
        "window_in_steps": per_window / step_series,
        "window_mb": statistics.median(r["trace_bytes"] for r in runs["every"]) / windows / 1e6,
        "step_series_ms": step_series * 1e3,
        "step_every_ms": step_every * 1e3,
        "every_share": per_window / (every * step_series),
        "loop_series_s": loop_series,
        "loop_every_s": loop_every,
        "loop_ratio": loop_every / loop_series,
        "job_wall_series_s": statistics.median(r["wall_s"] for r in runs["series"]),
        "job_wall_every_s": statistics.median(r["wall_s"] for r in runs["every"]),
        "loop_s": {k: [round(r["loop_s"], 3) for r in v] for k, v in runs.items()},
        "excess_s": [round(e, 4) for e in excess],
    }


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

    steps, every, reps = (300, 100, 2) if quick else (600, 100, 3)
    w = measure_windows(steps, every, reps)
    lo, hi = w["per_window_iqr_s"]
    report.add(
        "series-window-cost",
        w["per_window_s"] * 1e3,
        unit="ms",
        note=(
            f"each window (--warmup {WARMUP} --active {ACTIVE}: {w['profiled_steps_per_window']} profiled steps) "
            f"added {w['per_window_s'] * 1e3:.0f} ms to the job (quartiles {lo * 1e3:.0f}-{hi * 1e3:.0f} ms over "
            f"{len(w['excess_s'])} windows; its steps and the 2 after it vs as many of the same run's other steps), "
            f"{w['per_profiled_step_ms']:.1f} ms per profiled step, {w['window_in_steps']:.1f}x a step of the series-"
            f"only run ({w['step_series_ms']:.2f} ms)"
        ),
        **w,
    )
    report.add(
        "series-window-disk",
        w["window_mb"],
        unit="MB/window",
        note="the traces of one window, both ranks (gzip; this job's 2-layer model: a larger model writes more)",
        **w,
    )
    report.add(
        f"series-every-{every}-cost",
        1 + w["every_share"],
        note=(
            f"a window every {every} steps: the job's time with its windows vs the series only, from the per-window "
            f"cost ({w['windows']} windows in {steps} steps; the loops themselves took {w['loop_every_s']:.2f} s vs "
            f"{w['loop_series_s']:.2f} s, medians of {reps} runs each: run-to-run noise of a loaded host "
            f"{min(w['loop_s']['series']):.2f}-{max(w['loop_s']['series']):.2f} s; the steps outside the windows "
            f"{w['step_every_ms']:.2f} ms vs {w['step_series_ms']:.2f} ms with the series only)"
        ),
        **w,
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "--job":
        _job(int(sys.argv[2]), int(sys.argv[3]))
    else:
        print(json.dumps({"always-on": measure(4, 100, WIDTH), "per-window": measure_windows(300, 100, 2)}, indent=1))
