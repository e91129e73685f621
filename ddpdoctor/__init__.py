"""ddpdoctor: profile and diagnose PyTorch DataParallel / DistributedDataParallel training.

Library entry points:

- ``ddpdoctor.step()``: mark the end of a training step in a loop that does not use ``torch.optim``
  (a no-op when the script is not running under ``ddpdoctor trace``).
- ``ddpdoctor.load(path)``: load a run directory or any torch.profiler traces.
"""

from __future__ import annotations

from ddpdoctor._version import __version__

__all__ = ["__version__", "step", "load"]


def step() -> None:
    """Mark the end of one training step (only needed for loops without a ``torch.optim`` optimizer)."""
    from ddpdoctor.capture import session

    session.manual_step()


def load(path, **kwargs):  # type: ignore[no-untyped-def]
    """Load a run directory, a folder of torch.profiler traces or one trace file. See ``ddpdoctor.load.load``."""
    from ddpdoctor.load import load as _load

    return _load(path, **kwargs)
