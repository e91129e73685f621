"""Capture settings, shared by the launcher and every rank (handed to ranks through one environment variable)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

ENV_VAR = "DDPDOCTOR_CAPTURE"


@dataclass(frozen=True)
class CaptureConfig:
    out: str
    wait: int = 5  # steps skipped before profiling (the first iterations are warm-up noise)
    warmup: int = 2
    active: int = 5
    repeat: int = 1
    # --every: a window every this many steps, or every this many seconds (capture/every.py); None: torch's own
    # schedule (windows back to back, --repeat times)
    every_steps: int | None = None
    every_s: float | None = None
    keep: int | None = None  # --keep N: the newest N windows' traces are kept per rank (older ones removed)
    with_stack: bool = False
    record_shapes: bool = True
    profile_memory: bool = True
    gil: bool = True
    # With no step seen, the trace covers the run from its start; this bounds it (seconds).
    no_step_limit_s: float = 60.0
    # A rank with no step for this long after its first step asks every rank to dump; the dumps decide whether the
    # job hangs, and who is the cause (ddpdoctor.capture.hang). None: off (wait for the job's own timeouts).
    hang_timeout_s: float | None = None
    # hang_timeout_s is the floor of the default rule (no --hang-timeout): that or 10x the slowest step, whichever
    # is longer; the job is then stopped only when the dumps show a desync or a dead peer (a rank in its own code
    # while the others wait is reported: it may be a long checkpoint).
    hang_timeout_default: bool = False
    launcher_pid: int = 0
    quiet: bool = False
    # Record every thread (DataParallel's replica threads). In torch 2.13 this drops the trace's [memory] events,
    # and gloo's collectives are recorded without it, so "auto" uses it only for one-process (DataParallel) runs.
    all_threads: str = "auto"  # "auto" | "on" | "off"
    # One process driving all GPUs (DataParallel): record every visible device, touched or not.
    all_devices: bool = False
    # How the job was launched: "direct" (a script run by `ddpdoctor trace`, maybe starting its ranks with
    # mp.spawn), "torchrun", "scheduler" (this process is one rank a scheduler started), "command" (`-- COMMAND`).
    launch: str = "direct"
    # --max-steps: every rank stops cleanly at the step boundary after this many steps (None: the script's own end)
    max_steps: int | None = None
    # --set KNOB=VALUE: settings ddpdoctor applies to the script through its hooks (ddpdoctor.knobs), as text
    knobs: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> CaptureConfig | None:
        raw = (environ if environ is not None else os.environ).get(ENV_VAR)
        if not raw:
            return None
        return cls(**json.loads(raw))

    def schedule_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"wait": self.wait, "warmup": self.warmup, "active": self.active, "repeat": self.repeat}
        if self.every_steps or self.every_s:
            out.update(every_steps=self.every_steps, every_s=self.every_s)
        if self.keep:
            out["keep"] = self.keep
        return out
