"""The always-on step series' cost: the step time of one DDP training loop with the series recorded (what every
traced rank does at each step end: capture/series.py, its writer thread, DDP's logging data read at its bounded
rate) vs the same loop without it, in the same run (issue 28 item 1). Target: <= 1.01x.

One child process (a 1-rank gloo DDP job: forward, backward through DDP's all-reduce, the optimizer; the phase
tracker installed in the first three arms, as in every traced rank) runs ROUNDS rounds of a block of 8 steps in each
of four arms: with the recorder, bare, bare again (an A/A control: how far two identical arms differ on this machine
now), and with none of ddpdoctor (no hooks, no step clock, no memory sample: the whole always-on capture's cost
is the recorder arm against it; DDP times iterations at its own rate in every arm, as outside a window), their
order rotating each round, so that the steps compared are milliseconds apart and what the machine does hits them
alike (the 24 orders in turn: each arm as often in each place and after each other arm, so that what a block leaves
behind weighs on all alike). Per round and arm the median step (CPU time of the whole process, and wall time); per
round the ratio of the recorded arm to the mean of the two bare ones (and bare again to bare: the
A/A ratio); the median of those ratios over rounds with its 95% percentile bootstrap interval (2,000 resamples of
the rounds). PASS only when the whole interval is <= 1.01, MISS when all of it is above, UNSURE otherwise: a
loaded 2-core machine can leave the A/A interval wider than the 1% to be shown.

Then the cost timed directly, which a loaded machine's preemptions do not reach: a stretch of >= 800 steps all
recorded (as in a traced job: the RSS read every 50 ms, DDP's read at its budget, the writer's flush once a second
of all the steps since), the CPU time of each recorder call on the training thread (time.thread_time around it)
and of the writer thread per step, as a share of the bare step's CPU time (``series-added-work``; its interval is
the bootstrap one of the call's mean over the stretch's blocks). ``series-always-on-cost`` says whether the
requirement holds on both kinds of evidence: the direct cost within 1% (its whole interval), and no ratio's interval
wholly above the direct figure (which would be a cost that the direct timing cannot see).

Measured here 2026-12-02 (2 cores shared with other sessions' test runs), before and after the per-step path was
cut to one call and a deque append and the writer's lines made by msgspec's encoder:
  before (git 6721d90, the earlier form of this benchmark: blocks of 200 steps, no interval), load 1.3-3.6: the
  call 27.6 us + the writer 6.8 us per step on a 2.31 ms CPU step, 1.015x added (CPU ratio 1.098x, wall 0.991x).
  after, three runs:
    load 4.1-4.9 (full, 300 rounds): 10.7 us (median 7.4) + 3.3 us on 2.41 ms: added 1.0058x [1.0055, 1.0061];
      ratio CPU 1.0014x [0.9940, 1.0102], wall 1.0021x [0.9948, 1.0159]; A/A CPU 1.0040x [0.9945, 1.0125]
    load 5.4-6.5 (quick): 11.4 us (median 7.7) + 4.4 us on 2.00 ms: added 1.0079x [1.0073, 1.0084];
      ratio CPU 1.0058x [1.0027, 1.0113], wall 1.0069x [1.0015, 1.0091]; A/A CPU 1.0001x [0.9978, 1.0033]
    load 8.8-9.5 (quick): 12.5 us (median 8.3) + 4.3 us on 3.27 ms: added 1.0051x [1.0048, 1.0055];
      ratio CPU 0.9992x [0.9856, 1.0132], wall 0.9878x [0.9649, 1.0063]; A/A CPU 1.0000x [0.9874, 1.0132]
  series-always-on-cost's rule holds (PASS) in each; the ratios alone are UNSURE in 4 of the 6 (the A/A intervals
  are +-0.3 to 1.3% wide). The
  cost per step is fixed (~15 us of CPU here), not a share: <= 1% needs steps of >= ~1.5 ms of CPU on this machine;
  a 1 ms step would pay ~1.5%. DDP's logging data read is budgeted at 0.1% of the fastest step, the RSS read every
  50 ms (~30 us here: <= 0.06% of the time).

The per-window cost (``--every``, issue 28 item 2), in the same benchmark run: the same 2-rank DDP job
(torchrun + gloo, this file with ``--job``) traced by ``ddpdoctor trace`` with the series only (``--wait`` beyond its
last step: no profiled window) and with ``--every EVERY`` (a window of ``--warmup 2 --active 5`` every EVERY steps),
alternating, REPS times each. Compared: the training loop's time (the first step's end to the last one's, from the
series files, the slowest rank), the difference per window and per profiled step, and the traces written per
window (MB on disk, both ranks).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAME = "series"
WARMUP, ACTIVE = 2, 5  # each window of the per-window measure: --warmup 2 --active 5
# a larger model for the same comparison nearer a real step: ~9 MiB weights (below the 32 MiB that glibc maps and
# unmaps each step), a ~10x longer step
WIDTH_LARGE = 1536
WIDTH = 512  # the model: Linear(WIDTH, WIDTH), ReLU, Linear(WIDTH, 10) on a batch of 64; a ~5 ms CPU step


# the series recorded; bare (the rest of the always-on capture still there); bare again (the A/A control: the noise
# floor); none: the user's loop with nothing of ddpdoctor (no phase hooks, step clock, memory sample or series, DDP's
# own sample rate): "on" against it is the whole always-on capture's cost
ARMS = ("on", "off", "off2", "none")
LIMIT = 1.01  # issue 28: the always-on series costs <= 1% of step time
RESAMPLES = 2000  # of the bootstrap intervals


def _child(rounds: int, block: int, width: int, stretch: int, stretch_ms: int = 3500) -> dict:
    """``rounds`` rounds of a block of ``block`` steps per arm, the arms' order rotating each round: the steps of one
    round are milliseconds apart, so that what the machine does hits the arms alike. Then ``stretch`` steps (and at
    least ``stretch_ms``: 3 of the writer's flushes) all recorded."""
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
    ddp_capture.install()  # as in a traced rank outside its windows: DDP modules tracked, DDP timing at its own rate
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
    own: list[float] = []  # CPU time of each recorder.step call (s)

    def run_block(recorded: bool, steps: int, bare: bool = False) -> tuple[float, float]:
        if bare:  # nothing of ddpdoctor: the hooks out (outside the timed steps)
            phase.uninstall()
        cpu, wall = [], []
        for _ in range(steps):
            c, t = time.process_time(), time.perf_counter()
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if bare:
                cpu.append(time.process_time() - c)
                wall.append(time.perf_counter() - t)
                continue
            iteration = clock.iteration
            clock.tick("optimizer", recording=False)  # what the session does at every step end, both ways
            phase.step_ended(clock.iteration)
            memory.sample(iteration)
            if recorded:
                r = time.thread_time()  # CPU of this thread: a preemption on a loaded machine is not counted
                recorder.step(iteration)
                own.append(time.thread_time() - r)
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - t)
        if bare:
            phase.install()
        return statistics.median(cpu) * 1e6, statistics.median(wall) * 1e6

    run_block(False, 100)  # warm-up
    run_block(True, 20)  # the recorder's first step and first write (its thread, the file, imports) are a one-off
    time.sleep(1.5)
    own.clear()
    writer_cpu0, steps0 = recorder.writer_cpu_s, recorder.steps
    out: dict[str, Any] = {f"{arm}_{m}": [] for arm in ARMS for m in ("cpu", "wall")}
    out["own"] = []  # per round: the mean CPU time of the recorder's calls (us)
    orders = list(itertools.permutations(ARMS))  # each arm in each place, and after each other arm, as often
    for r in range(rounds):
        for arm in orders[r % len(orders)]:
            cpu, wall = run_block(arm == "on", block, bare=arm == "none")
            out[f"{arm}_cpu"].append(cpu)
            out[f"{arm}_wall"].append(wall)
            if arm == "on":
                out["own"].append(statistics.fmean(own[-block:]) * 1e6)
    out["rounds_own_median"] = statistics.median(own) * 1e6
    time.sleep(1.5)  # the writer's last flush of the rounds' steps
    # Then a stretch of steps all recorded, as in a traced job: the recorder's costs at their real rates (the RSS
    # read every 50 ms, DDP's timing at its budget, the writer's flush once a second of every step since). In the
    # rounds, the first step of each block reads the RSS more often than that.
    own.clear()
    writer_cpu0, steps0 = recorder.writer_cpu_s, recorder.steps
    t = time.perf_counter()
    while len(own) < stretch or time.perf_counter() - t < stretch_ms / 1e3:
        run_block(True, block)
    time.sleep(1.5)  # the writer's last flush of the stretch
    out["writer_cpu_per_step"] = (recorder.writer_cpu_s - writer_cpu0) / max(1, recorder.steps - steps0) * 1e6
    out["stretch_own"] = [statistics.fmean(own[i : i + block]) * 1e6 for i in range(0, len(own), block)]
    out["stretch_own_median"] = statistics.median(own) * 1e6
    out["stretch_steps"] = len(own)
    recorder.close()
    phase.uninstall()
    rows = read_rank_series(series_file(out_dir, 0)).rows
    out["rows"] = len(rows)
    out["steps_recorded"] = recorder.steps
    out["ddp_rows"] = sum(r["ddp_comm_s"] is not None for r in rows)
    dist.destroy_process_group()
    return out


