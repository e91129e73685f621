"""What a trial runs: RUN's own command from its manifest, with ``--out``, ``--max-steps`` and ``--set`` of ours.

The manifest of a run holds the ``ddpdoctor trace`` command line as typed (script, arguments, torchrun options,
schedule) and the directory it ran in. A trial runs the same line again from there, with the trial's run
directory, a step limit and the knobs; every other option stays as the user gave it.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddpdoctor import escape, knobs, rundir, runfiles
from ddpdoctor.errors import UsageError

# Options of `trace` a trial sets itself (with whether they take a value); the user's are dropped.
_OURS = {"--out": True, "-o": True, "--force": False, "--set": True, "--max-steps": True, "-q": False, "--quiet": False}
MAX_RANKS_PER_NODE = 1024  # what --nproc-per-node takes
STEPS_AFTER_WINDOW = 10  # steps a trial runs past the profiled window by default (samples of undisturbed steps)


@dataclass(frozen=True)
class RunCommand:
    """RUN's command, split: ``own`` ddpdoctor options (ours removed), ``torchrun`` options, ``target``
    (SCRIPT ARGS or -m MOD ARGS) or ``command`` (after ``--``), and where it ran."""

    run: Path
    manifest: dict[str, Any]
    own: tuple[str, ...]
    torchrun: tuple[str, ...]
    target: tuple[str, ...]
    command: tuple[str, ...] | None
    cwd: Path
    schedule: dict[str, int]

    @property
    def nproc_per_node(self) -> int:
        for i, tok in enumerate(self.torchrun):
            name, _, value = tok.partition("=")
            if name in ("--nproc-per-node", "--nproc_per_node"):
                value = value or (self.torchrun[i + 1] if i + 1 < len(self.torchrun) else "")
                return int(value) if value.isascii() and value.isdigit() else 1
        return int(self.manifest.get("world_size") or 1)

    def default_max_steps(self) -> int:
        """The end of RUN's profiled window(s) plus ``STEPS_AFTER_WINDOW`` steps."""
        s = self.schedule
        end = s.get("wait", 5) + s.get("warmup", 2) + s.get("active", 5) * max(s.get("repeat", 1), 1)
        return end + STEPS_AFTER_WINDOW

    def argv(self, out: Path, *, max_steps: int, settings: dict[str, str]) -> list[str]:
        """The trial's command line (run with ``cwd``)."""
        sets = [a for name, value in settings.items() for a in ("--set", f"{name}={value}")]
        head = [sys.executable, "-m", "ddpdoctor", "trace", *self.own, "--out", str(out.resolve()), "-q"]
        head += ["--max-steps", str(max_steps), *sets]
        if self.command is not None:
            return [*head, "--", *self.command]
        return [*head, *self.torchrun, *self.target]


def read_run(path: str) -> RunCommand:
    """RUN's command from its manifest; ``UsageError`` (one line naming the file and field, exit 2) when RUN cannot
    be run again. Only what ``ddpdoctor trace`` itself records is run: a ``ddpdoctor trace`` command line that
    trace's own parser accepts, from an absolute directory. Whether this user's own trace wrote it is
    ``ddpdoctor.capture.command_mark.check``'s to say (``try`` shows the command and asks when it did not)."""
    run = Path(path)
    if not run.is_dir() or not rundir.is_run_dir(run):
        raise UsageError(f"{path}: not a ddpdoctor run directory (no manifest.json); trace one with `ddpdoctor trace`")
    manifest, notes = runfiles.read_manifest(run)
    if not manifest:
        raise UsageError(f"{path}: {notes[0] if notes else 'no manifest.json'}: cannot tell which command to run")
    where = run / rundir.MANIFEST
    command = manifest.get("command")
    if not (
        isinstance(command, list) and command[:2] == ["ddpdoctor", "trace"] and all(isinstance(a, str) for a in command)
    ):
        raise UsageError(
            f"{where}: command: not a `ddpdoctor trace` command line (try runs only what `ddpdoctor trace` records)"
        )
    if any("\x00" in a for a in command):
        raise UsageError(f"{where}: command: an argument holds a NUL character, which no command line can")
    if manifest.get("launch") == "scheduler" or manifest.get("mode") == "scheduler":
        raise UsageError(
            f"{path}: each rank of this run was started by a scheduler; `ddpdoctor try` cannot start them again "
            "(trace with torchrun or `--` COMMAND to try knobs)"
        )
    from ddpdoctor.cli.trace_args import parse_own, split_argv

    try:
        own, tr, target, after = split_argv(command[2:])
        recorded = parse_own(own)
    except UsageError as exc:
        raise UsageError(f"{where}: command: not a command line `ddpdoctor trace` accepts: {exc}") from None
    if recorded.help or (not target and after is None) or (target[:1] == ["-m"] and len(target) < 2):
        raise UsageError(f"{where}: command: names no script or command to run")
    capture = manifest.get("capture")
    if capture is not None and not isinstance(capture, dict):
        raise UsageError(f"{where}: capture: not a JSON object (the profiler schedule trace ran with)")
    # the schedule the command itself gives (what trace recorded in capture, checked by trace's parser)
    schedule = {k: getattr(recorded, k) for k in ("wait", "warmup", "active", "repeat")}
    kept: list[str] = []
    skip = False
    for tok in own:
        if skip:
            skip = False
            continue
        name = tok.split("=", 1)[0]
        if name in _OURS:
            skip = _OURS[name] and "=" not in tok
            continue
        kept.append(tok)
    recorded_cwd = manifest.get("cwd")
    if recorded_cwd is None:  # written before manifests recorded it: from here, as before
        cwd = Path(os.getcwd())
    elif isinstance(recorded_cwd, str) and os.path.isabs(recorded_cwd) and "\x00" not in recorded_cwd:
        cwd = Path(recorded_cwd)
    else:
        raise UsageError(f"{where}: cwd: not an absolute directory path: {escape.terminal(repr(recorded_cwd))}")
    if not cwd.is_dir():
        raise UsageError(f"{path}: the directory it was traced in, {escape.terminal(cwd)}, no longer exists")
    if target and target[0] != "-m" and not (cwd / target[0]).is_file():
        raise UsageError(
            f"{path}: its script {escape.terminal(target[0])} is not in {escape.terminal(cwd)}"
            + ("" if recorded_cwd else " (this run does not record where it ran: run try from there)")
        )
    return RunCommand(
        run=run,
        manifest=manifest,
        own=tuple(kept),
        torchrun=tuple(tr),
        target=tuple(target),
        command=tuple(after) if after is not None else None,
        cwd=cwd,
        schedule=schedule,
    )


