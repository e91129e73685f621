"""ddpdoctor: profile and diagnose PyTorch DataParallel / DistributedDataParallel training.

Library entry points:

- ``ddpdoctor.step()``: mark the end of a training step in a loop that does not use ``torch.optim``
  (a no-op when the script is not running under ``ddpdoctor trace``).
- ``ddpdoctor.load(path)``: load a run directory or any torch.profiler traces.
- ``ddpdoctor.summary()``: this rank's latest step numbers as a flat dict, for a logger (W&B, MLflow, Lightning).
"""

from __future__ import annotations

from ddpdoctor._version import __version__

__all__ = ["__version__", "step", "load", "summary"]


def step() -> None:
    """Mark the end of one training step (only needed for loops without a ``torch.optim`` optimizer)."""
    from ddpdoctor.capture import session

    session.manual_step()


def load(path, **kwargs):  # type: ignore[no-untyped-def]
    """Load a run directory, a folder of torch.profiler traces or one trace file. See ``ddpdoctor.load.load``."""
    from ddpdoctor.load import load as _load

    return _load(path, **kwargs)


def summary() -> dict:
    """This rank's latest always-on step numbers as a flat dict of numbers, for a logger::

        wandb.log(ddpdoctor.summary())            # or mlflow.log_metrics(...), self.log_dict(...) in Lightning

    Keys (``ddpdoctor/`` prefixed): ``rank``, ``step`` (the last step completed), ``steps_recorded``,
    ``step_seconds``, ``data_wait_seconds``, ``forward_seconds``, ``backward_seconds``, ``optimizer_seconds``
    (the last step's), ``cpu_seconds`` (the process's CPU time in the last step, all its threads),
    ``mean_step_seconds`` (over the run so far), ``memory_bytes`` (CUDA allocated on the rank's
    device, the process RSS on CPU), ``memory_reserved_bytes`` (CUDA), ``ddp_comm_seconds`` (DDP's backward
    communication, a recent step's); a key is absent when its value was not measured. ``{}`` outside
    ``ddpdoctor trace`` or before the first step. Costs a dict copy: call it as often as you log.
    """
    from ddpdoctor.capture.series import summary as _summary

    return _summary()
