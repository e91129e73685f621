"""The GPU checks: each runs workloads under the real CLI (``python -m ddpdoctor trace``, then
``python -m ddpdoctor diagnose --format json``), reads what ddpdoctor wrote and what the workload measured
itself, and hands both to ``gpu_evaluate``. Needs a CUDA GPU; ``gpu_run.py`` runs them all, the ``gpu``-marked
tests in ``test_gpu_checks.py`` one each.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpu_evaluate as ev

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKLOADS = HERE / "workloads"
SCHEDULE = (5, 2, 5)  # ddpdoctor trace's defaults: --wait 5 --warmup 2 --active 5 (steps 8-12 profiled)


class CheckError(Exception):
    """A step of a check could not run (a command failed or timed out); the check reports ``error``."""


@dataclass
class Context:
    """Where a check works and how long it may take."""

    work: Path
    deadline: float  # time.monotonic() by which every command must have ended
    runs: list[Path] = field(default_factory=list)  # folders worth archiving, in order
    commands: list[dict[str, Any]] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)  # comparisons made so far (kept on an error)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}
    # Every rank runs on this machine: gloo and NCCL's bootstrap talk over the loopback, which needs neither a
    # network nor a resolvable host name (the device machine has no network).
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    # ddpdoctor from this working tree, in front of anything installed (the device image has none).
    parts = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def run_command(
    ctx: Context, cmd: list[str], *, env: dict[str, str] | None = None, timeout: float, ok_codes: tuple[int, ...] = (0,)
) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group (killed whole on timeout), within the context's deadline."""
    limit = min(timeout, ctx.remaining())
    if limit < 5:
        raise CheckError(f"no time left to run {' '.join(cmd[2:5])} (budget exhausted)")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        ctx.commands.append({"cmd": cmd, "rc": None, "seconds": round(time.monotonic() - t0, 1)})
        raise CheckError(f"timed out after {limit:.0f}s: {' '.join(cmd)}\n{_tail(err or out)}") from None
    ctx.commands.append({"cmd": cmd, "rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1)})
    if proc.returncode not in ok_codes:
        raise CheckError(f"exit {proc.returncode}: {' '.join(cmd)}\n{_tail(err or out)}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:])


def trace(
    ctx: Context, name: str, script: str, args: list[str], *, torchrun: list[str] | None = None, timeout: float = 90
) -> tuple[Path, Path]:
    """``python -m ddpdoctor trace --out WORK/NAME [torchrun options] WORKLOAD ARGS``; returns the run directory
    and the folder the workload wrote its own measurements to."""
    run, measure = ctx.work / name, ctx.work / f"{name}.measure"
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(measure, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "ddpdoctor",
        "trace",
        "--out",
        str(run),
        *(torchrun or []),
        str(WORKLOADS / script),
        *args,
    ]
    ctx.runs += [run, measure]
    run_command(ctx, cmd, env={"GPUCHECK_MEASURE": str(measure)}, timeout=timeout)
    return run, measure


def bare(ctx: Context, name: str, script: str, args: list[str], *, torchrun: list[str], timeout: float = 60) -> Path:
    """The same workload under torchrun alone (no ddpdoctor); returns its measurement folder."""
    measure = ctx.work / f"{name}.measure"
    shutil.rmtree(measure, ignore_errors=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun, str(WORKLOADS / script), *args]
    ctx.runs.append(measure)
    run_command(ctx, cmd, env={"GPUCHECK_MEASURE": str(measure)}, timeout=timeout)
    return measure


def diagnose(ctx: Context, run: Path) -> dict[str, Any]:
    """``python -m ddpdoctor diagnose RUN --format json``, saved beside the run as ``RUN.diagnose.json``."""
    out = run.with_name(run.name + ".diagnose.json")
    run_command(
        ctx,
        [sys.executable, "-m", "ddpdoctor", "diagnose", str(run), "--format", "json", "--output", str(out)],
        timeout=60,
    )
    ctx.runs.append(out)
    return json.loads(out.read_text())


def rule_param(rule: str, name: str) -> float:
    """A rule's threshold as shipped (``rules/<rule>.toml``, ``[params]``): the checks judge the rule by its own
    numbers, and follow them when they change."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return float(tomllib.loads((REPO / "rules" / f"{rule}.toml").read_text())["params"][name])


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckError(f"cannot read {path}: {exc}") from None


def summary(run: Path, rank: int = 0) -> dict[str, Any]:
    """ddpdoctor's own per-rank metrics, written by the rank at the end of ``trace``."""
    return read_json(run / "ranks" / f"rank{rank}.summary.json")


def measured(folder: Path, rank: int = 0) -> dict[str, Any]:
    return read_json(folder / f"rank{rank}.json")


def trace_counts(run: Path, rank: int = 0) -> dict[str, Any]:
    """Events of rank ``rank``'s trace files counted with plain gzip + json (not ddpdoctor's loader)."""
    files = sorted(run.glob(f"rank{rank}.*.pt.trace.json.gz"))
    if not files:
        raise CheckError(f"{run}: no trace file of rank {rank}")
    events: list[dict[str, Any]] = []
    for f in files:
        with gzip.open(f, "rt") as fh:
            events += json.load(fh).get("traceEvents") or []
    counts = ev.count_trace_events(events)
    counts["files"] = [f.name for f in files]
    return counts


# ------------------------------------------------------------------------------------------------ checks
def check_single(ctx: Context) -> list[dict[str, Any]]:
    run, measure = trace(ctx, "single", "single.py", ["--steps", "16", "--vary"])
    return ev.evaluate_single(diagnose(ctx, run), summary(run), measured(measure), trace_counts(run))


def check_ddp(ctx: Context) -> list[dict[str, Any]]:
    one = ["--standalone", "--nproc-per-node", "1"]
    run, measure = trace(ctx, "ddp-nccl", "ddp.py", ["--backend", "nccl", "--steps", "16"], torchrun=one)
    ctx.items += ev.evaluate_ddp_nccl(diagnose(ctx, run), summary(run), measured(measure), trace_counts(run))
    two = ["--standalone", "--nproc-per-node", "2"]
    run, measure = trace(
        ctx,
        "ddp-gloo-shared",
        "ddp.py",
        ["--backend", "gloo", "--no-set-device", "--steps", "16", "--width", "1024"],
        torchrun=two,
    )
    ctx.items += ev.evaluate_ddp_shared(diagnose(ctx, run), [measured(measure, r) for r in (0, 1)])
    return ctx.items


def check_oom(ctx: Context) -> list[dict[str, Any]]:
    runs = []
    for label, fraction in (("oom-93", "0.93"), ("oom-40", "0.40")):
        run, measure = trace(ctx, label, "single.py", ["--steps", "16", "--reserve", fraction, "--width", "1024"])
        runs.append((diagnose(ctx, run), measured(measure)))
    return ev.evaluate_oom(runs, rule_param("gpu0-oom-risk", "min_headroom"))


# A fine-tuning loop (a frozen 96-layer body, a trained head: backward is short) with a 1024-wide layer on 1024
# rows, tens of µs per kernel: an .item() after every layer leaves the GPU idle while the host launches the next
# one. The same loop without .item() is the control.
HOST_SYNC_ARGS = [
    "--steps", "16", "--width", "1024", "--batch", "1024", "--depth", "96", "--train-last", "1", "--log-every", "0",
]  # fmt: skip


def check_host_sync(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for label, every in (("sync-item", "1"), ("sync-none", "0")):
        run, measure = trace(ctx, label, "single.py", [*HOST_SYNC_ARGS, "--sync-every", every])
        out.append((diagnose(ctx, run), summary(run), measured(measure)))
    return ev.evaluate_host_sync(out[0], out[1], rule_param("host-sync-stalls", "min_ms"))


def check_dp(ctx: Context) -> list[dict[str, Any]]:
    run, measure = trace(ctx, "dp-one-gpu", "dp.py", ["--steps", "16"])
    capture = read_json(run / "ranks" / "rank0.json")
    return ev.evaluate_dp(diagnose(ctx, run), summary(run), capture, measured(measure), trace_counts(run))


OVERHEAD_ROUNDS = 3
# Steps of ~10 ms of GPU work, like the CPU benchmark's ~14 ms: the per-step cost of the capture outside the
# window (the step hook, the allocator counters) is then measured against a realistic step.
OVERHEAD_ARGS = ["--backend", "nccl", "--steps", "100", "--width", "2048", "--depth", "8", "--batch", "2048"]


def check_overhead(ctx: Context) -> list[dict[str, Any]]:
    one = ["--standalone", "--nproc-per-node", "1"]
    bare_ms, traced_ms = [], []
    for i in range(OVERHEAD_ROUNDS):  # interleaved, as benchmarks/capture_overhead.py does
        bare_ms.append(measured(bare(ctx, f"overhead-bare-{i}", "ddp.py", OVERHEAD_ARGS, torchrun=one))["wall_ms"])
        _, measure = trace(ctx, f"overhead-traced-{i}", "ddp.py", OVERHEAD_ARGS, torchrun=one)
        traced_ms.append(measured(measure)["wall_ms"])
    return ev.evaluate_overhead(bare_ms, traced_ms, SCHEDULE)


@dataclass(frozen=True)
class Check:
    key: str  # also the archive's name: letters, digits, '-' only
    title: str
    run: Callable[[Context], list[dict[str, Any]]]
    min_seconds: float  # not started with less time than this left


CHECKS = (
    Check(
        "1-single-process",
        "one-process CUDA training: kernels, kernel time vs CUDA events, memory peaks",
        check_single,
        40,
    ),
    Check("2-ddp", "DDP: NCCL at world size 1; gloo at world size 2 on one GPU without set_device", check_ddp, 80),
    Check("3-gpu0-oom-risk", "gpu0-oom-risk at ~93 % and ~40 % of the GPU reserved", check_oom, 60),
    Check("4-host-sync-stalls", "host-sync-stalls with .item() every layer and without", check_host_sync, 60),
    Check("5-dataparallel", "DataParallel on one device (device_ids=[0])", check_dp, 40),
    Check("6-capture-overhead", "steps outside the profiled window vs bare, on the GPU", check_overhead, 90),
)


def run_check(check: Check, work: Path, deadline: float) -> tuple[dict[str, Any], list[Path]]:
    """Run one check; never raises. Returns its result and the folders/files it produced."""
    ctx = Context(work=work / check.key, deadline=deadline)
    ctx.work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result: dict[str, Any] = {"check": check.key, "title": check.title}
    if ctx.remaining() < check.min_seconds:
        result.update(
            status="error",
            error=f"not started: {ctx.remaining():.0f}s of the time budget left, "
            f"it needs about {check.min_seconds:.0f}s",
            items=[],
        )
    else:
        try:
            items = check.run(ctx)
            result.update(status=ev.status_of(items), items=items)
        except CheckError as exc:
            result.update(status="error", error=str(exc), items=ctx.items)
        except Exception as exc:  # a bug in the check itself: report it and go on with the others
            result.update(
                status="error",
                error=f"{type(exc).__name__}: {exc}\n{_tail(traceback.format_exc())}",
                items=ctx.items,
            )
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["commands"] = [
        {"cmd": " ".join(Path(c).name if "/" in c else c for c in x["cmd"]), "rc": x["rc"], "seconds": x["seconds"]}
        for x in ctx.commands
    ]
    return result, [p for p in ctx.runs if p.exists()]