def describe(cmd: RunCommand, trial_cmd: RunCommand | None = None) -> list[str]:
    """What ``try`` runs, for the user to read before it does: the recorded command line and the directory, every
    character shown (a control character in an argument cannot rewrite the terminal line that shows it)."""
    recorded = [str(a) for a in cmd.manifest.get("command") or []]
    lines = [
        f"RUN's command, as recorded in {escape.terminal(cmd.run / rundir.MANIFEST)}, runs again in "
        f"{escape.terminal(cmd.cwd)}:",
        "  " + escape.terminal(shlex.join(recorded)),
    ]
    if cmd.command is not None:
        lines.append("  the command after -- runs as you: " + escape.terminal(shlex.join(cmd.command)))
    elif cmd.target and cmd.target[0] == "-m":
        lines.append(f"  the module it runs: {escape.terminal(cmd.target[1])} (found from {escape.terminal(cmd.cwd)})")
    elif cmd.target:
        lines.append(f"  the script it runs: {escape.terminal(cmd.cwd / cmd.target[0])}")
    if trial_cmd is not None and trial_cmd.torchrun != cmd.torchrun:
        lines.append(f"  the trials run it with torchrun {escape.terminal(shlex.join(trial_cmd.torchrun))}")
    lines.append("  each run adds its own --out, -q, --max-steps and --set (the recorded ones are left out)")
    return lines


def resolve(settings: dict[str, str], nproc_per_node: int) -> dict[str, str]:
    """``cpus_per_rank`` replaced by the number (a trial's settings are numbers in its results)."""
    cpus = knobs.cpus_per_rank(nproc_per_node)
    return {name: str(cpus) if value == knobs.CPUS_PER_RANK else value for name, value in settings.items()}


trials_dir = rundir.trials_dir  # where the trials of RUN go: ``<RUN>.trials/`` beside it


def new_session_dir(run: Path) -> Path:
    """A new, empty ``<RUN>.trials/<n>/`` (n = 1, 2, ...)."""
    base = trials_dir(run)
    try:
        base.mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write the trials of {run} to {base}: {exc.strerror or exc}") from None
    n = 1 + max((int(p.name) for p in base.iterdir() if p.name.isascii() and p.name.isdigit()), default=0)
    while True:
        path = base / str(n)
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
        except OSError as exc:
            raise UsageError(f"cannot write to {base}: {exc.strerror or exc}") from None


def setting_label(settings: dict[str, str]) -> str:
    """``ddp.bucket_cap_mb=25`` (several joined by ``,``); ``control`` for none. Also the trial's folder name."""
    return ",".join(f"{k}={v}" for k, v in settings.items()) or "control"


def as_ddp(cmd: RunCommand, analysis: Any, nproc_per_node: int | None) -> RunCommand:
    """RUN's command as a DDP job: torchrun, ``nproc_per_node`` ranks (default: the devices DataParallel used, 2
    on a CPU); ``UsageError`` when RUN is not a one-process DataParallel run."""
    captures = list(getattr(analysis, "captures", {}).values())
    dp = [entry for c in captures for entry in c.get("dp") or []]
    if not dp or len(captures) != 1 or cmd.torchrun or cmd.command is not None:
        raise UsageError(
            f"{cmd.run}: not a DataParallel run (--as-ddp converts a one-process job that builds nn.DataParallel)"
        )
    if nproc_per_node is None:
        devices = max((len(entry.get("device_ids") or []) for entry in dp), default=0)
        nproc_per_node = devices if devices > 1 else 2
        if nproc_per_node > MAX_RANKS_PER_NODE:  # a rank file says so; no node has that many devices
            raise UsageError(
                f"{cmd.run}: its DataParallel lists {devices} devices; give the ranks with --nproc-per-node N"
            )
    return replace(cmd, torchrun=("--standalone", "--nproc-per-node", str(nproc_per_node)))
