"""The script's own ``torch.profiler`` while ``ddpdoctor trace`` profiles it: it stands aside.

Only one Kineto profiler can record in a process. A script that profiles itself (``torch.profiler.profile``,
``torch.autograd.profiler.profile``, Lightning's ``profiler="pytorch"``, ``accelerator.profile()``) under
``ddpdoctor trace`` would start a second one beside ddpdoctor's: where their windows overlap, torch 2.13 ends the
process with SIGSEGV (seen with a script profiling steps 8-13 of a traced run), and where they do not, one of them
silently records nothing. So while a session profiles the process, every other profiler is *idle*: it starts,
steps and stops as the script drives it, records nothing and touches no profiler state; its ``key_averages()`` and
``events()`` are empty and its exported traces hold no events. The first time, the rank says so on stderr (unless
``--quiet``) and in its rank file's ``capture_errors``: where the script started it, and that its trace is empty.

Everything goes through ``torch.autograd.profiler.profile`` (``torch.profiler.profile`` makes one per cycle and
calls its ``_prepare_trace``/``_start_trace``/``__exit__``); the session's own is the one its ``torch.profiler``
object holds (``owner``)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_IDLE = "_ddpdoctor_idle"  # set on a profile object that records nothing (a script's, while a session traces)

_lock = threading.Lock()
_patched: dict[tuple[Any, str], Any] = {}  # (class, method name) -> the original
_owner: Callable[[Any], bool] | None = None  # whether a profile object is the session's own
_on_idle: Callable[[str], None] | None = None  # told once where the script started its profiler


def install(owner: Callable[[Any], bool], on_idle: Callable[[str], None]) -> None:
    """While installed, a profiler for which ``owner(profile)`` is false records nothing (module docstring; ``owner``
    is given ``torch.autograd.profiler.profile`` objects and ``torch.profiler.profile`` ones);
    ``on_idle(where)`` is called the first time one starts (``where``: the script's file and line)."""
    global _owner, _on_idle
    from torch.autograd import profiler as autograd_profiler
    from torch.profiler import profiler as torch_profiler

    with _lock:
        _owner, _on_idle = owner, on_idle
        if _patched:
            return
        base = autograd_profiler.profile
        kineto = torch_profiler._KinetoProfile
        scheduled = torch_profiler.profile
        for cls, name, wrapper in (
            (scheduled, "start", _no_step_ranges),
            (scheduled, "step", _no_step_ranges),
            (base, "_prepare_trace", _prepare_trace),
            (base, "_start_trace", _start_trace),
            (base, "__exit__", _exit),
            (base, "export_chrome_trace", _export_chrome_trace),
            (base, "toggle_collection_dynamic", _toggle),
            (kineto, "add_metadata", _add_metadata),
            (kineto, "add_metadata_json", _add_metadata),
            (kineto, "export_memory_timeline", _export_memory_timeline),
        ):
            original = cls.__dict__.get(name)
            if original is None:  # another torch: that method is not where this one has it
                continue
            _patched[(cls, name)] = original
            setattr(cls, name, wrapper(original))


def uninstall() -> None:
    """torch's methods back, at the end of the session: profilers started from now on record as usual."""
    global _owner, _on_idle
    with _lock:
        for (cls, name), original in _patched.items():
            setattr(cls, name, original)
        _patched.clear()
        _owner = _on_idle = None


def _stands_aside(prof: Any) -> bool:
    """Whether ``prof`` is to record nothing: already idle, or starting while a session owns the profiler."""
    if getattr(prof, _IDLE, False):
        return True
    owner, on_idle = _owner, _on_idle
    if owner is None or owner(prof):
        return False
    setattr(prof, _IDLE, True)
    if on_idle is not None:
        on_idle(_script_frame())
    return True


def _no_step_ranges(original: Any) -> Any:
    """``torch.profiler.profile.start``/``step``: a script's profiler marks no ``ProfilerStep#N`` range. Each is a
    ``record_function`` that the session's profiler records: a script stepping its own profiler doubled the steps
    the run analysed (10 of 5: Lightning's ``profiler="pytorch"``)."""

    def call(self: Any) -> Any:
        owner = _owner
        if owner is not None and not owner(self):
            self.record_steps = False
        return original(self)

    return call


def _prepare_trace(original: Any) -> Any:
    def prepare(self: Any) -> Any:
        if _stands_aside(self):
            self.entered = True
            return None
        return original(self)

    return prepare


def _start_trace(original: Any) -> Any:
    def start(self: Any) -> Any:
        if _stands_aside(self):  # (one prepared before the session began is stood down here)
            self.entered = True
            self.profiling_start_time_ns = time.perf_counter_ns()
            return None
        return original(self)

    return start


def _exit(original: Any) -> Any:
    def exit_(self: Any, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        if getattr(self, _IDLE, False):
            self._function_events = None
            self._needs_processing = True
            self.kineto_results = None  # key_averages(), events(): empty
            self.profiling_end_time_ns = time.perf_counter_ns()
            return False
        return original(self, exc_type, exc_val, exc_tb)

    return exit_


def _export_chrome_trace(original: Any) -> Any:
    def export(self: Any, path: Any, metadata: Any = None, use_python_export: bool = False) -> Any:
        if getattr(self, _IDLE, False):  # a valid trace without events, as a profiler that saw nothing writes
            with open(path, "w") as out:
                json.dump({"traceEvents": [], "otherData": {"ddpdoctor": NOTE}}, out)
            return None
        return original(self, path, metadata, use_python_export)

    return export


def _toggle(original: Any) -> Any:
    def toggle(self: Any, enabled: bool, activities: Any) -> Any:
        if getattr(self, _IDLE, False):
            return None
        return original(self, enabled, activities)

    return toggle


def _add_metadata(original: Any) -> Any:
    def add(self: Any, key: str, value: str) -> Any:
        if getattr(
            getattr(self, "profiler", None), _IDLE, False
        ):  # into its own table only: not into the session's trace
            self._trace_metadata[key] = value
            return None
        return original(self, key, value)

    return add


def _export_memory_timeline(original: Any) -> Any:
    def export(self: Any, path: str, device: str | None = None) -> Any:
        if getattr(getattr(self, "profiler", None), _IDLE, False):  # nothing recorded: no timeline to write
            return None
        return original(self, path, device)

    return export


NOTE = (
    "records nothing while `ddpdoctor trace` profiles this process (two torch profilers at once can crash it): its "
    "tables are empty and its traces hold no events; run the script without ddpdoctor for its own profile"
)


def _script_frame() -> str:
    """``file:line`` of the innermost frame outside torch, ddpdoctor and the standard library: the script's call."""
    skip = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(os.__file__))
    try:
        import torch

        skip += (os.path.dirname(torch.__file__),)
    except ImportError:
        pass
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(skip) and not path.startswith("<"):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "an unknown place"