def interval(values: list[float], stat: Any = statistics.median, seed: int = 0) -> tuple[float, float, float]:
    """``stat`` of ``values`` and its 95% percentile bootstrap interval (``RESAMPLES`` resamples, seeded)."""
    rng = random.Random(seed)
    boot = sorted(stat(rng.choices(values, k=len(values))) for _ in range(RESAMPLES))
    return stat(values), boot[int(0.025 * RESAMPLES)], boot[int(0.975 * RESAMPLES) - 1]


def verdict(lo: float, hi: float, limit: float = LIMIT) -> str:
    """PASS only when the whole interval is within the limit, MISS when it is all beyond it; UNSURE otherwise (the
    machine too noisy for this run to tell)."""
    return "PASS" if hi <= limit else ("MISS" if lo > limit else "UNSURE")


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


def measure(rounds: int, block: int, width: int = WIDTH, stretch: int = 800, stretch_ms: int = 3500) -> dict:
    """The always-on series vs the same loop bare, in one child process (``_child``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--child", str(rounds), str(block), str(width), str(stretch), str(stretch_ms)]
    load = [os.getloadavg()[0]]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    load.append(os.getloadavg()[0])
    if done.returncode != 0:
        raise RuntimeError(f"bench_series child failed: {done.stderr.strip()[-300:]}")
    r = json.loads(done.stdout)
    out: dict[str, Any] = {"rounds": rounds, "block": block, "load_1min": load}
    for m in ("cpu", "wall"):  # paired within each round: on vs the mean of its two bare blocks; off2 vs off
        on, off, off2 = r[f"on_{m}"], r[f"off_{m}"], r[f"off2_{m}"]
        out[f"on_{m}_ratio"] = interval([a / ((b + c) / 2) for a, b, c in zip(on, off, off2, strict=True)])
        out[f"off2_{m}_ratio"] = interval([c / b for b, c in zip(off, off2, strict=True)])
        out[f"whole_{m}_ratio"] = interval([a / n for a, n in zip(on, r[f"none_{m}"], strict=True)])
        out[f"none_{m}_us"] = statistics.median(r[f"none_{m}"])
        out[f"off_{m}_us"] = statistics.median(off + off2)
    # the recorder's work, timed directly over the stretch: its call's CPU time (mean per step; the interval over
    # its blocks) plus its writer thread's per step, as a share of the bare step's CPU time (median of the rounds)
    writer, off = r["writer_cpu_per_step"], out["off_cpu_us"]
    out["own_us"] = own = interval(r["stretch_own"], statistics.fmean)
    out["added"] = tuple(1 + (x + writer) / off for x in own)
    out["own_median_us"] = r["stretch_own_median"]
    out["writer_us"] = writer
    out["stretch_steps"] = r["stretch_steps"]
    out["rounds_own_us"] = statistics.fmean(r["own"])  # the rounds' (their blocks' first steps read the RSS more)
    out["rounds_own_median_us"] = r["rounds_own_median"]
    out.update(rows=r["rows"], steps_recorded=r["steps_recorded"], ddp_rows=r["ddp_rows"])
    return out


def always_on_verdict(added: tuple[float, float, float], ratios: list[tuple[float, float, float]]) -> str:
    """The requirement itself (<= 1% of step time), from both kinds of evidence: PASS when the work timed directly is
    within the limit (its whole interval) and no ratio to bare shows more than it (no ratio's interval wholly above
    the direct figure's: a cost the direct timing cannot see, e.g. the step's data evicted from the caches); MISS when
    the direct interval or a ratio's is wholly above the limit; UNSURE otherwise."""
    if added[1] > LIMIT or any(lo > LIMIT for _, lo, _ in ratios):
        return "MISS"
    if added[2] <= LIMIT and all(lo <= added[2] for _, lo, _ in ratios):
        return "PASS"
    return "UNSURE"


