"""The profiling session inside one training process (one rank, or the single DataParallel process).

Steps are found without touching the script: torch's global optimizer step hook marks the end of each iteration
(``ddpdoctor.step()`` does the same for loops without ``torch.optim``). Iteration 0 also holds the script's start-up,
so the schedule counts from iteration 1: ``--wait`` iterations skipped, ``--warmup``, then ``--active`` recorded,
``--repeat`` times.

Until the first step is seen the profiler records (so a script with no detectable step still yields a trace of its
start); that start-up trace is dropped at the first step, or kept and closed after ``no_step_limit_s`` seconds.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from ddpdoctor import __version__, rundir
from ddpdoctor.capture import ddp as ddp_capture
from ddpdoctor.capture.config import CaptureConfig
from ddpdoctor.capture.gil import GilProbe
from ddpdoctor.capture.memory import DeviceMemory
from ddpdoctor.capture.setup import SetupObserver

_current: Session | None = None


def current() -> Session | None:
    return _current


def manual_step() -> None:
    """``ddpdoctor.step()``: end the current iteration (no-op outside ``ddpdoctor trace``)."""
    if _current is not None:
        _current.step(source="manual")


def _rank_env() -> dict[str, int]:
    env = os.environ
    return {
        "rank": int(env.get("RANK", 0)),
        "local_rank": int(env.get("LOCAL_RANK", 0)),
        "world_size": int(env.get("WORLD_SIZE", 1)),
        "node_rank": int(env.get("GROUP_RANK", env.get("NODE_RANK", 0))),
        "local_world_size": int(env.get("LOCAL_WORLD_SIZE", 1)),
    }


def _dist_info() -> dict[str, Any] | None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return {
                "backend": str(dist.get_backend()),
                "rank": dist.get_rank(),
                "world_size": dist.get_world_size(),
            }
    except Exception:
        pass
    return None


def _ranges(indices: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


class Session:
    def __init__(self, config: CaptureConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        self.info = _rank_env()
        self.rank = self.info["rank"]
        self.step_source: str | None = None  # "optimizer" | "manual"
        self.iteration = 0  # index of the iteration now running (ProfilerStep#<iteration>)
        self.wall_ms: list[float] = []
        self.recorded: list[int] = []
        self.trace_files: list[str] = []
        self.capture_errors: list[str] = []
        self.fallback: dict[str, Any] = {"state": "recording", "ended_by": None}
        self.memory = DeviceMemory(all_devices=config.all_devices)
        self.gil = GilProbe(enabled=config.gil)
        self.setup = SetupObserver()
        self.status = "running"
        self.exit_code: int | None = None
        self.error: str | None = None
        self._lock = threading.RLock()
        self._thread_id = threading.get_ident()
        self._first_optimizer: int | None = None
        self._last_step_t = time.perf_counter()
        self._started_at = time.time()
        self._t0 = time.perf_counter()
        self._last_span = 0
        self._handles: list[Any] = []
        self._prof: Any = None
        self._finished = False
        self._dp: Any = None
        self.dist: dict[str, Any] | None = None  # backend, rank, world size once the process group exists
        self.dp_steps: list[dict] = []  # DataParallel stage timings and gathered bytes per step

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        global _current
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        _current = self
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        base = schedule(
            wait=self.config.wait,
            warmup=self.config.warmup,
            active=self.config.active,
            repeat=self.config.repeat,
        )
        from torch.profiler import ProfilerAction

        def _schedule(step: int) -> ProfilerAction:
            # Iteration 0 is start-up plus the first iteration: recorded only as the no-step fallback.
            return ProfilerAction.RECORD_AND_SAVE if step == 0 else base(step - 1)

        kwargs: dict[str, Any] = dict(
            activities=activities,
            schedule=_schedule,
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.config.record_shapes,
            profile_memory=self.config.profile_memory,
            with_stack=self.config.with_stack,
        )
        if self._all_threads():
            try:  # DataParallel's replicas run in other threads: record them too.
                kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(
                    profile_all_threads=True
                )
            except (TypeError, AttributeError):
                self.capture_errors.append(
                    "this torch cannot profile all threads; only the main thread is recorded"
                )

        self._install_hooks()
        if self.config.hang_timeout_s:
            threading.Thread(target=self._hang_watchdog, name="ddpdoctor-hang-watchdog", daemon=True).start()
        # We step the profiler on purpose across cycles; its advice about acc_events is not for our users.
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        self._prof = profile(**kwargs)
        self._prof.start()
        self.write_rank_file()

    def _all_threads(self) -> bool:
        if self.config.all_threads == "auto":
            return self.config.all_devices  # one process driving all devices: the DataParallel case
        return self.config.all_threads == "on"

    def _install_hooks(self) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles.append(register_optimizer_step_post_hook(self._on_optimizer_step))
        self._handles.append(register_module_forward_pre_hook(self._on_module_forward))
        self._fallback_hook = self._handles[-1]
        ddp_capture.install()
        try:
            self.setup.install()
        except Exception as exc:  # internals of another torch version: lose the set-up checks, not the run
            self.capture_errors.append(f"set-up observation unavailable: {type(exc).__name__}: {exc}")
        try:
            from ddpdoctor.capture import dp

            skipped = dp.install()
            self._dp = dp
            if skipped:
                self.capture_errors.append(
                    f"DataParallel internals not found in this torch: {', '.join(skipped)}"
                )
        except ImportError:
            self._dp = None

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.setup.uninstall()
        ddp_capture.uninstall()
        if self._dp is not None:
            self._dp.uninstall()

    # ---- steps -----------------------------------------------------------------------------------------------
    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.step_source == "manual":
            return
        # With several optimizers (GANs, per-group optimizers) the first one to step marks the iteration.
        if self._first_optimizer is None:
            self._first_optimizer = id(optimizer)
        elif id(optimizer) != self._first_optimizer:
            return
        self.step(source="optimizer")

    def _on_module_forward(self, module: Any, args: Any) -> None:
        # Only installed until the first step: bounds the start-up recording of a script with no visible step.
        if (
            self.fallback["state"] == "recording"
            and time.perf_counter() - self._t0 > self.config.no_step_limit_s
            and threading.get_ident() == self._thread_id
        ):
            self._end_fallback(ended_by="time limit")
            self._prof.step()

    def _end_fallback(self, ended_by: str) -> None:
        self.fallback = {"state": "kept" if ended_by != "first step" else "dropped", "ended_by": ended_by}
        hook = getattr(self, "_fallback_hook", None)
        if hook is not None:
            hook.remove()
            self._fallback_hook = None

    def step(self, source: str) -> None:
        if self._finished or threading.get_ident() != self._thread_id:
            return
        with self._lock:
            if self.step_source is None or (source == "manual" and self.step_source != "manual"):
                self.step_source = source
            now = time.perf_counter()
            if self.iteration >= 1:
                self.wall_ms.append(round((now - self._last_step_t) * 1e3, 4))
            self._last_step_t = now
            if self.fallback["state"] == "recording":
                self._end_fallback(ended_by="first step")
            elif self._recording():
                self.recorded.append(self.iteration)
            self.memory.sample(self.iteration)
            self.setup.on_optimizer_step()
            if self._window_open() or self.iteration % 100 == 0:
                ddp_capture.snapshot()
            if self.dist is None:
                self.dist = _dist_info()
            if self.gil.running:
                self.gil.sample(self.iteration)
            if self._dp is not None:
                stats = self._dp.take_step_stats()
                if stats.get("replicas"):
                    self.dp_steps.append({"step": self.iteration, **stats})
            self.iteration += 1
            self._prof.step()
            if self._window_open():
                self.gil.start()
            else:
                self.gil.stop()

    def _recording(self) -> bool:
        from torch.profiler import ProfilerAction

        return self._prof is not None and self._prof.current_action in (
            ProfilerAction.RECORD,
            ProfilerAction.RECORD_AND_SAVE,
        )

    def _window_open(self) -> bool:
        from torch.profiler import ProfilerAction

        return self._prof is not None and self._prof.current_action != ProfilerAction.NONE

    # ---- output ----------------------------------------------------------------------------------------------
    def _on_trace_ready(self, prof: Any) -> None:
        if self.fallback["state"] == "dropped" and self.fallback.get("trace_handled") is None:
            self.fallback["trace_handled"] = True  # the start-up recording: not a training step
            return
        try:
            span = max(int(time.time() * 1000), self._last_span + 1)
            self._last_span = span
            name = rundir.trace_file_name(self.rank, span)
            fd, tmp = tempfile.mkstemp(prefix=f".rank{self.rank}.", suffix=".json", dir=self.out)
            os.close(fd)
            try:
                prof.export_chrome_trace(tmp)
                rundir.atomic_gzip_file(tmp, self.out / name)
            finally:
                for leftover in (tmp, tmp + ".tmp"):  # Kineto writes <tmp>.tmp and renames it
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
            self.trace_files.append(name)
            self.write_rank_file()
            if self.info["local_rank"] == 0 and not self.config.quiet:
                size_mb = (self.out / name).stat().st_size / 1e6
                print(
                    f"ddpdoctor: rank {self.rank}: profiled window {len(self.trace_files)} written "
                    f"({name}, {size_mb:.1f} MB)",
                    file=sys.stderr,
                    flush=True,
                )
        except Exception as exc:  # never break the user's training because a trace could not be written
            self.capture_errors.append(f"writing trace failed: {type(exc).__name__}: {exc}")

    def finish(self, status: str, exit_code: int | None, error: str | None = None) -> None:
        """Stop profiling, write what was captured; safe to call twice."""
        global _current
        with self._lock:
            if self._finished:
                return
            self._finished = True
            # No garbage collection while we write: a collection here could free the script's DDP model, whose
            # process group then joins gloo threads from this thread (see runner._settle_background_threads).
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                self._finish(status, exit_code, error)
            finally:
                if gc_was_enabled:
                    gc.enable()

    def _finish(self, status: str, exit_code: int | None, error: str | None) -> None:
        global _current
        self.status, self.exit_code, self.error = status, exit_code, error
        if self.fallback["state"] == "recording":
            self._end_fallback(ended_by="end of run")
        try:
            self._remove_hooks()
            if self._prof is not None:
                self._prof.stop()  # writes a window still open (partial if the run ended inside it)
        except Exception as exc:
            self.capture_errors.append(f"stopping the profiler failed: {type(exc).__name__}: {exc}")
        self.gil.stop()
        self.write_rank_file()
        self._write_summary()
        _current = None

    def _hang_watchdog(self) -> None:
        timeout = float(self.config.hang_timeout_s or 0)
        while not self._finished:
            time.sleep(min(1.0, timeout / 4))
            idle = time.perf_counter() - self._last_step_t
            if self.step_source is None or idle < timeout or self._finished:
                continue
            frame = sys._current_frames().get(self._thread_id)
            stack = "".join(traceback.format_stack(frame)[-8:]) if frame is not None else "(no stack)"
            with self._lock:
                self.status = "hung"
                self.error = f"no step for {idle:.0f}s after step {self.iteration}; main thread at:\n{stack}"
                self.write_rank_file()
            print(
                f"ddpdoctor: rank {self.rank} hung: no step for {idle:.0f}s (--hang-timeout); stopping it",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGTERM)  # unwinds the main thread if it is running Python
            time.sleep(10)
            os._exit(124)  # blocked in a collective: leave, torchrun stops the other ranks

    def flush_interrupted(self, signum: int) -> None:
        """Called from a watcher thread when a signal arrives while the main thread may be blocked."""
        with self._lock:
            if not self._finished and self.status == "running":
                self.status = "interrupted"
                self.error = f"received signal {signum}"
                self.write_rank_file()

    def _write_summary(self) -> None:
        """Summarise this rank's own trace here, in the job, so analysing 1,000 ranks reads 1,000 small files."""
        if not self.trace_files:
            return
        try:
            from ddpdoctor.load.loader import load_rank_files
            from ddpdoctor.metrics.summary import summarize_rank

            rank_trace = load_rank_files([self.out / f for f in self.trace_files], self.rank)
            summary = summarize_rank(rank_trace, self.rank_data())
            rundir.atomic_write_json(rundir.summary_file(self.out, self.rank), summary)
        except Exception as exc:  # the run's data is on disk either way; analysis falls back to the traces
            self.capture_errors.append(f"per-rank summary failed: {type(exc).__name__}: {exc}")
            self.write_rank_file()

    def rank_data(self) -> dict[str, Any]:
        import torch

        device = None
        info = self.dist or _dist_info() or {}
        backend = info.get("backend")
        rank, world_size = info.get("rank", self.rank), info.get("world_size", self.info["world_size"])
        if self.memory.cuda_ready():
            device = f"cuda:{torch.cuda.current_device()}"
        elif not torch.cuda.is_available():
            device = "cpu"
        steps = {
            "source": self.step_source or "none",
            "count": self.iteration if self.step_source else 0,
            "first": 1,
            "wall_ms": self.wall_ms,
            "profiled": _ranges(self.recorded),
        }
        return {
            "schema_version": rundir.SCHEMA_VERSION,
            "ddpdoctor_version": __version__,
            "rank": rank,
            "local_rank": self.info["local_rank"],
            "world_size": world_size,
            "local_world_size": self.info["local_world_size"],
            "node_rank": self.info["node_rank"],
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "backend": backend,
            "device": device,
            "steps": steps,
            "fallback_window": {k: v for k, v in self.fallback.items() if k != "trace_handled"},
            "schedule": self.config.schedule_dict(),
            "profile_all_threads": self._all_threads(),
            "memory": self.memory.to_json(),
            "gil": self.gil.to_json(),
            "ddp": ddp_capture.describe(),
            "dp": self._dp.describe() if self._dp is not None else [],
            "dp_steps": self.dp_steps,
            "setup": self.setup.to_json(),
            "threads": {
                "cpu_count": os.cpu_count(),
                "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "torch_intra_op_threads": torch.get_num_threads(),
                "torch_inter_op_threads": torch.get_num_interop_threads(),
            },
            "trace_files": list(self.trace_files),
            "torch_version": torch.__version__,
            "cuda_available": torch.cuda.is_available(),
            "started_at": self._started_at,
            "updated_at": time.time(),
            "capture_errors": self.capture_errors,
            "python": sys.version.split()[0],
        }

    def write_rank_file(self) -> None:
        try:
            rundir.atomic_write_json(rundir.rank_file(self.out, self.rank), self.rank_data())
        except Exception as exc:
            self.capture_errors.append(f"writing rank file failed: {type(exc).__name__}: {exc}")
