"""Iterations whose optimizer step a GradScaler skipped.

``scaler.step(optimizer)`` does not call ``optimizer.step()`` in an iteration whose gradients overflowed (inf or
NaN after unscaling): the first iterations of an fp16 job often do, while the scale settles, and one now and then
after it grows. The session marks iterations by optimizer steps, so without this such an iteration merged into the
next one's step (one "step" of two or three iterations in the profiled window). ``install(on_skipped)`` wraps
``torch.amp.GradScaler.step`` (``torch.cuda.amp.GradScaler`` inherits it): where no optimizer step ran inside it,
``on_skipped(optimizer)`` is called after it returns, as the optimizer's own step would have ended the iteration.
Nothing else changes: the wrapper returns what the scaler returns and raises what it raises.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_patched: tuple[Any, Any, Any] | None = None  # (class, original step, our replacement)


def install(steps_seen: Callable[[], int], on_skipped: Callable[[Any], None]) -> bool:
    """Wrap ``GradScaler.step``. ``steps_seen()``: how many optimizer steps have ended so far (the session's
    count); ``on_skipped(optimizer)``: an iteration ended without its optimizer step. False where this torch has
    no ``torch.amp.GradScaler.step`` (nothing is patched)."""
    global _patched
    with _lock:
        if _patched is not None:
            return True
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:
            return False
        original = GradScaler.__dict__.get("step")
        if not callable(original):
            return False

        @functools.wraps(original)
        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = steps_seen()
            out = original(self, optimizer, *args, **kwargs)
            try:
                if steps_seen() == before:
                    on_skipped(optimizer)
            except Exception:  # never the script's problem
                pass
            return out

        GradScaler.step = step  # type: ignore[method-assign]
        _patched = (GradScaler, original, step)
        return True


def uninstall() -> None:
    """Restore ``GradScaler.step`` (left alone where someone re-patched it after us)."""
    global _patched
    with _lock:
        if _patched is None:
            return
        owner, original, replacement = _patched
        if owner.__dict__.get("step") is replacement:
            owner.step = original
        _patched = None
