"""The profiling session inside one training process (one rank, or the single DataParallel process): its lifecycle.

``start()`` installs the hooks and starts torch.profiler, ``step()`` ends an iteration (the :class:`StepClock` counts
them), each profiled window is exported as it completes (gzip follows in a background thread,
:mod:`ddpdoctor.capture.compress`: no step waits for it; the trace files' handling is
:mod:`ddpdoctor.capture.trace_output`'s), and ``finish()`` stops everything and writes the rank files
(:mod:`ddpdoctor.capture.rank_file`). The profiler schedule: ``--wait`` iterations skipped, ``--warmup``, then
``--active`` recorded, ``--repeat`` times, counted from iteration 1 (iteration 0 holds the start-up).

A session started before it knows whether its process is a rank (``claimed=False``: the process ``ddpdoctor trace``
runs a script in, which may only launch the ranks with ``mp.spawn``) writes nothing until it steps or joins a process
group; if it never does and other processes wrote rank files, it was only their launcher and leaves no files.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from ddpdoctor import rundir
from ddpdoctor.capture import (
    amp_scaler,
    compiled,
    flight,
    groups,
    other_profiler,
    progress,
    rank_file,
    series,
    window_summary,
)
from ddpdoctor.capture import ddp as ddp_capture
from ddpdoctor.capture import knobs as knobs_capture
from ddpdoctor.capture.compress import Compressor
from ddpdoctor.capture.config import CaptureConfig
from ddpdoctor.capture.gil import GilProbe
from ddpdoctor.capture.hostload import HostLoad, recording_next
from ddpdoctor.capture.max_steps import StopTraining, stopped_by
from ddpdoctor.capture.memory import DeviceMemory
from ddpdoctor.capture.phase import PhaseTracker
from ddpdoctor.capture.setup import SetupObserver
from ddpdoctor.capture.step_clock import StartupTrace, StepClock
from ddpdoctor.capture.trace_output import TraceOutput
from ddpdoctor.capture.watchdog import HangWatchdog

MAX_ERROR_FRAMES = 32  # the innermost frames of the ending exception's traceback kept in the rank file

_current: Session | None = None


def current() -> Session | None:
    """The session of this process (None outside ``ddpdoctor trace``, and in a forked child of a traced process)."""
    if _current is not None and _current.pid != os.getpid():
        return None
    return _current


def _forked_child() -> None:
    """In a process forked from a traced one (a ``multiprocessing.Pool`` or DataLoader worker, a sweep's worker
    fitting a model of its own, ranks started with ``start_method="fork"``): the session it inherited is its
    parent's. Its hooks, still in torch, do nothing here (a worker's optimizer steps wrote traces and rank files
    under the parent's rank); a child that joins a process group starts a session of its own (``autostart``), as a
    spawned rank does."""
    global _current
    session = _current
    if session is not None and session.pid != os.getpid():
        session._finished = True
        _current = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


def manual_step() -> None:
    """``ddpdoctor.step()``: end the current iteration (no-op outside ``ddpdoctor trace``)."""
    session = current()
    if session is not None:
        session.step(source="manual")


class Session(TraceOutput):
    def __init__(
        self, config: CaptureConfig, *, claimed: bool = True, identity: rank_file.Identity | None = None
    ) -> None:
        self.config = config
        self.out = Path(config.out)  # where this session's files go: the run directory, or its group's folder
        self.root = Path(config.out)  # the run directory
        self.identity = identity or rank_file.identity()
        self.claimed = claimed  # whether this process is known to be a rank (writes its files)
        self.clock = StepClock()
        self.trace_files: list[str] = []
        self.capture_errors: list[str] = []
        self.memory = DeviceMemory(all_devices=config.all_devices)
        self.gil = GilProbe(enabled=config.gil)
        self.hostload = HostLoad()  # the host's load over the recorded steps (capture/hostload.py)
        self.setup = SetupObserver()
        self.status = "running"
        self.exit_code: int | None = None
        self.error: str | None = None
        self.error_frames: list[dict[str, Any]] = []  # the ending exception's traceback (saw_exception)
        self.run_collectives: int | None = None  # counted where the run ends (flight.run_collectives)
        self.training_collectives: int | None = None  # of them, those after the first step (idem)
        self.training_collective_bytes: int | None = None  # and their bytes (idem)
        self.first_step_ns: int | None = None  # time.time_ns() at the end of the first step
        self.pid = os.getpid()
        self.started_at = time.time()
        self.dist: dict[str, Any] | None = None  # backend, rank, world size once the process group exists
        self.dp: Any = None  # ddpdoctor.capture.dp once its hooks are in
        self.dp_steps: list[dict] = []  # DataParallel stage timings and gathered bytes per step
        self.stopped_by: str | None = None  # "ddpdoctor --max-steps N" once --max-steps ended the job
        # The process groups this process joined, in order ({"name", "rank", "world_size", "backend"}; name "" is
        # the run's top level): the first is the one this session's files describe (see capture/groups.py).
        self.process_groups: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._thread_id = threading.get_ident()
        self.phase = PhaseTracker(self._thread_id)  # the step and phase a dump reports
        self.flight = flight.Dumper(self)  # dumps/rank<R>.<id>.json (capture/flight.py)
        self.series = series.SeriesRecorder(self)  # ranks/rank<R>.series.jsonl, every step (capture/series.py)
        self._last_span = 0
        self._handles: list[Any] = []
        self._optimizer_steps_seen = 0  # post-hooks of optimizer steps so far (amp_scaler tells skipped ones)
        self._startup_hook: Any = None
        self._watchdog: HangWatchdog | None = None
        self._prof: Any = None
        self._finished = False
        self._compressor = Compressor(self.out, self._compressed)
        self._compressed_files: list[tuple[str, BaseException | None]] = []  # done, not yet in the rank file
        self.dropped_windows: list[dict[str, Any]] = []  # --keep: the windows whose traces were removed
        self._summarizing: list[window_summary.Pending] = []  # their summarisers still running
        self._window_steps: dict[str, tuple[int, int] | None] = {}  # trace file (uncompressed name) -> its steps
        # the start-up recorded up to --no-step-limit (the trace of a run that never steps), until the first step
        self._startup_trace: str | None = None
        self._dropped_startup: set[str] = set()  # its uncompressed name, once a step came: gone, its gzip too

    @property
    def rank(self) -> int:
        return self.identity.rank

    @property
    def finished(self) -> bool:
        return self._finished

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        global _current
        import torch
        from torch.profiler import ProfilerAction, profile, schedule

        _current = self
        if self.config.every_steps or self.config.every_s:  # --every: periodic windows (capture/every.py)
            from ddpdoctor.capture.every import EverySchedule

            base = EverySchedule(
                wait=self.config.wait,
                warmup=self.config.warmup,
                active=self.config.active,
                repeat=self.config.repeat,
                every_steps=self.config.every_steps,
                every_s=self.config.every_s,
            )
        else:
            base = schedule(
                wait=self.config.wait, warmup=self.config.warmup, active=self.config.active, repeat=self.config.repeat
            )

        def _schedule(step: int) -> ProfilerAction:
            # Iteration 0 is start-up plus the first iteration: recorded only as the no-step fallback.
            return ProfilerAction.RECORD_AND_SAVE if step == 0 else base(step - 1)

        kwargs: dict[str, Any] = dict(
            activities=self._activities(),
            schedule=_schedule,
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.config.record_shapes,
            profile_memory=self.config.profile_memory,
            with_stack=self.config.with_stack,
        )
        if self.all_threads():
            try:  # DataParallel's replicas run in other threads: record them too.
                kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
            except (TypeError, AttributeError):
                self.capture_errors.append("this torch cannot profile all threads; only the main thread is recorded")

        self._install_hooks()
        if self.config.hang_timeout_s:
            self._watchdog = HangWatchdog(
                clock=self.clock,
                timeout_s=self.config.hang_timeout_s,
                thread_id=self._thread_id,
                rank=lambda: self.rank,
                finished=lambda: self._finished,
                on_hang=self._on_hang,
            )
            self._watchdog.start()
        # We step the profiler on purpose across cycles; its advice about acc_events is not for our users.
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        self._prof = profile(**kwargs)
        other_profiler.install(
            lambda p: p is self._prof or getattr(self._prof, "profiler", None) is p, self._other_profiler
        )
        _quietly(self._prof.start)
        self.write_rank_file()
        try:
            self.flight.start()
        except Exception as exc:  # no thread to be had: no dumps, the run goes on
            self.capture_errors.append(f"dumps unavailable: {type(exc).__name__}: {exc}")

    @staticmethod
    def _activities() -> list[Any]:
        import torch
        from torch.profiler import ProfilerActivity

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        return activities

    def all_threads(self) -> bool:
        """Whether the profiler records every thread (not only the main one)."""
        if self.config.all_threads == "auto":
            return self.config.all_devices  # one process driving all devices: the DataParallel case
        return self.config.all_threads == "on"

    def _install_hooks(self) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        # the pre-hook keeps which optimizer steps are running: only the outermost ends an iteration (ZeRO)
        self._handles.append(register_optimizer_step_pre_hook(self._on_optimizer_start))
        self._handles.append(register_optimizer_step_post_hook(self._on_optimizer_step))
        # an iteration whose optimizer step a GradScaler skipped (overflow) ends at its scaler.step() instead
        amp_scaler.install(lambda: self._optimizer_steps_seen, lambda opt: self._on_optimizer_step(opt, (), {}))
        self._startup_hook = register_module_forward_pre_hook(self._on_module_forward)
        try:  # before the phase tracker's hooks: it listens for the script's torch.compile
            compiled.install()
            compiled.on_compile_mode(self._compile_mode)
        except Exception as exc:  # another torch: compiled jobs may see ddpdoctor's hooks, the run goes on
            self.capture_errors.append(f"torch.compile watch unavailable: {type(exc).__name__}: {exc}")
        try:
            self.phase.install()
        except Exception as exc:  # internals of another torch version: dumps say "outside", the run goes on
            self.capture_errors.append(f"phase tracking unavailable: {type(exc).__name__}: {exc}")
        ddp_capture.install()
        try:
            self.setup.install()
        except Exception as exc:  # internals of another torch version: lose the set-up checks, not the run
            self.capture_errors.append(f"set-up observation unavailable: {type(exc).__name__}: {exc}")
        from ddpdoctor.capture import dp

        skipped = dp.install()
        self.dp = dp
        if skipped:
            self.capture_errors.append(f"DataParallel internals not found in this torch: {', '.join(skipped)}")
        if self.config.knobs:  # after ddp.install(): the knobs' DDP wrapper is the outer one
            knobs_capture.install(self.config.knobs, local_world_size=self.identity.local_world_size)

    def _remove_hooks(self) -> None:
        knobs_capture.uninstall()
        amp_scaler.uninstall()
        self.phase.uninstall()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._remove_startup_hook()
        self.setup.uninstall()
        ddp_capture.uninstall()
        compiled.uninstall()
        if self.dp is not None:
            self.dp.uninstall()

    def _remove_startup_hook(self) -> None:
        if self._startup_hook is not None:
            self._startup_hook.remove()
            self._startup_hook = None

    def joined_process_group(self, placement: groups.Placement | None = None) -> None:
        """The script created the default process group: this process is a rank, with the group's rank. A later
        group of the same process is recorded, and changes nothing of what this session's files describe."""
        info = rank_file.dist_info()
        if info is None or self._finished:
            return
        if placement is None:
            placement = groups.join(
                self.root, rank=info["rank"], world_size=info["world_size"], backend=info["backend"]
            )
        with self._lock:
            self.process_groups.append({"name": placement.name, **info})
            if len(self.process_groups) > 1:  # a second group after this process's first: not this session's
                self.write_rank_file()
                return
            if not placement.top_level:
                self._move_to(placement.folder(self.root))
            self.dist = info
            if self.claimed and info["rank"] == self.rank:
                return
            previous, was_claimed = self.rank, self.claimed
            self.identity = self.identity.with_process_group(info["rank"], info["world_size"])
            self.claimed = True
            if was_claimed and previous != self.rank and not self.trace_files:
                _remove_own_rank_file(self.out, previous, self.pid)  # written under the rank the environment gave
            self.write_rank_file()

    def _claim(self) -> None:
        """This process turned out to be a rank (it steps, or left a trace) without joining a process group (a
        launcher's process that trains or evaluates on its own): its files go to the top level unless another
        process holds this rank's files there (the ranks it spawned), then to a group folder of their own."""
        self.claimed = True
        if self.process_groups:
            return
        try:
            placement = groups.alone(self.root, rank=self.rank)
        except Exception as exc:  # never break the run for it: the top level, as before
            self.capture_errors.append(f"process group placement failed: {type(exc).__name__}: {exc}")
            return
        self.process_groups.append({"name": placement.name, "rank": self.rank, "world_size": 1, "backend": None})
        if not placement.top_level:
            self._move_to(placement.folder(self.root))

    def _move_to(self, folder: Path) -> None:
        """Write this session's files in ``folder`` (its process group's own) from now on. Files it wrote at the top
        level before it knew its group (a rank file only, no trace) are removed; it writes them again there."""
        if self.claimed and not self.trace_files:
            _remove_own_rank_file(self.out, self.rank, self.pid)
        folder.mkdir(parents=True, exist_ok=True)
        self.out = folder
        self._compressor.out = folder

    # ---- steps -----------------------------------------------------------------------------------------------
    def _on_optimizer_start(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.clock.optimizer_started(optimizer, sys._getframe(1))  # the frame of torch's step wrapper

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if compiled.is_compiling():  # a compiled optimizer step: nothing of ours in its graph
            return
        self._optimizer_steps_seen += 1
        # another thread's optimizer (an EMA or a probe in a helper thread) never marks the iterations once the
        # session's thread stepped; before that, the thread that steps first is the training loop's (_follow_thread)
        own = threading.get_ident() == self._thread_id or self.clock.source is None
        if self.clock.counts_optimizer(optimizer, may_count=own):
            self.step(source="optimizer")

    def _on_module_forward(self, module: Any, args: Any = None) -> None:
        # Only installed until the first step: bounds the start-up recording of a script with no visible step.
        if compiled.is_compiling():
            return
        if (
            self._prof is not None
            and not self._finished
            and self.clock.startup_over_limit(self.config.no_step_limit_s)
            and threading.get_ident() == self._thread_id
        ):
            self._end_startup("time limit")
            _quietly(self._prof.step)

    def _compile_mode(self) -> None:
        """The script calls torch.compile: the start-up bound's global hook would be traced into its graphs; the
        compiled modules' own forward hooks check the bound instead (capture/compiled.py)."""
        if self._startup_hook is not None:
            self._remove_startup_hook()
            compiled.on_compiled_forward(self._on_module_forward)

    def _end_startup(self, ended_by: str) -> None:
        self.clock.end_startup(ended_by)
        self._remove_startup_hook()

    def step(self, source: str) -> None:
        if self._finished or (threading.get_ident() != self._thread_id and not self._follow_thread()):
            return
        with self._lock:
            if not self.claimed:  # a process that trains is a rank
                self._claim()
                self.write_rank_file()
            iteration = self.clock.iteration
            if self.first_step_ns is None:
                self.first_step_ns = time.time_ns()
            self.clock.tick(source, recording=self._recording())
            observe = self._observe
            observe("phase", self.phase.step_ended, self.clock.iteration)
            if self.clock.startup is not StartupTrace.RECORDING:
                observe("start-up hook", self._remove_startup_hook)
            observe("device memory", self.memory.sample, iteration)
            observe("series", self.series.step, iteration)
            observe("set-up", self.setup.on_optimizer_step)
            if self._window_open() or iteration % 100 == 0:
                observe("DDP logging data", ddp_capture.snapshot)
            if self.dist is None:
                observe("process group", self._read_dist)
            if self.gil.running:
                observe("GIL", self.gil.sample, iteration)
            if self.dp is not None:
                observe("DataParallel", self._take_dp_stats, iteration)
            # before the export, not after
            observe("host load", self.hostload.step, self.clock.iteration, recording_next(self._prof))
            if iteration == 0 and self.clock.startup_ended_by == "time limit":
                self._drop_startup_trace()  # the profiler moved past the start-up at the limit: not again
            else:
                _quietly(self._prof.step)
            observe("progress", progress.after_step, self)
            window = self._window_open()
            observe("DDP timing", ddp_capture.time_every_iteration, window)  # each iteration of a window only
            observe("GIL", self.gil.start if window else self.gil.stop)
        if self.config.max_steps and self.clock.iteration >= self.config.max_steps:
            self.stopped_by = stopped_by(self.config.max_steps)
            raise StopTraining(self.config.max_steps)

    def _observe(self, what: str, call: Any, *args: Any) -> None:
        """One of the step's observers, which never breaks the script's training: an error is kept in the rank file
        (once per observer) and the step goes on."""
        try:
            call(*args)
        except Exception as exc:
            why = f"{what} at a step failed (step {self.clock.iteration}): {type(exc).__name__}: {exc}"
            if not any(e.startswith(f"{what} at a step failed") for e in self.capture_errors):
                self.capture_errors.append(why)

    def _read_dist(self) -> None:
        self.dist = rank_file.dist_info()

    def _take_dp_stats(self, iteration: int) -> None:
        stats = self.dp.take_step_stats()
        if stats.get("replicas"):
            self.dp_steps.append({"step": iteration, **stats})

    def _follow_thread(self) -> bool:
        """An optimizer stepped in a thread other than the session's before any step of its own: the job trains in
        that thread (a script's ``threading.Thread(target=train)``, Ray Train's worker thread), which the session
        follows from now on (its steps, the profiler's windows, the host's load, the hang watchdog). Without it the
        run said no optimizer ever stepped, and that the ranks never synchronised."""
        if self.clock.iteration > 0 or self.clock.source is not None:
            return False  # the session's thread steps: another thread's optimizer is not the training loop
        self._thread_id = threading.get_ident()
        self.phase._thread_id = self._thread_id
        self.hostload.main_tid = threading.get_native_id()
        if self._watchdog is not None:
            self._watchdog.thread_id = self._thread_id
        return True

    def _recording(self) -> bool:
        from torch.profiler import ProfilerAction

        return self._prof is not None and self._prof.current_action in (
            ProfilerAction.RECORD,
            ProfilerAction.RECORD_AND_SAVE,
        )

    def _window_open(self) -> bool:
        from torch.profiler import ProfilerAction

        return self._prof is not None and self._prof.current_action != ProfilerAction.NONE

    def _launched_ranks(self) -> bool:
        """Other processes of this run wrote rank files: they are the ranks, this process launched them."""
        for data in _rank_files(self.out):
            if data.get("pid") != self.pid or data.get("hostname") != _hostname():
                return True
        return False

    def finish(self, status: str, exit_code: int | None, error: str | None = None) -> None:
        """Stop profiling, write what was captured; safe to call twice."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            # No garbage collection while we write: a collection here could free the script's DDP model, whose
            # process group then joins gloo threads from this thread (see runner._Settling).
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
        if status == "interrupted" and exit_code and exit_code > 128:  # a signal seen only now (no watcher thread)
            self.flight.dump_signal(exit_code - 128)
        self.flight.stop()
        self.series.close()
        if self.clock.startup is StartupTrace.RECORDING:
            self.clock.end_startup("end of run")
        self.hostload.stop(self.clock.iteration - 1)  # a window still open: up to the last step completed
        try:
            self._remove_hooks()
            if self._prof is not None:
                _quietly(self._prof.stop)  # writes a window still open (partial if the run ended inside it)
        except Exception as exc:
            self.capture_errors.append(f"stopping the profiler failed: {type(exc).__name__}: {exc}")
        other_profiler.uninstall()
        self.gil.stop()
        if not self.claimed and self._launched_ranks():
            _current = None
            return  # a launcher of ranks (mp.spawn's parent): the ranks wrote the run
        if not self.claimed:
            self._claim()
        if self._summarizing:  # the removed windows' summaries, before the rank file says how the run ended
            self._summarizing = window_summary.reap(self._summarizing, window_summary.FINISH_WAIT_S)
        try:
            backend = (self.dist or {}).get("backend")
            self.run_collectives, self.training_collectives, self.training_collective_bytes = flight.run_collectives(
                backend, self.first_step_ns, int(self.started_at * 1e9)
            )
        except Exception as exc:  # never stand between the run and its rank file
            self.capture_errors.append(f"counting the run's collectives failed: {type(exc).__name__}: {exc}")
        self.write_rank_file()
        # The summary reads the traces not yet compressed as they are (faster), while they are compressed.
        summary = rank_file.summarize(self)
        self._compressor.wait()
        self._apply_compressed()
        rank_file.write_summary(self, summary)
        _current = None

    def _other_profiler(self, where: str) -> None:
        """The script started a profiler of its own at ``where``: it records nothing (capture/other_profiler.py)."""
        what = f"the script's own torch.profiler (at {where}) {other_profiler.NOTE}"
        if what in self.capture_errors:  # once a place (torch.profiler starts a new one every cycle)
            return
        self.capture_errors.append(what)
        if not self.config.quiet:
            progress.say(f"ddpdoctor: warning: rank {self.rank}: {what}")

    def _on_hang(self, idle_s: float, stack: str) -> None:
        with self._lock:
            self.status = "hung"
            self.error = f"no step for {idle_s:.0f}s after step {self.clock.iteration}; main thread at:\n{stack}"
            self.write_rank_file()

    def flush_interrupted(self, signum: int) -> None:
        """Called from a watcher thread when a signal arrives while the main thread may be blocked."""
        with self._lock:
            if not self._finished and self.status == "running":
                self.status = "interrupted"
                self.error = f"received signal {signum}"
                self.write_rank_file()
        if not self._finished:
            self.flight.dump_signal(signum)  # where every thread was when the signal came

    def signal_arrived(self, signum: int) -> None:
        """A watcher thread saw a signal other than SIGTERM/SIGINT (the main thread may be blocked in C++)."""
        if signum == getattr(signal, "SIGUSR1", None) and not self._finished:
            self.flight.signals_watched = True
            self.flight.on_demand_signal()

    def saw_exception(self, exc: BaseException) -> None:
        """An exception escaped the script: keep its traceback for the rank file and dump the rank (before the
        process ends)."""
        with contextlib.suppress(Exception):  # never stand between the user and their traceback
            self.error_frames = flight.exception_record(exc)["frames"][-MAX_ERROR_FRAMES:]
        if not self._finished and isinstance(exc, Exception):
            self.flight.dump_exception(exc)

    def rank_data(self) -> dict[str, Any]:
        """The rank capture file's content as it stands."""
        return rank_file.record(self)

    def write_rank_file(self) -> bool:
        """Write the rank file (if this process is a rank); False when that failed."""
        return rank_file.write(self) if self.claimed and os.getpid() == self.pid else False


def _quietly(call: Any) -> None:
    """Call into the profiler with the script's warning filters out of the way. A script that turns warnings into
    errors (``warnings.simplefilter("error")``, ``pytest -W error``) had torch's own profiler warning raise inside
    its optimizer step (its training ended), and the profiler, left half-way through a transition, then crashed the
    process with SIGSEGV at the end of the run. Torch's warnings about ddpdoctor's profiling are not the script's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call()


def _remove_own_rank_file(out: Path, rank: int, pid: int) -> None:
    path = rundir.rank_file(out, rank)
    with contextlib.suppress(OSError, ValueError):
        data = rundir.read_json(path)
        if data.get("pid") == pid and data.get("hostname") == _hostname():
            path.unlink()


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _rank_files(out: Path) -> list[dict[str, Any]]:
    from ddpdoctor.capture.manifest import read_rank_files

    return list(read_rank_files(out).values())
