"""Run one trial (RUN's command with a step limit and knobs) and read what it left: its run directory, or why it
failed (the rank's own error, a knob that applied nowhere, a time-out)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor import rundir, runfiles
from ddpdoctor.trial.plan import RunCommand, setting_label


@dataclass
class TrialRun:
    settings: dict[str, str]
    out: Path  # the trial's run directory
    log: Path  # everything the job printed
    exit_code: int | None
    seconds: float
    error: str | None = None  # why the trial failed (None: it ran and every knob applied)
    knobs: dict[str, Any] = field(default_factory=dict)  # the manifest's knobs: what applied

    @property
    def label(self) -> str:
        return setting_label(self.settings)

    @property
    def ok(self) -> bool:
        return self.error is None


def run_trial(
    cmd: RunCommand,
    session: Path,
    settings: dict[str, str],
    *,
    max_steps: int,
    timeout_s: float,
    label: str | None = None,
) -> TrialRun:
    """Run RUN's command into ``session/<label>/`` (label: the settings') with ``settings``; never raises for the
    job's own failure."""
    label = label or setting_label(settings)
    out = session / label
    log = session / f"{label}.log"
    argv = cmd.argv(out, max_steps=max_steps, settings=settings)
    env = {k: v for k, v in os.environ.items() if k != "DDPDOCTOR_CAPTURE"}
    env["PYTHONUNBUFFERED"] = "1"
    started = time.perf_counter()
    timed_out = False
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            argv, cwd=cmd.cwd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
            code = proc.returncode
        except KeyboardInterrupt:
            _stop(proc)
            raise
    trial = TrialRun(settings, out, log, code, time.perf_counter() - started)
    trial.error = _failure(trial, timed_out, timeout_s)
    return trial


def _stop(proc: subprocess.Popen) -> None:
    """End the trial's whole process group (torchrun and its ranks): SIGTERM, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _failure(trial: TrialRun, timed_out: bool, timeout_s: float) -> str | None:
    manifest: dict[str, Any] = {}
    if (trial.out / rundir.MANIFEST).is_file():
        manifest, _ = runfiles.read_manifest(trial.out)
    trial.knobs = dict(manifest.get("knobs") or {})
    if timed_out:
        return f"did not finish within {timeout_s:.0f} s (stopped; see {trial.log})"
    failed = [r for r in manifest.get("ranks") or [] if r.get("status") != "ok"]
    if trial.exit_code != 0 or failed or not manifest:
        reason = next((r.get("reason") for r in failed if r.get("reason")), None)
        if reason is None or reason.startswith("exit code") or "died without finishing" in reason:
            reason = _last_error_line(trial.log) or reason
        where = f"rank {failed[0]['rank']}: " if failed else ""
        return f"the job failed (exit code {trial.exit_code}): {where}{reason or 'see ' + str(trial.log)}"
    for name in trial.settings:
        entry = trial.knobs.get(name) or {}
        if not entry.get("applied"):
            return f"{name} does not apply to this job: {entry.get('reason') or 'it changed nothing'}"
    return None


def _last_error_line(log: Path) -> str | None:
    """The last ``SomeError: message`` line the job printed (a rank's traceback)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = line.strip()
        head = text.split(":", 1)[0].split("]")[-1].strip()
        if ":" in text and (head.endswith("Error") or head.endswith("Exception")) and " " not in head:
            return text.split("]", 1)[-1].strip() if text.startswith("[rank") else text
    return None
