"""Where in its iteration a rank is: the step it had completed and its phase, for the dumps (``FlightDump``).

Phases, as the hooks see them (one call each per step, nothing per module, so the cost stays far below 1% of a step):

- ``outside``: before the first forward of the run, and after the hooks are removed (the end of the run);
- ``data``: from the end of the previous step (the optimizer's step, ``ddpdoctor.step()``) to the first module forward:
  fetching and preparing the next batch;
- ``forward``: from the first module forward of the step (a global forward pre-hook, armed only while it waits for
  that first forward and removed as soon as it fires: the module calls that follow take torch's fast path; it is
  registered once, and arming / disarming it puts its entry into torch's hook dict / takes it out, about 0.2 us,
  where registering anew each step made a handle, several us);
- ``backward``: from ``loss.backward()`` / ``torch.autograd.backward`` to the optimizer's step (gradient clipping, a
  metric's all-reduce after the backward count as backward too);
- ``optimizer``: inside the optimizer's step (a global optimizer step pre-hook), until the step ends.

With gradient accumulation the next micro-batch's forward is "forward" again (the forward hook is re-armed when a
backward returns); its data loading in between counts as backward. ``since`` is unix seconds.

Once the script calls ``torch.compile`` (``capture/compiled.py``) no global forward hook is armed again: dynamo would
trace it into the compiled graph. The first forward is then the first call of a compiled module (its own hook, run
outside the compiled region); a forward reached only from inside a compiled function counts as the phase before it.
Every hook returns at once while dynamo traces.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ddpdoctor.capture import compiled

PHASES = ("outside", "data", "forward", "backward", "optimizer")
STEP_WIDTH = 10  # the step, right-aligned, in a fatal record's "where" line
PHASE_WIDTH = 9  # the phase, padded with spaces
_PHASE_BYTES = {p: p.encode().ljust(PHASE_WIDTH) for p in PHASES}


class PhaseTracker:
    """The step and phase of one process's main thread. The hooks only run on that thread (``thread_id``);
    the methods are what the hooks and the step clock call, and may be called directly (tests)."""

    __slots__ = (
        "phase",
        "since",
        "step",
        "last_step_end",
        "spent",
        "last_spent",
        "_thread_id",
        "_forward_handle",
        "_awaiting_forward",
        "_handles",
        "_patched",
        "_register",
        "_hooks",
        "_key",
        "_hook",
        "_where",
        "_step_at",
        "_phase_at",
    )

    def __init__(self, thread_id: int | None = None) -> None:
        self.phase = "outside"
        self.since = time.time()
        self.step = 0  # steps completed
        self.last_step_end: float | None = None
        self.spent: dict[str, float] = {}  # seconds in each phase since the last step ended (capture/series.py)
        self.last_spent: dict[str, float] = {}  # the same for the step that ended last
        self._thread_id = threading.get_ident() if thread_id is None else thread_id
        self._forward_handle: Any = None
        self._awaiting_forward = False  # armed: the next forward is the step's (or micro-batch's) first
        self._handles: list[Any] = []
        self._patched: Any = None  # (module, original backward) while torch.autograd.backward is wrapped
        self._register: Any = None  # torch's register_module_forward_pre_hook, once installed
        self._hooks: Any = None  # torch's global forward pre-hook dict, where the hook's entry comes and goes
        self._key: Any = None  # the hook's key in it (its handle's id: torch's own bookkeeping)
        self._hook = self._on_forward_pre  # bound once
        self._where: Any = None  # the fatal record's "where" line (a writable mapping of its file), once attached
        self._step_at = self._phase_at = 0  # where in it the step and the phase are written

    # ---- transitions -----------------------------------------------------------------------------------------
    def _enter(self, phase: str) -> None:
        if self.phase != phase:
            now = time.time()
            self.spent[self.phase] = self.spent.get(self.phase, 0.0) + (now - self.since)
            self.phase = phase
            self.since = now
            if self._where is not None:
                self._where[self._phase_at : self._phase_at + PHASE_WIDTH] = _PHASE_BYTES[phase]

    def step_ended(self, completed: int) -> None:
        """A step ended (``completed`` steps so far): the next batch's data phase starts."""
        now = time.time()
        self.spent[self.phase] = self.spent.get(self.phase, 0.0) + (now - self.since)
        self.last_spent, self.spent = self.spent, {}
        self.step = completed
        self.last_step_end = now
        self.phase, self.since = "data", now
        if self._where is not None:
            self._where[self._step_at : self._step_at + STEP_WIDTH] = b"%10d" % completed
            self._where[self._phase_at : self._phase_at + PHASE_WIDTH] = _PHASE_BYTES["data"]
        self._arm_forward()

    def forward_started(self) -> None:
        if self.phase != "forward":
            self._enter("forward")

    def backward_started(self) -> None:
        self._enter("backward")

    def backward_returned(self) -> None:
        self._arm_forward()  # a next micro-batch's forward is "forward" again

    def optimizer_started(self) -> None:
        self._enter("optimizer")

    def attach_where(self, where: Any, step_at: int, phase_at: int) -> None:
        """Keep the step and phase written in ``where`` (a writable buffer: the fatal record's mapped "where" line,
        ``capture/flight.py``) at ``step_at`` (``STEP_WIDTH`` bytes) and ``phase_at`` (``PHASE_WIDTH``) from now on,
        so that a rank a fatal signal ends (it runs no Python again) still says where it was: a store into memory
        the kernel keeps for the file, no system call. ``None`` stops it (a forked child)."""
        self._where = where
        self._step_at, self._phase_at = step_at, phase_at
        if where is not None:
            where[step_at : step_at + STEP_WIDTH] = b"%10d" % self.step
            where[phase_at : phase_at + PHASE_WIDTH] = _PHASE_BYTES[self.phase]

    def snapshot(self) -> dict[str, Any]:
        """``step``, ``phase``, ``phase_since``, ``last_step_end`` as a dump writes them."""
        return {"step": self.step, "phase": self.phase, "phase_since": self.since, "last_step_end": self.last_step_end}

    # ---- hooks -----------------------------------------------------------------------------------------------
    def install(self) -> None:
        """Hook torch: the first forward of each step, ``torch.autograd.backward``, the optimizer's step."""
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._register = register_module_forward_pre_hook
        self._register_once()
        self._handles.append(register_optimizer_step_pre_hook(self._on_optimizer_pre))
        self._arm_forward()
        self._patch_backward()
        compiled.on_compile_mode(self.compile_mode)

    def compile_mode(self) -> None:
        """The script compiles: no global forward hook from now on; compiled modules' own hooks tell the forward."""
        if self._register is None:
            return
        awaiting = self._awaiting_forward
        self._disarm_forward()
        self._awaiting_forward = awaiting
        self._register = self._hooks = self._key = None
        compiled.on_compiled_forward(self._on_compiled_forward)

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._disarm_forward()
        self._register = self._hooks = self._key = None
        if self._patched is not None:
            module, original, wrapper = self._patched
            if getattr(module, "backward", None) is wrapper:
                module.backward = original
            self._patched = None
        self._enter("outside")

    def _arm_forward(self) -> None:
        self._awaiting_forward = True
        if self._register is None:
            return
        if self._hooks is not None:  # the entry of the handle registered once
            self._hooks[self._key] = self._hook
        elif self._forward_handle is None:  # a torch whose handles keep no dict: register anew
            self._forward_handle = self._register(self._hook)

    def _disarm_forward(self) -> None:
        self._awaiting_forward = False
        if self._hooks is not None:
            self._hooks.pop(self._key, None)
        if self._forward_handle is not None:
            self._forward_handle.remove()
            self._forward_handle = None

    def _register_once(self) -> None:
        """Register the forward pre-hook once, keep its handle's dict and key, and take the entry out (disarmed)."""
        handle = self._register(self._hook)
        hooks = getattr(handle, "hooks_dict_ref", lambda: None)()
        key = getattr(handle, "id", None)
        if isinstance(hooks, dict) and key is not None and hooks.get(key) is self._hook:
            self._hooks, self._key = hooks, key
            hooks.pop(key, None)
        else:
            handle.remove()

    def _on_forward_pre(self, module: Any, args: Any) -> None:
        if compiled.is_compiling():
            return
        if threading.get_ident() == self._thread_id:
            self._disarm_forward()
            self.forward_started()

    def _on_compiled_forward(self, module: Any) -> None:
        if self._awaiting_forward and threading.get_ident() == self._thread_id:
            self._awaiting_forward = False
            self.forward_started()

    def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if compiled.is_compiling():
            return
        if threading.get_ident() == self._thread_id:
            self.optimizer_started()

    def _patch_backward(self) -> None:
        import torch.autograd

        from ddpdoctor.capture.invisible import invisible

        module = torch.autograd
        original = module.backward
        if getattr(original, "_ddpdoctor_phase", False):
            return
        tracker = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            if compiled.is_compiling():
                return original(*args, **kwargs)
            mine = threading.get_ident() == tracker._thread_id
            if mine:
                tracker.backward_started()
            try:
                return original(*args, **kwargs)
            finally:
                if mine:
                    tracker.backward_returned()

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        backward.__doc__ = original.__doc__
        backward._ddpdoctor_phase = True  # type: ignore[attr-defined]
        wrapper = invisible(backward)
        module.backward = wrapper
        self._patched = (module, original, wrapper)
