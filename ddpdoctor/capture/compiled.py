"""torch.compile: nothing of ddpdoctor's inside a compiled region (a profiler must not change what it measures).

ddpdoctor keeps two global module forward pre-hooks for a while: the start-up bound (until the first step,
``capture/session.py``) and the phase tracker's "first forward of the step" (``capture/phase.py``). Dynamo traces a
module's ``_call_impl`` with the global hooks in it when any exist: a hook's ``time.perf_counter`` splits the graph
(14 compiled regions and 35 graph calls per step instead of 2 and 6), the hooks' dict sizes become guards (a
recompile whenever a hook comes or goes), and ``OptimizedModule.__call__`` warns about global hooks.

So ``torch.compile`` is wrapped: the first call (before anything can be compiled or an ``OptimizedModule`` called)
puts the process in *compile mode*: the listeners remove every global module hook of ddpdoctor's for the rest of
the run, and the first forward of a step is seen from then on by a forward pre-hook on each compiled module itself
(the ``OptimizedModule`` that ``torch.compile(module)`` returns runs its own hooks eagerly, outside the compiled
region). ``nn.Module.compile()`` and ``@torch.compile`` go through ``torch.compile`` too. Every hook of ddpdoctor's
also returns at once while dynamo traces (``torch.compiler.is_compiling()``), so a hook reached from a compiled
function (``torch.compile(train_step)``, a compiled optimizer step) adds nothing to its graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpdoctor.capture.invisible import invisible

_original: Any = None  # torch.compile before install()
_listeners: list[Callable[[], None]] = []  # called once, when the process enters compile mode
_forward_listeners: list[Callable[[Any], None]] = []  # called with each compiled module before its forward
_target_listeners: list[Callable[[Any], None]] = []  # called with what the script compiles, before torch.compile
active = False  # the script called torch.compile (this process is in compile mode)
compiled_modules = 0  # modules torch.compile returned (OptimizedModule), for the rank file


def _is_compiling_fn() -> Callable[[], bool]:
    try:
        from torch.compiler import is_compiling  # torch >= 2.3

        return is_compiling
    except ImportError:  # pragma: no cover - older torch
        try:
            from torch._dynamo import is_compiling as dynamo_is_compiling

            return dynamo_is_compiling
        except ImportError:
            return lambda: False


def _first_is_compiling() -> bool:
    """The first call looks torch's own ``is_compiling`` up and rebinds :data:`is_compiling` to it, so that importing
    this module does not import torch (``ddpdoctor trace``'s launcher process, which only starts torchrun, never
    needs it: about 1.5 s of CPU before the job starts) and every later call is torch's function itself."""
    global is_compiling
    is_compiling = _is_compiling_fn()
    return is_compiling()


is_compiling: Callable[[], bool] = _first_is_compiling


def install() -> None:
    """Wrap ``torch.compile`` (a no-op when already installed)."""
    global _original, active, compiled_modules
    import torch

    if _original is not None or not hasattr(torch, "compile"):
        return
    active = False
    compiled_modules = 0
    _original = torch.compile
    original = _original

    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("disable", False):
            enter_compile_mode()
            if model is not None:
                for listener in list(_target_listeners):
                    listener(model)
        result = original(model, *args, **kwargs)
        if model is not None and isinstance(result, torch.nn.Module) and result is not model:
            _watch(result)
        return result

    compile.__wrapped__ = original  # type: ignore[attr-defined]
    compile.__doc__ = original.__doc__
    torch.compile = invisible(compile)


def uninstall() -> None:
    global _original
    if _original is None:
        return
    import torch

    if getattr(torch.compile, "__wrapped__", None) is _original:
        torch.compile = _original
    _original = None
    _listeners.clear()
    _forward_listeners.clear()
    _target_listeners.clear()


def on_compile_mode(listener: Callable[[], None]) -> None:
    """Call ``listener()`` once when the script first calls ``torch.compile`` (at once if it already has)."""
    if active:
        listener()
    else:
        _listeners.append(listener)


def on_compiled_forward(listener: Callable[[Any], None]) -> None:
    """Call ``listener(module)`` before each forward of a module ``torch.compile`` returned (eagerly, on the
    script's thread or another one: the listener checks)."""
    _forward_listeners.append(listener)


def on_compile_target(listener: Callable[[Any], None]) -> None:
    """Call ``listener(model)`` with whatever the script passes to ``torch.compile`` (a module, a function), before
    torch compiles it: a wrapper of ddpdoctor's on that module's own path is taken off it there (dynamo would stop
    at it, a graph break the bare job does not have)."""
    _target_listeners.append(listener)


def enter_compile_mode() -> None:
    global active
    if active:
        return
    active = True
    for listener in list(_listeners):
        listener()
    _listeners.clear()
    _skip_own_frames()


def _skip_own_frames() -> None:
    """Tell dynamo never to trace a frame of ddpdoctor's (its wrappers of torch functions, such as DDP.forward's in
    capture/setup.py): they run eagerly, as they do without torch.compile."""
    try:
        from torch._dynamo import trace_rules  # torch >= 2.2 (torch.compile imports it anyway)

        trace_rules.add("ddpdoctor")
    except Exception:  # pragma: no cover - another torch: the wrappers are traced, their hooks return at once
        pass


def _watch(module: Any) -> None:
    global compiled_modules
    compiled_modules += 1
    try:
        module.register_forward_pre_hook(_on_forward_pre)
    except Exception:  # pragma: no cover - an OptimizedModule without hooks: no forward phase, the run goes on
        pass


def _on_forward_pre(module: Any, args: Any) -> None:
    if is_compiling():  # a compiled module called inside another compiled region: nothing of ours in its graph
        return
    for listener in list(_forward_listeners):
        listener(module)