def _x(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.4f}x [{t[1]:.4f}, {t[2]:.4f}]"


def run(report, quick: bool) -> None:
    rounds, block = (120, 8) if quick else (312, 8)  # a multiple of the 24 orders
    r = measure(rounds, block)
    load = f"load average {r['load_1min'][0]:.1f} before, {r['load_1min'][1]:.1f} after"
    report.say(
        f"  always-on: {rounds} rounds of {block} steps each of the loop with the series, bare, bare again, and "
        f"with none of ddpdoctor (the 24 orders in turn), 1-rank gloo DDP, {r['off_cpu_us'] / 1e3:.2f} ms CPU "
        f"({r['off_wall_us'] / 1e3:.2f} ms wall) a bare step; {load}; per round the median step, then the median "
        "over rounds of the paired ratios (with the series vs the round's two bare blocks), with 95% bootstrap "
        "intervals"
    )
    aa_lo, aa_hi = r["off2_cpu_ratio"][1:]
    what_cpu = "CPU time of the whole process (the writer's flush once a second mostly falls outside the medians)"

    def ratio_entry(name: str, ratio: tuple[float, float, float], note: str, **extra: Any) -> None:
        report.add(
            name, ratio[0], target=("<=", LIMIT), status=verdict(ratio[1], ratio[2]), note=note, interval=ratio[1:],
            **extra,
        )  # fmt: skip

    for m, what in (("cpu", what_cpu), ("wall", "wall time")):
        ratio, aa = r[f"on_{m}_ratio"], r[f"off2_{m}_ratio"]
        ratio_entry(
            f"series-step-cost-{m}",
            ratio,
            f"step {what} with the series vs bare, in the same run: {_x(ratio)}; bare vs bare (the noise floor) "
            f"{_x(aa)}",
            aa=aa,
            **{k: v for k, v in r.items() if not k.endswith("_ratio")},
        )
        whole = r[f"whole_{m}_ratio"]
        ratio_entry(
            f"always-on-capture-cost-{m}",
            whole,
            f"step {what.split(' (')[0]} with the whole always-on capture (phase hooks, step clock, memory sample, "
            f"the series; DDP times iterations at its own rate outside a window) vs the same loop with none of "
            f"ddpdoctor ({r[f'none_{m}_us'] / 1e3:.2f} ms a step), in the same run: {_x(whole)}",
        )
    added = r["added"]
    report.add(
        "series-added-work",
        added[0],
        target=("<=", LIMIT),
        status=verdict(added[1], added[2]),
        note=(
            f"the bare step's CPU time plus what the series adds, timed directly over {r['stretch_steps']} steps "
            f"all recorded: its call at each step end {r['own_us'][0]:.1f} us mean (median "
            f"{r['own_median_us']:.1f} us; {r['rounds_own_us']:.1f} us in the rounds) and its writer thread "
            f"{r['writer_us']:.1f} us per step (CPU times of those threads: a loaded machine's preemptions are not "
            f"counted); {_x(added)}; {r['rows']} rows written, {r['ddp_rows']} with DDP's timing; the A/A "
            f"interval of the CPU ratio {aa_lo:.4f}-{aa_hi:.4f}"
        ),
        interval=added[1:],
    )
    ratios = [r["on_cpu_ratio"], r["on_wall_ratio"]]
    report.add(
        "series-always-on-cost",
        added[0],
        target=("<=", LIMIT),
        status=always_on_verdict(added, ratios),
        note=(
            f"issue 28's <= 1% of step time: the work timed directly {_x(added)}, and the ratios to bare (CPU "
            f"{_x(ratios[0])}, wall {_x(ratios[1])}) show no more than it; {load}"
        ),
        interval=added[1:],
    )

    # The cost is fixed per step: the same four arms on a model whose step is nearer a real training step's
    big = measure(48 if quick else 120, block, width=WIDTH_LARGE, stretch=200, stretch_ms=2000)
    for m in ("cpu", "wall"):
        whole = big[f"whole_{m}_ratio"]
        ratio_entry(
            f"always-on-capture-cost-{m}-larger-step",
            whole,
            f"the same on Linear({WIDTH_LARGE}) layers, a {big[f'none_{m}_us'] / 1e3:.1f} ms step ({m}) with none of "
            f"ddpdoctor: {_x(whole)}; the series alone {_x(big[f'on_{m}_ratio'])}",
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
        print(json.dumps(_child(*map(int, sys.argv[2:7]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "--job":
        _job(int(sys.argv[2]), int(sys.argv[3]))
    else:
        print(json.dumps({"always-on": measure(120, 8), "per-window": measure_windows(300, 100, 2)}, indent=1))
